"""Calls a sweep kept while the store did not answer, sent later: ``replay`` (into the store they were
meant for, or another). The command is ``sweep replay FILE [--uri URI]`` (sweep/cli/replay.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from sweep.errors import TrackingError
from sweep.failures import first_line
from sweep.secrets import scrub
from sweep.tracking.sender import Sender
from sweep.tracking.spool import Spool, read_records, spool_files, unreachable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Replayed:
    uri: str
    sent: int
    left: int  # not sent: the store stopped answering, or refused them
    file: Path | None  # where the calls not sent are (None: all sent)


def replay(where: Path, uri: str | None = None) -> Replayed:
    """Send the calls kept in ``where`` (a spool file or folder) to ``uri`` (default: the store they
    were meant for). Runs are found by id, else by parent and name, so a second replay, or one into
    a server that already holds part of the sweep, adds no runs; sent calls leave the file. Stops at
    the first call the store does not answer."""
    files = spool_files(Path(where))
    if uri is None:
        recorded = {r.get("uri") for f in files for r in read_records(f)}
        if len(recorded) != 1:
            raise TrackingError(f"replay: {where} holds calls for {len(recorded)} stores; name one with --uri URI")
        uri = str(recorded.pop())
    sender = Sender(uri)
    sent = 0
    for path in files:
        pending, refused = read_records(path), []
        for i, record in enumerate(pending):
            try:
                sender.send(record)
                sent += 1
            except Exception as e:
                if unreachable(e):
                    Spool(path).keep(refused + pending[i:])
                    return Replayed(uri, sent, _count(files), path)
                refused.append(record)  # kept for a look, not in the way of the rest
                log.warning("replay: %s refused a %s call of run %s: %s", scrub(uri), record.get("op"),
                            record.get("run_name"), first_line(e, 300, scrubbed=True))
        Spool(path).keep(refused)
    return Replayed(uri, sent, _count(files), next((p for p in files if p.exists()), None))


def _count(files: list[Path]) -> int:
    return sum(len(read_records(p)) for p in files if p.exists())
