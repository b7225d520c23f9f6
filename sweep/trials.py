"""Each trial's own record of its evaluations, kept in the sweep's storage and read back by the driver.

A trial writes ``<storage>/history/<Tune trial id>.json`` after every evaluation, from whatever
node runs it; the driver reads it for the records (Tune's own table of a killed driver misses the
last rows), a resumed sweep for the trials already done and for the rungs its new board must learn.
The storage is a folder every node sees, or ``s3://…`` (any URI pyarrow opens, as Ray's own
storage does): both are written and read through this one module, so nothing depends on the
driver and the trial sharing a disk. Rows are plain JSON values; a file is replaced whole (an
atomic rename on a folder, one PUT on S3), never seen half-written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sweep.files import write_json
from sweep.remote_files import is_remote

Row = dict[str, Any]
FOLDER = "history"


class TrialHistories:
    """The history files of one sweep, under ``root`` (``<storage path>/history``, a folder or URI)."""

    def __init__(self, root: str) -> None:
        self.root = str(root).rstrip("/")
        self._fs = None

    def __reduce__(self):  # travels to the trials as its root alone (a pyarrow filesystem is per process)
        return (TrialHistories, (self.root,))

    @property
    def remote(self) -> bool:
        return is_remote(self.root)

    def _filesystem(self):
        if self._fs is None:
            import pyarrow.fs

            self._fs, self._base = pyarrow.fs.FileSystem.from_uri(self.root)
        return self._fs

    def location(self, trial_id: str) -> str:
        return f"{self.root}/{trial_id}.json"

    def read(self, trial_id: str) -> list[Row]:
        """The trial's rows, oldest first ([] when it has written none)."""
        if not self.remote:
            path = Path(self.root) / f"{trial_id}.json"
            return json.loads(path.read_text()) if path.exists() else []
        import pyarrow

        fs = self._filesystem()
        try:
            with fs.open_input_stream(f"{self._base}/{trial_id}.json") as f:
                return json.loads(f.read())
        except (FileNotFoundError, pyarrow.ArrowIOError) as e:
            if isinstance(e, FileNotFoundError) or "not found" in str(e).lower() or "does not exist" in str(e).lower():
                return []
            raise

    def write(self, trial_id: str, rows: list[Row]) -> None:
        if not self.remote:
            write_json(Path(self.root) / f"{trial_id}.json", rows)
            return
        fs = self._filesystem()
        with fs.open_output_stream(f"{self._base}/{trial_id}.json") as f:
            f.write(json.dumps(rows).encode())

    def all(self) -> dict[str, list[Row]]:
        """Every trial's rows by Tune trial id, in the ids' order."""
        if not self.remote:
            folder = Path(self.root)
            return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))} if folder.is_dir() else {}
        import pyarrow.fs

        fs = self._filesystem()
        found = fs.get_file_info(pyarrow.fs.FileSelector(self._base, allow_not_found=True))
        ids = sorted(Path(info.path).stem for info in found if info.path.endswith(".json"))
        return {trial_id: self.read(trial_id) for trial_id in ids}
