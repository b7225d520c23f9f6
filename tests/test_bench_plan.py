"""``scripts/bench_plan.py`` reads what the sweep prints and writes: the plan's lines (as
``sweep.plan.dispatch`` formats them) and results.csv (as ``sweep.results.records`` writes it). A changed
format on either side breaks the bench here, not in a long run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from sweep.plan.costs import StepCost
from sweep.plan.cpu_load import CpuLoad
from sweep.plan.dispatch import Dispatch, OnCpu
from sweep.plan.makespan import TrialWork
from sweep.plan.probe import Probe, cpu_note, end_seconds
from sweep.results.records import TrialRecord, write_results

BENCH = Path(__file__).resolve().parents[1] / "scripts" / "bench_plan.py"


def bench_module() -> Any:
    spec = importlib.util.spec_from_file_location("bench_plan", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


ORDER = (TrialWork("MRPC", 38, 53.0), TrialWork("MRPC", 39, 53.0), TrialWork("SST-2", 38, 31.0),
         TrialWork("SST-2", 39, 31.0))


def plan_lines(makespan: float | None, note: str) -> list[str]:
    return [f"plan: {line}" for line in Dispatch(ORDER, {}, None).describe(cpu=OnCpu(2, 1.0, makespan, note))]


def test_the_bench_reads_the_plan_lines_the_sweep_prints():
    bench = bench_module()
    printed = "\n".join(["sweep: 4 trials", *plan_lines(95.0, "training measured here: ..."), "[00:01] 0/4 done"])
    assert bench.planned(printed) == ({"MRPC": 53.0, "SST-2": 31.0}, 95.0)
    with pytest.raises(ValueError, match="printed no CPU plan"):
        bench.planned("\n".join(plan_lines(None, "the trials run on GPUs")))


def test_the_table_sets_each_trials_end_against_the_prior_the_plan_line_names(monkeypatch):
    """The plan line's note (``cpu_note``) names each trial's end: its checkpoints at the probe's save time,
    at the probe's slowdown (beside one busy CPU of two, two trials at once at Ray's niceness: about x2);
    the table reads it back."""
    bench = bench_module()
    monkeypatch.delenv("RAY_worker_niceness", raising=False)
    probe = Probe(StepCost(train=1e-3, eval=2e-4, measured=True, per_step=0.1), setup_seconds=0.5, seconds=5.0,
                  steps=3, threads=1, load=CpuLoad(cpus=2.0, others=1.0), save_seconds=0.5)
    end = round(end_seconds(probe, 4, 2))
    assert end > 4 * 0.5
    run = {"load": "busy", "planned_trial_s": {"MRPC": 53.0}, "planned_makespan_s": 95.0, "makespan_s": 100,
           "loop_s": {"MRPC": [55.0]}, "rest_s": {"MRPC": [2.0, 3.0]},
           "plan_lines": plan_lines(95.0, cpu_note(probe, "", at_once=2, saves=4))}
    table = "\n".join(bench.table([run]))
    assert f"| busy | MRPC trial's saves and end | {end} s | 2.0, 3.0 s | {2.5 / end:.2f} |" in table, table


def test_the_bench_splits_each_trials_wall_time_from_results_csv(tmp_path):
    bench = bench_module()
    records = [TrialRecord("MRPC", 38, score=0.8, wall_seconds=65.6, loop_seconds=56.0, startup_seconds=6.9),
               TrialRecord("SST-2", 38, score=0.5, wall_seconds=38.8, loop_seconds=34.2, startup_seconds=0.3),
               TrialRecord("SST-2", 39, status="ERROR", error="killed", wall_seconds=3.0)]
    write_results(tmp_path, records, [])
    trials, clock = bench.measured("[01:30] 4/4 done\n[01:38] sweep finished\n", tmp_path / "results.csv")
    assert clock == 98
    assert trials["MRPC"]["loop"] == [56.0] and trials["MRPC"]["startup"] == [6.9]
    assert trials["MRPC"]["rest"] == [pytest.approx(2.7)] and trials["SST-2"]["rest"] == [pytest.approx(4.3)]
    assert len(trials["SST-2"]["loop"]) == 1  # the failed trial is not a trial's time
    with pytest.raises(ValueError, match="sweep finished"):
        bench.measured("[01:30] 4/4 done\n", tmp_path / "results.csv")


@pytest.mark.parametrize(("text", "seconds"), [("1h02m", 3720), ("1m21s", 81), ("57s", 57), ("5m", 300)])
def test_durations_as_the_plan_formats_them(text, seconds):
    from sweep.plan.makespan import format_duration

    bench = bench_module()
    assert bench.duration_seconds(text) == seconds
    assert bench.duration_seconds(format_duration(seconds)) == pytest.approx(seconds, abs=60 if seconds >= 3600 else 0)
