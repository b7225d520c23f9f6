"""The sweep on a real Ray cluster: local, and multi-node with fake GPUs (ray.cluster_utils)."""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import threading
import time
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster

from sweep.app import run
from sweep.config.validate import validate
from sweep.data.synthetic import write_synthetic_glue
from sweep.driver.tuner import run_tune
from sweep.errors import ResourceError
from sweep.plan.cpu_load import trial_niceness
from sweep.results.export_layout import MADE_BY
from sweep.results.records import load_records, rank_key
from sweep.results.trial_reports import CHECKPOINT_MARKER
from tests.helpers.configs import demo_config
from tests.helpers.overlap import most_at_once
from tests.helpers.sweeps import TRAIN_WORKER, actors

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def compose_cfg(*overrides: str):
    return demo_config("tracking=none", *overrides)


@pytest.fixture
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture
def two_gpu_nodes():
    """Two raylets with 4 CPUs and 2 (fake) GPUs each: GPU scheduling tested on a CPU machine. One per test:
    the module's tests run on either xdist worker, in any order, and its other tests start a local Ray."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "num_gpus": 2})
    cluster.add_node(num_cpus=4, num_gpus=2)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def holding_spans(records) -> list[tuple[float, float]]:
    """Each trial holds its resources from its start (its process's start, for the first trial of a
    process) to its last report."""
    return [(r.started_at, r.started_at + r.wall_seconds) for r in records]


class WorkerWatch:
    """Polls the GCS for alive actors of one class (the processes holding trials' resources): how
    many at once, and on which nodes."""

    def __init__(self, class_name: str):
        self.class_name = class_name
        self.max_alive, self.nodes, self._stop = 0, set(), threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self):
        while not self._stop.is_set():
            alive = actors(self.class_name)
            self.max_alive = max(self.max_alive, len(alive))
            self.nodes |= {a["Address"]["NodeID"] for a in alive}
            time.sleep(0.5)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def test_two_tasks_three_seeds_end_to_end(local_ray, cache_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SWEEP_CACHE_DIR", str(cache_dir))
    out = tmp_path / "out"
    cfg = compose_cfg("task=[WNLI,RTE]", "train.epochs=2", "train.max_train_samples=64", f"out_dir={out}")
    summaries = run(cfg, out)
    # no GPU here: the plan says CPU, how many at once, what trains, and a time measured on this CPU
    printed = capsys.readouterr().out
    plan = [line for line in printed.splitlines() if line.startswith("plan: ")]
    assert "plan: 6 trials on CPU, 2 at once (1 CPU each), longest first" in plan
    assert any("WNLI 64 of 200 rows" in line for line in plan) and not any("GPU" in line for line in plan)
    assert plan[-1].startswith("plan: predicted makespan ") and "measured here" in plan[-1]
    # the trials' share of this CPU is planned at the niceness Ray gives its workers: theirs
    assert f"2 trial(s) at once at niceness {trial_niceness()}: steps x" in plan[-1]
    assert ray.get(ray.remote(num_cpus=0)(lambda: os.nice(0)).remote()) == trial_niceness()

    records = load_records(out / "results.json")
    assert sorted((r.task, r.seed) for r in records) == sorted((t, s) for t in ("WNLI", "RTE") for s in (38, 39, 40))
    assert all(r.status == "TERMINATED" and r.epochs_done == 2 and r.score is not None for r in records)
    for s in summaries:  # summary numbers recomputed from the rows
        scores = [r.score for r in records if r.task == s.task]
        assert s.n == 3 and s.mean == pytest.approx(statistics.fmean(scores))
        assert s.std == pytest.approx(statistics.stdev(scores)) and s.median == pytest.approx(statistics.median(scores))
        best = max((r for r in records if r.task == s.task), key=lambda r: rank_key(s.mode, r.score, r.seed))
        assert (s.best_seed, s.best_score) == (best.seed, best.score)
        made_by = (out / "best" / s.task / MADE_BY).read_text()
        assert f'"seed": {best.seed}' in made_by
    assert sorted(p.name for p in (out / "best").iterdir()) == ["RTE", "WNLI"]
    assert not list((out / "ray").rglob("checkpoint_*")), "checkpoints of pruned trials left behind"
    assert not actors(TRAIN_WORKER, alive_only=False)  # one-worker trials start no Train worker group
    # the driver's node alone, none can join: the driver staged it itself, with no relay of lines
    assert not actors("ProgressRelay", alive_only=False)
    assert re.search(r"^staging: node \w{8} \(.*\): already staged in", printed, re.MULTILINE), printed
    pids = {r.pid for r in records}
    assert None not in pids and len(pids) <= 2  # 6 trials, 2 CPUs: at most 2 (reused) trial processes
    assert (out / "summary.csv").exists() and (out / "results.csv").exists()


def test_gpu_packing_on_two_nodes(two_gpu_nodes, cache_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SWEEP_CACHE_DIR", str(cache_dir))
    base = ["train.epochs=1", "train.max_train_samples=32", f"cluster.storage_path={tmp_path / 'storage'}",
            "cluster.shared_storage=true"]

    one = validate(compose_cfg(*base, "sweep.seeds=[1,2,3,4,5,6]", "resources.gpus_per_trial=1"))
    records, _ = run_tune(one, tmp_path / "one")
    assert [r.status for r in records] == ["TERMINATED"] * 6, [r.error for r in records]
    assert 2 <= most_at_once(holding_spans(records)) <= 4, holding_spans(records)  # 4 GPUs in all
    assert len({r.node for r in records}) == 2
    assert actors("ProgressRelay", alive_only=False)  # two nodes: each stages in a task; their lines relayed

    half = validate(compose_cfg(*base, "sweep.seeds=[1,2,3,4,5,6,7,8]", "resources.gpus_per_trial=0.5",
                                f"cluster.storage_path={tmp_path / 'storage2'}", "cluster.shared_storage=true"))
    records, _ = run_tune(half, tmp_path / "half")
    assert [r.status for r in records] == ["TERMINATED"] * 8, [r.error for r in records]
    assert most_at_once(holding_spans(records)) == 8  # two trials per GPU
    assert len({r.pid for r in records}) == 8

    t0 = time.time()
    with pytest.raises(ResourceError, match="the largest node has 4 CPU and 2 GPU"):
        run_tune(validate(compose_cfg(*base, "resources.gpus_per_trial=3")), tmp_path / "three")
    assert time.time() - t0 < 10


def test_longest_task_first_and_a_ddp_task_beside_one_gpu_trials(two_gpu_nodes, cache_dir, tmp_path, monkeypatch):
    """Config order puts the smallest task first; the plan starts the biggest: RTE (6000 rows) as a
    2-GPU DDP run on one node, SST-2 (300) and MRPC (200) on the other node's two GPUs; WNLI (40
    rows) waits for a GPU to free. In config order WNLI would have started first."""
    monkeypatch.setenv("SWEEP_CACHE_DIR", str(cache_dir))
    data = tmp_path / "data"
    # RTE trains long enough (~15 s) after its workers are up for the 1-GPU trials to start beside it
    for task, rows in (("RTE", 6000), ("SST-2", 300), ("MRPC", 200), ("WNLI", 40)):
        write_synthetic_glue(data, [task], n_train=rows, n_dev=32)
    settings = validate(compose_cfg(
        "task=[WNLI,MRPC,SST-2,RTE]", "sweep.seeds=[1]", "+resources.tasks.RTE.gpus_per_trial=2",
        "train.epochs=1", "train.max_train_samples=null", f"storage.data_dir={data}",
        f"cluster.storage_path={tmp_path / 'storage'}", "cluster.shared_storage=true",
    ))
    with WorkerWatch(TRAIN_WORKER) as watch:
        records, _ = run_tune(settings, tmp_path / "out")
    assert all(r.status == "TERMINATED" for r in records), [r.error for r in records]
    by_task = {r.task: r for r in records}
    assert {task: r.gpus for task, r in by_task.items()} == {"RTE": 2.0, "SST-2": 1.0, "MRPC": 1.0, "WNLI": 1.0}
    assert watch.max_alive == 2  # the DDP trial's two Train workers (one-GPU trials start none)
    # RTE's two GPUs and the other node's two held at one time: the DDP run beside two 1-GPU trials
    assert most_at_once(holding_spans([by_task[t] for t in ("RTE", "SST-2", "MRPC")])) == 3
    # WNLI, first in the config, started only once a trial had freed its GPU
    first_end = min(end for _, end in holding_spans(records))
    assert by_task["WNLI"].started_at >= first_end - 1.0, {r.task: holding_spans([r]) for r in records}


def test_multi_node_without_storage_path_is_an_error(two_gpu_nodes, tmp_path):
    with pytest.raises(ResourceError, match="cluster.storage_path: this Ray cluster has 2 nodes"):
        run_tune(validate(compose_cfg()), tmp_path)


@pytest.mark.parametrize("size, evals, stale", [([], 3, True), (["resources.gpus_per_trial=2"], 1, False),
                                                 (["train.method=lora"], 3, False)],
                         ids=["trial-process-mid-epoch-stale-record", "ddp", "lora-mid-epoch"])
def test_a_killed_trial_is_retried_from_its_checkpoint(local_ray, cache_dir, tmp_path, monkeypatch, size, evals,
                                                      stale):
    """The process running the trial's loop (the Tune trial's own; rank 0 of a DDP run's Train
    workers) is SIGKILLed once its history holds evaluation ``evals + 2``: Tune retries the trial from
    its latest registered checkpoint (a DDP trial's new TorchTrainer resumes its Train run), and the
    retry reports the remaining evaluations. With 3 evaluations per epoch that checkpoint is one
    inside epoch 2: the retry goes on from the middle of an epoch.

    ``stale``: just before the kill that checkpoint's folder moves, so that the one Tune holds is gone,
    as after a preemption between Tune deleting a checkpoint and saving its state
    (sweep/trial/kept_checkpoints.py): the retry finds the moved folder by its marker and goes on from it."""
    monkeypatch.setenv("SWEEP_CACHE_DIR", str(cache_dir))
    data = write_synthetic_glue(tmp_path / "data", ["RTE"], n_train=1500, n_dev=64)
    epochs = 5  # 3 epochs (~2 s each) after the kill point: time for the killer to see it in the history
    settings = validate(compose_cfg("task=RTE", "sweep.seeds=[38]", f"train.epochs={epochs}",
                                    f"train.evals_per_epoch={evals}", "train.max_train_samples=null",
                                    f"storage.data_dir={data}", *size))
    killed, steps_at_kill = [], []

    def kill_after_evaluation_n():
        deadline = time.time() + 240
        while time.time() < deadline and not killed:
            # Once evaluation n is on record the driver has long registered the checkpoint of n - 1
            # (a kill right after the first report could beat the driver to it: a restart from scratch).
            history = next((tmp_path / "out").rglob("history/*.json"), None)
            rows = json.loads(history.read_text()) if history and history.stat().st_size else []
            if len(rows) >= evals + 2:
                if stale:
                    move_checkpoint_of(rows[-1], tmp_path / "out")
                # The process that reported the evaluation is the one running the loop (no actor-table lookup)
                os.kill(rows[-1]["pid"], signal.SIGKILL)
                killed.append(rows[-1]["pid"])
                steps_at_kill.append(rows[-1]["step"])
            time.sleep(0.05)

    killer = threading.Thread(target=kill_after_evaluation_n, daemon=True)
    killer.start()
    records, _ = run_tune(settings, tmp_path / "out")
    killer.join()
    assert killed, "no trial process was killed"
    (record,) = records
    assert steps_at_kill[0] < record.steps_total, \
        f"killed after its last evaluation ({steps_at_kill}): nothing to resume"
    assert record.status == "TERMINATED" and record.epochs_done == epochs, record.error
    assert record.steps_done == record.steps_total
    history = json.loads(next((tmp_path / "out").rglob("history/*.json")).read_text())
    steps = [r["step"] for r in history]
    assert steps == sorted(set(steps)), steps  # the retry dropped rows past its checkpoint: none twice, none missing
    assert len(steps) == epochs * evals
    first_steps = [r["step"] for r in history if not r["resumed"]]
    resumed = [r["step"] for r in history if r["resumed"]]
    # from a checkpoint, not the start: the first evaluation after it is past the second one
    after_kill = steps[steps.index(steps_at_kill[0]) + 1]
    assert resumed and resumed[-1] == record.steps_total and first_steps[1] < resumed[0] <= after_kill, history
    from_step = steps[steps.index(resumed[0]) - 1]  # the checkpoint the retry went on from
    per_epoch = record.steps_total // epochs
    # mid-epoch when it evaluates inside epochs
    assert (from_step % per_epoch != 0) == (evals > 1), (from_step, per_epoch)
    pids = [r["pid"] for r in history]
    assert pids[0] == killed[0] and len(set(pids)) == 2  # the killed process, then the retry's new one


def move_checkpoint_of(row: dict, out: Path) -> None:
    """The checkpoint folder of history row ``row`` moved to a name after every other (Tune's record of it stale)."""
    for marker in out.rglob(f"checkpoint_*/{CHECKPOINT_MARKER}"):
        if json.loads(marker.read_text()).get("checkpoint_id") == row["checkpoint_id"]:
            marker.parent.rename(marker.parent.with_name("checkpoint_999999"))
            return
    raise AssertionError(f"no checkpoint folder of {row['checkpoint_id']} under {out}")


def test_trial_after_trial_in_one_reused_process_without_growing(cache_dir, tmp_path, monkeypatch):
    """One CPU: one trial at a time, each in the same Tune trial process (no worker group, no
    re-import); what a trial leaves behind does not add up: memory after the 10th trial is within
    5% of after the 1st (without handing freed heap back to the OS it grew 10%: 641 -> 709 MiB)."""
    monkeypatch.setenv("SWEEP_CACHE_DIR", str(cache_dir))
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        settings = validate(compose_cfg("sweep.seeds=[1,2,3,4,5,6,7,8,9,10,11]", "train.epochs=1",
                                        "train.max_train_samples=32", "train.max_eval_samples=32"))
        records, _ = run_tune(settings, tmp_path / "out")
        assert all(r.status == "TERMINATED" for r in records), [r.error for r in records]
        assert not actors(TRAIN_WORKER, alive_only=False) and not actors("TrainController", alive_only=False)
    finally:
        ray.shutdown()
    firsts = sorted((json.loads(p.read_text())[0] for p in (tmp_path / "out" / "ray" / "history").glob("*.json")),
                    key=lambda row: row["driver_started"])
    assert len(firsts) == 11 and len({row["pid"] for row in firsts}) == 1  # all 11 trials in one process
    rss = [row["rss_at_start_mb"] for row in firsts]  # trial k+1 starts with what trial k left
    print(f"\nRSS at each trial's start (MiB): {[round(x) for x in rss]}")
    assert rss[10] <= 1.05 * rss[1], f"after the 10th trial {rss[10]:.0f} MiB vs after the 1st {rss[1]:.0f} MiB"


def test_two_gpus_per_trial_is_a_ddp_run_with_two_workers(local_ray, cache_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SWEEP_CACHE_DIR", str(cache_dir))
    settings = validate(compose_cfg("sweep.seeds=[38]", "train.epochs=2", "resources.gpus_per_trial=2"))
    with WorkerWatch(TRAIN_WORKER) as watch:
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


def test_asha_stops_the_weak_trial_and_its_process_serves_the_next(cache_dir, tmp_path, monkeypatch):
    """One CPU, so trials run one at a time in dispatch order: the trial with a useful lr passes the
    rungs (epochs 1 and 2) first; the one with lr=1e-9 (a model that cannot move) arrives below it
    and ends there as a finished trial; the CPU it held goes to the next trial, and the sweep ends
    with nothing pending (a trial that held on to its CPU would hang it)."""
    monkeypatch.setenv("SWEEP_CACHE_DIR", str(cache_dir))
    data = write_synthetic_glue(tmp_path / "data", ["RTE"], n_train=600, n_dev=64)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        settings = validate(compose_cfg(
            "task=RTE", "sweep.seeds=[1,2]", "train.epochs=3", "train.max_train_samples=null", "train.lr=2e-3",
            "sweep.scheduler=asha", "+sweep.grid.lr=[2e-3,1e-9]", f"storage.data_dir={data}"))
        records, _ = run_tune(settings, tmp_path / "out")
        # no trial process left holding a CPU (found by the class name Ray shows: there were some)
        assert actors("ImplicitFunc", alive_only=False) and not actors("ImplicitFunc")
    finally:
        ray.shutdown()
    assert [r.status for r in records] == ["TERMINATED"] * 4, [r.error for r in records]
    done = {(r.seed, r.hparams["lr"]): r.epochs_done for r in records}
    first = min(records, key=lambda r: r.started_at)
    assert (first.seed, first.hparams["lr"]) == (1, 2e-3) and first.epochs_done == 3
    assert done[(1, 1e-9)] < 3, done  # cut at a rung (epoch 1 or 2: at epoch 1 both may still be at chance)
    scores = {(r.seed, r.hparams["lr"]): r.score for r in records}
    assert scores[(1, 1e-9)] < scores[(1, 2e-3)], scores
