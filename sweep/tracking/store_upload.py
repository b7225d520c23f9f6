"""The sweep's sqlite MLflow store to S3 when the sweep ends, so its records outlive the head's disk.

A KubeRay RayJob deletes its cluster, and with it the head's ``sqlite:///mlflow.db``, when the sweep ends.
With ``storage.output_prefix`` set, the end of the sweep (sweep/outputs/publish.py, ``UploadOutputs``) writes, under
``<output_prefix>/mlflow/``:

    mlflow.db      a consistent copy of the store (sqlite3's backup API, never the raw file being written),
                   its artifact locations made relative: ``mlartifacts/<experiment>/<run>/artifacts``
    mlartifacts/   the artifacts folder beside the store (where sweep.tracking creates experiments)

The head's db records absolute ``file:///…/mlartifacts/…`` locations, which do not exist where the copy is
downloaded; in the copy they are relative to the folder it is opened from:

    aws s3 cp --recursive s3://BUCKET/PREFIX/mlflow/ mlflow/ && cd mlflow \\
        && mlflow ui --backend-store-uri sqlite:///mlflow.db

(from another working directory the runs, params and metrics show but the artifacts are not found).
Artifact locations outside the store's ``mlartifacts/`` are neither uploaded nor changed.

By hand (the line a failed upload prints; the command is sweep/cli/upload_mlflow.py):

    python -m sweep upload-mlflow sqlite:////ABS/mlflow.db s3://BUCKET/PREFIX/mlflow [--endpoint URL]

The upload never fails the sweep: its results and models are already written; a failure is one line.
"""

from __future__ import annotations

import json
import shlex
import sqlite3
import tempfile
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from sweep.failures import first_line
from sweep.secrets import scrub

DB_NAME = "mlflow.db"
ARTIFACTS = "mlartifacts"  # beside the db: sweep.tracking's _artifact_location (a test checks they agree)
SUBDIR = "mlflow"  # under storage.output_prefix
PROG = "python -m sweep upload-mlflow"  # what a failed upload says to run (``sweep upload-mlflow``)


@dataclass(frozen=True)
class Uploaded:
    dest: str  # s3://bucket/prefix/mlflow
    relocated: int  # locations in the copy rewritten from the head's absolute path to mlartifacts/...
    artifact_files: int


def sqlite_file(uri: str | None) -> Path | None:
    """The database file of a ``sqlite:///`` tracking URI (relative or absolute); None for other stores."""
    if not uri or not uri.startswith("sqlite:///") or uri.startswith("sqlite:///:memory:"):
        return None
    return Path(uri.removeprefix("sqlite:///").split("?", 1)[0])


def sweep_store(configured_uri: str | None, out_dir: Path | None) -> str | None:
    """The store the sweep really logged to: the one its parent run was saved with in ``out_dir``
    (a tracking server that did not answer with tracking.required=false means the local sqlite
    fallback), else the configured URI."""
    if out_dir is not None:
        from sweep.tracking import PARENT_FILE

        try:
            saved = json.loads((Path(out_dir) / PARENT_FILE).read_text()).get("uri")
        except (OSError, ValueError, AttributeError):
            saved = None
        if isinstance(saved, str) and "***" not in saved:  # a scrubbed URI is no address
            return saved
    return configured_uri


def snapshot(db: Path, dest: Path) -> None:
    """A consistent copy of ``db`` in ``dest``: sqlite's online backup, safe against a writer."""
    if not db.is_file():
        raise FileNotFoundError(f"no sqlite store at {db}")
    # mode=ro: a missing or moved file is an error, never a new empty database.
    with closing(sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=30)) as source, \
            closing(sqlite3.connect(dest)) as copy:
        source.backup(copy)


def text_columns(conn: sqlite3.Connection) -> list[tuple[str, str]]:
    tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table' "
                                             "AND name NOT LIKE 'sqlite_%'")]
    columns = []
    for table in tables:
        for _, name, kind, *_ in conn.execute(f'PRAGMA table_info("{table}")'):
            if not kind or any(word in kind.upper() for word in ("CHAR", "TEXT", "CLOB")):
                columns.append((table, name))
    return columns


def relocate(copy: Path, artifact_root: Path) -> int:
    """In the copy (never the live store), every location under ``artifact_root`` (``file://`` URI or plain
    path) becomes relative, ``mlartifacts/...``: experiments, runs, logged models, model versions, tags."""
    root = artifact_root.resolve()
    prefixes = sorted({root.as_uri(), str(root), f"file://{root}"}, key=len, reverse=True)
    changed = 0
    with closing(sqlite3.connect(copy)) as conn:
        for table, column in text_columns(conn):
            for prefix in prefixes:
                n = len(prefix)
                cursor = conn.execute(
                    f'UPDATE "{table}" SET "{column}" = ? || substr("{column}", ?) '
                    f'WHERE "{column}" = ? OR substr("{column}", 1, ?) = ?',
                    (ARTIFACTS, n + 1, prefix, n + 1, prefix + "/"))
                changed += cursor.rowcount
        conn.commit()
    return changed


def upload_store(client, tracking_uri: str, dest: str) -> Uploaded:
    """The store's consistent, relocated copy to ``dest``/mlflow.db and its artifacts to ``dest``/mlartifacts/."""
    from sweep.storage.s3 import check_bucket, parse_uri, upload_tree

    db = sqlite_file(tracking_uri)
    if db is None:
        raise ValueError(f"{scrub(tracking_uri)} is not a sqlite:/// store")
    if not db.is_file():
        raise FileNotFoundError(f"no sqlite store at {db}")
    root = db.resolve().parent / ARTIFACTS
    check_bucket(client, parse_uri(dest)[0])  # one clear line, not boto3's paragraph about a temporary file
    with tempfile.TemporaryDirectory(prefix="sweep-mlflow-") as tmp:
        copy = Path(tmp) / DB_NAME
        snapshot(db, copy)
        relocated = relocate(copy, root)
        upload_tree(client, Path(tmp), dest, files=[copy])  # the records first: they matter most
    files = upload_tree(client, root, f"{dest}/{ARTIFACTS}") if root.is_dir() else []
    return Uploaded(dest, relocated, len(files))


def by_hand(tracking_uri: str, dest: str, endpoint: str | None = None, region: str | None = None) -> str:
    words = [*PROG.split(), tracking_uri, dest]
    words += ["--endpoint", endpoint] if endpoint else []
    words += ["--region", region] if region else []
    return scrub(shlex.join(words))


def open_command(dest: str, endpoint: str | None = None) -> str:
    """How to look at the uploaded store: download it, then MLflow's UI from that folder."""
    endpoint_option = f" --endpoint-url {shlex.quote(endpoint)}" if endpoint else ""
    return scrub(f"aws s3 cp --recursive{endpoint_option} {dest}/ {SUBDIR}/ && cd {SUBDIR} && "
                 f"mlflow ui --backend-store-uri sqlite:///{DB_NAME}")


def upload_mlflow(tracking_uri: str | None, output_prefix: str, endpoint: str | None = None,
                  region: str | None = None, out_dir: Path | None = None,
                  emit: Callable[[str], None] = print) -> Uploaded | None:
    """After the sweep: a ``sqlite:///`` store to ``<output_prefix>/mlflow/``, said in one line.

    ``tracking_uri`` is the configured store; with ``out_dir``, the one the sweep really used (``sweep_store``).
    None (and nothing said) for another store (a tracking server keeps its own records). Never raises
    an Exception: a failed upload is one ``warning:`` line with the command that does it by hand.
    """
    try:
        tracking_uri = sweep_store(tracking_uri, out_dir)
    except Exception:  # noqa: BLE001 - the configured store, then
        pass
    if sqlite_file(tracking_uri) is None:
        return None
    dest = f"{output_prefix.rstrip('/')}/{SUBDIR}"
    try:
        from sweep.storage.s3 import endpoint_url, make_client

        shown_endpoint = endpoint_url(endpoint)
        done = upload_store(make_client(endpoint, region), tracking_uri, dest)
    except Exception as e:  # noqa: BLE001 - the sweep's results are written; this must not fail it
        reason = first_line(e, scrubbed=True)
        emit(f"warning: the MLflow store {scrub(tracking_uri)} was not uploaded to {dest}/ ({reason}); "
             f"upload it by hand, on the head before the cluster goes: {by_hand(tracking_uri, dest, endpoint, region)}")
        return None
    emit(f"uploaded: MLflow store ({DB_NAME}, {done.artifact_files} artifact files) -> {dest}/; open it with: "
         f"{open_command(dest, shown_endpoint)}")
    return done
