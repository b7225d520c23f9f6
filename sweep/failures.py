"""Which trial failures a retry can fix, in plain Python (no Ray import; unit-tested without Ray).

A trial that fails on its own data, config or the model's limits fails the same way every time:
it is marked failed at once. Everything else (a killed process, a lost node, a transient S3 or
MLflow error, anything we do not recognise) is an infrastructure fault and is retried as before.

Ray wraps a trial's exception in layers (Train's ``WorkerGroupError`` holding each rank's failure,
``UserExceptionWithTraceback``, ``RayTaskError``); ``causes`` walks them all by their attributes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from sweep.errors import ConfigError, DataFormatError, DiskFullError, ModelSourceError, StagingError, TrackingError
from sweep.secrets import scrub

# Our own verdicts on the trial's inputs: never retried, whatever else went wrong with them.
SWEEP_TRIAL_ERRORS = (ConfigError, DataFormatError, ModelSourceError, StagingError)
# What the data or model raise where a row, a label or a sequence does not fit: a label outside the
# task's (KeyError/ValueError), a sequence longer than the model's positions (torch's IndexError
# "index out of range in self"), a tensor of the wrong shape or type (ValueError/TypeError).
BUILTIN_TRIAL_ERRORS = (LookupError, ValueError, TypeError)
# Faults of the machine, the network or the tracking store: raised (and retried) even when a
# trial error was raised from them. A full disk is raised too: the sweep ends on it (disk_stop).
INFRA_ERRORS = (OSError, MemoryError, TrackingError, DiskFullError)
# Ray's own failures (by name: no Ray import here): a process or node that went away.
RAY_INFRA_ERRORS = frozenset({
    "RayActorError", "ActorDiedError", "ActorUnavailableError", "WorkerCrashedError", "NodeDiedError",
    "ObjectLostError", "OwnerDiedError", "ObjectFetchTimedOutError", "RaySystemError", "GetTimeoutError",
    "OutOfMemoryError", "TaskUnschedulableError", "ActorUnschedulableError", "PreemptionError",
})


def causes(error: BaseException) -> Iterator[BaseException]:
    """The error and every error inside it: Python's chain and Ray's wrappers, each once."""
    seen: set[int] = set()
    todo = [error]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        inner = [e.__cause__, None if e.__suppress_context__ else e.__context__,
                 getattr(e, "_base_exc", None),  # Train's UserExceptionWithTraceback
                 getattr(e, "cause", None)]  # RayTaskError
        failures = getattr(e, "worker_failures", None)  # Train's WorkerGroupError: rank -> error
        if isinstance(failures, dict):
            inner += list(failures.values())
        todo += [i for i in inner if isinstance(i, BaseException)]


def trial_error(error: BaseException) -> BaseException | None:
    """The trial's own error inside ``error`` (a retry would fail the same way), or None: retry it."""
    chain = list(causes(error))
    ours = [e for e in chain if isinstance(e, SWEEP_TRIAL_ERRORS)]
    if ours:
        return ours[0]
    if any(isinstance(e, INFRA_ERRORS) or type(e).__name__ in RAY_INFRA_ERRORS for e in chain):
        return None
    # not a Ray wrapper (Train's wrappers subclass Exception only; this keeps any that may not)
    builtin = [e for e in chain if isinstance(e, BUILTIN_TRIAL_ERRORS) and not _wraps(e)]
    return builtin[0] if builtin else None


def is_retryable(error: BaseException) -> bool:
    return trial_error(error) is None


def first_line(error: BaseException, limit: int | None = None, scrubbed: bool = False) -> str:
    """The first line of the error's message, or its type name when it has none, cut to ``limit``
    characters. ``scrubbed``: secrets and URL passwords replaced (sweep.secrets.scrub) in the whole
    message before it is cut, so a cut never leaves the start of a secret behind."""
    text = scrub(str(error)) if scrubbed else str(error)
    return (text.splitlines()[0] if text else type(error).__name__)[:limit]


def last_line(error: BaseException, limit: int = 500) -> str:
    """The last line of an error Ray wrapped in several layers (a trial's Tune error): its root
    cause, which is what a person needs; the error's repr when it has no message."""
    lines = str(error).strip().splitlines()
    return lines[-1][:limit] if lines else repr(error)


TRACEBACK = "Traceback (most recent call last):"


def error_line(error: BaseException) -> str:
    """One line for the results and the progress: ``Type: message`` (the message's first line; of a message
    that is a whole traceback, as Tune's TuneError carries a callback's, the first line of the exception
    after its last frame: the root cause)."""
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    if lines and lines[0].startswith(TRACEBACK):  # the exception's first line follows the last (indented) frame
        frames = [i for i, line in enumerate(lines) if line[:1].isspace()]
        lines = lines[frames[-1] + 1:] if frames and frames[-1] + 1 < len(lines) else lines[-1:]
    text = lines[0].strip() if lines else ""
    name = type(error).__name__
    return (f"{name}: {text}" if text else name)[:500]


# Ray's memory monitor: "Memory on the node (IP: 10.0.0.5, ID: 8a27…) was 21.70GB used / 23.47GB limit (0.92…)"
# (Ray 2.60; before: "… where the task (…) was running was 21.70GB / 23.47GB (0.92…), which exceeds …")
RAY_MEMORY_KILL = re.compile(
    r"Memory on the node \(IP: ([^,]+), ID: (\w+)\).*? was ([\d.]+)GB(?: used)? / ([\d.]+)GB", re.S)
# A worker gone without a word (Ray: "Worker unexpectedly exits …", a SIGKILL, as the kernel's OOM killer sends)
RAY_WORKER_DIED = ("worker process has died", "Worker unexpectedly exits")
MEMORY_HINT = "lower train.batch_size or give the trial more memory"


def trial_failure_line(error: BaseException | str) -> str:
    """The one line of a trial that failed for good: killed for memory, its process gone, else the root cause."""
    text = str(error)
    memory = RAY_MEMORY_KILL.search(text)
    if memory:
        ip, node, used, total = memory.groups()
        return (f"killed for memory: {float(used):.1f} of {float(total):.1f} GB used on node {ip} ({node[:8]}); "
                f"{MEMORY_HINT}")
    if any(mark in text for mark in RAY_WORKER_DIED):
        return ("killed: the trial's process died without an error (a SIGKILL, as the kernel's OOM killer sends, "
                f"or a crash); if it ran out of memory, {MEMORY_HINT}")
    return last_line(error) if isinstance(error, BaseException) else (text.strip().splitlines() or [text])[-1][:500]


def _wraps(error: BaseException) -> bool:
    return any(getattr(error, a, None) is not None for a in ("_base_exc", "cause", "worker_failures"))
