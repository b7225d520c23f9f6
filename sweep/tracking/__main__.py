"""``python -m sweep.tracking replay FILE [--uri URI]``: send the MLflow calls a sweep kept."""

import sys

from sweep.tracking.replaying import main

if __name__ == "__main__":
    sys.exit(main())
