"""Sweeps on an autoscaling cluster (a real Ray autoscaler, the fake node provider, fake GPUs).

1. GPU nodes scaled from zero vs GPU nodes up from the start (the baseline, same run): seconds from
   the sweep's start to its first trial's loop running on a GPU node, and the sweep's wall time.
2. Two sweeps at once vs one after the other, on the cluster whose GPU nodes are up: total wall time
   (each sweep a separate driver process joining with cluster.address=auto, as two users would).

    python scripts/bench_autoscale.py [--trials 4] [--rounds 2] [--out bench_results/autoscale.json]

Each round runs both cases; the order flips every round (the first cluster of a run pays cold
caches), and so does serial vs at once. The JSON holds every round and the means.

Starts and stops Ray clusters (`ray stop --force`): nothing else of Ray may run on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sweep.testing.local_cluster import GPU_TYPE, autoscaling_cluster, gpu_worker_type  # the tests' cluster too

ROOT = Path(__file__).resolve().parents[1]

HEAD = {"CPU": 2, "GPU": 0}


def overrides(work: Path, name: str, seeds: list[int]) -> list[str]:
    return ["experiment=demo", "tracking=none", "cluster.address=auto", "resources.gpus_per_trial=1",
            f"sweep.seeds=[{','.join(map(str, seeds))}]", "train.epochs=1", "train.max_train_samples=32",
            "train.max_eval_samples=32", f"cluster.storage_path={work / name / 'storage'}",
            "cluster.shared_storage=true", f"storage.cache_dir={work / 'cache'}", f"out_dir={work / name / 'out'}"]


def sweep(work: Path, name: str, seeds: list[int]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sweep", *overrides(work, name, seeds)], cwd=work,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen) -> None:
    out, _ = proc.communicate(timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"sweep failed (exit {proc.returncode}):\n{out[-3000:]}")


def first_loop_after(work: Path, name: str, started: float) -> float:
    """Seconds from ``started`` to the first trial's training loop (its worker on a GPU node)."""
    rows = [r for p in (work / name / "storage" / "history").glob("*.json") for r in json.loads(p.read_text())]
    return min(r["loop_started"] for r in rows) - started


def gpu_nodes_alive() -> int:
    import ray

    return sum(1 for n in ray.nodes() if n.get("Alive") and n["Resources"].get("GPU", 0) > 0)


def one_sweep(work: Path, name: str, min_workers: int, trials: int, parallel_first: bool) -> dict:
    import ray

    worker_types = {GPU_TYPE: gpu_worker_type(max_workers=2, min_workers=min_workers)}
    with autoscaling_cluster(head=HEAD, worker_types=worker_types, idle_timeout_minutes=5) as address:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        deadline = time.monotonic() + 300
        while gpu_nodes_alive() < min_workers and time.monotonic() < deadline:  # the baseline's nodes, up first
            time.sleep(1)
        alive = gpu_nodes_alive()
        ray.shutdown()
        started = time.time()
        finish(sweep(work, name, list(range(38, 38 + trials))))
        wall = time.time() - started
        row = {"gpu_nodes_at_start": alive, "first_trial_s": round(first_loop_after(work, name, started), 1),
               "wall_s": round(wall, 1)}
        if min_workers:
            row.update(two_sweeps(work, name, trials, parallel_first))
        return row


def two_sweeps(work: Path, name: str, trials: int, parallel_first: bool) -> dict:
    half = trials // 2
    seeds = [list(range(38 + i * half, 38 + (i + 1) * half)) for i in range(2)]

    def serial() -> float:
        started = time.time()
        for i in range(2):
            finish(sweep(work, f"{name}-serial{i}", seeds[i]))
        return time.time() - started

    def at_once() -> float:
        started = time.time()
        for proc in [sweep(work, f"{name}-parallel{i}", seeds[i]) for i in range(2)]:
            finish(proc)
        return time.time() - started

    if parallel_first:
        parallel_s, serial_s = at_once(), serial()
    else:
        serial_s, parallel_s = serial(), at_once()
    return {"two_sweeps_one_after_the_other_s": round(serial_s, 1), "two_sweeps_at_once_s": round(parallel_s, 1)}


def mean(rows: list[dict], key: str) -> float:
    return round(sum(r[key] for r in rows) / len(rows), 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2, help="each round runs both cases; the order flips every round")
    p.add_argument("--start-with", choices=["up", "zero"], default="up",
                   help="the case the first round runs first (to add the other order to an earlier run)")
    p.add_argument("--out", type=Path, default=ROOT / "bench_results" / "autoscale.json")
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rounds: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-autoscale-") as tmp:
        work = Path(tmp)
        from sweep.config.validate import compose_settings
        from sweep.storage.staging import ensure_local

        ensure_local(compose_settings(*overrides(work, "warm", [38])))  # the tiny model and data, built once for all
        for r in range(args.rounds):
            flip = (r % 2 == 1) != (args.start_with == "zero")
            row: dict = {"order": "from zero first" if flip else "nodes up first"}
            for case, min_workers in (("zero", 0), ("up", 2)) if flip else (("up", 2), ("zero", 0)):
                row[case] = one_sweep(work, f"{case}{r}", min_workers, args.trials, parallel_first=flip)
                print(f"round {r + 1} {case}: {row[case]}", flush=True)
            rounds.append(row)
    up, zero = [r["up"] for r in rounds], [r["zero"] for r in rounds]
    result = {
        "trials": args.trials, "rounds": rounds,
        "mean": {"up_first_trial_s": mean(up, "first_trial_s"), "up_wall_s": mean(up, "wall_s"),
                 "zero_first_trial_s": mean(zero, "first_trial_s"), "zero_wall_s": mean(zero, "wall_s"),
                 "two_sweeps_one_after_the_other_s": mean(up, "two_sweeps_one_after_the_other_s"),
                 "two_sweeps_at_once_s": mean(up, "two_sweeps_at_once_s")},
    }
    m = result["mean"]
    result["first_trial_ratio"] = round(m["zero_first_trial_s"] / m["up_first_trial_s"], 2)
    result["wall_ratio"] = round(m["zero_wall_s"] / m["up_wall_s"], 2)
    result["two_sweeps_at_once_vs_one_after_the_other"] = round(
        m["two_sweeps_at_once_s"] / m["two_sweeps_one_after_the_other_s"], 2)
    print(json.dumps(result, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
