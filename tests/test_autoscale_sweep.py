"""A sweep on an autoscaling cluster (a real Ray autoscaler, the fake node provider): the GPU worker
group starts at zero nodes, and the sweep asks for its nodes, waits for them, runs every trial on
them, and withdraws its request; a group that can never grow is an error before any trial; nodes
that never come are one clear error after cluster.scale_timeout_s.

Each test starts and stops a Ray cluster (ending every Ray process on the machine).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from autoscaling import GPU_TYPE, autoscaling_cluster, gpu_worker_type, never_starting_gpu_worker_type
from configs import demo_config
from sweep.app import run
from sweep.errors import ResourceError
from sweep.results import load_records

pytestmark = pytest.mark.slow
HEAD = {"CPU": 2, "GPU": 0}  # the head holds the trials' drivers, never a GPU trial


def sweep_cfg(address: str, tmp_path: Path, *extra: str):
    return demo_config(
        "tracking=none", f"cluster.address={address}", "resources.gpus_per_trial=1", "sweep.seeds=[38,39,40,41]",
        "train.epochs=1", "train.max_train_samples=32", "train.max_eval_samples=32",
        f"cluster.storage_path={tmp_path / 'storage'}", f"storage.cache_dir={tmp_path / 'cache'}",
        f"out_dir={tmp_path / 'out'}", *extra,
    )


def request_gone(autoscale, within_s: float = 30) -> bool:
    """The standing request as the autoscaler reports it (its status lags a write by a few seconds)."""
    deadline = time.monotonic() + within_s
    while autoscale.pending_status().requested and time.monotonic() < deadline:
        time.sleep(1)
    return autoscale.pending_status().requested == []


def trial_intervals(history_dir: Path) -> list[tuple[float, float]]:
    """[driver started, last epoch reported] of each trial, from the trials' own history files."""
    spans = []
    for path in history_dir.glob("*.json"):
        rows = json.loads(path.read_text())
        spans.append((min(r["driver_started"] for r in rows), max(r["reported_at"] for r in rows)))
    return spans


def most_at_once(spans: list[tuple[float, float]]) -> int:
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


@pytest.mark.timeout(600)
def test_gpu_trials_wait_for_launched_gpu_nodes_and_run_only_there(tmp_path, capsys):
    import ray

    from sweep.run import autoscale

    with autoscaling_cluster(head=HEAD, worker_types={GPU_TYPE: gpu_worker_type(max_workers=2)}) as address:
        started = time.time()
        summaries = run(sweep_cfg(address, tmp_path), tmp_path / "out")
        head_node = ray.get_runtime_context().get_node_id()  # the driver joined on the head
        withdrawn = request_gone(autoscale)
    out = capsys.readouterr().out
    assert "waiting for 2 GPU node(s) (type gpu_worker) from the autoscaler" in out
    assert "no GPU" not in out  # never the CPU fallback
    records = load_records(tmp_path / "out" / "results.json")
    assert len(records) == 4 and all(r.ok for r in records), [(r.status, r.error) for r in records]
    assert head_node not in {r.node for r in records}  # every trial on a launched GPU node
    # (with this test's 6 s idle timeout a GPU node may go between two trials and another come:
    # the group's max bounds nodes at once, not nodes over the sweep)
    assert all(r.gpus == 1.0 for r in records)
    spans = trial_intervals(tmp_path / "storage" / "history")
    assert len(spans) == 4 and most_at_once(spans) <= 2
    assert withdrawn  # the request was withdrawn when the sweep ended
    assert summaries and summaries[0].task == "WNLI"
    first_loop = min(start for start, _ in spans)
    print(f"autoscaling: first trial driver {first_loop - started:.1f} s after the sweep began")


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
    from sweep.run import autoscale

    with autoscaling_cluster(head=HEAD, worker_types={GPU_TYPE: never_starting_gpu_worker_type(max_workers=2)}) as address:
        t0 = time.monotonic()
        with pytest.raises(autoscale.ScaleTimeoutError) as error:
            run(sweep_cfg(address, tmp_path, "cluster.scale_timeout_s=10"), tmp_path / "out")
        waited = time.monotonic() - t0
        withdrawn = request_gone(autoscale)
    assert str(error.value).startswith("no node of type gpu_worker arrived within 10 s; pending: 2 x {GPU: 1, CPU: 1}")
    assert waited < 120  # the error comes soon after the timeout, not after Train's own retries
    assert withdrawn  # withdrawn on the way out of the failed sweep
    assert not (tmp_path / "out" / "results.json").exists()
