"""Sweeps on an autoscaling cluster (a real Ray autoscaler, the fake node provider): the GPU worker
group starts at zero nodes, and two sweeps at once ask for their nodes (one request, the sum),
wait for them, run every trial on them, and withdraw; a group that can never grow is an error before any trial; nodes
that never come are one clear error after cluster.scale_timeout_s.

Each test starts and stops a Ray cluster (ending every Ray process on the machine).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sweep.app import run
from sweep.errors import ResourceError
from sweep.results.records import load_records
from sweep.testing.local_cluster import GPU_TYPE, autoscaling_cluster, gpu_worker_type
from tests.helpers.configs import demo_config
from tests.helpers.overlap import most_at_once

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.ray_cluster]
HEAD = {"CPU": 2, "GPU": 0}  # the head holds the trials' drivers, never a GPU trial


def never_starting_gpu_worker_type(max_workers: int = 2) -> dict:
    """A GPU type the autoscaler tries to launch but whose node never joins: the fake provider starts
    the raylet with a 1 PB object store, which cannot come up (measured: launching 2 for 40 s+, no
    node). For the "no node arrived within cluster.scale_timeout_s" case; the plan still sees a
    1 CPU + 1 GPU type with max ``max_workers``."""
    node_type = gpu_worker_type(max_workers=max_workers)
    node_type["resources"]["object_store_memory"] = 10**15
    return node_type


def sweep_cfg(address: str, tmp_path: Path, *extra: str):
    return demo_config(
        "tracking=none", f"cluster.address={address}", "resources.gpus_per_trial=1", "sweep.seeds=[38,39,40,41]",
        "train.epochs=1", "train.max_train_samples=32", "train.max_eval_samples=32",
        f"cluster.storage_path={tmp_path / 'storage'}", "cluster.shared_storage=true",
        f"storage.cache_dir={tmp_path / 'cache'}", f"out_dir={tmp_path / 'out'}", *extra,
    )


def request_gone(autoscale, within_s: float = 30) -> bool:
    """The standing request as the autoscaler reports it (its status lags a write by a few seconds)."""
    deadline = time.monotonic() + within_s
    while autoscale.pending_status().requested and time.monotonic() < deadline:
        time.sleep(1)
    return autoscale.pending_status().requested == []


def trial_intervals(history_dir: Path) -> list[tuple[float, float]]:
    """[training loop started, last epoch reported] of each trial (from the trials' own history
    files): while its worker holds the trial's GPU bundle. (A trial's driver holds no GPU and may
    start long before: it waits there for its worker's resources.)"""
    spans = []
    for path in history_dir.glob("*.json"):
        rows = json.loads(path.read_text())
        spans.append((min(r["loop_started"] for r in rows), max(r["reported_at"] for r in rows)))
    return spans


def sweep_overrides(tmp_path: Path, name: str, seeds: str) -> list[str]:
    """A 2-trial sweep as `python -m sweep` gets it, joining the running cluster as a user would."""
    return [
        "experiment=demo", "tracking=none", "cluster.address=auto", "resources.gpus_per_trial=1",
        f"sweep.seeds={seeds}", "train.epochs=1", "train.max_train_samples=32", "train.max_eval_samples=32",
        f"cluster.storage_path={tmp_path / name / 'storage'}", "cluster.shared_storage=true",
        f"storage.cache_dir={tmp_path / 'cache'}", f"out_dir={tmp_path / name / 'out'}",
    ]


def stored_request() -> list[dict]:
    """The cluster's one standing request, as autoscaler v1 stores it."""
    from ray.autoscaler._private.constants import AUTOSCALER_RESOURCE_REQUEST_CHANNEL
    from ray.experimental.internal_kv import _internal_kv_get

    raw = _internal_kv_get(AUTOSCALER_RESOURCE_REQUEST_CHANNEL)
    return json.loads(raw) if raw else []


@pytest.mark.timeout(720)
def test_two_sweeps_at_once_share_launched_gpu_nodes_and_the_request(tmp_path):
    """Two sweeps submitted at once on a cluster whose GPU group starts at zero: both finish, every
    trial runs on a launched GPU node, never more trials at once than the group's 2 GPUs hold, the
    autoscaler is asked for BOTH sweeps' trials (Ray keeps one request per cluster: without the
    shared keeper the second sweep's request would replace the first's), and the request is withdrawn."""
    import ray

    from sweep.cluster import autoscale, request as cluster_request

    with autoscaling_cluster(head=HEAD, worker_types={GPU_TYPE: gpu_worker_type(max_workers=2)}) as address:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)  # to read the request
        head_node = ray.get_runtime_context().get_node_id()
        started = time.time()
        sweeps = {}
        for name, seeds in (("a", "[38,39]"), ("b", "[40,41]")):
            log = (tmp_path / f"{name}.log").open("w")
            sweeps[name] = (subprocess.Popen([sys.executable, "-m", "sweep", *sweep_overrides(tmp_path, name, seeds)],
                                             stdout=log, stderr=subprocess.STDOUT), log)
        most_requested = 0
        while any(proc.poll() is None for proc, _ in sweeps.values()):
            most_requested = max(most_requested, len(stored_request()))
            time.sleep(0.5)
        codes = {name: proc.returncode for name, (proc, _) in sweeps.items()}
        withdrawn = request_gone(autoscale) and stored_request() == []
        keeper_gone = not any(a["name"] == cluster_request.KEEPER_NAME
                              for a in ray.util.list_named_actors(all_namespaces=True))
    outs = {name: (tmp_path / f"{name}.log").read_text() for name in sweeps}
    assert codes == {"a": 0, "b": 0}, {n: o[-2000:] for n, o in outs.items()}
    assert any("GPU node(s) (type gpu_worker) from the autoscaler" in o for o in outs.values()), outs
    assert not any("no GPU" in o for o in outs.values())  # never the CPU fallback
    records = [r for name in sweeps for r in load_records(tmp_path / name / "out" / "results.json")]
    assert len(records) == 4 and all(r.ok for r in records), [(r.status, r.error) for r in records]
    assert head_node not in {r.node for r in records}  # every trial on a launched GPU node
    # (with this test's 6 s idle timeout a GPU node may go between two trials and another come:
    # the group's max bounds nodes at once, not nodes over the sweep)
    assert all(r.gpus == 1.0 for r in records)
    spans = [s for name in sweeps for s in trial_intervals(tmp_path / name / "storage" / "history")]
    assert len(spans) == 4 and most_at_once(spans) <= 2  # together never more than the cluster holds
    assert most_requested == 4  # both sweeps' 2 bundles stood at once
    assert withdrawn and keeper_gone  # the last sweep out cleared the request and ended the keeper
    first_loop = min(start for start, _ in spans)
    print(f"autoscaling: first trial loop on a GPU node {first_loop - started:.1f} s after the sweeps began")


@pytest.mark.timeout(300)
def test_a_gpu_group_that_cannot_grow_is_an_error_before_any_trial(tmp_path):
    with autoscaling_cluster(head=HEAD, worker_types={GPU_TYPE: gpu_worker_type(max_workers=0)}) as address:
        with pytest.raises(ResourceError) as error:
            run(sweep_cfg(address, tmp_path), tmp_path / "out")
    message = str(error.value)
    assert "has no GPU node and its autoscaler can launch none" in message
    assert "gpu_worker max 0" in message and "resources.gpus_per_trial=0" in message
    assert not (tmp_path / "storage" / "history").exists() and not (tmp_path / "out" / "results.json").exists()


@pytest.mark.timeout(300)
def test_nodes_that_never_come_end_in_one_clear_error(tmp_path):
    from sweep.cluster import autoscale
    from sweep.plan.scale import ScaleTimeoutError

    with autoscaling_cluster(head=HEAD,
                             worker_types={GPU_TYPE: never_starting_gpu_worker_type(max_workers=2)}) as address:
        # The head is alone, but the cluster can grow: each launched node has its own disk, so a sweep
        # without a storage path every node reaches is refused before any trial (this cluster, shared).
        cfg = sweep_cfg(address, tmp_path)
        cfg.cluster.storage_path = None
        with pytest.raises(ResourceError) as no_storage:
            run(cfg, tmp_path / "out")
        t0 = time.monotonic()
        with pytest.raises(ScaleTimeoutError) as error:
            run(sweep_cfg(address, tmp_path, "cluster.scale_timeout_s=10"), tmp_path / "out")
        waited = time.monotonic() - t0
        withdrawn = request_gone(autoscale)
    assert str(no_storage.value).startswith(
        "cluster.storage_path: this Ray cluster can launch nodes of type gpu_worker")
    assert "s3://bucket/prefix" in str(no_storage.value) and "\n" not in str(no_storage.value)
    assert str(error.value).startswith("no node of type gpu_worker arrived within 10 s; pending: 2 x {GPU: 1, CPU: 1}")
    assert waited < 120  # the error comes soon after the timeout, not after Train's own retries
    assert withdrawn  # withdrawn on the way out of the failed sweep
    assert not (tmp_path / "out" / "results.json").exists()
