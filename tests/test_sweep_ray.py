"""The sweep on a real Ray cluster: local, and multi-node with fake GPUs (ray.cluster_utils)."""

from __future__ import annotations

import csv
import json
import os
import signal
import statistics
import threading
import time
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster

from configs import demo_config
from sweep.app import run
from sweep.config import validate
from sweep.results import MADE_BY, load_records
from sweep.data.synthetic import write_synthetic_glue
from sweep.errors import ResourceError
from sweep.run.tuner import run_tune

pytestmark = pytest.mark.slow


def compose_cfg(*overrides: str):
    return demo_config("tracking=none", *overrides)


@pytest.fixture
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture
def two_gpu_nodes():
    """Two raylets with 4 CPUs and 2 (fake) GPUs each: GPU scheduling tested on a CPU machine."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "num_gpus": 2})
    cluster.add_node(num_cpus=4, num_gpus=2)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def registered_checkpoint(snapshot: Path) -> bool:
    """Whether Train's checkpoint manager snapshot names a checkpoint (it is written in place: may be partial)."""
    try:
        return json.loads(snapshot.read_text()).get("latest_checkpoint_result") is not None
    except (OSError, ValueError):
        return False


def alive_train_workers() -> list[dict]:
    # The GCS's actor table (the public state API needs the dashboard, which tests don't start).
    from ray._private import state

    return [a for a in state.actors().values() if a["ActorClassName"] == "RayTrainWorker" and a["State"] == "ALIVE"]


class WorkerWatch:
    """Polls the GCS for alive Train workers: how many at once, and on which nodes."""

    def __init__(self):
        self.max_alive, self.nodes, self._stop = 0, set(), threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self):
        while not self._stop.is_set():
            alive = alive_train_workers()
            self.max_alive = max(self.max_alive, len(alive))
            self.nodes |= {a["Address"]["NodeID"] for a in alive}
            time.sleep(0.5)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def test_two_tasks_three_seeds_end_to_end(local_ray, cache_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SWEEP_CACHE_DIR", str(cache_dir))
    out = tmp_path / "out"
    cfg = compose_cfg("task=[WNLI,RTE]", "train.epochs=2", "train.max_train_samples=64", f"out_dir={out}")
    summaries = run(cfg, out)

    records = load_records(out / "results.json")
    assert sorted((r.task, r.seed) for r in records) == sorted((t, s) for t in ("WNLI", "RTE") for s in (38, 39, 40))
    assert all(r.status == "TERMINATED" and r.epochs_done == 2 and r.score is not None for r in records)
    for s in summaries:  # summary numbers recomputed from the rows
        scores = [r.score for r in records if r.task == s.task]
        assert s.n == 3 and s.mean == pytest.approx(statistics.fmean(scores))
        assert s.std == pytest.approx(statistics.stdev(scores)) and s.median == pytest.approx(statistics.median(scores))
        best = max((r for r in records if r.task == s.task), key=lambda r: (r.score, -r.seed))
        assert (s.best_seed, s.best_score) == (best.seed, best.score)
        made_by = (out / "best" / s.task / MADE_BY).read_text()
        assert f'"seed": {best.seed}' in made_by
    assert sorted(p.name for p in (out / "best").iterdir()) == ["RTE", "WNLI"]
    assert not (out / "ray" / "train").exists(), "checkpoints of pruned trials left behind"
    assert (out / "summary.csv").exists() and (out / "results.csv").exists()


def test_gpu_packing_on_two_nodes(two_gpu_nodes, cache_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SWEEP_CACHE_DIR", str(cache_dir))
    base = ["train.epochs=1", "train.max_train_samples=32", f"cluster.storage_path={tmp_path / 'storage'}"]

    one = validate(compose_cfg(*base, "sweep.seeds=[1,2,3,4,5,6]", "resources.gpus_per_trial=1"))
    with WorkerWatch() as watch:
        records, _ = run_tune(one, tmp_path / "one")
    assert [r.status for r in records] == ["TERMINATED"] * 6, [r.error for r in records]
    assert 2 <= watch.max_alive <= 4, watch.max_alive
    assert len(watch.nodes) == 2 and len({r.node for r in records}) == 2

    half = validate(compose_cfg(*base, "sweep.seeds=[1,2,3,4,5,6,7,8]", "resources.gpus_per_trial=0.5",
                                f"cluster.storage_path={tmp_path / 'storage2'}"))
    with WorkerWatch() as watch:
        records, _ = run_tune(half, tmp_path / "half")
    assert [r.status for r in records] == ["TERMINATED"] * 8, [r.error for r in records]
    assert watch.max_alive == 8, watch.max_alive

    t0 = time.time()
    with pytest.raises(ResourceError, match="the largest node has 4 CPU and 2 GPU"):
        run_tune(validate(compose_cfg(*base, "resources.gpus_per_trial=3")), tmp_path / "three")
    assert time.time() - t0 < 10


def test_multi_node_without_storage_path_is_an_error(two_gpu_nodes, tmp_path):
    with pytest.raises(ResourceError, match="cluster.storage_path: this Ray cluster has 2 nodes"):
        run_tune(validate(compose_cfg()), tmp_path)


def test_a_killed_worker_is_retried_from_its_checkpoint(local_ray, cache_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SWEEP_CACHE_DIR", str(cache_dir))
    data = write_synthetic_glue(tmp_path / "data", ["RTE"], n_train=1500, n_dev=64)
    settings = validate(compose_cfg("task=RTE", "sweep.seeds=[38]", "train.epochs=4", "train.max_train_samples=null",
                                    f"storage.data_dir={data}"))
    killed, epochs_at_kill = [], []

    def kill_after_first_checkpoint():
        deadline = time.time() + 240
        while time.time() < deadline and not killed:
            # Kill once Train's controller has registered a checkpoint (its snapshot names one), so the
            # restart must resume from it: the worker's own report returning is too early (the
            # controller polls for it), and Tune's progress.csv can lag until the trial is all done.
            if any(registered_checkpoint(p) for p in (tmp_path / "out" / "ray").rglob("checkpoint_manager_snapshot.json")):
                for actor in alive_train_workers():
                    os.kill(actor["Pid"], signal.SIGKILL)
                    killed.append(actor["Pid"])
                history = next((tmp_path / "out").rglob("history/*.json"), None)
                epochs_at_kill.append(len(json.loads(history.read_text())) if history else 0)
            time.sleep(0.05)

    killer = threading.Thread(target=kill_after_first_checkpoint, daemon=True)
    killer.start()
    records, root = run_tune(settings, tmp_path / "out")
    killer.join()
    assert killed, "no worker was killed"
    assert epochs_at_kill[0] < 4, f"the worker was killed after its last epoch ({epochs_at_kill}): nothing left to resume"
    (record,) = records
    assert record.status == "TERMINATED" and record.epochs_done == 4
    progress = next((tmp_path / "out" / "ray" / "tune").glob("*/progress.csv"))
    rows = list(csv.DictReader(progress.open()))
    assert [r["epoch"] for r in rows] == ["1", "2", "3", "4"]
    assert "True" in {r["resumed"] for r in rows}, "no epoch was reported by a resumed worker"


def test_a_trial_that_keeps_failing_is_recorded_and_the_others_finish(local_ray, cache_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SWEEP_CACHE_DIR", str(cache_dir))
    data = write_synthetic_glue(tmp_path / "data", ["WNLI", "RTE"], n_train=64, n_dev=32)
    rte_train = data / "glue_data" / "RTE" / "train.tsv"
    lines = rte_train.read_text().splitlines()
    lines[40] = lines[40].rsplit("\t", 1)[0] + "\tmaybe"  # a label RTE does not have
    rte_train.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    cfg = compose_cfg("task=[WNLI,RTE]", "sweep.seeds=[38]", "train.epochs=1", "sweep.max_failures=1",
                      f"storage.data_dir={data}", f"out_dir={out}")
    summaries = run(cfg, out)
    by_task = {r.task: r for r in load_records(out / "results.json")}
    assert by_task["WNLI"].status == "TERMINATED"
    assert by_task["RTE"].status == "ERROR" and "maybe" in by_task["RTE"].error and "train.tsv:41" in by_task["RTE"].error
    rte = next(s for s in summaries if s.task == "RTE")
    assert rte.failed == 1 and rte.best_seed is None
    assert (out / "best" / "WNLI").is_dir() and not (out / "best" / "RTE").exists()


def test_two_gpus_per_trial_is_a_ddp_run_with_two_workers(local_ray, cache_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SWEEP_CACHE_DIR", str(cache_dir))
    settings = validate(compose_cfg("sweep.seeds=[38]", "train.epochs=2", "resources.gpus_per_trial=2"))
    with WorkerWatch() as watch:
        (record,), _ = run_tune(settings, tmp_path / "out")  # no GPU here: 2 CPU workers over gloo
    assert record.status == "TERMINATED" and record.epochs_done == 2, record.error
    assert watch.max_alive == 2


def test_asha_search_samples_and_completes(local_ray, cache_dir, tmp_path, monkeypatch):
    """The rung logic is unit-tested (test_schedulers.py); here: the Ray wiring ends every trial cleanly."""
    monkeypatch.setenv("SWEEP_CACHE_DIR", str(cache_dir))
    settings = validate(compose_cfg(
        "sweep.seeds=[38]", "train.epochs=3", "sweep.scheduler=asha", "sweep.num_samples=4",
        "+sweep.search.lr={dist:loguniform,low:1e-6,high:1e-2}",
    ))
    records, _ = run_tune(settings, tmp_path / "out")
    assert len(records) == 4 and all(r.status == "TERMINATED" for r in records)
    lrs = {r.hparams["lr"] for r in records}
    assert len(lrs) == 4 and all(1e-6 <= lr <= 1e-2 for lr in lrs)
    assert all(1 <= r.epochs_done <= 3 for r in records)
