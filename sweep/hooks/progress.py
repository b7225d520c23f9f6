"""What a person sees while a sweep runs: one line per change, not a wall of Ray log noise.

    [01:12] 4/10 done, 2 running, 4 pending, 0 failed | WNLI acc best 0.5634 (seed 39) | ETA 2m05s
"""

from __future__ import annotations

import time
from typing import Any

from ray.tune import Callback

from sweep.config.settings import Settings
from sweep.failures import error_line
from sweep.plan.eta import Forecast
from sweep.results.records import rank_key
from sweep.results.trial_reports import Report, point_of, trial_key, trial_of
from sweep.schedulers.policies import SchedulerPolicy, policies_for


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}h{m % 60:02d}m" if m >= 60 else f"{m:02d}:{s:02d}"


class SweepProgress(Callback):
    def __init__(self, settings: Settings, total: int, forecast: Forecast | None = None,
                 scheduler: SchedulerPolicy | None = None):
        self.total = total
        self.forecast = forecast  # the ETA from the trials' costs, then their observed pace
        self.epochs = settings.train.epochs
        self.metric = {t.name: t.metric for t in settings.tasks}
        self.mode = {t.name: t.mode for t in settings.tasks}
        self.best: dict[str, tuple[float, int]] = {}  # task -> (metric value, seed)
        self.running: set[str] = set()  # started, not ended (maybe paused)
        self.paused = 0  # seed halving and PBT pause trials: their slot goes to another
        self.done: dict[str, float] = {}  # trial id -> wall seconds
        self.failed = 0
        self.start = time.time()
        self.last_line = ""
        self.pauses = policies_for(settings.sweep, scheduler).scheduler.pauses_trials
        self.waiting: str | None = None  # what the sweep waits for from the autoscaler (WaitForNodes sets it)

    def _on_forecast(self, method: str, *args: Any) -> Any:
        """The forecast's ``method(*args)``. The ETA is for the eye: one that fails is dropped with one warning (the
        line shows ``ETA ?`` from then on) and the sweep goes on -- Tune ends its run on a callback's error."""
        if self.forecast is None:
            return None
        try:
            return getattr(self.forecast, method)(*args)
        except Exception as e:  # noqa: BLE001 - any: the trials' work matters more than their ETA
            self.forecast = None
            print(f"warning: the ETA failed and is left out from here ({error_line(e)}); the sweep goes on",
                  flush=True)
            return None

    def _eta(self) -> str:
        left = self._on_forecast("remaining", time.time())
        return "?" if left is None else _clock(left)

    def print_line(self) -> None:
        pending = self.total - len(self.done) - len(self.running)
        paused = min(self.paused, len(self.running))
        bests = " | ".join(
            f"{task} {self.metric[task]} best {value:.4f} (seed {seed})"
            for task, (value, seed) in sorted(self.best.items())
        )
        line = (f"{len(self.done)}/{self.total} done, {len(self.running) - paused} running, "
                + (f"{paused} paused, " if paused else "") + f"{max(pending, 0)} pending, "
                f"{self.failed} failed" + (f" | {bests}" if bests else "") + f" | ETA {self._eta()}"
                + (f" | {self.waiting}" if self.waiting else ""))
        if line != self.last_line:
            self.last_line = line
            print(f"[{_clock(time.time() - self.start)}] {line}", flush=True)

    def count_ended(self, entries: list) -> None:
        """A resumed launch: the trials an earlier launch ended (the ledger's entries) count as done, and
        the failed ones as failed, from the first line on."""
        for entry in entries:
            self.done[entry.identity] = 0.0
            self.failed += entry.state == "failed"
            self._on_forecast("ended_before", trial_key({"trial": point_of(entry.task, entry.seed, entry.grid)}))
        if entries:
            self.print_line()

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        if not self.pauses:  # a walk over every trial each step of Tune's loop: only where trials pause
            return
        paused = sum(1 for trial in trials if trial.status == "PAUSED")
        if paused != self.paused:  # Tune has no pause callback: its loop's step shows it
            self.paused = paused
            self.print_line()

    def on_trial_start(self, iteration: int, trials: list, trial, **info: Any) -> None:
        self.running.add(trial.trial_id)
        self._on_forecast("start", trial.trial_id, trial_key(trial.config), time.time())
        self.print_line()

    def on_trial_result(self, iteration: int, trials: list, trial, result: dict, **info: Any) -> None:
        task, seed, _ = trial_of(trial.config)
        report = Report.from_row(result)
        self._on_forecast("report", trial.trial_id, self._progress(report), report.loop_started,
                          report.reported_at, report.pid, bool(report.resumed))
        value = report.metrics.get(self.metric.get(task))
        if task in self.metric and value is not None:
            old = self.best.get(task)
            # the same order as the final choice
            if old is None or rank_key(self.mode[task], value, seed) > rank_key(self.mode[task], *old):
                self.best[task] = (float(value), seed)
        self.print_line()

    def _progress(self, report: Report) -> float | None:
        """The share of the trial's steps done (evaluations may fall inside an epoch)."""
        if report.progress is not None:
            return report.progress
        if report.epoch is not None and self.epochs:
            return report.epoch / self.epochs
        return None

    def _finish(self, trial) -> None:
        self.running.discard(trial.trial_id)
        self._on_forecast("finish", trial.trial_id, time.time())
        self.done[trial.trial_id] = time.time() - (trial.run_metadata.start_time or self.start)

    def on_trial_complete(self, iteration: int, trials: list, trial, **info: Any) -> None:
        self._finish(trial)
        # a trial that failed on its own data/config ends without an error for Tune (never retried)
        if Report.from_row(trial.last_result or {"trial_id": trial.trial_id}).trial_error:
            self.failed += 1
        self.print_line()

    def on_trial_error(self, iteration: int, trials: list, trial, **info: Any) -> None:
        self._finish(trial)
        self.failed += 1
        self.print_line()

    def close(self) -> None:
        print(f"[{_clock(time.time() - self.start)}] sweep finished", flush=True)


class WaitForNodes(Callback):
    """While the autoscaler brings the nodes the plan asked for: what is still awaited goes into the
    progress line, and no node arriving within cluster.scale_timeout_s ends the sweep with one error
    (ScaleTimeoutError) naming the node type and the pending request."""

    def __init__(self, wait, progress: SweepProgress, poll_s: float = 2.0):
        self.wait, self.progress, self.poll_s = wait, progress, poll_s
        self.next_poll = 0.0

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        if self.wait is None or time.monotonic() < self.next_poll:
            return
        self.next_poll = time.monotonic() + self.poll_s
        from sweep.cluster.autoscale import check_wait

        text = check_wait(self.wait)  # raises ScaleTimeoutError past the timeout with no node up
        if text is None:  # every node asked for is up: stop asking
            self.wait = None
        if text != self.progress.waiting:
            self.progress.waiting = text
            self.progress.print_line()
