"""What the end-of-sweep analyses cost against writing the results, on one synthetic results set.

The records: TASKS GLUE tasks x SEEDS seeds x a 2-key grid (lr x batch_size, 2 values each), with
scores that depend on lr in some tasks, on batch_size in others, plus seed noise. Timed in one
process, each step REPEATS times (the median and the min are printed):

  baseline     summarize + write_results (results.json, results.csv, summary.csv): what finish() always does
  importance   report_importance: fANOVA per task in an in-memory Optuna study, importance.csv, the lines
  expected_max sweep_curves + curves_csv (written) + plot_expected_max (expected_max.png)

and, once, the import of sweep.results.importance (optuna and its dependencies), which the first call
pays. No Ray, no model: plain Python over records.

    python scripts/bench_analysis.py                   # 9 tasks x 10 seeds x 4 points = 360 records
    python scripts/bench_analysis.py --seeds 20 --repeats 5
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sweep.config.validate import compose_settings  # noqa: E402
from sweep.files import write_text  # noqa: E402
from sweep.results.expected_max import curves_csv, sweep_curves  # noqa: E402
from sweep.results.records import TrialRecord, summarize, write_results  # noqa: E402
from sweep.results.report import plot_expected_max  # noqa: E402

GRID = {"lr": [1e-5, 2e-5], "batch_size": [16, 32]}


def synthetic_records(tasks: list[str], seeds: list[int]) -> list[TrialRecord]:
    rng = random.Random(0)
    records = []
    for i, task in enumerate(tasks):
        key = "lr" if i % 2 == 0 else "batch_size"  # the key that matters alternates between tasks
        for lr in GRID["lr"]:
            for bs in GRID["batch_size"]:
                for seed in seeds:
                    hparams = {"lr": lr, "batch_size": bs}
                    effect = 0.1 * GRID[key].index(hparams[key])
                    records.append(TrialRecord(task=task, seed=seed, hparams=hparams,
                                               score=0.6 + effect + rng.gauss(0, 0.02), gpus=1.0, wall_seconds=600.0,
                                               steps_done=1000, steps_total=1000, trial_id=f"{task}-{lr}-{bs}-{seed}"))
    return records


def timed(step: Callable[[], object], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):  # the report's lines are not what is measured
            step()
        times.append(time.perf_counter() - start)
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    seeds = [38 + i for i in range(args.seeds)]
    settings = compose_settings("task=glue", f"sweep.seeds=[{','.join(map(str, seeds))}]",
                                *(f"+sweep.grid.{k}=[{','.join(map(str, v))}]" for k, v in GRID.items()))
    records = synthetic_records([t.name for t in settings.tasks], seeds)

    start = time.perf_counter()
    report_importance = importlib.import_module("sweep.results.importance").report_importance
    import_s = time.perf_counter() - start

    with tempfile.TemporaryDirectory(prefix="bench-analysis-") as tmp:
        out = Path(tmp)

        def baseline() -> None:
            write_results(out, records, summarize(records, settings.tasks))

        def importance() -> None:
            assert report_importance(records, settings.tasks, settings.sweep, out) is not None

        def expected_max() -> None:
            curves = sweep_curves(records, settings.tasks)
            write_text(out / "expected_max.csv", curves_csv(curves), key="out_dir")
            plot_expected_max(curves, settings.tasks, out / "expected_max.png")

        runs = {name: timed(step, args.repeats) for name, step in
                (("baseline", baseline), ("importance", importance), ("expected_max", expected_max))}
        with contextlib.redirect_stdout(io.StringIO()) as lines:
            report_importance(records, settings.tasks, settings.sweep, out)

    print(f"{len(settings.tasks)} tasks x {len(seeds)} seeds x {len(GRID['lr']) * len(GRID['batch_size'])} points "
          f"= {len(records)} records; {args.repeats} repeats; python {sys.version.split()[0]}")
    base = statistics.median(runs["baseline"])
    for name, times in runs.items():
        median = statistics.median(times)
        print(f"{name:<13} median {median:7.3f} s  min {min(times):7.3f} s  x{median / base:6.1f} of baseline")
    print(f"{'import':<13} {import_s:7.3f} s once (sweep.results.importance: optuna, sklearn)")
    print(lines.getvalue().rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
