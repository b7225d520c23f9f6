"""Import kserve without letting it read our command line.

kserve parses ``sys.argv`` when imported (its ModelServer's flags, prefixes allowed): a
``key=value`` argument of ``python -m sweep serve`` or ``--grpc`` of ``python -m sweep infer``
must not reach it. It also takes seconds to import, so callers import it late.
"""

from __future__ import annotations

import sys
from typing import Any


def import_kserve() -> Any:
    """The kserve package (and kserve.model_server), imported with an empty argv."""
    saved = sys.argv
    sys.argv = saved[:1]
    try:
        import kserve
        import kserve.model_server
    finally:
        sys.argv = saved
    return kserve
