"""Shared fixtures: generated GLUE-layout data for every task, the real data next to the repo, the
session's caches; and the fixtures of tests/helpers/, registered here once (``pytest_plugins``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweep.cluster.connect import no_prestarted_workers
from sweep.serving.cpu_budget import quiet_openmp_environment

# OpenMP's idle threads sleep instead of spinning, in the test processes and every process they start, before
# anything loads torch: two workers on 2 cores, each torch with 2 threads, spun away the CPU of the other's
# processes (Ray-free torch tests here: 127 -> 111 CPU-s, 69 -> 60 s). Results are the same; a test of the
# server's own setting starts its server without it (tests/helpers/serving.py).
quiet_openmp_environment()
# Every Ray a test starts (ray.init, cluster_utils, `ray start`) as the sweep's own local Ray: no idle prestarted
# workers (sweep/cluster/connect.py).
no_prestarted_workers()

from sweep.config.tasks import GLUE_TASKS  # noqa: E402
from sweep.data.synthetic import write_synthetic_glue  # noqa: E402
from sweep.train.tiny_exports import TINY_ROBERTA  # noqa: E402

# Fixtures any test module may name as an argument (none imports them).
pytest_plugins = [
    "tests.helpers.own_disks",  # own_disk_cluster
    "tests.helpers.s3",  # moto_server
    "tests.helpers.sweeps",  # local_ray
    "tests.helpers.tracking",  # mlflow_server
]


@pytest.fixture(scope="session")
def synthetic_glue_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir holding ``glue_data/<TASK>/`` for all nine tasks (200 train, 64 dev rows)."""
    return write_synthetic_glue(tmp_path_factory.mktemp("synthetic"), GLUE_TASKS)


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """The real GLUE / WikiText-2 copies in ``../shared/data`` (skips when this checkout lacks them)."""
    path = Path(__file__).resolve().parents[2] / "shared" / "data"
    if not path.is_dir():
        pytest.skip(f"real data not present at {path}")
    return path


@pytest.fixture(scope="session")
def crds() -> dict:
    """The CRDs in ``../shared/reference/crds`` by (group, kind) (skips when this checkout lacks them)."""
    from tests.helpers.manifests import load_crds

    path = Path(__file__).resolve().parents[2] / "shared" / "reference" / "crds"
    if not path.is_dir():
        pytest.skip(f"CRD schemas not present at {path}")
    return load_crds(path)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One per-machine cache for the session (tiny models, tokenized data), as a node would have."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="session")
def tiny_roberta_dir(cache_dir: Path) -> Path:
    from sweep.models.local_folder import resolve_model_dir

    return resolve_model_dir(TINY_ROBERTA, cache_dir)


# `make test` runs two pytest-xdist workers in two phases (tests/helpers/lanes.py). A test marked `ray` starts its
# own Ray (`ray.init`, a sweep in-process or as `python -m sweep`, a `cluster_utils` cluster); two of those run
# side by side, with the Ray-free tests. A test also marked `ray_cluster` starts or stops Ray for the whole
# machine (a `ray start` head, `ray stop --force`, the autoscaler's cluster): those run last, one at a time on
# one worker, once every other Ray test has finished; the other worker runs the Ray-free tests left. The marks
# are read from the source: the scheduler runs in xdist's controller, which has node ids, not items. (xdist's
# own --dist loadgroup renames node ids, which pytest 9.2 no longer lets it do: the grouping is here.)
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    from tests.helpers.lanes import CLUSTER_MARK, ray_lane_scheduling, ray_test_ids

    tests = Path(__file__).parent
    try:
        prefix = tests.relative_to(config.rootpath).as_posix()  # node ids are paths from the rootdir
    except ValueError:
        prefix = tests.name
    return ray_lane_scheduling(config, log, ray_test_ids(tests, prefix), ray_test_ids(tests, prefix, CLUSTER_MARK))


# A test that starts Ray beside another (`ray`, not `ray_cluster`) starts a Ray of its own: Ray's init with no
# address joins the newest cluster whose head wrote /tmp/ray/ray_current_cluster (a cluster_utils head does, in
# the test beside it), unless RAY_ADDRESS says `local`. Its `python -m sweep` commands inherit it; an address
# given (a cluster's, `cluster.address=`) still wins. (Said here, not in a docstring: tests/test_architecture.py
# reads a fixture's text for what starts Ray, and this one starts none.)
@pytest.fixture(autouse=True)
def ray_of_its_own(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.helpers.lanes import CLUSTER_MARK, RAY_MARK, RAY_OF_ITS_OWN

    if request.node.get_closest_marker(RAY_MARK) and not request.node.get_closest_marker(CLUSTER_MARK):
        monkeypatch.setenv("RAY_ADDRESS", RAY_OF_ITS_OWN)


# Ray's core worker keeps C++ threads that can crash while the interpreter tears down after many
# ray.init/shutdown cycles in one process (ray-project/ray#31145): CI once saw "Segmentation fault"
# after pytest had printed its result. Every result is in by then, so leave with pytest's own status
# and skip the teardown.
_EXIT_STATUS = pytest.StashKey[int]()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_EXIT_STATUS] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    import os
    import sys

    if "ray" in sys.modules and _EXIT_STATUS in config.stash:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(config.stash[_EXIT_STATUS])
