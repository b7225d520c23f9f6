"""Early stopping per task: ASHA and seed halving, decided on a rungs board that the trials ask.

Why not Tune's ``ASHAScheduler``: it ranks every trial of the Tune run in one bracket, and a sweep
runs all its tasks in one Tune run, whose scores are not comparable (a CoLA MCC of 0.3 is good, an
SST-2 accuracy of 0.3 is awful): each task needs its own rungs. So a named actor holds the rungs
(``AshaRungs`` or ``SeedHalving``), each trial tells it every evaluation and ends itself cleanly
(``EarlyStop``) when told to stop, on one path for single-worker and DDP trials. The ranking and
the two rules are plain Python in ``sweep.plan.rungs``.

Seed halving (Dodge et al. 2020) decides once, when every trial of a task has reached fraction
``at`` of its training, so a trial that gets there first must wait without holding its GPU while
later seeds still need one: ``schedulers/seed_halving.SeedHalvingScheduler`` (Tune's side) pauses it, with its
checkpoint of that evaluation, and resumes the kept trials once the task is decided.

Which board a sweep has (if any) is its scheduler policy's answer (``schedulers/policies.py``: ``rung_board``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sweep.plan.rungs import GO_ON, RungEntry, Verdict, asha_verdict, halving_verdicts, keep_count, past_rung
from sweep.results.trial_reports import Report

ASHA_NAMESPACE = "sweep"  # the Ray namespace of the named rungs actor (the driver creates it, trials look it up)


class EarlyStop(Exception):
    """Raised by a trial's evaluation callback when the rungs stop the trial: it ends as finished."""

    def __init__(self, verdict: Verdict):
        super().__init__(verdict.stop_text)
        self.verdict = verdict


@dataclass(frozen=True)
class EvalPoint:
    """What a trial tells the board after one evaluation."""

    task: str
    trial_id: str
    seed: int
    epoch: int
    step: int
    progress: float  # step / the trial's planned steps
    end_of_epoch: bool
    score: float
    eval_loss: float | None = None
    trivial: float | None = None

    def entry(self) -> RungEntry:
        return RungEntry(self.trial_id, self.seed, self.score, self.eval_loss, self.trivial)

    @classmethod
    def from_report(cls, report: Report) -> "EvalPoint | None":
        """The point in a trial's report (or history row); None for a report that is no evaluation."""
        if not report.is_evaluation:
            return None
        return cls(task=str(report.task), trial_id=report.trial_id, seed=int(report.seed or 0),
                   epoch=int(report.epoch or 0), step=int(report.step), progress=float(report.progress or 0.0),
                   end_of_epoch=bool(report.end_of_epoch), score=float(report.score),
                   eval_loss=report.metrics.get("eval_loss"), trivial=report.trivial_score)


class AshaRungs:
    """Asynchronous successive halving with rungs at epoch ends, per task."""

    def __init__(self, max_t: int, grace_period: int = 1, reduction_factor: float = 2):
        self.reduction_factor = reduction_factor
        self.milestones = []
        t = grace_period
        while t < max_t:  # no rung at the last epoch: a trial that got there finishes anyway
            self.milestones.append(t)
            t = int(np.ceil(t * reduction_factor))
        self.recorded: dict[tuple[str, int], dict[str, RungEntry]] = {}
        self.verdicts: dict[tuple[str, int], Verdict] = {}  # (trial, rung): its first answer

    def at_eval(self, point: EvalPoint) -> Verdict:
        """Record a rung's evaluation; go on only if in the top 1/reduction_factor so far (tie-free)."""
        if not point.end_of_epoch or point.epoch not in self.milestones:
            return GO_ON
        key = (point.trial_id, point.epoch)
        if key not in self.verdicts:  # DDP ranks and a restarted trial ask again: the same answer
            recorded = self.recorded.setdefault((point.task, point.epoch), {})
            recorded[point.trial_id] = point.entry()
            self.verdicts[key] = asha_verdict(point.entry(), list(recorded.values()), self.reduction_factor,
                                              f"at epoch {point.epoch}")
        return self.verdicts[key]

    def verdict_of(self, trial_id: str) -> Verdict | None:
        stops = [v for (t, _), v in self.verdicts.items() if t == trial_id and not v.go_on]
        return stops[0] if stops else None


class SeedHalving:
    """One decision per task at fraction ``at`` of training: the best ``keep`` trials go on."""

    def __init__(self, trials_per_task: dict[str, int], keep: float, at: float):
        self.expected, self.keep, self.at = dict(trials_per_task), keep, at
        self.entries: dict[str, dict[str, RungEntry]] = {task: {} for task in trials_per_task}
        self.gone_before: dict[str, set[str]] = {task: set() for task in trials_per_task}
        self.verdicts: dict[str, Verdict] = {}

    def at_eval(self, point: EvalPoint) -> Verdict | None:
        """A verdict, or None: wait, the task's other trials have not all reached the rung."""
        if point.trial_id in self.verdicts:
            return self.verdicts[point.trial_id]
        if not past_rung(point.progress, self.at):
            return GO_ON
        self.entries[point.task].setdefault(point.trial_id, point.entry())
        self._decide(point.task)
        return self.verdicts.get(point.trial_id)

    def gone(self, task: str, trial_id: str) -> bool:
        """A trial ended (failed) before the rung: the task no longer waits for it. True: decided."""
        if trial_id not in self.entries[task]:
            self.gone_before[task].add(trial_id)
            self._decide(task)
        return self.decided(task)

    def decided(self, task: str) -> bool:
        return any(t in self.verdicts for t in self.entries[task])

    def verdict_of(self, trial_id: str) -> Verdict | None:
        return self.verdicts.get(trial_id)

    def _decide(self, task: str) -> None:
        entries = self.entries[task]
        if self.decided(task) or not entries or len(entries) + len(self.gone_before[task]) < self.expected[task]:
            return
        keep = keep_count(self.keep, len(entries))
        self.verdicts.update(halving_verdicts(list(entries.values()), keep, f"at {self.at:.0%} of training"))


def trials_per_task(settings, total: int) -> dict[str, int]:
    """How many trials each task has: every task has the same seeds x grid x samples."""
    return {spec.name: total // len(settings.tasks) for spec in settings.tasks}


def board_name(experiment: str) -> str:
    """One name per sweep folder: a resumed sweep's restored Tune scheduler finds the new board."""
    import hashlib

    return "sweep-rungs-" + hashlib.sha1(experiment.encode()).hexdigest()[:12]


def recorded_rungs(histories) -> tuple[list[EvalPoint], list[tuple[str, str]]]:
    """What a resumed sweep's new board must learn again from the trials' histories: every rung
    evaluation, and the (task, trial) pairs that failed on their own before reaching a rung (a
    seed-halving decision must not wait for them)."""
    points, gone = [], []
    for trial_id, rows in histories.all().items():  # trials.TrialHistories: a folder or s3://…
        first = next((r for r in rows if r.task is not None), None)
        if first is None:
            continue
        rungs = [p for p in (EvalPoint.from_report(r) for r in rows if r.rung) if p is not None]
        points += rungs
        if not rungs and rows[-1].trial_error:
            gone.append((str(first.task), trial_id))
    return points, gone
