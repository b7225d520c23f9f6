"""The progress line's ETA (sweep/hooks/progress.py over sweep/plan/eta.py), with Tune's callbacks called
by hand: trials start, report their loop's start and progress, end; the clock is set by the test."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sweep.plan.eta import Forecast, Overheads
from sweep.plan.makespan import TrialWork
from sweep.results.trial_reports import point_of, trial_key
from tests.helpers.configs import demo_settings


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def trial(seed: int) -> SimpleNamespace:
    config = {"trial": point_of("WNLI", seed, {})}
    return SimpleNamespace(trial_id=f"t{seed}", config=config, run_metadata=SimpleNamespace(start_time=None),
                           last_result=None, status="RUNNING")


def watched_sweep(monkeypatch, overheads: Overheads, forecast_class: type[Forecast] = Forecast):
    """The demo's three WNLI trials of 20 s predicted, 2 at once, under the test's clock: the progress line,
    its forecast, the trials and the clock."""
    from sweep.hooks import progress

    clock = Clock()
    monkeypatch.setattr(progress.time, "time", clock)
    settings = demo_settings()  # WNLI, seeds 38-40, 4 epochs
    trials = [trial(seed) for seed in settings.sweep.seeds]
    work = [TrialWork("WNLI", seed, 20.0) for seed in settings.sweep.seeds]
    forecast = forecast_class(work, [trial_key(t.config) for t in trials], None, capacity=2, concurrency=2,
                              known=True, overheads=overheads)
    return progress.SweepProgress(settings, 3, forecast), forecast, trials, clock


def test_the_eta_counts_start_ups_and_slots_then_follows_the_trials_pace(monkeypatch, capsys):
    line, forecast, trials, clock = watched_sweep(monkeypatch, Overheads(launch=6.0, cold=10.0, warm=1.0, finish=0.0))
    for t in trials[:2]:
        line.on_trial_start(0, trials, t)
    assert line.last_line.endswith("ETA 00:51")  # 2 x (10 + 20) start together, then 1 + 20 on a reused process
    clock.now += 20  # both started their loops at +10, and after a quarter (one epoch) of it took 20 s
    for t in trials[:2]:
        row = {"trial_id": t.trial_id, "trial": t.config["trial"], "epoch": 1, "step": 13, "steps_total": 52,
               "progress": 0.25, "score": 0.5, "eval/acc": 0.5, "loop_started": 1010.0, "reported_at": 1020.0,
               "pid": int(t.trial_id[1:]), "train_tokens": 100, "train_seconds": 4.0}
        line.on_trial_result(0, trials, t, row)
    # each trial's loop is 40 s at its pace: 30 s left; the third, scaled 2x: 1 + 40 after
    assert line.last_line.endswith("ETA 01:11")
    assert forecast.scale == pytest.approx(2.0)
    clock.now += 30
    for t in trials[:2]:
        line.on_trial_complete(0, trials, t)
    line.on_trial_start(0, trials, trials[2])
    assert line.last_line.endswith("ETA 00:41")
    assert "2/3 done, 1 running" in line.last_line


def report_row(t: SimpleNamespace, progress_done: float, loop_started: float, reported_at: float) -> dict:
    return {"trial_id": t.trial_id, "trial": t.config["trial"], "epoch": 4, "step": 52, "steps_total": 52,
            "progress": progress_done, "score": 0.5, "eval/acc": 0.5, "loop_started": loop_started,
            "reported_at": reported_at, "pid": int(t.trial_id[1:]), "train_tokens": 100, "train_seconds": 4.0}


def test_the_eta_learns_how_long_a_trial_takes_to_end_after_its_loop(monkeypatch):
    """The driver's clock at the trial's end against its report at the loop's last step: 7 s here, where
    the prior said 3; the third trial's estimate carries the 7."""
    line, forecast, trials, clock = watched_sweep(monkeypatch, Overheads(launch=0.0, cold=0.0, warm=1.0, finish=3.0))
    for t in trials[:2]:
        line.on_trial_start(0, trials, t)
    assert line.last_line.endswith("ETA 00:47")  # (20 + 3) on each slot, then 1 + 20 + 3
    clock.now += 20
    for t in trials[:2]:
        line.on_trial_result(0, trials, t, report_row(t, 1.0, 1000.0, 1020.0))
    assert line.last_line.endswith("ETA 00:27")  # 3 s to end, then the third trial
    clock.now += 7
    for t in trials[:2]:
        line.on_trial_complete(0, trials, t)
    assert forecast.ending() == pytest.approx(7.0)
    line.on_trial_start(0, trials, trials[2])
    assert line.last_line.endswith("ETA 00:28")  # 1 + 20 + 7


class BrokenForecast(Forecast):
    """A forecast with a bug in its arithmetic (as a wrong call signature once was, mid-edit)."""

    def remaining(self, now: float) -> float | None:
        raise ZeroDivisionError("float division by zero")


def test_a_failing_eta_is_dropped_with_one_warning_and_the_progress_goes_on(monkeypatch, capsys):
    """Tune ends its whole run on a callback's error: an ETA's bug must not end a sweep whose trials train."""
    line, _, trials, _ = watched_sweep(monkeypatch, Overheads(), BrokenForecast)
    line.on_trial_start(0, trials, trials[0])
    line.on_trial_result(0, trials, trials[0], report_row(trials[0], 0.5, 1000.0, 1000.0))
    line.on_trial_complete(0, trials, trials[0])
    out = capsys.readouterr().out
    assert out.count("warning: the ETA failed and is left out from here (ZeroDivisionError: float division by "
                     "zero); the sweep goes on") == 1
    assert line.forecast is None and line.last_line.endswith("ETA ?")
    assert "1/3 done, 0 running" in line.last_line


def test_a_resumed_sweep_counts_the_trials_its_ledger_holds_ended_as_done_and_not_in_the_eta(monkeypatch, capsys):
    from sweep.results.ledger import TrialEntry

    line, forecast, trials, clock = watched_sweep(monkeypatch, Overheads(launch=6.0, cold=10.0, warm=1.0, finish=0.0))
    line.count_ended([TrialEntry("WNLI-seed38-x-r0", "WNLI", 38, state="finished"),
                      TrialEntry("WNLI-seed39-x-r0", "WNLI", 39, state="failed")])
    assert line.last_line.startswith("2/3 done, 0 running, 1 pending, 1 failed")
    line.on_trial_start(0, trials, trials[2])  # the one trial left: 10 + 20, nothing after it
    assert line.last_line == "2/3 done, 1 running, 0 pending, 1 failed | ETA 00:30"
    assert forecast.pending == 0
