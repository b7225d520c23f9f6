"""The per-node cache: each object version is downloaded and unpacked at most once per node.

``<target>/.sweep-staged.json`` (the object's URI, ETag and size) is written LAST, inside a
temporary folder that is then renamed into place, so a folder with a matching marker is always
complete. A file lock makes concurrent callers on one node wait for the single download instead
of repeating it. A killed download leaves only a ``.<name>.partial-*`` folder, swept away by the
next call.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from sweep.files import atomic_folder, sweep_partials, write_json
from sweep.storage import s3
from sweep.storage.s3 import RemoteSource

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


def stage(target: Path, source: RemoteSource, fetch: Callable[[Path], int]) -> Staged:
    """Make ``target`` hold ``source``'s pinned version; ``fetch(folder)`` fills a fresh folder."""
    started = time.monotonic()
    if is_staged(target, source):  # the common case: no lock, no request
        return Staged(target, 0, time.monotonic() - started)
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.parent / f".{target.name}.lock")):
        if is_staged(target, source):  # another process staged it while we waited
            return Staged(target, 0, time.monotonic() - started)
        sweep_partials(target)  # what a killed download left behind (we hold the lock: none is live)
        with atomic_folder(target) as tmp:
            downloaded = fetch(tmp)
            write_json(tmp / MARKER, source.version)  # last: the folder is complete
    return Staged(target, downloaded, time.monotonic() - started)


def download_prefix(uri: str, dest: Path, endpoint: str | None = None, max_unpack_gb: float = 64) -> Path:
    """Stage ``s3://bucket/key`` (an archive or a prefix) into ``dest``, once per version; the folder it
    holds (its single top folder, e.g. ``dest/<key name>``, else ``dest`` itself)."""
    s3.check_credentials()
    bucket, key = s3.parse_uri(uri)
    client = s3.make_client(endpoint)
    source = s3.describe(client, bucket, key)
    root = stage(Path(dest), source, lambda tmp: s3.fetch(client, source, tmp, int(max_unpack_gb * s3.GiB))).path
    entries = [p for p in root.iterdir() if p.name != MARKER]
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else root
