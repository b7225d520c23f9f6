"""``sweep submit`` (also ``python -m sweep submit``): the sweep as a Ray Job on a running cluster, and its jobs.

    sweep submit --address http://HEAD:8265 [--working-dir DIR] [--no-wait] [--job-id ID] -- task=RTE ...
    sweep submit status JOB_ID | logs JOB_ID [--follow] | stop JOB_ID | list     [--address URL]

The command line becomes a ``Command``; what is done with it is sweep/cluster/jobs.py (Ray's Jobs API).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from sweep.cluster.jobs import (
    ACTIONS,
    EXIT_DETACHED,
    EXIT_USAGE,
    Command,
    SubmitError,
    check_token_env,
    dashboard_url,
)

PROG = "sweep submit"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    # --address is accepted before and after the subcommand; SUPPRESS keeps a subparser from
    # resetting what the top level already parsed.
    address = argparse.ArgumentParser(add_help=False)
    address.add_argument("--address", default=argparse.SUPPRESS,
                         help="the Ray dashboard, http://HEAD:8265 (default: $RAY_API_SERVER_ADDRESS, $RAY_ADDRESS)")
    parser = argparse.ArgumentParser(
        prog=prog, parents=[address],
        description="Submit the sweep to a running Ray cluster (Ray's Jobs API) and follow it. "
                    "The sweep's Hydra overrides go after `--`.",
        epilog=f"example: {prog} --address http://127.0.0.1:8265 --working-dir . -- "
               "task=RTE model=tiny-roberta storage.output_prefix=s3://bucket/rte cluster.address=auto")
    parser.add_argument("--working-dir", type=Path, default=None,
                        help="upload this project folder as the job's working directory")
    parser.add_argument("--no-wait", action="store_true", help="print the job id and return; do not follow")
    parser.add_argument("--job-id", default=None, help="the submission id to use (default: Ray makes one)")
    sub = parser.add_subparsers(dest="action", metavar="{status,logs,stop,list}")
    sub.add_parser("status", parents=[address], help="the job's status").add_argument("job_id")
    logs = sub.add_parser("logs", parents=[address], help="the job's log so far (--follow: until it ends)")
    logs.add_argument("job_id")
    logs.add_argument("--follow", action="store_true")
    sub.add_parser("stop", parents=[address], help="stop the job and wait until it ended").add_argument("job_id")
    sub.add_parser("list", parents=[address], help="every job on the cluster")
    return parser


def parse_args(argv: Sequence[str], env: Mapping[str, str], prog: str = PROG) -> Command:
    """The command line as a Command; the overrides are everything after the first ``--``."""
    argv = list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    options, overrides = argv[:split], tuple(argv[split + 1:])
    stray = [a for a in options if "=" in a and not a.startswith("-")]
    if stray:  # argparse would call them an "invalid choice" of subcommand
        raise SubmitError(f"put the sweep's overrides after `--`: {prog} --address URL -- {' '.join(stray)}")
    args = build_parser(prog).parse_args(options)
    action = args.action or "submit"
    if action != "submit" and overrides:
        raise SubmitError(f"`{action}` takes no sweep overrides (got {' '.join(overrides)})")
    if action == "submit" and not overrides:
        raise SubmitError(f"no sweep overrides after `--`: {prog} --address URL -- +experiment=demo ...")
    working_dir = args.working_dir
    if working_dir is not None:
        if not working_dir.is_dir():
            raise SubmitError(f"--working-dir {working_dir}: not a folder")
        working_dir = working_dir.resolve()
    return Command(action=action, address=dashboard_url(getattr(args, "address", None), env),
                   job_id=args.job_id,  # a subcommand's JOB_ID, or submit's --job-id
                   overrides=overrides, working_dir=working_dir, wait=not args.no_wait,
                   follow=getattr(args, "follow", False))


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> None:
    try:
        command = parse_args(sys.argv[1:] if argv is None else argv, os.environ, prog)
        check_token_env(os.environ)
        code = ACTIONS[command.action](command)
    except SubmitError as e:
        print(f"error: {e}", file=sys.stderr)
        code = EXIT_USAGE
    except KeyboardInterrupt:  # before a job id was known (following handles its own Ctrl-C)
        print("\ninterrupted", file=sys.stderr)
        code = EXIT_DETACHED
    sys.exit(code)
