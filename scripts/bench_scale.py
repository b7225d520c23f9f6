"""What a sweep's driver costs per trial as the trial count grows: 10, 100 and 1,000 trials of the
tiny model (one step and one short evaluation each), each count in a fresh process and local Ray.

For each count N, ``python -m sweep``'s own ``app.run`` runs in a child process, which measures itself:

  peak RSS      the driver process's resident memory, sampled every 0.2 s (Ray's own processes and
                the trials' are other processes); and its growth after warm-up: RSS at the end of
                Tune's run minus RSS when a tenth of the trials were done, per 100 trials
  bookkeeping   the driver's CPU seconds per trial (``time.process_time``: every thread of the driver,
                Tune's loop, our callbacks, progress, MLflow's logging thread) during Tune's run, and
                the wall seconds of what follows it (records, results/summary files, MLflow, export)
  wall          wall seconds per trial, Tune's run alone and start to end

The goal (issue 16): bookkeeping per trial at 1,000 trials no more than 1.5x that at 10, and memory flat
after warm-up. Ratios come from the same run of this script.

    python scripts/bench_scale.py                        # 10, 100, 1000 trials, MLflow on sqlite
    python scripts/bench_scale.py --counts 10 100        # a quicker look
    python scripts/bench_scale.py --tracking none
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the tiny model is built here; nothing is fetched

from sweep.config.validate import compose  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def overrides(trials: int, out: Path, tracking: str) -> list[str]:
    seeds = ",".join(str(s) for s in range(trials))
    store = [f"tracking.uri=sqlite:///{out.parent / 'mlflow.db'}"] if tracking == "mlflow" else []  # a fresh store
    return ["experiment=demo", f"sweep.seeds=[{seeds}]", "train.epochs=1", "train.max_train_samples=8",
            "train.max_eval_samples=8", "train.batch_size=8", f"tracking={tracking}", *store, f"out_dir={out}"]


class Sampler:
    """This process's RSS every ``every_s``, with the trials done so far (from the progress callback)."""

    def __init__(self, every_s: float = 0.2):
        import psutil

        self.process, self.every_s = psutil.Process(), every_s
        self.samples: list[tuple[float, int, float]] = []  # (time, trials done, RSS MiB)
        self.done = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stop.wait(self.every_s):
            self.samples.append((time.time(), self.done, self.process.memory_info().rss / 2**20))

    def rss_when(self, done: int) -> float:
        return next((rss for _, d, rss in self.samples if d >= done), self.samples[-1][2])


def profiled(trials: int, tracking: str, top: int = 30) -> None:
    """``--profile N``: one sweep of N trials under cProfile (Tune's loop runs in the main thread) and
    tracemalloc (what the driver's memory grew by between a tenth of the trials and the end)."""
    import cProfile
    import pstats
    import tracemalloc

    import sweep.hooks.progress as progress

    tracemalloc.start(8)
    snapshots = {}
    finish_trial = progress.SweepProgress._finish

    def snapshot_at_warmup(self, trial):
        finish_trial(self, trial)
        if len(self.done) == max(trials // 10, 1):
            snapshots["warm"] = tracemalloc.take_snapshot()
    progress.SweepProgress._finish = snapshot_at_warmup
    profile = cProfile.Profile()
    profile.enable()
    row = one(trials, tracking, sample=False)
    profile.disable()
    end = tracemalloc.take_snapshot()
    stats = pstats.Stats(profile)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top * 2)  # where Tune's loop spends it, callers included
    profile.dump_stats(str(Path(tempfile.gettempdir()) / f"bench-scale-{trials}.prof"))
    print("memory grown after warm-up, by allocation site:")
    for stat in end.compare_to(snapshots["warm"], "traceback")[:12]:
        print(f"{stat.size_diff / 2**20:+.1f} MiB in {stat.count_diff:+d} blocks")
        for line in stat.traceback.format()[-8:]:
            print("    " + line)
    print(json.dumps(row))


def one(trials: int, tracking: str, sample: bool = True) -> dict:
    """Runs in the child: one sweep of ``trials`` trials, measured from inside."""
    import sweep.app as app
    import sweep.driver.tuner as tuner
    import sweep.hooks.progress as progress
    import sweep.outputs.end as end

    sampler = Sampler()
    phases: dict[str, float] = {}

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            t0, cpu0 = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                phases[name] = time.perf_counter() - t0
                phases[f"{name}_cpu"] = time.process_time() - cpu0
        return wrapper

    # measurement wrappers around the real functions (the sweep runs unchanged)
    tuner.run_tune = timed("tune", tuner.run_tune)
    end.end_of_sweep = timed("finish", end.end_of_sweep)
    if sample:
        finish_trial = progress.SweepProgress._finish

        def counting_finish(self, trial):
            finish_trial(self, trial)
            sampler.done = len(self.done)
        progress.SweepProgress._finish = counting_finish

    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        out = Path(tmp) / "out"
        cfg = compose(*overrides(trials, out, tracking))
        sampler.thread.start()
        t0 = time.perf_counter()
        app.run(cfg, out)
        wall = time.perf_counter() - t0
        sampler.stop.set()
        records = json.loads((out / "results.json").read_text())["trials"]
    ok = sum(1 for r in records if r["status"] == "TERMINATED")
    warm = max(trials // 10, 1)
    rss_warm, rss_end = sampler.rss_when(warm), sampler.rss_when(trials)
    return {
        "trials": trials, "ok": ok, "wall_s": wall, "tune_s": phases["tune"], "finish_s": phases["finish"],
        "driver_cpu_per_trial_s": phases["tune_cpu"] / trials,
        "finish_per_trial_s": phases["finish"] / trials,
        "wall_per_trial_s": wall / trials, "tune_per_trial_s": phases["tune"] / trials,
        "peak_rss_mib": max(rss for _, _, rss in sampler.samples),
        "rss_after_warmup_mib": rss_warm, "rss_at_end_mib": rss_end,
        "rss_growth_per_100_trials_mib": (rss_end - rss_warm) / max(trials - warm, 1) * 100,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--counts", type=int, nargs="+", default=[10, 100, 1000])
    p.add_argument("--tracking", default="mlflow", choices=["mlflow", "none"])
    p.add_argument("--out", type=Path, default=ROOT / "bench_results" / "scale.json")
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the child: one count, JSON on stdout's last line
    p.add_argument("--profile", type=int, metavar="N",
                   help="instead: one sweep of N trials under cProfile and tracemalloc, the top entries printed")
    args = p.parse_args()
    if args.profile:
        profiled(args.profile, args.tracking)
        return
    if args.one:
        print(json.dumps(one(args.one, args.tracking)), flush=True)
        return
    rows = []
    for n in args.counts:
        t0 = time.time()
        r = subprocess.run([sys.executable, __file__, "--one", str(n), "--tracking", args.tracking],
                           capture_output=True, text=True, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        if r.returncode != 0:
            sys.exit(f"{n} trials: the sweep failed after {time.time() - t0:.0f} s:\n"
                     f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        row = json.loads(r.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(f"{n:>5} trials ({row['ok']} ok): wall {row['wall_s']:.0f} s ({row['wall_per_trial_s']:.2f} s/trial), "
              f"driver CPU {row['driver_cpu_per_trial_s'] * 1000:.0f} ms/trial in Tune's run, "
              f"after it {row['finish_per_trial_s'] * 1000:.1f} ms/trial; peak RSS {row['peak_rss_mib']:.0f} MiB, "
              f"+{row['rss_growth_per_100_trials_mib']:.1f} MiB per 100 trials after warm-up", flush=True)
    base = rows[0]
    for row in rows[1:]:
        print(f"{row['trials']} vs {base['trials']} trials: driver CPU per trial x"
              f"{row['driver_cpu_per_trial_s'] / base['driver_cpu_per_trial_s']:.2f}, after-run per trial x"
              f"{row['finish_per_trial_s'] / base['finish_per_trial_s']:.2f}, wall per trial x"
              f"{row['wall_per_trial_s'] / base['wall_per_trial_s']:.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": platform.node(), "cpus": os.cpu_count(), "tracking": args.tracking,
                                    "rows": rows}, indent=2))
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
