"""python -m sweep.upload: ``sweep upload`` (sweep/cli/upload.py), folders packed and uploaded for storage=s3."""

import sys

from sweep.cli.upload import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m sweep.upload"))
