"""The driver's own source folders, shipped to nodes that do not see them (``storage=local``).

On a laptop every node is this machine; on a real cluster a pod sees only its own disk, so a
``storage.data_dir`` or ``model.path`` that exists on the driver's side is missing on the others.
The driver packs each such folder once (a plain tar: weights do not compress), Ray's object store
carries it to any node that lacks the folder (the original workflow's plasma step), and the node
unpacks it safely into its cache, where ``ensure_local`` finds it from then on: once per node,
cached like an S3 source. This module is the plain half (packing, where a copy lives, unpacking);
``cluster/stage_nodes.py`` moves the bytes. Where a node finds each folder is a value of its own
(``SourceFolders``): the settings keep naming the driver's folders.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from sweep.config.settings import Settings
from sweep.files import atomic_folder
from sweep.storage.archive import extract_archive

SHIPPED = "shipped"  # under a node's cache: the copies of the driver's folders
DONE = ".shipped-from"  # inside a copy: which driver folder it is (written last)


def _expand(path: str) -> str:
    return str(Path(os.path.expanduser(path)).resolve())


def driver_folders(settings: Settings) -> dict[str, str]:
    """Config key -> folder, for each source the config names as a folder on the driver's side."""
    if settings.storage.kind != "local":
        return {}
    folders = {}
    if settings.storage.data_dir:
        folders["storage.data_dir"] = _expand(settings.storage.data_dir)
    if settings.model.path:
        folders["model.path"] = _expand(settings.model.path)
    elif settings.storage.model_dir:
        folders["storage.model_dir"] = _expand(settings.storage.model_dir)
    return folders


def copy_of(cache: Path, origin: str) -> Path:
    """Where a node keeps its copy of the driver's folder ``origin``."""
    digest = hashlib.sha256(origin.encode()).hexdigest()[:12]
    return Path(cache) / SHIPPED / f"{Path(origin).name}-{digest}"


def has_copy(cache: Path, origin: str) -> bool:
    return (copy_of(cache, origin) / DONE).is_file()


def missing_here(settings: Settings, cache: Path) -> dict[str, str]:
    """The driver folders this machine neither sees nor holds a copy of."""
    return {key: origin for key, origin in driver_folders(settings).items()
            if not Path(origin).is_dir() and not has_copy(cache, origin)}


def pack(origin: str) -> bytes:
    """The folder as an uncompressed tar of its contents (names relative to the folder)."""
    with tempfile.TemporaryFile() as f:
        with tarfile.open(fileobj=f, mode="w") as tar:
            for child in sorted(Path(origin).iterdir()):
                tar.add(child, arcname=child.name, recursive=True)
        f.seek(0)
        return f.read()


def unpack(blob: bytes, cache: Path, origin: str, max_bytes: int) -> Path:
    """This node's copy of ``origin`` from its packed bytes (safe extraction; once, under a lock)."""
    target = copy_of(cache, origin)
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if has_copy(cache, origin):
            return target
        with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".tar") as f:
            f.write(blob)
            f.flush()
            with atomic_folder(target) as tmp:  # a half-unpacked copy is never taken for one
                extract_archive(Path(f.name), tmp, f"the shipped copy of {origin}", max_bytes)
                (tmp / DONE).write_text(origin)
    return target


@dataclass(frozen=True)
class SourceFolders:
    """Where this machine finds the source folders the settings name: each the driver's folder, or this
    node's shipped copy of it (None: the setting is unset)."""

    data_dir: str | None
    model_dir: str | None
    model_path: str | None


def folders_here(settings: Settings, cache: Path) -> SourceFolders:
    """The settings' source folders on this machine: a driver folder it lacks is its shipped copy here."""
    swap = {key: str(copy_of(cache, origin)) for key, origin in driver_folders(settings).items()
            if not Path(origin).is_dir() and has_copy(cache, origin)}
    return SourceFolders(data_dir=swap.get("storage.data_dir", settings.storage.data_dir),
                         model_dir=swap.get("storage.model_dir", settings.storage.model_dir),
                         model_path=swap.get("model.path", settings.model.path))
