"""python -m sweep.upload: pack folders and upload them to S3 for storage=s3.

The code is in sweep/storage/upload.py."""

import sys

from sweep.storage.upload import main

if __name__ == "__main__":
    sys.exit(main())
