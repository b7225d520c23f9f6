"""Pack folders and upload them to S3 as a sweep with ``storage=s3`` reads them (nobody tars by hand).

Each folder becomes one ``.tgz`` object keyed by the folder's name (``roberta-base``, ``glue_data``: the
original layout), or with ``plain`` a prefix of plain objects. Credentials from the AWS chain; the
endpoint from ``endpoint``, ``AWS_ENDPOINT_URL`` or ``ENDPOINT_URL``. The command is ``sweep upload``
(sweep/cli/upload.py, also ``python -m sweep upload``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

from sweep.storage.s3 import RemoteSource, check_credentials, make_client, upload_folder

# (folder, its size in bytes) -> a context whose value is called with each chunk's bytes as they go
Progress = Callable[[Path, int], AbstractContextManager[Callable[[int], object] | None]]


def folder_size(folder: Path) -> int:
    """The bytes of the files in ``folder`` (0 when it is no folder: the upload says why)."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


def upload_folders(folders: Sequence[Path], bucket: str, key: str | None = None, plain: bool = False,
                   endpoint: str | None = None, region: str | None = None,
                   progress: Progress = lambda folder, size: nullcontext()) -> Iterator[tuple[Path, RemoteSource]]:
    """Upload each folder in turn, yielding (the folder, resolved; what it became). ``key`` names the
    object of one folder (default: the folder's name). A failure is a StagingError (S3Error): one line."""
    check_credentials()
    client = make_client(endpoint, region)
    for folder in folders:
        folder = Path(folder).resolve()
        with progress(folder, folder_size(folder)) as advance:
            source = upload_folder(client, folder, bucket, key, "prefix" if plain else "archive", progress=advance)
        yield folder, source
