"""Paths that are not on this machine's disk: ``s3://…`` (any URI pyarrow opens, as Ray's storage does)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any


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


class JsonFolder:
    """JSON files in one folder, here or at a URI (``s3://…``), each replaced whole: an atomic rename after
    an fsync on a folder, one PUT on S3. A reader sees the old file or the new one, never half of one."""

    def __init__(self, root: str) -> None:
        self.root = str(root).rstrip("/")
        self._fs = None

    def __reduce__(self):  # travels as its root alone (a pyarrow filesystem is per process)
        return (type(self), (self.root,))

    @property
    def remote(self) -> bool:
        return is_remote(self.root)

    def _filesystem(self):
        if self._fs is None:
            import pyarrow.fs

            self._fs, self._base = pyarrow.fs.FileSystem.from_uri(self.root)
        return self._fs

    def read(self, name: str) -> Any | None:
        """``name``.json's content, None when there is none."""
        if not self.remote:
            path = Path(self.root) / f"{name}.json"
            return json.loads(path.read_text()) if path.exists() else None
        import pyarrow

        fs = self._filesystem()
        try:
            with fs.open_input_stream(f"{self._base}/{name}.json") as f:
                return json.loads(f.read())
        except (FileNotFoundError, pyarrow.ArrowIOError) as e:
            if isinstance(e, FileNotFoundError) or "not found" in str(e).lower() or "does not exist" in str(e).lower():
                return None
            raise

    def write(self, name: str, payload: Any) -> None:
        text = json.dumps(payload, default=float)
        if not self.remote:
            from sweep.disk import writing
            from sweep.files import atomic_file

            path = Path(self.root) / f"{name}.json"
            with writing(path.name, path.parent, len(text.encode())), atomic_file(path, fsync=True) as f:
                f.write(text)
            return
        fs = self._filesystem()
        with fs.open_output_stream(f"{self._base}/{name}.json") as f:
            f.write(text.encode())

    def delete(self, name: str) -> None:
        if not self.remote:
            (Path(self.root) / f"{name}.json").unlink(missing_ok=True)
            return
        import pyarrow.fs

        fs = self._filesystem()
        if fs.get_file_info(f"{self._base}/{name}.json").type != pyarrow.fs.FileType.NotFound:
            fs.delete_file(f"{self._base}/{name}.json")

    def names(self) -> list[str]:
        """Every file's name (without .json), sorted."""
        if not self.remote:
            folder = Path(self.root)
            return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []
        import pyarrow.fs

        found = self._filesystem().get_file_info(pyarrow.fs.FileSelector(self._base, allow_not_found=True))
        return sorted(Path(info.path).stem for info in found if info.path.endswith(".json"))
