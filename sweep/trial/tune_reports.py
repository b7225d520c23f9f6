"""A multi-worker (DDP) trial's reports, handed to Tune by the trial's own thread.

Ray's ``TuneReportCallback`` passes Train's reports to the trial process's *main* thread (Tune's
``step``), which reports them itself, while the trainable's thread reports too: its own last row
(a failed trial's) and, when it returns, Tune's end-of-function marker. Both go into a one-slot
queue that only the main thread empties, so the main thread blocks for ever when it takes one of
Train's reports after the trainable's thread has filled the slot: a report of Train's still queued
when ``fit`` ends (a driver busy for a few seconds suffices). CI's run hung 73 min on it (a DDP
trial's data error right after its workers' first report; tests/test_tune_reports.py makes it
happen every time).

Here Train's controller puts each report into a queue of ours, and the trainable's thread (the one
Tune's function API expects reports from) takes them and calls ``tune.report`` while ``fit`` runs
in a helper thread: every report reaches Tune from one thread, in order, and nothing is left queued
when the trainable ends.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ray import tune
from ray.train import Checkpoint
from ray.train.v2.api.callback import UserCallback
from ray.tune.integration.ray_train import CHECKPOINT_PATH_KEY  # the key Tune's rows of a DDP trial carry
from ray.util.queue import Empty, Queue


class ReportToTrialThread(UserCallback):
    """Runs in Train's controller: each report of the workers (rank 0's row, as TuneReportCallback
    passed it), with the path of the checkpoint Train persisted, into the trial's queue. The queue
    holds one: the controller waits while Tune has not taken the last one (Tune's own pace)."""

    def __init__(self, reports: Queue) -> None:
        self.reports = reports

    def after_report(self, run_context, metrics: list[dict[str, Any]], checkpoint: Checkpoint | None) -> None:
        row = dict(metrics[0])
        if checkpoint is not None:
            row[CHECKPOINT_PATH_KEY] = checkpoint.path
        self.reports.put(row)


def fit_reporting_to_tune(trainer_with: Callable[[UserCallback], Any], poll_s: float = 0.5) -> None:
    """``trainer_with(callback).fit()`` in a helper thread, every report of it passed to
    ``tune.report`` from this (the trainable's) thread; raises what ``fit`` raised. When Tune ends
    the trial meanwhile (``tune.report`` raises SystemExit), the queue is killed: the controller's
    next report fails and the Train run ends with it."""
    reports = Queue(maxsize=1, actor_options={"num_cpus": 0})
    raised: list[BaseException] = []

    def fit() -> None:
        try:
            trainer_with(ReportToTrialThread(reports)).fit()
        except BaseException as error:  # noqa: BLE001 (raised again in the trainable's thread)
            raised.append(error)

    fitting = threading.Thread(target=fit, name="sweep-train-fit", daemon=True)
    fitting.start()
    try:
        while True:
            # sampled before the get: a report put before fit ended is taken before the loop ends
            ended = not fitting.is_alive()
            try:
                row = reports.get(timeout=poll_s)
            except Empty:
                if ended:
                    break
                continue
            tune.report(row)
    finally:
        reports.shutdown(force=True)
    fitting.join()
    if raised:
        raise raised[0]
