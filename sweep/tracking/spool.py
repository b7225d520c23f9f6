"""MLflow calls that could not be sent, kept on disk until a server takes them.

Each run (a trial's nested run, the sweep's parent) writes its unsent calls to its own JSON-lines
file under ``<out_dir>/mlflow-unsent/``: one writer per file, so processes on one machine never
interleave lines. A record names its run by identity (experiment, parent run, run name, run id if
it was ever created), not only by id, so it can be replayed into a server that never saw the run.
At the end of a sweep the driver merges what is left into one file, ``mlflow-unsent.jsonl``.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from sweep.files import write_text

log = logging.getLogger(__name__)

SPOOL_DIR = "mlflow-unsent"  # one file per run, while the sweep runs
UNSENT_FILE = "mlflow-unsent.jsonl"  # what is left at the end, for `sweep replay` (python -m sweep replay)
Record = dict[str, Any]

# Raised by MLflow's REST client when no answer came (connection refused, timeout, 5xx after its
# own retries), as opposed to an answer that refuses the call (a bad param: a real error).
_NO_ANSWER = re.compile(r"API request to .* failed with (exception|timeout)|Max retries exceeded"
                        r"|Connection (refused|reset|aborted)|Read timed out|RemoteDisconnected"
                        r"|Bad Gateway|Service Unavailable|Gateway Time-?out", re.I)


def unreachable(error: BaseException) -> bool:
    """The store did not answer (down, restarting, unreachable): keep the call for later, not a bug."""
    if isinstance(error, (ConnectionError, TimeoutError)):
        return True
    try:
        import requests

        if isinstance(error, (requests.ConnectionError, requests.Timeout)):
            return True
    except ImportError:  # pragma: no cover - mlflow depends on requests
        pass
    return bool(_NO_ANSWER.search(str(error)))


def _file_name(run_name: str) -> str:
    return re.sub(r"[^\w.-]", "_", run_name)[:200] + ".jsonl"


def spool_for(folder: str | Path, run_name: str) -> Spool:
    """The spool file of run ``run_name``: ``<folder>/<run name>.jsonl``."""
    return Spool(Path(folder) / _file_name(run_name))


class Spool:
    """One run's unsent calls, oldest first, one JSON object a line (one writer per file)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def append(self, record: Record) -> bool:
        """Add a call; False (and a warning) when the file cannot be written: the call is lost, training goes on."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as f:
                f.write(json.dumps(record, sort_keys=True) + "\n")
                f.flush()
                os.fsync(f.fileno())  # a killed trial process keeps what it spooled
            return True
        except OSError as e:
            log.warning("tracking: cannot keep an unsent MLflow call in %s (%s); it is lost", self.path, e)
            return False

    def pending(self) -> list[Record]:
        return read_records(self.path) if self.path.exists() else []

    def keep(self, records: list[Record]) -> None:
        """What is still unsent replaces the file (atomically); nothing left: no file."""
        if records:
            write_text(self.path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
        else:
            self.path.unlink(missing_ok=True)


def read_records(path: Path) -> list[Record]:
    """The records of one spool file; a line cut short by a killed writer is skipped."""
    records = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            log.warning("tracking: %s line %d is cut short (a killed writer); skipped", path, n)
    return records


def spool_files(where: Path) -> list[Path]:
    """The spool files of a folder (sorted), or the one file given."""
    where = Path(where)
    if where.is_dir():
        return sorted(where.glob("*.jsonl"))
    return [where] if where.is_file() else []


def merge(folder: Path, into: Path) -> int:
    """Move every record left under ``folder`` to the end of ``into``; the count moved."""
    files = spool_files(folder)
    records = [r for f in files for r in read_records(f)]
    if records:
        before = into.read_text() if into.exists() else ""
        write_text(into, before + "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    for f in files:
        f.unlink(missing_ok=True)
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
    return len(records)
