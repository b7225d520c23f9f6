"""``sweep upload-mlflow sqlite:////ABS/mlflow.db s3://BUCKET/PREFIX/mlflow [--endpoint URL] [--region R]``

By hand, what a sweep with ``storage.output_prefix`` does when it ends (sweep/tracking/store_upload.py):
a consistent copy of the sqlite MLflow store, its artifact locations made relative, and its artifacts,
under the destination. A failed upload at the end of a sweep prints this command (as ``python -m sweep
upload-mlflow …``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from sweep.failures import first_line
from sweep.secrets import scrub
from sweep.tracking.store_upload import DB_NAME, sqlite_file, upload_store

PROG = "sweep upload-mlflow"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="A sweep's sqlite MLflow store and its artifacts to S3, openable where downloaded.")
    parser.add_argument("tracking_uri", help="the store, sqlite:////ABSOLUTE/mlflow.db (or relative to here)")
    parser.add_argument("dest", help="s3://BUCKET/PREFIX/mlflow: mlflow.db and mlartifacts/ go below it")
    parser.add_argument("--endpoint", help="S3 endpoint URL (default: AWS_ENDPOINT_URL / ENDPOINT_URL / AWS)")
    parser.add_argument("--region")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if sqlite_file(args.tracking_uri) is None:
        parser.error(f"{scrub(args.tracking_uri)}: only a sqlite:/// store is uploaded")
    from sweep.storage.s3 import make_client

    try:
        done = upload_store(make_client(args.endpoint, args.region), args.tracking_uri, args.dest.rstrip("/"))
    except Exception as e:  # noqa: BLE001 - one line, whatever went wrong
        print(f"error: {first_line(e, scrubbed=True)}", file=sys.stderr)
        return 1
    print(f"uploaded: {DB_NAME} and {done.artifact_files} artifact files -> {done.dest}/")
    return 0
