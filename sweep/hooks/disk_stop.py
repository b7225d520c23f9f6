"""End the sweep at the first trial that failed on a full disk, with that trial's one line.

A retry on the same disk fails the same way, and every other trial would fill it too. The error is
raised from Tune's loop as the failure is processed, before Tune saves its state again: the trials
that were running stay unfinished in the saved state, so ``resume=true`` (after freeing space)
runs them again and finishes the sweep. Tune wraps what a callback raises in a TuneError holding
the traceback; ``fit_until_disk_full`` turns it back into the one line, and the tracebacks Tune and
Ray log for the trials that hit the full disk are kept off the terminal (the line says it all).
"""

from __future__ import annotations

import logging
import traceback
from pathlib import Path

from ray.tune import Callback
from ray.tune.error import TuneError

from sweep.disk import disk_full_line
from sweep.errors import DiskFullError

FAILURE_MARK = "Failure # "  # Tune appends each failure of a trial to its error file under this
# Tune's "Trial task failed" and Ray's "Unhandled error" (a concurrent trial's failure, at exit)
TRACEBACK_LOGGERS = ("ray.tune.execution.tune_controller", "ray._private.worker")


class HideDiskFullTracebacks(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if record.exc_info:
            text += "".join(traceback.format_exception(*record.exc_info))
        return disk_full_line(text) is None


class StopOnDiskFull(Callback):
    def setup(self, **info) -> None:
        for name in TRACEBACK_LOGGERS:
            logger = logging.getLogger(name)
            if not any(isinstance(f, HideDiskFullTracebacks) for f in logger.filters):
                logger.addFilter(HideDiskFullTracebacks())

    def on_trial_recover(self, iteration, trials, trial, **info) -> None:
        _raise_if_disk_full(trial)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        _raise_if_disk_full(trial)


def _raise_if_disk_full(trial) -> None:
    path = trial.error_file  # on the driver's own staging disk, written before the callbacks run
    if not path or not Path(path).is_file():
        return
    last = Path(path).read_text(errors="replace").rsplit(FAILURE_MARK, 1)[-1]
    line = disk_full_line(last)
    if line is not None:
        raise DiskFullError(line)


def fit_until_disk_full(tuner):
    """``tuner.fit()``; a full disk that ended it (StopOnDiskFull) is raised as its DiskFullError line."""
    try:
        return tuner.fit()
    except TuneError as e:
        line = disk_full_line(str(e))
        if line is None:
            raise
        raise DiskFullError(line) from None
