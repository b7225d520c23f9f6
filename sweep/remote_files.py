"""Paths that are not on this machine's disk: ``s3://…`` (any URI pyarrow opens, as Ray's storage does)."""

from __future__ import annotations

import shutil
from pathlib import Path


def is_remote(path: str) -> bool:
    """s3://…, gs://…: a place reached through pyarrow, not this machine's disk."""
    return "://" in str(path)


def uri_of(filesystem, path: str) -> str:
    """A pyarrow filesystem's path as a URI (``s3://bucket/key``), or the plain path on a local one."""
    scheme = filesystem.type_name if filesystem is not None else "local"
    return path if scheme == "local" else f"{scheme}://{path}"


def fetch_folder(uri: str, dest: Path) -> Path:
    """Copy the folder at ``uri`` (e.g. a checkpoint in ``cluster.storage_path=s3://…``) to ``dest``."""
    import pyarrow.fs

    fs, path = pyarrow.fs.FileSystem.from_uri(uri)
    Path(dest).mkdir(parents=True, exist_ok=True)
    pyarrow.fs.copy_files(path, str(dest), source_filesystem=fs, destination_filesystem=pyarrow.fs.LocalFileSystem())
    return Path(dest)


def remove_folder(path: str | Path) -> None:
    """Delete a folder here or at a URI; one already gone is no error."""
    if not is_remote(str(path)):
        shutil.rmtree(path, ignore_errors=True)
        return
    import pyarrow.fs

    fs, where = pyarrow.fs.FileSystem.from_uri(str(path))
    if fs.get_file_info(where).type != pyarrow.fs.FileType.NotFound:
        fs.delete_dir(where)
