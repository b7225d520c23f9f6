"""``sweep upload FOLDER [FOLDER ...] --bucket BUCKET`` (also ``python -m sweep upload``): pack folders and
upload them to S3 for ``storage=s3``. The upload is sweep/storage/folder_upload.py."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from sweep.errors import StagingError

PROG = "sweep upload"


def parse_args(argv: Sequence[str] | None, prog: str = PROG) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description="Pack folders and upload them to S3 for storage=s3.")
    parser.add_argument("folders", nargs="+", type=Path, help="a model folder (save_pretrained) or glue_data/")
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--key", help="object key (default: the folder's name); only with one folder")
    parser.add_argument("--plain", action="store_true", help="upload the files as a prefix of plain objects")
    parser.add_argument("--endpoint", help="S3 endpoint URL (default: AWS_ENDPOINT_URL / ENDPOINT_URL / AWS)")
    parser.add_argument("--region")
    args = parser.parse_args(argv)
    if args.key and len(args.folders) > 1:
        parser.error("--key names one object: give one folder with it")
    return args


@contextmanager
def _bar(folder: Path, size: int) -> Iterator[Callable[[int], object]]:
    from tqdm import tqdm

    with tqdm(total=size, unit="B", unit_scale=True, desc=folder.name, disable=None) as bar:
        yield bar.update


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    args = parse_args(argv, prog)
    from sweep.storage.folder_upload import upload_folders

    try:
        for folder, source in upload_folders(args.folders, args.bucket, args.key, args.plain, args.endpoint,
                                             args.region, progress=_bar):
            print(f"uploaded {folder} -> {source.uri} ({source.form}, {source.size / 2**20:.1f} MiB, "
                  f"ETag {source.etag[:12]})")
    except StagingError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
