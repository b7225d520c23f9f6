"""One copy of each model on disk: once the registry has logged an exported model (out_dir/best/<task>), each
export file that is byte for byte a file of the logged model becomes a hard link to it.

The registry's artifact store and the export then share their bytes (``du`` counts them once), and neither
depends on the other: deleting the sweep's out_dir, or the registry's artifacts, leaves the other whole (a hard
link is a second name for the same data, not a pointer that can dangle). Where the artifacts are not a folder
on the same file system (a tracking server, S3, another disk) there is nothing to share and nothing changes.
"""

from __future__ import annotations

import filecmp
import logging
import os
import stat
from pathlib import Path
from urllib.parse import unquote, urlparse

log = logging.getLogger(__name__)

SHARED_MIN_BYTES = 1 << 16  # weights and tokenizers, not a config's few hundred bytes: a link saves nothing there


def local_folder(uri: str | None) -> Path | None:
    """The folder an artifact location names on this machine (``file:///…`` or a plain path), else None."""
    if not uri:
        return None
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        path = Path(unquote(parsed.path))
        return path if path.is_dir() else None
    return None


def share_with_artifacts(export: Path, artifacts: Path) -> int:
    """Hard-link each file of ``export`` (recursively) of at least SHARED_MIN_BYTES to the file of the same name
    and the same bytes under ``artifacts``; the bytes no longer stored twice."""
    candidates: dict[tuple[str, int], list[Path]] = {}
    for path in artifacts.rglob("*"):
        if path.is_file() and not path.is_symlink():
            candidates.setdefault((path.name, path.stat().st_size), []).append(path)
    saved = 0
    for path in sorted(Path(export).rglob("*")):
        if not path.is_file() or path.is_symlink():
            continue
        stat = path.stat()
        if stat.st_size < SHARED_MIN_BYTES:
            continue
        for twin in candidates.get((path.name, stat.st_size), []):
            if os.path.samefile(path, twin):
                break  # linked already (a resumed end)
            if filecmp.cmp(path, twin, shallow=False) and _link(twin, path):
                saved += stat.st_size
                break
    return saved


def _link(source: Path, target: Path) -> bool:
    """``target`` replaced by a hard link to ``source``, atomically (a new name, then a rename over it). The
    shared file keeps the export's permissions too (an export is readable by all: a server in a container
    runs as another user; MLflow writes its artifacts 0600)."""
    staged = target.with_name(f".{target.name}.link-{os.getpid()}")
    wanted = stat.S_IMODE(target.stat().st_mode) | stat.S_IMODE(source.stat().st_mode)
    try:
        os.link(source, staged)
    except OSError as e:  # another file system, a store that does not allow links: both copies stay
        log.debug("not linked %s -> %s: %s", target, source, e)
        return False
    os.chmod(staged, wanted)
    os.replace(staged, target)
    return True
