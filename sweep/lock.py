"""One sweep per out_dir: a lock taken before anything is written there, released however the
sweep ends (the OS drops it with the process, even on SIGKILL).

Two sweeps writing one results file and one Tune experiment at once would corrupt both; the
second is refused with one line naming the first (its pid and start, from a note beside the lock).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from sweep.errors import OutDirInUseError

LOCK_FILE = ".sweep.lock"
OWNER_FILE = ".sweep.lock.owner"  # who holds it; apart from the lock file, which the lock library owns


@contextlib.contextmanager
def hold_out_dir(out_dir: Path) -> Iterator[None]:
    """Hold ``out_dir``'s lock for the block; OutDirInUseError at once if another sweep holds it."""
    from filelock import FileLock, Timeout

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(out_dir / LOCK_FILE))
    try:
        lock.acquire(blocking=False)
    except Timeout:
        raise in_use(out_dir) from None
    owner = out_dir / OWNER_FILE
    try:
        owner.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}))
        yield
    finally:
        owner.unlink(missing_ok=True)
        lock.release()


def check_free(out_dir: Path) -> None:
    """OutDirInUseError now when another sweep holds ``out_dir`` (the command asks before Hydra writes its log
    there); writes nothing: a folder without the lock file is free. ``hold_out_dir`` still takes the lock."""
    from filelock import FileLock, Timeout

    path = Path(out_dir) / LOCK_FILE
    if not path.is_file():
        return
    lock = FileLock(str(path))
    try:
        lock.acquire(blocking=False)
    except Timeout:
        raise in_use(Path(out_dir)) from None
    lock.release()


def in_use(out_dir: Path) -> OutDirInUseError:
    return OutDirInUseError(
        f"out_dir {out_dir} is in use by another sweep ({_owner(out_dir)}); wait for it or choose another out_dir")


def _owner(out_dir: Path) -> str:
    """'pid N on HOST, started at T' from the holder's note ('pid unknown' in the instant before it is written)."""
    try:
        note = json.loads((out_dir / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return "pid unknown"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(note["started"]))
    host = "" if note.get("host") == socket.gethostname() else f" on {note.get('host')}"
    return f"pid {note['pid']}{host}, started at {started}"
