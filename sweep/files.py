"""The one way this project writes a file or a folder that others read: beside the target, then rename.

A process killed halfway (a preempted node, Ctrl-C, an OOM kill) leaves a dot-named temporary
next to the target, never a half-written target: readers, a resumed sweep and a second trial on the
same node only ever see the old version or the new one. Folder temporaries are named
``.<target>.partial-*`` so that a later writer, holding the target's lock, can sweep them away.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from sweep.disk import writing

FILE_MODE, FOLDER_MODE = 0o644, 0o755  # what a published file or folder is: anyone may read it


@contextmanager
def atomic_file(path: str | Path, mode: str = "w", fsync: bool = False) -> Iterator[IO]:
    """Open a temporary beside ``path`` for writing; it becomes ``path`` when the block ends cleanly.
    ``fsync``: its bytes are on the disk before the rename (a record a power cut must not lose)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"newline": ""})) as f:
            yield f
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, FILE_MODE)  # mkstemp's 0600 would hide a shared file from other users
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: str | Path, text: str, *, key: str | None = None) -> Path:
    """``text`` into ``path`` atomically; a full disk is a DiskFullError naming the folder, the
    bytes and ``key`` (the setting that moves the folder)."""
    path = Path(path)
    with writing(path.name, path.parent, len(text.encode()), key), atomic_file(path) as f:
        f.write(text)
    return path


def write_json(path: str | Path, payload: Any, *, key: str | None = None, **dumps: Any) -> Path:
    return write_text(path, json.dumps(payload, **dumps), key=key)


def partial_folders(target: Path) -> list[Path]:
    """What interrupted writers of ``target`` left behind (safe to remove only under the target's lock)."""
    return [p for pattern in (f".{target.name}.partial-*", f".{target.name}.old-*")
            for p in target.parent.glob(pattern)]


def share(folder: str | Path) -> None:
    """Every file under ``folder`` 0644 (0755 if executable), every folder 0755; links are left alone.

    Writers leave private files behind: safetensors (so every ``save_pretrained``) writes 0600 through a
    temporary file, ``tempfile`` makes 0600 files and 0700 folders; a copy keeps them. A server or a node
    running as another user must read what was published.
    """
    for root, _, files in os.walk(folder):  # it enters no linked folder: what a link points to is not ours
        os.chmod(root, FOLDER_MODE)
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                executable = os.stat(path).st_mode & 0o111
                os.chmod(path, FOLDER_MODE if executable else FILE_MODE)


@contextmanager
def atomic_folder(target: str | Path) -> Iterator[Path]:
    """Yield an empty folder beside ``target``; fill it, and when the block ends cleanly it replaces
    ``target`` (an older ``target`` is moved aside first, then removed), readable by all (``share``). On an
    error nothing changes.

    Two writers of one target must hold a lock around this (each caller keeps its own FileLock).
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        yield tmp
        share(tmp)
        old = None
        if target.exists() or target.is_symlink():
            old = target.parent / f".{target.name}.old-{os.getpid()}"
            os.replace(target, old)
        os.replace(tmp, target)
        if old is not None:
            _remove(old)
    finally:
        _remove(tmp)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def sweep_partials(target: Path) -> None:
    for stale in partial_folders(Path(target)):
        _remove(stale)


MODEL_CONFIG = "config.json"  # what every save_pretrained folder holds


def is_model_folder(path: Path) -> bool:
    return (Path(path) / MODEL_CONFIG).is_file()


def require_model_folder(path: Path, label: str, hint: str) -> Path:
    """``path`` if it is a save_pretrained folder; else a ModelSourceError: ``<label> <path> <why>; <hint>``."""
    from sweep.errors import ModelSourceError

    path = Path(path)
    if not path.is_dir():
        why = "is not a folder" if path.exists() else "does not exist"
        raise ModelSourceError(f"{label} {path} {why}; {hint}")
    if not is_model_folder(path):
        raise ModelSourceError(
            f"{label} {path} has no {MODEL_CONFIG} (not a folder written by save_pretrained); {hint}")
    return path
