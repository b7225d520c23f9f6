"""``sweep replay FILE [--uri URI]``: send the MLflow calls a sweep kept while its store did not answer
(``out_dir/mlflow-unsent.jsonl``, or the ``out_dir/mlflow-unsent/`` folder), into the store they were
meant for or the one ``--uri`` names. The replay is sweep/tracking/replaying.py."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

PROG = "sweep replay"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="Send the MLflow calls a sweep kept while the store did not answer.")
    parser.add_argument("file", type=Path, help="a sweep's mlflow-unsent.jsonl (or its mlflow-unsent/ folder)")
    parser.add_argument("--uri", help="the tracking store to send them to (default: the one they were meant for)")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    args = build_parser(prog).parse_args(argv)
    from sweep.errors import TrackingError
    from sweep.secrets import scrub
    from sweep.tracking.replaying import replay
    from sweep.tracking.spool import spool_files

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if not spool_files(args.file):
        print(f"error: replay: {args.file} is not a file or folder of kept MLflow calls", file=sys.stderr)
        return 2
    try:
        done = replay(args.file, args.uri)
    except TrackingError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"replay: {done.sent} MLflow calls sent to {scrub(done.uri)}")
    if done.left:
        print(f"replay: {done.left} calls not sent (the store did not answer or refused them); "
              f"they stay in {done.file}", file=sys.stderr)
        return 1
    return 0
