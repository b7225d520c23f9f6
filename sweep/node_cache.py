"""The per-node cache: each object version is downloaded and unpacked at most once per node.

``<target>/.sweep-staged.json`` (the object's URI, ETag and size) is written LAST, inside a
temporary folder that is then renamed into place, so a folder with a matching marker is always
complete. A file lock makes concurrent callers on one node wait for the single download instead
of repeating it. A killed download leaves only a ``.<name>.partial-*`` folder, swept away by the
next call.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from sweep.s3 import RemoteSource

MARKER = ".sweep-staged.json"


@dataclass(frozen=True)
class Staged:
    path: Path
    downloaded: int  # bytes fetched by this call (0 on a cache hit or after waiting for another)
    seconds: float


def read_marker(target: Path) -> dict | None:
    try:
        return json.loads((target / MARKER).read_text())
    except (OSError, ValueError):
        return None


def is_staged(target: Path, source: RemoteSource) -> bool:
    return read_marker(target) == source.version


def _sweep_partials(target: Path) -> None:
    for pattern in (f".{target.name}.partial-*", f".{target.name}.old-*"):
        for stale in target.parent.glob(pattern):
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
            else:  # a half-downloaded archive
                stale.unlink(missing_ok=True)


def stage(target: Path, source: RemoteSource, fetch: Callable[[Path], int]) -> Staged:
    """Make ``target`` hold ``source``'s pinned version; ``fetch(folder)`` fills a fresh folder."""
    started = time.monotonic()
    if is_staged(target, source):  # the common case: no lock, no request
        return Staged(target, 0, time.monotonic() - started)
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.parent / f".{target.name}.lock")):
        if is_staged(target, source):  # another process staged it while we waited
            return Staged(target, 0, time.monotonic() - started)
        _sweep_partials(target)  # what a killed download left behind (we hold the lock: none is live)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
        try:
            downloaded = fetch(tmp)
            (tmp / MARKER).write_text(json.dumps(source.version))  # last: the folder is complete
            old = None
            if target.exists():  # an older version: move it aside, then swap the new one in
                old = target.parent / f".{target.name}.old-{os.getpid()}"
                os.replace(target, old)
            os.replace(tmp, target)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return Staged(target, downloaded, time.monotonic() - started)
