"""Search that learns, measured: random search vs Optuna's TPE vs PBT at the same budget of trials,
and configs scored over seeds (``sweep.seeds_per_point=3``) vs single runs at the same total.

Every arm is a real sweep (``python -m sweep``, local Ray, tracking off) of a real model on a real GLUE
task from ``--data-dir`` (MiniLM on a subset of SST-2 by default), over ``train.lr`` in
[--low, --high] (log scale; its low end cannot learn in the budget), repeated over ``--reps``
sampler seeds; the arms alternate within each repetition (same machine, same load).

(1) the same budget of B trials per arm (every arm's sampler seeded by the repetition):
      random   sweep.num_samples=B, one training seed, drawn at random
      tpe      the same space, sweep.search_alg=optuna, sweep.search_seed=<rep>
      pbt      B training seeds as the population, each drawing its lr from the range,
               sweep.scheduler=pbt, mutations over the same range, an exploit every evaluation
    reported: the best dev score found (mean ± sd over reps), and trials-to-within-1-point: the
    first trial (in start order) whose score is within 0.01 of the best score any arm found in that
    repetition (B+1: never; PBT's population all starts at once: its count is B if it got there).
    Half the budget: TPE's best among its first B/2 trials, and PBT with a population of B/2 (its own
    run, "pbt-half"), each against random's best of all B.
(2) configs scored over seeds, at an equal total of T trials (T divisible by 3):
      single   TPE, T points x 1 seed: the pick is the best single trial's lr
      over-3   TPE, T/3 points x 3 seeds (sweep.seeds_per_point=3): the pick is the best point by the mean
    then each pick's lr is trained again with --fresh fresh seeds (one sweep with a grid of the picks):
    the "truly best" of each repetition's two picks is the one with the higher fresh-seed mean; reported:
    how often each way picked it, and the picks' fresh-seed means.

    python scripts/bench_search.py --data-dir ../shared/data                    # the full measurement
    python scripts/bench_search.py --data-dir ../shared/data --reps 2 --budget 6 --rows 500   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def sweep(args, out: Path, *overrides: str) -> list[dict]:
    """One sweep; its trials as results.json lists them, in start order (Tune's trial numbers)."""
    base = [f"task={args.task}", f"model={args.model}", "tracking=none", f"storage.data_dir={args.data_dir}",
            f"train.epochs={args.epochs}", "train.evals_per_epoch=2", f"train.max_train_samples={args.rows}",
            f"train.max_eval_samples={args.eval_rows}", "train.batch_size=16", "train.max_seq_length=64",
            "sweep.keep_checkpoints=best", f"out_dir={out}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SWEEP_CACHE_DIR": str(args.cache)}
    r = subprocess.run([sys.executable, "-m", "sweep", *base, *overrides], capture_output=True, text=True,
                       cwd=ROOT, env=env)
    if r.returncode != 0:
        sys.exit(f"sweep {' '.join(overrides)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    trials = json.loads((out / "results.json").read_text())["trials"]
    return sorted(trials, key=lambda t: t["started_at"])


def space(args) -> str:
    return f"{{dist:loguniform,low:{args.low},high:{args.high}}}"


def arm(name: str, args, rep: int, out: Path) -> list[dict]:
    b, lr = args.budget, space(args)
    if name == "random":
        return sweep(args, out, "sweep.seeds=[42]", f"+sweep.search.lr={lr}", f"sweep.num_samples={b}",
                     f"sweep.search_seed={rep}")
    if name == "tpe":
        return sweep(args, out, "sweep.seeds=[42]", f"+sweep.search.lr={lr}", f"sweep.num_samples={b}",
                     "sweep.search_alg=optuna", f"sweep.search_seed={rep}")
    population = b // 2 if name == "pbt-half" else b
    seeds = ",".join(str(42 + i) for i in range(population))
    return sweep(args, out, f"sweep.seeds=[{seeds}]", "sweep.scheduler=pbt", f"+sweep.pbt.mutations.lr={lr}",
                 f"sweep.search_seed={rep}")


def scores(trials: list[dict]) -> list[float]:
    return [t["score"] if t["score"] is not None else float("-inf") for t in trials]


def to_within(trial_scores: list[float], best: float, population: int | None) -> int:
    if population is not None:  # PBT: the whole population trains at once (B+1: it never got there)
        return population if max(trial_scores) >= best - 0.01 else population + 1
    hits = [i + 1 for i, s in enumerate(trial_scores) if s >= best - 0.01]
    return hits[0] if hits else len(trial_scores) + 1


def mean_sd(values: list[float]) -> str:
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values) if len(values) > 1 else 0.0:.4f}"


def budget_part(args, tmp: Path) -> dict:
    arms = ("random", "tpe", "pbt", "pbt-half")
    found: dict[str, list[float]] = {a: [] for a in arms}
    within: dict[str, list[int]] = {a: [] for a in arms[:3]}
    tpe_half: list[float] = []  # TPE's best among its first B/2 trials (start order)
    for rep in range(args.reps):
        order = arms[rep % 4:] + arms[:rep % 4]  # who goes first rotates
        runs = {}
        for name in order:
            t0 = time.time()
            runs[name] = scores(arm(name, args, rep, tmp / f"{name}-{rep}"))
            print(f"rep {rep} {name}: best {max(runs[name]):.4f} in {time.time() - t0:.0f} s", flush=True)
        best = max(max(s) for name, s in runs.items() if name != "pbt-half")
        for name, s in runs.items():
            found[name].append(max(s))
            if name in within:
                within[name].append(to_within(s, best, args.budget if name == "pbt" else None))
        tpe_half.append(max(runs["tpe"][:args.budget // 2]))
    for name in arms[:3]:
        print(f"{name:>7}: best found {mean_sd(found[name])}; trials to within 1 point of the best "
              f"{statistics.mean(within[name]):.1f} (of {args.budget})")
    # the goal: TPE or PBT with half the trials at least matches random's best with all of them
    half = {"tpe": tpe_half, "pbt": found["pbt-half"]}
    for name, values in half.items():
        matched = sum(h >= r for h, r in zip(values, found["random"]))
        print(f"{name:>7} with {args.budget // 2} trials: best found {mean_sd(values)}; at least random's best of "
              f"{args.budget} in {matched}/{args.reps} repetitions")
    return {"found": found, "trials_to_within_1pt": within, "half_budget": half}


def picks_part(args, tmp: Path) -> dict:
    total, lr = args.budget - args.budget % 3, space(args)
    right = {"single": 0, "over-3": 0}
    fresh_means: dict[str, list[float]] = {"single": [], "over-3": []}
    for rep in range(args.reps):
        common = [f"+sweep.search.lr={lr}", "sweep.search_alg=optuna", f"sweep.search_seed={100 + rep}"]
        single = sweep(args, tmp / f"single-{rep}", "sweep.seeds=[42]", f"sweep.num_samples={total}", *common)
        over3 = sweep(args, tmp / f"over3-{rep}", "sweep.seeds=[42,43,44]", f"sweep.num_samples={total // 3}",
                      "sweep.seeds_per_point=3", *common)
        pick_single = max(single, key=lambda t: t["score"] or float("-inf"))["hparams"]["lr"]
        by_point: dict[float, list[float]] = {}
        for t in over3:
            by_point.setdefault(t["hparams"]["lr"], []).append(t["score"] or float("-inf"))
        pick_over3 = max(by_point, key=lambda p: statistics.mean(by_point[p]))
        if pick_single == pick_over3:  # the same config: both right, nothing to tell apart
            print(f"rep {rep}: both picked lr={pick_single:.2e}", flush=True)
            right = {name: n + 1 for name, n in right.items()}
            continue
        seeds = ",".join(str(1000 + rep * 10 + i) for i in range(args.fresh))
        fresh = sweep(args, tmp / f"fresh-{rep}", f"sweep.seeds=[{seeds}]",
                      f"+sweep.grid.lr=[{pick_single},{pick_over3}]")
        mean_of = {p: statistics.mean(t["score"] for t in fresh if t["hparams"]["lr"] == p)
                   for p in {pick_single, pick_over3}}
        truly = max(mean_of, key=mean_of.get)
        for name, pick in (("single", pick_single), ("over-3", pick_over3)):
            right[name] += pick == truly
            fresh_means[name].append(mean_of[pick])
        print(f"rep {rep}: single picked lr={pick_single:.2e} (fresh mean {mean_of[pick_single]:.4f}), "
              f"over-3 picked lr={pick_over3:.2e} (fresh mean {mean_of[pick_over3]:.4f})", flush=True)
    for name in right:
        print(f"{name:>7}: picked the truly better config {right[name]}/{args.reps} times; "
              f"its fresh-seed mean {mean_sd(fresh_means[name])}")
    return {"picked_truly_best": right, "fresh_means": fresh_means, "total_trials": total}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", required=True, help="a folder holding glue_data/<TASK>/ (../shared/data)")
    p.add_argument("--task", default="SST-2")
    p.add_argument("--model", default="minilm")
    p.add_argument("--rows", type=int, default=1500, help="training rows per trial")
    p.add_argument("--eval-rows", type=int, default=872)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--budget", type=int, default=12, help="trials per arm")
    p.add_argument("--reps", type=int, default=5, help="sampler seeds (repetitions)")
    p.add_argument("--fresh", type=int, default=5, help="fresh seeds to score each pick")
    p.add_argument("--low", type=float, default=1e-6)
    p.add_argument("--high", type=float, default=1e-2)
    p.add_argument("--parts", nargs="+", default=["budget", "picks"], choices=["budget", "picks"])
    p.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "bench-search-cache")
    p.add_argument("--out", type=Path, default=ROOT / "bench_results" / "search.json")
    args = p.parse_args()
    args.data_dir = str(Path(args.data_dir).resolve())
    results = {"args": {k: str(v) for k, v in vars(args).items()}}
    with tempfile.TemporaryDirectory(prefix="bench-search-") as tmp:
        if "budget" in args.parts:
            results["budget"] = budget_part(args, Path(tmp))
        if "picks" in args.parts:
            results["picks"] = picks_part(args, Path(tmp))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
