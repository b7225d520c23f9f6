"""The plan against the sweep it planned, on this CPU: what the plan printed before the first trial (each
task's seconds in training per trial, the predicted makespan) against what the trials' loops took
(results.csv's loop_seconds) and the sweep's own clock (its "sweep finished" line), on a quiet machine
and beside a busy process (``scripts/cpu_hog.py``: a loop on one core holding --hog-mb MiB).

The baseline is the plan itself: measured / planned = 1.0 is a plan that told the truth. The sweep by
default is the README's tour (SST-2 and MRPC, MiniLM, train=quick, two seeds) on ../shared/data; its
MLflow records go to a store in the run's own folder, not the working directory's.

    python scripts/bench_plan.py                                   # quiet, then busy
    python scripts/bench_plan.py --loads busy --out /tmp/plan.json
    python scripts/bench_plan.py -- 'task=[RTE,CoLA]' model=minilm train=quick storage.data_dir=../shared/data
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.cpu_hog import hog_command, wait_until_ready  # noqa: E402

TOUR = ["task=[SST-2,MRPC]", "model=minilm", f"storage.data_dir={ROOT.parent / 'shared' / 'data'}", "train=quick",
        "train.lr=1e-4", "sweep.seeds=[38,39]"]
TASK_LINE = re.compile(r"^plan: (\S+)\s+\d+ trials\s+~(\S+) each in training", re.M)
MAKESPAN_LINE = re.compile(r"^plan: predicted makespan (\S+) ", re.M)
END_PRIOR = re.compile(r"~(\S+) to end each trial")
FINISHED_LINE = re.compile(r"^\[(\d+):(\d+)\] sweep finished", re.M)


def duration_seconds(text: str) -> float:
    """'1h02m', '1m21s', '57s', '5m' (sweep.plan.makespan.format_duration's forms) -> seconds."""
    match = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text)
    if not match or not text:
        raise ValueError(f"not a duration: {text!r}")
    hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds


def planned(output: str) -> tuple[dict[str, float], float]:
    """Each task's planned seconds per trial in training, and the predicted makespan, from the plan lines."""
    tasks = {task: duration_seconds(d) for task, d in TASK_LINE.findall(output)}
    makespan = MAKESPAN_LINE.search(output)
    if not tasks or makespan is None:
        raise ValueError("the sweep printed no CPU plan (plan: ... each in training / predicted makespan)")
    return tasks, duration_seconds(makespan.group(1))


def measured(output: str, results: Path) -> tuple[dict[str, dict[str, list[float]]], float]:
    """Each task's trials' seconds (results.csv): ``loop`` (training and evaluation), ``startup`` (trial start
    to first batch) and ``rest`` (the rest of the trial's wall time: its checkpoints' saving and its end);
    and the sweep's clock at its end."""
    trials: dict[str, dict[str, list[float]]] = {}
    with results.open() as f:
        for row in csv.DictReader(f):
            if row["status"] == "TERMINATED" and row["loop_seconds"]:
                loop, startup = float(row["loop_seconds"]), float(row["startup_seconds"] or "nan")
                seconds = trials.setdefault(row["task"], {"loop": [], "startup": [], "rest": []})
                seconds["loop"].append(loop)
                seconds["startup"].append(startup)
                seconds["rest"].append(float(row["wall_seconds"]) - loop - startup)
    finished = FINISHED_LINE.search(output)
    if finished is None:
        raise ValueError("the sweep did not print 'sweep finished'")
    return trials, int(finished.group(1)) * 60 + int(finished.group(2))


def run_sweep(overrides: list[str], folder: Path, load: str, hog_mb: int) -> dict:
    folder.mkdir(parents=True)
    command = [sys.executable, "-m", "sweep", *overrides, f"out_dir={folder / 'run'}",
               f"tracking.uri=sqlite:///{folder / 'mlflow.db'}"]
    hog = None
    if load == "busy":
        hog_log = folder / "hog.log"
        with hog_log.open("w") as log:
            hog = subprocess.Popen(hog_command(hog_mb, 3600), stdout=log, stderr=subprocess.STDOUT)
        wait_until_ready(hog, hog_log)
    try:
        started = time.monotonic()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        wall = time.monotonic() - started
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    (folder / "sweep.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"the sweep exited {done.returncode}; its output: {folder / 'sweep.log'}\n"
                           f"{(done.stdout + done.stderr)[-3000:]}")
    plan, makespan = planned(done.stdout)
    trials, clock = measured(done.stdout, folder / "run" / "results.csv")
    return {"load": load, "planned_trial_s": plan, "planned_makespan_s": makespan,
            **{f"{part}_s": {task: seconds[part] for task, seconds in trials.items()}
               for part in ("loop", "startup", "rest")},
            "makespan_s": clock, "wall_s": round(wall, 1),
            "plan_lines": [line for line in done.stdout.splitlines() if line.startswith("plan: ")]}


def ratios(run: dict) -> dict[str, float]:
    """measured / planned: each task's median loop, and the makespan."""
    out = {task: statistics.median(run["loop_s"][task]) / planned_s
           for task, planned_s in run["planned_trial_s"].items() if run["loop_s"].get(task) and planned_s > 0}
    out["makespan"] = run["makespan_s"] / max(run["planned_makespan_s"], 1)
    return out


def table(runs: list[dict]) -> list[str]:
    lines = ["| load | what | planned | measured | measured / planned |", "|---|---|---|---|---|"]
    for run in runs:
        ratio = ratios(run)
        prior = END_PRIOR.search(" ".join(run["plan_lines"]))  # the end each trial was planned
        end = duration_seconds(prior.group(1)) if prior else float("nan")
        for task, planned_s in run["planned_trial_s"].items():
            loops = ", ".join(f"{s:.0f}" for s in run["loop_s"].get(task, []))
            lines.append(f"| {run['load']} | {task} trial in training | {planned_s:.0f} s | {loops} s | "
                         f"{ratio.get(task, float('nan')):.2f} |")
            rests = run["rest_s"].get(task, [])
            lines.append(f"| {run['load']} | {task} trial's saves and end | {end:.0f} s | "
                         f"{', '.join(f'{s:.1f}' for s in rests)} s | "
                         f"{statistics.median(rests) / end if rests and end > 0 else float('nan'):.2f} |")
        lines.append(f"| {run['load']} | makespan | {run['planned_makespan_s']:.0f} s | {run['makespan_s']:.0f} s | "
                     f"{ratio['makespan']:.2f} |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--loads", nargs="+", choices=("quiet", "busy"), default=["quiet", "busy"])
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--hog-mb", type=int, default=4096, help="memory the busy process holds (MiB)")
    p.add_argument("--out", type=Path, help="the runs as JSON")
    p.add_argument("overrides", nargs="*", help="the sweep's overrides (default: the README's tour)")
    args = p.parse_args()

    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-plan-") as tmp:
        for repeat in range(args.repeats):
            for load in args.loads:
                print(f"[{load} {repeat + 1}/{args.repeats}] sweep {' '.join(args.overrides or TOUR)}", flush=True)
                runs.append(run_sweep(args.overrides or TOUR, Path(tmp) / f"{load}-{repeat}", load, args.hog_mb))
                print("\n".join(runs[-1]["plan_lines"]), flush=True)
    print("\n".join(table(runs)))
    if args.out:
        args.out.write_text(json.dumps({"machine": platform.node(), "overrides": args.overrides or TOUR,
                                        "runs": runs, "ratios": [ratios(r) for r in runs]}, indent=1))


if __name__ == "__main__":
    main()
