"""Replay a sweep's trial durations through the planner: config order on 1 GPU each vs the plan.

For each cluster size it simulates (``sweep.plan.makespan.simulate``: greedy dispatch with backfill,
as Ray Tune does it, a multi-GPU trial on one node) two ways of running the same trials:

* fifo: today's sweep, config order (tasks in GLUE order, seeds 1..N within a task), 1 GPU each;
* planned: ``make_plan(..., shares="auto")``: GPUs per task chosen by search, longest first.

Each figure is lower bound / makespan (1.0: no plan of that kind can be faster), each against the
bound of the plans it chooses from:

* fifo's bound = max(sum of one-GPU seconds / GPUs, longest trial on 1 GPU): work and span.
* planned's bound = ``tight_lower_bound`` with up to a whole node per trial: the smallest M no lower
  than the longest trial on a whole node such that the cluster's GPUs * M covers the work the trials
  hold when each runs on the fewest GPUs that end it by M (DDP holds g * t1 / (1 + eff (g-1)) >= t1
  GPU-seconds for eff <= 1). No plan beats it: a plan ending at M runs every trial in <= M, so on at
  least those GPUs. The looser max(sum t1 / GPUs, span) is kept as "loose" (it ignores the work DDP
  loses: at 64 GPUs it is 6% below what any plan can reach under this model).
* DDP model: t1 / (1 + eff (g-1)) seconds on g whole GPUs of one node, eff = 0.9 (--efficiency).

Durations: run_glue's published one-GPU times of bert-base (3 epochs), times --seeds seeds; or
--results: a sweep's results.json (one-GPU time = wall_seconds x gpus when gpus >= 1).

    python scripts/bench_schedule.py --out /tmp/schedule.json
    python scripts/bench_schedule.py --results outputs/SWEEP/results.json --sizes 8 16
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from sweep.plan.makespan import Speedup, TrialWork, lower_bound, make_plan, node_sizes, simulate

# run_glue README: bert-base-cased, 3 epochs, one GPU, seconds per task
RUN_GLUE_SECONDS = {"CoLA": 197, "SST-2": 1566, "MRPC": 141, "STS-B": 133, "QQP": 8546,
                    "MNLI": 9323, "QNLI": 2457, "RTE": 57, "WNLI": 24}


def published_trials(seeds: int) -> list[TrialWork]:
    """Config order: task-major in GLUE order, seeds 1..N within a task."""
    return [TrialWork(task, seed, float(sec)) for task, sec in RUN_GLUE_SECONDS.items() for seed in range(1, seeds + 1)]


def trials_from_results(path: Path) -> list[TrialWork]:
    """A results.json's trials in the file's order (a list of records, or the sweep's {"trials": [...]})."""
    data = json.loads(Path(path).read_text())
    records = data["trials"] if isinstance(data, dict) else data
    trials = []
    for r in records:
        gpus = float(r.get("gpus", 0) or 0)
        wall = float(r["wall_seconds"])
        if wall > 0:  # a trial that never ran (0 s) has no duration to replay
            trials.append(TrialWork(str(r["task"]), int(r["seed"]), wall * gpus if gpus >= 1 else wall))
    if not trials:
        raise SystemExit(f"{path}: no trial with wall_seconds > 0")
    return trials


def hours(seconds: float) -> str:
    return f"{seconds / 3600:6.2f}h"


def bench_size(trials: list[TrialWork], size: int, gpus_per_node: int, speedup: Speedup) -> dict[str, Any]:
    fifo_shares = {t.task: 1.0 for t in trials}
    fifo = simulate(trials, fifo_shares, size, gpus_per_node, "given", speedup)
    fifo_bound = lower_bound(trials, size, 1, speedup)
    plan = make_plan(trials, size, gpus_per_node, "auto", speedup)  # plan.lower_bound: the tight bound
    loose = lower_bound(trials, size, max(node_sizes(size, gpus_per_node)), speedup)
    return {
        "fifo": round(fifo_bound / fifo, 3),
        "planned": round(plan.efficiency, 3),
        "fifo_makespan_s": round(fifo, 1),
        "planned_makespan_s": round(plan.makespan, 1),
        "bound_1gpu_s": round(fifo_bound, 1),
        "bound_s": round(plan.lower_bound, 1),
        "fifo_vs_bound": round(plan.lower_bound / fifo, 3),  # fifo against the bound that allows DDP
        "loose_bound_s": round(loose, 1),
        "planned_vs_loose": round(loose / plan.makespan, 3),  # against the bound that ignores DDP's lost work
        "speedup": round(fifo / plan.makespan, 3),
        "shares": {task: int(g) for task, g in plan.shares.items()},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", type=Path, help="a sweep's results.json to replay instead of the published times")
    p.add_argument("--seeds", type=int, default=10, help="seeds per task for the published times")
    p.add_argument("--sizes", type=int, nargs="+", default=[8, 16, 32, 64])
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--efficiency", type=float, default=0.9, help="DDP efficiency per added GPU")
    p.add_argument("--out", type=Path, help="write the figures as JSON")
    args = p.parse_args(argv)

    trials = trials_from_results(args.results) if args.results else published_trials(args.seeds)
    speedup = Speedup(args.efficiency)
    t0 = time.perf_counter()
    sizes = {str(n): bench_size(trials, n, args.gpus_per_node, speedup) for n in args.sizes}
    seconds = time.perf_counter() - t0

    print(f"{len(trials)} trials, {sum(t.gpu_seconds for t in trials) / 3600:.1f} GPU-hours, nodes of "
          f"{args.gpus_per_node} GPUs, DDP efficiency {args.efficiency:g}; figures = lower bound / makespan")
    print(f"{'GPUs':>5} {'fifo':>6} {'makespan':>9} {'planned':>8} {'makespan':>9} {'bound':>8} "
          f"{'fifo/bound':>10} {'loose':>8} {'planned/loose':>13} {'speed-up':>8}  "
          "shares (GPUs per trial, 1 unless named)")
    for n, r in sizes.items():
        named = " ".join(f"{task}={g}" for task, g in r["shares"].items() if g != 1) or "-"
        print(f"{n:>5} {r['fifo']:6.3f} {hours(r['fifo_makespan_s']):>9} {r['planned']:8.3f} "
              f"{hours(r['planned_makespan_s']):>9} {hours(r['bound_s']):>8} {r['fifo_vs_bound']:10.3f} "
              f"{hours(r['loose_bound_s']):>8} {r['planned_vs_loose']:13.3f} "
              f"{r['speedup']:7.2f}x  {named}")
    print("(fifo: 1 GPU per trial, config order, against the 1-GPU bound; planned and fifo/bound: against the "
          "DDP bound that counts the work DDP loses at eff < 1; loose: max(work / GPUs, span), which does not)")
    print(f"planned {len(sizes)} size(s) in {seconds:.2f} s")

    out = {
        "sizes": sizes,
        "trials": len(trials),
        "source": str(args.results) if args.results else "run_glue published bert-base times",
        "gpus_per_node": args.gpus_per_node,
        "efficiency": args.efficiency,
        "plan_seconds": round(seconds, 3),
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
