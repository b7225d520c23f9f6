"""S3 (or any S3-compatible store): the client, what an object key names, fetching it, uploading.

Credentials come only from boto3's standard chain (environment, profile, role); the endpoint from
``storage.endpoint``, else ``AWS_ENDPOINT_URL`` or the original workflow's ``ENDPOINT_URL``, else
AWS. Transient errors are retried by botocore's ``standard`` retry mode (throttling, 5xx,
connection errors, with backoff); 403/404 are not. Every message we raise is scrubbed of the
environment's secret values.

A key names one of two forms: an object holding a tar archive of a folder (the original layout:
key ``roberta-base`` = ``roberta-base.tgz``), or a prefix ``key/`` of plain objects (a folder
uploaded as it is). Both unpack to ``<target>/<folder>/...``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Callable

from sweep.errors import StagingError
from sweep.secrets import scrub
from sweep.storage.archive import UnsafeArchiveError, extract_archive, pack_folder

ENDPOINT_ENV = ("AWS_ENDPOINT_URL", "ENDPOINT_URL")
CHUNK = 8 * 2**20
PARALLEL_GETS = 8
GiB = 2**30
MiB = 2**20
PROGRESS_EVERY_S = 10.0


class S3Error(StagingError):
    """S3 refused or could not be reached; the message names the bucket/key and the fix."""


@dataclass(frozen=True)
class RemoteSource:
    """One staged unit, pinned to the version seen by the driver's preflight."""

    bucket: str
    key: str
    form: str  # archive | prefix
    etag: str  # the archive's ETag, or a digest of the prefix's listing
    size: int  # bytes to download
    objects: tuple[tuple[str, str, int], ...] = ()  # prefix form: (key, etag, size) of each object

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    @property
    def version(self) -> dict[str, Any]:
        return {"uri": self.uri, "form": self.form, "etag": self.etag, "size": self.size}


def parse_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/key`` → (bucket, key); a clear error for anything else."""
    if not uri.startswith("s3://") or "/" not in uri[5:] or not uri[5:].split("/", 1)[1].strip("/"):
        raise S3Error(f"{uri!r} is not an S3 URI of the form s3://BUCKET/KEY")
    bucket, key = uri[5:].split("/", 1)
    return bucket, key.strip("/")


def endpoint_url(configured: str | None = None) -> str | None:
    for value in (configured, *(os.environ.get(name) for name in ENDPOINT_ENV)):
        if value:
            return value
    return None  # AWS


def quiet_botocore() -> None:
    logging.getLogger("botocore").setLevel(logging.WARNING)  # no "Found credentials in ..." lines


def make_client(endpoint: str | None = None, region: str | None = None, attempts: int = 5,
                connect_timeout: float = 10):
    import boto3
    from botocore.config import Config

    quiet_botocore()
    url = endpoint_url(endpoint)
    config = Config(
        retries={"max_attempts": attempts, "mode": "standard"},
        connect_timeout=connect_timeout,
        read_timeout=60,
        # MinIO, Ceph and moto serve buckets by path, not by virtual host.
        s3={"addressing_style": "path" if url else "auto"},
    )
    return boto3.session.Session().client(
        "s3", endpoint_url=url, region_name=region or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
        config=config,
    )


def check_credentials() -> None:
    import boto3

    quiet_botocore()
    if boto3.session.Session().get_credentials() is None:
        raise S3Error(
            "no S3 credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, "
            "or run with an IAM role); they are never read from the sweep config"
        )


def _code(error: Exception) -> str:
    return str(getattr(error, "response", {}).get("Error", {}).get("Code", "")) if hasattr(error, "response") else ""


def _explain(error: Exception, what: str, endpoint: str | None) -> S3Error:
    """A botocore error as one line naming the bucket/key and what to do."""
    from botocore.exceptions import (
        ConnectTimeoutError,
        EndpointConnectionError,
        NoCredentialsError,
        ReadTimeoutError,
    )

    where = endpoint or "AWS S3"
    code = _code(error)
    if isinstance(error, NoCredentialsError):
        return S3Error(f"{what}: no S3 credentials; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    if isinstance(error, (EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError)):
        return S3Error(f"{what}: cannot reach the S3 endpoint {where}; check storage.endpoint "
                       f"(or AWS_ENDPOINT_URL) and that the server is up")
    if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
        return S3Error(f"{what}: access denied ({code}) at {where}; check the credentials and that they "
                       "may read this bucket")
    if code in ("404", "NoSuchBucket", "NoSuchKey"):
        return S3Error(f"{what}: not found at {where}")
    if code in ("412", "PreconditionFailed"):
        return S3Error(f"{what}: the object changed since the sweep started; run the sweep again to stage "
                       "the new version")
    return S3Error(f"{what}: {type(error).__name__}: {scrub(str(error))}")


def check_bucket(client, bucket: str) -> None:
    try:
        client.head_bucket(Bucket=bucket)
    except Exception as e:  # noqa: BLE001 - every botocore failure becomes one explained line
        err = _explain(e, f"s3://{bucket}", client.meta.endpoint_url)
        if _code(e) in ("404", "NoSuchBucket"):
            err = S3Error(f"bucket {bucket!r} does not exist at {client.meta.endpoint_url}; create it or name "
                          "an existing one (storage.bucket)")
        raise err from None


def describe(client, bucket: str, key: str) -> RemoteSource:
    """What ``key`` names now: an archive object, or a prefix of objects (with their ETags)."""
    key = key.strip("/")
    try:
        head = client.head_object(Bucket=bucket, Key=key)
        return RemoteSource(bucket, key, "archive", head["ETag"].strip('"'), int(head["ContentLength"]))
    except Exception as e:  # noqa: BLE001
        if _code(e) not in ("404", "NoSuchKey"):
            raise _explain(e, f"s3://{bucket}/{key}", client.meta.endpoint_url) from None
    objects = []
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key + "/"):
            for obj in page.get("Contents", []):
                if not obj["Key"].endswith("/"):  # folder placeholders some tools write
                    objects.append((obj["Key"], obj["ETag"].strip('"'), int(obj["Size"])))
    except Exception as e:  # noqa: BLE001
        raise _explain(e, f"s3://{bucket}/{key}/", client.meta.endpoint_url) from None
    if not objects:
        raise S3Error(
            f"s3://{bucket}/{key} not found: neither an object nor a prefix {key}/ with objects; upload it "
            f"with `python -m sweep upload FOLDER --bucket {bucket} --key {key}`"
        )
    objects.sort()
    digest = hashlib.sha256(repr(objects).encode()).hexdigest()[:32]
    return RemoteSource(bucket, key, "prefix", digest, sum(size for _, _, size in objects), tuple(objects))


def _relative(source: RemoteSource, key: str) -> Path:
    """Where a prefix object lands below the target: ``<last part of the prefix>/<rest>``."""
    parent = source.key.rsplit("/", 1)[0] + "/" if "/" in source.key else ""
    rel = PurePosixPath(key[len(parent):])
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise UnsafeArchiveError(f"{source.uri}: object {key!r} would land outside the target; refused")
    return Path(*rel.parts)


def print_progress(message: str) -> None:
    print(f"staging: {message}", flush=True)


class DownloadProgress:
    """A line every ``every_s`` seconds while a big download runs (``s3://…: 120.0 / 480.0 MiB (25%), …``).

    Plain lines, not a tqdm bar: on a cluster they are relayed from each node's staging task to
    the driver (``emit``), where a bar's carriage returns would mean nothing. A download shorter
    than ``every_s`` says nothing; the driver reports each node's total after.
    """

    def __init__(self, label: str, total: int, every_s: float = PROGRESS_EVERY_S,
                 emit: Callable[[str], None] = print_progress) -> None:
        self.label, self.total, self.every_s, self.emit = label, total, every_s, emit
        self.done = 0
        self._started = self._last = time.monotonic()
        self._lock = threading.Lock()  # a prefix's objects arrive on several threads

    def add(self, n: int) -> None:
        with self._lock:
            self.done += n
            now = time.monotonic()
            if now - self._last < self.every_s:
                return
            self._last = now
            rate = self.done / MiB / max(now - self._started, 1e-9)
            share = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
            self.emit(f"{self.label}: {self.done / MiB:.1f} / {self.total / MiB:.1f} MiB{share}, {rate:.1f} MiB/s")


def _get(client, bucket: str, key: str, etag: str, dest: Path, progress: DownloadProgress | None = None) -> int:
    """One GET, pinned to ``etag`` (If-Match): a changed object fails instead of mixing versions."""
    try:
        body = client.get_object(Bucket=bucket, Key=key, IfMatch=f'"{etag}"')["Body"]
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(dest, "wb") as out:
            while chunk := body.read(CHUNK):
                out.write(chunk)
                if progress is not None:
                    progress.add(len(chunk))
        return dest.stat().st_size
    except (OSError, UnsafeArchiveError):
        raise
    except Exception as e:  # noqa: BLE001
        raise _explain(e, f"s3://{bucket}/{key}", client.meta.endpoint_url) from None


def fetch(client, source: RemoteSource, target: Path, max_bytes: int,
          progress_every_s: float = PROGRESS_EVERY_S, emit: Callable[[str], None] = print_progress) -> int:
    """Download ``source`` into the (fresh, empty) folder ``target`` and unpack it; bytes downloaded."""
    progress = DownloadProgress(source.uri, source.size, progress_every_s, emit)
    if source.form == "archive":
        if source.size > max_bytes:
            raise StagingError(f"{source.uri}: {source.size / GiB:.2f} GiB is over storage.max_unpack_gb")
        archive = target.with_name(target.name + ".download")  # beside the folder, swept with it
        try:
            moved = _get(client, source.bucket, source.key, source.etag, archive, progress)
            extract_archive(archive, target, source.uri, max_bytes)
        finally:
            archive.unlink(missing_ok=True)
        return moved
    if source.size > max_bytes:
        raise StagingError(f"{source.uri}/: {source.size / GiB:.2f} GiB is over storage.max_unpack_gb")
    jobs = [(key, etag, target / _relative(source, key)) for key, etag, _ in source.objects]
    with ThreadPoolExecutor(PARALLEL_GETS) as pool:
        return sum(pool.map(lambda job: _get(client, source.bucket, job[0], job[1], job[2], progress), jobs))


# --- upload ----------------------------------------------------------------------------------


def upload_folder(client, folder: Path, bucket: str, key: str | None = None, form: str = "archive",
                  progress=None) -> RemoteSource:
    """Upload a folder as the sweep expects it: one ``.tgz`` object (default) or a prefix of objects."""
    from boto3.s3.transfer import TransferConfig

    folder = Path(folder).resolve()
    if not folder.is_dir():
        raise StagingError(f"{folder} is not a folder; give the model folder or glue_data/ to upload")
    key = (key or folder.name).strip("/")
    check_bucket(client, bucket)
    transfer = TransferConfig(multipart_threshold=64 * 2**20, max_concurrency=PARALLEL_GETS)
    try:
        if form == "archive":
            with tempfile.TemporaryDirectory(prefix="sweep-upload-") as tmp:
                archive = pack_folder(folder, Path(tmp) / f"{folder.name}.tgz")
                client.upload_file(str(archive), bucket, key, Config=transfer, Callback=progress)
        elif form == "prefix":
            files = sorted(p for p in folder.rglob("*") if p.is_file())
            for path in files:
                rel = path.relative_to(folder).as_posix()
                client.upload_file(str(path), bucket, f"{key}/{rel}", Config=transfer, Callback=progress)
        else:
            raise StagingError(f"form {form!r}: use archive (one .tgz object) or prefix (plain objects)")
    except StagingError:
        raise
    except Exception as e:  # noqa: BLE001
        raise _explain(e, f"s3://{bucket}/{key}", client.meta.endpoint_url) from None
    return describe(client, bucket, key)


def upload_tree(client, folder: Path, uri: str, files: list[Path] | None = None) -> list[str]:
    """Every file below ``folder`` (or just ``files``) to ``uri``/<relative path>; the keys written."""
    bucket, prefix = parse_uri(uri)
    keys = []
    for path in sorted(files if files is not None else (p for p in Path(folder).rglob("*") if p.is_file())):
        key = f"{prefix}/{path.relative_to(folder).as_posix()}"
        try:
            client.upload_file(str(path), bucket, key)
        except Exception as e:  # noqa: BLE001
            raise _explain(e, f"s3://{bucket}/{key}", client.meta.endpoint_url) from None
        keys.append(key)
    return keys


# --- download of plain objects (the MLflow records a resumed sweep takes back) ------------------


def object_exists(client, bucket: str, key: str) -> bool:
    """Whether ``key`` is an object; a refusal or an unreachable endpoint is an ``S3Error``, not a no."""
    try:
        client.head_object(Bucket=bucket, Key=key)
        return True
    except Exception as e:  # noqa: BLE001
        if _code(e) in ("404", "NoSuchKey", "NotFound"):
            return False
        raise _explain(e, f"s3://{bucket}/{key}", client.meta.endpoint_url) from None


def download_object(client, bucket: str, key: str, dest: Path) -> None:
    try:
        client.download_file(bucket, key, str(dest))
    except OSError:
        raise
    except Exception as e:  # noqa: BLE001
        raise _explain(e, f"s3://{bucket}/{key}", client.meta.endpoint_url) from None


def download_tree(client, bucket: str, prefix: str, target: Path) -> int:
    """Every object under ``prefix``/ into ``target`` by its relative key; a key that would land outside
    ``target`` is refused before anything is written. The number of files."""
    prefix = prefix.strip("/")
    try:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/")
        keys = [item["Key"] for page in pages for item in page.get("Contents", [])]
    except Exception as e:  # noqa: BLE001
        raise _explain(e, f"s3://{bucket}/{prefix}/", client.meta.endpoint_url) from None
    files = []
    for key in keys:
        rel = PurePosixPath(key[len(prefix) + 1:])
        if rel.is_absolute() or ".." in rel.parts or not rel.parts:
            raise UnsafeArchiveError(f"s3://{bucket}/{key}: a key that leaves {target}; refused")
        files.append((key, target.joinpath(*rel.parts)))
    for key, path in files:
        path.parent.mkdir(parents=True, exist_ok=True)
        download_object(client, bucket, key, path)
    return len(files)
