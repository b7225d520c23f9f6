"""The sweep's MLflow records kept in ``storage.output_prefix`` while it runs, and taken back by a resumed
sweep on a new cluster (Kueue preempted the RayJob: the head went, its disk with it).

While the sweep runs, ``StoreCopies`` writes what ``store_upload`` writes at the end (a consistent,
relocated copy of a ``sqlite:///`` store and its new artifact files, under ``<output_prefix>/mlflow/``)
after each trial that ended and every ``every_s`` seconds, on one background thread: never in Tune's
event loop, never two at once. Beside it, the parent run's identity (``mlflow-parent.json``), for any
store: with an MLflow server the resumed sweep finds its parent by that id.

``restore_store``: a sweep started with ``resume=true|auto`` whose store is not on this disk takes the
copy back (the reverse of the relocation: ``mlartifacts/...`` becomes this head's absolute location)
before tracking starts, so it reopens the same parent run and each trial finds its run again.
"""

from __future__ import annotations

import json
import logging
import shutil
import sqlite3
import tempfile
import threading
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from sweep.failures import first_line
from sweep.tracking.store_upload import ARTIFACTS, DB_NAME, SUBDIR, sqlite_file, text_columns, upload_store

log = logging.getLogger(__name__)

PARENT_FILE = "mlflow-parent.json"  # sweep.tracking.PARENT_FILE (a test checks they agree): no MLflow import
EVERY_S = 300.0  # a copy at least this often while trials run (and after each trial that ended)


def destination(output_prefix: str) -> str:
    return f"{output_prefix.rstrip('/')}/{SUBDIR}"


def copy_store(client, tracking_uri: str | None, dest: str, out_dir: Path) -> int:
    """One copy: the parent's identity, then (a sqlite store) the store and its artifacts; the files sent."""
    from sweep.storage.s3 import upload_tree

    sent = 0
    if (out_dir / PARENT_FILE).is_file():
        sent += len(upload_tree(client, out_dir, dest, files=[out_dir / PARENT_FILE]))
    if sqlite_file(tracking_uri) is not None:
        done = upload_store(client, tracking_uri, dest)
        sent += 1 + done.artifact_files
    return sent


@dataclass
class StoreCopies:
    """Copies of the store while the sweep runs (see the module's docstring); ``request`` never blocks."""

    tracking_uri: str | None
    output_prefix: str
    out_dir: Path
    endpoint: str | None = None
    region: str | None = None
    every_s: float = EVERY_S

    def __post_init__(self) -> None:
        self.dest = destination(self.output_prefix)
        self.last_at = time.monotonic()
        self.copies = 0
        self._lock = threading.Lock()
        self._again = False  # a request came while a copy ran: one more after it
        self._thread: threading.Thread | None = None
        self._client = None

    def due(self) -> bool:
        return time.monotonic() - self.last_at >= self.every_s

    def request(self) -> None:
        """A copy soon: now on the background thread, or right after the one that runs."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                self._again = True
                return
            self.last_at = time.monotonic()
            self._thread = threading.Thread(target=self._work, name="sweep-mlflow-copies", daemon=True)
            self._thread.start()

    def close(self, wait_s: float = 120.0) -> None:
        """Let the copy that runs finish (the end of the sweep uploads the last one itself)."""
        thread = self._thread
        if thread is not None:
            thread.join(wait_s)

    def _work(self) -> None:
        while True:
            try:
                if self._client is None:
                    from sweep.storage.s3 import make_client

                    self._client = make_client(self.endpoint, self.region)
                copy_store(self._client, self.tracking_uri, self.dest, self.out_dir)
                self.copies += 1
            except Exception as e:  # noqa: BLE001 - a copy that failed: the next one tries again
                log.warning("tracking: the MLflow store was not copied to %s/ (%s); the next copy tries again",
                            self.dest, first_line(e, 300, scrubbed=True))
            with self._lock:
                if not self._again:
                    return
                self._again = False
                self.last_at = time.monotonic()


def unrelocate(db: Path, artifact_root: Path) -> int:
    """The reverse of ``store_upload.relocate`` in a downloaded copy: each ``mlartifacts/...`` location
    becomes this machine's ``file://<artifact_root>/...``."""
    root = artifact_root.resolve().as_uri()
    changed = 0
    with closing(sqlite3.connect(db)) as conn:
        for table, column in text_columns(conn):
            cursor = conn.execute(
                f'UPDATE "{table}" SET "{column}" = ? || substr("{column}", ?) '
                f'WHERE "{column}" = ? OR substr("{column}", 1, ?) = ?',
                (root, len(ARTIFACTS) + 1, ARTIFACTS, len(ARTIFACTS) + 1, ARTIFACTS + "/"))
            changed += cursor.rowcount
        conn.commit()
    return changed


def restore_store(client, tracking_uri: str | None, output_prefix: str, out_dir: Path) -> str | None:
    """A resumed sweep's records taken back from ``<output_prefix>/mlflow/`` when they are not here: the
    sqlite store (when its file is missing) with its artifacts, and the parent's identity (when out_dir
    lacks it, pointed at this store). What was restored, in a few words; None when nothing was. S3 that
    refuses or cannot be reached is one ``S3Error`` line that says so, before the store is opened."""
    from sweep.storage.s3 import S3Error

    try:
        return _restore(client, tracking_uri, output_prefix, out_dir)
    except S3Error as e:
        raise S3Error(f"resume: the sweep's records were not taken back from {destination(output_prefix)}/ "
                      f"({e}); run the same command again once S3 answers") from None


def _restore(client, tracking_uri: str | None, output_prefix: str, out_dir: Path) -> str | None:
    from sweep.storage.s3 import download_object, download_tree, object_exists, parse_uri

    bucket, prefix = parse_uri(destination(output_prefix))
    restored = []
    db = sqlite_file(tracking_uri)
    if db is not None and not db.exists() and object_exists(client, bucket, f"{prefix}/{DB_NAME}"):
        db = db.resolve()
        db.parent.mkdir(parents=True, exist_ok=True)
        artifacts = db.parent / ARTIFACTS
        # Everything lands in a folder beside the store first: a failed download leaves nothing behind.
        with tempfile.TemporaryDirectory(prefix="sweep-mlflow-", dir=db.parent) as tmp:
            copy = Path(tmp) / DB_NAME
            download_object(client, bucket, f"{prefix}/{DB_NAME}", copy)
            unrelocate(copy, artifacts)
            files = download_tree(client, bucket, f"{prefix}/{ARTIFACTS}", Path(tmp) / ARTIFACTS)
            if files:
                shutil.copytree(Path(tmp) / ARTIFACTS, artifacts, dirs_exist_ok=True)
            copy.replace(db)  # the same folder: one rename
        restored.append(f"the store ({DB_NAME}, {files} artifact files)")
    parent = out_dir / PARENT_FILE
    if not parent.exists() and object_exists(client, bucket, f"{prefix}/{PARENT_FILE}"):
        out_dir.mkdir(parents=True, exist_ok=True)
        download_object(client, bucket, f"{prefix}/{PARENT_FILE}", parent)
        if db is not None:  # the same store, at this head's path: saved_parent compares the two
            from sweep.files import write_json
            from sweep.secrets import scrub

            saved = json.loads(parent.read_text())
            write_json(parent, {**saved, "uri": scrub(tracking_uri)}, indent=1)
        restored.append("the parent run's id")
    return " and ".join(restored) or None
