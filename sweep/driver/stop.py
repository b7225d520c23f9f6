"""SIGTERM and SIGINT of the driver stop a sweep cleanly, the way Ctrl-C stops a Tune run.

While ``tuner.fit`` runs, the first signal is handed to Tune's own "end the run" handler (the one
it installs for SIGUSR1 and, unless TUNE_DISABLE_SIGINT_HANDLER, SIGINT): Tune stops the trials,
saves the experiment state and returns; the sweep then raises ``SweepStopped``, which withdraws
the autoscaler request and shuts Ray down on its way out. A signal outside ``fit`` (staging,
planning) or a second signal raises ``SweepStopped`` at once. ``python -m sweep`` prints one line
with the command that resumes the sweep.

Ray's ``init`` installs its own SIGTERM handler (exit at once), so these are installed after it.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from sweep.errors import SweepStopped

SIGNALS = (signal.SIGTERM, signal.SIGINT)
TUNE_STOP_SIGNAL = signal.SIGUSR1  # Tune always installs its stop handler on it


class StopSignals:
    """The handlers, and which signal arrived (``received``)."""

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        self._in_tune = False
        self._tune_before: Any = None  # SIGUSR1's handler before fit: a stale one of an earlier run

    def handle(self, signum: int, frame) -> None:
        sig = signal.Signals(signum)
        first = self.received is None
        self.received = self.received or sig
        tune_stop = self._tune_handler()
        if first and tune_stop is not None:
            print(f"sweep: {sig.name}: stopping the trials and saving the sweep's state "
                  f"(send it again to stop at once)", file=sys.stderr, flush=True)
            tune_stop(signum, frame)
            return
        raise SweepStopped(self.received.name, int(self.received))

    @contextlib.contextmanager
    def tune_running(self) -> Iterator[None]:
        """Around ``tuner.fit``: a signal goes to Tune's handler once fit has installed it."""
        self._tune_before, self._in_tune = signal.getsignal(TUNE_STOP_SIGNAL), True
        try:
            yield
        finally:
            self._in_tune = False

    def check(self) -> None:
        """After fit returned: raise SweepStopped if a signal made it return."""
        if self.received is not None:
            raise SweepStopped(self.received.name, int(self.received))

    def _tune_handler(self):
        if not self._in_tune:
            return None
        handler = signal.getsignal(TUNE_STOP_SIGNAL)
        return handler if callable(handler) and handler is not self._tune_before else None


@contextlib.contextmanager
def stop_signals() -> Iterator[StopSignals]:
    """SIGTERM and SIGINT handled by a StopSignals for the block (where signals can be: main thread)."""
    stop = StopSignals()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"  # SIGINT comes here first too, not to Tune directly
    before = {sig: signal.signal(sig, stop.handle) for sig in SIGNALS}
    try:
        yield stop
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def resume_command(overrides: Sequence[str], out_dir: str) -> str:
    """The command that finishes a stopped sweep: the same overrides, its out_dir, resume=true."""
    kept = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in ("out_dir", "resume")]
    return shlex.join(["python", "-m", "sweep", *kept, f"out_dir={out_dir}", "resume=true"])


def stopped_line(stopped: SweepStopped, overrides: Sequence[str], out_dir: str) -> str:
    return f"sweep: stopped by {stopped.signal_name}; resume with: {resume_command(overrides, out_dir)}"
