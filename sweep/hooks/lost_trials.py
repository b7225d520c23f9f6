"""A trial whose process Ray ended (its memory monitor, a node gone) is a failed trial, not a crashed sweep.

Tune's actor manager (Ray 2.60, ``ray/air/execution/_internal/actor_manager.py``, ``_actor_task_failed``)
knows two errors of a trial's task: ``RayActorError`` (the process died: the trial fails, and is retried
up to ``sweep.max_failures`` from its last checkpoint) and ``RayTaskError``. Ray's memory monitor ends the
task with ``OutOfMemoryError``, which is neither: the manager raised ``RuntimeError("Caught unexpected
exception")`` out of ``tuner.fit()`` and the whole sweep died with a traceback. Such an error is handed to
Tune as what it is for the trial: its process lost (a ``RayActorError`` keeping Ray's message).
``sweep.failures.trial_failure_line`` turns either into the one line a person reads, also where Tune logs
a trial's failure (``OneLineTrialFailures``): the whole error stays in the trial's error file.
"""

from __future__ import annotations

import logging
import traceback

from ray.exceptions import RayActorError, RayError, RayTaskError

from sweep.disk import disk_full_line
from sweep.failures import trial_failure_line
from sweep.hooks.disk_stop import TRACEBACK_LOGGERS


class TrialProcessLost(RayActorError):
    """Ray ended the trial's process (``cause``: Ray's own error, e.g. OutOfMemoryError); its message kept."""

    def __init__(self, cause: BaseException | None = None, message: str | None = None) -> None:
        super().__init__(error_msg=message if message is not None else str(cause))
        self.cause = cause  # sweep.failures.causes: the retry rule sees Ray's error

    def __reduce__(self):  # Tune pickles a trial's error; Ray's errors do not all unpickle
        return TrialProcessLost, (None, self.error_msg)


def lost_process(exception: BaseException) -> BaseException:
    """``exception`` as Tune's actor manager can take it: Ray's errors other than its two, as a lost process."""
    if isinstance(exception, RayError) and not isinstance(exception, (RayActorError, RayTaskError)):
        return TrialProcessLost(exception)
    return exception


def treat_lost_processes_as_trial_failures() -> None:
    """Wrap Tune's actor manager once per process (idempotent)."""
    from sweep.cluster.ray_internals import actor_manager_class

    manager = actor_manager_class()
    original = manager._actor_task_failed
    if getattr(original, "sweep_wrapped", False):
        return

    def _actor_task_failed(self, tracked_actor_task, exception):
        return original(self, tracked_actor_task, lost_process(exception))

    _actor_task_failed.sweep_wrapped = True
    manager._actor_task_failed = _actor_task_failed


class OneLineTrialFailures(logging.Filter):
    """Tune logs each trial's failure with its traceback, and Ray each unretrieved error at exit: one line
    each here (the whole error stays in the trial's error file; the sweep's end lists every failed trial).
    A full disk's is left to ``disk_stop.HideDiskFullTracebacks``, which drops it."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + "".join(traceback.format_exception(*record.exc_info))
        if "Traceback" not in text or disk_full_line(text) is not None:
            return True
        head = record.getMessage().strip().splitlines()[0].rstrip(":")
        record.msg, record.args = f"{head}: {trial_failure_line(text)}", None
        record.exc_info = record.exc_text = None
        return True


def one_line_trial_failures() -> None:
    """Install the filter on Tune's and Ray's loggers once per process."""
    for name in TRACEBACK_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, OneLineTrialFailures) for f in logger.filters):
            logger.addFilter(OneLineTrialFailures())
