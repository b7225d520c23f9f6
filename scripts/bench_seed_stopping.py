"""Seed halving vs running every seed to the end: compute spent and the best score found.

Dodge et al. (2020) start many seeds, evaluate them after a fraction of training and continue only
the best. Their comparison, and this one: every seed of a pool is fine-tuned ONCE to the end with
evaluations inside each epoch (``finetune``, no Ray); a run is seeded, so its evaluations up to
the rung are the same whether or not it is stopped there. For each of ``--repeats`` seed sets
drawn from the pool:

* without halving: every seed runs to the end; the best score is the best evaluation of any seed;
  compute = seeds x steps;
* with seed halving: the real decision code (``sweep.plan.rungs.halving_verdicts``) reads the
  rung evaluations; stopped seeds spent the steps up to the rung and offer their best evaluation
  so far (as the sweep's records do), kept seeds run to the end.

Three pools: generated GLUE-layout data with the tiny model (the demo's, where a share of seeds
stays at chance), and real RTE and SST-2 from ../shared/data with MiniLM on subsets. ``--sweep`` also runs the
real thing once (``python -m sweep`` with seed_halving, and with fifo, on the demo) and compares
its kept seeds, steps and best score with what the simulation predicts for the same seeds.

    python scripts/bench_seed_stopping.py                      # both pools, 10 repeats
    python scripts/bench_seed_stopping.py --pools demo --sweep
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sweep.config.validate import compose_settings  # noqa: E402
from sweep.plan.rungs import RungEntry, halving_verdicts, keep_count, past_rung  # noqa: E402

POOLS = {
    # the README's demo recipe (tiny RoBERTa, synthetic WNLI, 256 rows, 4 epochs), 2 evaluations per epoch
    "demo": ("experiment=demo", "train.epochs=4", "train.evals_per_epoch=2"),
    # real RTE (all 277 dev rows), MiniLM on a 256-row training subset, 3 epochs, 2 evaluations per
    # epoch: ~2 min a seed on 2 CPU cores
    "rte-minilm": ("model=minilm", "task=RTE", "train.max_train_samples=256", "train.max_eval_samples=277",
                   "train.epochs=3", "train.batch_size=16", "train.lr=5e-5", "train.evals_per_epoch=2",
                   f"storage.data_dir={ROOT.parent / 'shared' / 'data'}"),
    # real SST-2 (400 dev rows), MiniLM on 512 training rows, 3 epochs, a high lr (1e-4): the small-data,
    # large-lr regime where Mosbach et al. see seeds collapse to the majority class
    "sst2-minilm": ("model=minilm", "task=SST-2", "train.max_train_samples=512", "train.max_eval_samples=400",
                    "train.epochs=3", "train.batch_size=16", "train.lr=1e-4", "train.evals_per_epoch=2",
                    f"storage.data_dir={ROOT.parent / 'shared' / 'data'}"),
}


@dataclass
class SeedRun:
    seed: int
    evals: list[dict]  # step, progress, score, eval_loss, trivial

    def rung(self, at: float) -> dict:
        return next(e for e in self.evals if past_rung(e["progress"], at))

    def best_until(self, step: int) -> float:
        return max(e["score"] for e in self.evals if e["step"] <= step)

    @property
    def steps_total(self) -> int:
        return self.evals[-1]["steps_total"]


def run_pool(name: str, seeds: list[int], cache: Path) -> list[SeedRun]:
    from sweep.storage.staging import cache_root, ensure_local
    from sweep.train.loop import finetune

    settings = compose_settings(*POOLS[name], "tracking=none")
    sources = ensure_local(settings)
    spec = settings.tasks[0]
    runs = []
    for seed in seeds:
        t0 = time.perf_counter()
        result = finetune(spec, sources.model_dir, sources.data_dir, settings.train, seed,
                          cache_dir=cache_root(settings.storage))
        evals = [{"step": e.step, "steps_total": e.steps_total, "progress": e.progress, "score": e.score,
                  "eval_loss": e.metrics.get("eval_loss"), "trivial": e.trivial_score} for e in result.epochs]
        runs.append(SeedRun(seed, evals))
        curve = " ".join(f"{e['score']:.3f}" for e in evals)
        print(f"  {name} seed {seed}: {time.perf_counter() - t0:5.1f} s, trivial {evals[0]['trivial']:.3f}, "
              f"scores {curve}", flush=True)
    return runs


def simulate(runs: list[SeedRun], keep: float, at: float) -> dict:
    """One seed set: (best, steps) without and with seed halving, and who was kept."""
    full = runs[0].steps_total
    entries = []
    for run in runs:
        e = run.rung(at)
        entries.append(RungEntry(str(run.seed), run.seed, e["score"], e["eval_loss"], e["trivial"]))
    verdicts = halving_verdicts(entries, keep_count(keep, len(runs)), "")
    best_all = max(run.best_until(full) for run in runs)
    best_halved, steps = -float("inf"), 0
    for run in runs:
        go_on = verdicts[str(run.seed)].go_on
        until = full if go_on else run.rung(at)["step"]
        steps += until
        best_halved = max(best_halved, run.best_until(until))
    return {"best_all": best_all, "best_halved": best_halved, "steps_all": full * len(runs), "steps_halved": steps,
            "kept": sorted(run.seed for run in runs if verdicts[str(run.seed)].go_on),
            "degenerate": sorted(int(t) for t, v in verdicts.items() if v.reason == "degenerate")}


def compare(runs: list[SeedRun], n: int, repeats: int, keep: float, at: float) -> dict:
    rows = [simulate(random.Random(r).sample(runs, n), keep, at) for r in range(repeats)]
    same = sum(abs(row["best_halved"] - row["best_all"]) < 1e-12 for row in rows)
    share = [row["steps_halved"] / row["steps_all"] for row in rows]
    return {"keep": keep, "at": at, "seeds": n, "repeats": repeats, "same_best": same,
            "compute_share_mean": statistics.fmean(share),
            "best_all_mean": statistics.fmean(row["best_all"] for row in rows),
            "best_halved_mean": statistics.fmean(row["best_halved"] for row in rows),
            "degenerate_mean": statistics.fmean(len(row["degenerate"]) for row in rows)}


def run_sweeps(seeds: list[int], keep: float, at: float, work: Path) -> dict:
    """The real sweep (python -m sweep, local Ray) with seed halving and with fifo on the demo pool."""
    out = {}
    for scheduler in ("seed_halving", "fifo"):
        folder = work / scheduler
        args = [sys.executable, "-m", "sweep", *POOLS["demo"], f"sweep.seeds=[{','.join(map(str, seeds))}]",
                f"sweep.scheduler={scheduler}", f"sweep.halving.keep={keep}", f"sweep.halving.at={at}",
                "tracking=none", f"out_dir={folder}"]
        t0 = time.perf_counter()
        subprocess.run(args, cwd=ROOT, check=True, capture_output=True, text=True, env={**os.environ})
        summary = json.loads((folder / "results.json").read_text())
        trials = summary["trials"]
        out[scheduler] = {
            "wall_s": time.perf_counter() - t0, "steps": sum(t["steps_done"] for t in trials),
            "best": max(t["score"] for t in trials if t["score"] is not None),
            "kept": sorted(t["seed"] for t in trials if not t["stopped"]),
        }
        print(f"  sweep {scheduler}: {out[scheduler]}", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pools", nargs="+", default=list(POOLS), choices=list(POOLS))
    p.add_argument("--pool-size", type=int, nargs="+", default=[20, 8, 10],
                   help="seeds fine-tuned per pool (in --pools order)")
    p.add_argument("--seeds", type=int, default=6, help="seeds per sweep (drawn from the pool)")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--keep", type=float, nargs="+", default=[0.5, 2])
    p.add_argument("--at", type=float, nargs="+", default=[0.25, 0.5])
    p.add_argument("--sweep", action="store_true", help="also run the demo sweep for real, halving vs fifo")
    p.add_argument("--sweep-seeds", type=int, nargs="+", default=[3, 4, 6, 7, 9, 11])
    p.add_argument("--out", type=Path, default=ROOT / "bench_results" / "seed_stopping.json")
    args = p.parse_args()

    report: dict = {"pools": {}, "args": {k: str(v) for k, v in vars(args).items()}}
    for name, size in zip(args.pools, args.pool_size + args.pool_size[-1:] * len(args.pools)):
        print(f"{name}: fine-tuning {size} seeds to the end", flush=True)
        runs = run_pool(name, list(range(1, size + 1)), Path.home() / ".cache" / "sweep")
        n = min(args.seeds, size)
        results = [compare(runs, n, args.repeats, keep, at) for at in args.at for keep in args.keep]
        report["pools"][name] = {"runs": [r.__dict__ for r in runs], "comparisons": results}
        for c in results:
            print(f"{name}: {n} of {size} seeds x {c['repeats']} sets, keep {c['keep']:g} at {c['at']:.0%}: "
                  f"same best in {c['same_best']}/{c['repeats']}, compute {c['compute_share_mean']:.1%} of all seeds "
                  f"to the end, best {c['best_halved_mean']:.4f} vs {c['best_all_mean']:.4f}, "
                  f"{c['degenerate_mean']:.1f} degenerate per set", flush=True)
    if args.sweep:
        seeds = args.sweep_seeds
        demo_runs = run_pool("demo", seeds, Path.home() / ".cache" / "sweep")
        predicted = simulate(demo_runs, args.keep[-1], args.at[-1])
        print(f"  simulation for seeds {seeds}: kept {predicted['kept']}, steps {predicted['steps_halved']}, "
              f"best {predicted['best_halved']:.4f} (all: {predicted['best_all']:.4f})", flush=True)
        import tempfile

        with tempfile.TemporaryDirectory() as work:
            report["sweep"] = {"predicted": predicted, **run_sweeps(seeds, args.keep[-1], args.at[-1], Path(work))}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str))
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
