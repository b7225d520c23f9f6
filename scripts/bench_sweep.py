"""Per-trial overhead of the Ray sweep, and the sweep vs the same trials run one after another.

(a) overhead = a trial's wall time minus the time inside its training loop (train + eval), for
    trials of about two minutes; startup = trial start -> first batch (processes, imports, model
    and data loading).
(b) total wall time of N trials through the sweep (Ray Tune + TorchTrainer, trials in parallel as
    the machine allows) vs the same N trials by the plain loop in this process, same run.

    python scripts/bench_sweep.py                          # 4 trials of ~2 min each on this machine
    python scripts/bench_sweep.py --trials 2 --train-rows 2000 --epochs 2     # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from sweep.config.validate import compose_settings
from sweep.data.synthetic import write_synthetic_glue
from sweep.driver.tuner import run_tune
from sweep.storage.staging import ensure_local
from sweep.train.sequential import run_sequential

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=4)
    # 56,000 rows x 3 epochs: ~2 minutes a trial with two trials sharing this 2-core machine (24,000 gave ~50 s)
    p.add_argument("--train-rows", type=int, default=56000, help="synthetic SST-2 training rows per trial")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--model", default="tiny-roberta")
    p.add_argument("--out", type=Path, default=ROOT / "bench_results" / "sweep.json")
    args = p.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    data = write_synthetic_glue(work / "data", ["SST-2"], n_train=args.train_rows, n_dev=256)
    overrides = [
        "experiment=demo", "tracking=none", "task=SST-2", f"model={args.model}", f"storage.data_dir={data}",
        f"sweep.seeds=[{','.join(str(38 + i) for i in range(args.trials))}]", f"train.epochs={args.epochs}",
        "train.max_train_samples=null", "train.max_eval_samples=null", "cluster.num_cpus=" + str(os.cpu_count()),
    ]
    settings = compose_settings(*overrides)
    sources = ensure_local(settings)  # build the tiny model once, outside both timings

    t0 = time.perf_counter()
    records, _ = run_tune(settings, work / "sweep")
    sweep_wall = time.perf_counter() - t0
    import ray

    ray.shutdown()

    t0 = time.perf_counter()
    sequential = run_sequential(settings, sources, work / "sequential")
    sequential_wall = time.perf_counter() - t0

    ok = [r for r in records if r.status == "TERMINATED"]
    per_trial = [{
        "seed": r.seed, "wall_s": round(r.wall_seconds, 2), "loop_s": round(r.loop_seconds, 2),
        "overhead_s": round(r.wall_seconds - r.loop_seconds, 2), "startup_s": round(r.startup_seconds, 2),
    } for r in ok]
    overhead = statistics.fmean(t["overhead_s"] for t in per_trial)
    wall = statistics.fmean(t["wall_s"] for t in per_trial)
    print(f"{'seed':>5} {'trial wall s':>13} {'in loop s':>10} {'overhead s':>11} {'startup s':>10}")
    for t in per_trial:
        print(f"{t['seed']:>5} {t['wall_s']:>13.1f} {t['loop_s']:>10.1f} {t['overhead_s']:>11.1f} "
              f"{t['startup_s']:>10.1f}")
    print(f"\nper-trial overhead: {overhead:.1f} s = {100 * overhead / wall:.1f}% of a {wall:.0f} s trial")
    seq_loop = sum(r.wall_seconds for r in sequential)
    print(f"{args.trials} trials: sweep {sweep_wall:.1f} s, sequential (plain loop, one process) "
          f"{sequential_wall:.1f} s -> sweep / sequential = {sweep_wall / sequential_wall:.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "args": {k: str(v) for k, v in vars(args).items()}, "host": platform.node(), "cpus": os.cpu_count(),
        "per_trial": per_trial, "mean_overhead_s": overhead, "mean_trial_wall_s": wall,
        "overhead_fraction": overhead / wall, "sweep_wall_s": sweep_wall, "sequential_wall_s": sequential_wall,
        "sequential_trials_s": seq_loop, "sweep_over_sequential": sweep_wall / sequential_wall,
    }, indent=2))
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
