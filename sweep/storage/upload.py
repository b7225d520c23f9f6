"""python -m sweep.upload FOLDER [FOLDER ...] --bucket BUCKET   (pack and upload, nobody tars by hand)

Each folder becomes the object a sweep with ``storage=s3`` expects: by default one ``.tgz`` object
keyed by the folder's name (``roberta-base``, ``glue_data``: the original layout), or with
``--plain`` a prefix of plain objects. Credentials from the AWS chain; the endpoint from
``--endpoint``, ``AWS_ENDPOINT_URL`` or ``ENDPOINT_URL``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sweep.errors import StagingError


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sweep.upload", description=__doc__.splitlines()[0])
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


def main(argv: list[str] | None = None) -> int:
    from tqdm import tqdm

    from sweep.storage.s3 import check_credentials, make_client, upload_folder

    args = parse_args(argv)
    try:
        check_credentials()
        client = make_client(args.endpoint, args.region)
        for folder in args.folders:
            folder = folder.resolve()
            total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0
            with tqdm(total=total, unit="B", unit_scale=True, desc=folder.name, disable=None) as bar:
                source = upload_folder(client, folder, args.bucket, args.key, "prefix" if args.plain else "archive",
                                       progress=bar.update)
            print(f"uploaded {folder} -> {source.uri} ({source.form}, {source.size / 2**20:.1f} MiB, "
                  f"ETag {source.etag[:12]})")
    except StagingError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
