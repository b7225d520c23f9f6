"""A resumed sweep's searcher, brought in line with the trials Tune restored.

Tune restores the trial list from its newest experiment state file, and the searcher and its
concurrency limiter from their own files of that snapshot. The snapshot is uploaded file by file
(to S3 on a cluster), so a driver killed mid-upload (a preemption) leaves them from two snapshots:
a searcher that handed out a trial the list does not hold (that trial never runs), or a limiter
counting a trial that is not there (a slot never freed). The trial list is the truth: before Tune
asks for the first new trial, the searcher's position and the limiter's live trials are set from it.
Tune's own count of trials made (its ``SearchGenerator``, which ends the search at ``num_samples``) is
out of a callback's reach: from a newer file than the trial list it still ends the search early.
"""

from __future__ import annotations

from typing import Any

from ray.tune import Callback
from ray.tune.search import ConcurrencyLimiter

ENDED = ("TERMINATED", "ERROR")


class ResumeTheSearch(Callback):
    """``search``: the Tuner's search algorithm (an ``OrderedTrials``, maybe in a ``ConcurrencyLimiter``)."""

    def __init__(self, search: Any) -> None:
        self.search = search
        self.done = False

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        if self.done:
            return
        self.done = True  # the first step comes before Tune's first request for a new trial
        reconcile(self.search, [(t.trial_id, t.status) for t in trials])


def reconcile(search: Any, restored: list[tuple[str, str]]) -> None:
    """Set ``search`` from the restored trials, each ``(trial_id, status)``."""
    searcher = search
    while isinstance(searcher, ConcurrencyLimiter):
        live = {trial_id for trial_id, status in restored if status not in ENDED}
        searcher.live_trials = live
        searcher.num_unfinished_live_trials = len(live)
        searcher = searcher.searcher
    searcher.resume_after(len(restored))
