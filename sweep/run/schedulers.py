"""Asynchronous successive halving (ASHA), decided inside the trials, with rungs per task.

Why not Tune's ``ASHAScheduler``: it ranks every trial of the Tune run in one bracket, and a sweep
runs all its tasks in one Tune run, whose scores are not comparable (a CoLA MCC of 0.3 is good, an
SST-2 accuracy of 0.3 is awful): each task needs its own rungs. (Tune stopping the function
trainable is clean now for one-worker trials, which run in Train's local mode inside the trial's
process; for a DDP trial it would leave the worker group running.) So the trial asks after each
epoch and ends itself cleanly, the same way on either path.
"""

from __future__ import annotations

import numpy as np


ASHA_NAMESPACE = "sweep"  # the Ray namespace of the named rungs actor (the driver creates it, trials look it up)


class EarlyStop(Exception):
    """Raised by a trial's epoch callback when ASHA cuts the trial: it ends as a finished trial."""


class AshaRungs:
    def __init__(self, max_t: int, grace_period: int = 1, reduction_factor: float = 2):
        self.reduction_factor = reduction_factor
        self.milestones = []
        t = grace_period
        while t < max_t:  # no rung at the last epoch: a trial that got there finishes anyway
            self.milestones.append(t)
            t = int(np.ceil(t * reduction_factor))
        self.recorded: dict[tuple[str, int], dict[str, float]] = {}

    def should_continue(self, task: str, trial_id: str, epoch: int, score: float) -> bool:
        """Record a score at a rung; go on only if it is in the top 1/reduction_factor so far."""
        if epoch not in self.milestones:
            return True
        scores = self.recorded.setdefault((task, epoch), {})
        scores[trial_id] = score  # idempotent: DDP ranks and a restarted trial ask again
        if len(scores) < 2:
            return True
        cutoff = np.percentile(list(scores.values()), (1 - 1 / self.reduction_factor) * 100)
        return score >= cutoff
