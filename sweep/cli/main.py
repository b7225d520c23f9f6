"""The ``sweep`` command: ``sweep COMMAND ARGS...`` runs one of ``COMMANDS``; anything else is the sweep's
own command line, so ``sweep <overrides>`` is ``sweep run <overrides>``. ``python -m sweep`` is the same
command. Only the chosen command's module is imported: ``--help`` and one-line errors stay fast.
"""

from __future__ import annotations

import gc
import importlib
import os
import re
import sys
from collections.abc import Sequence

PROG = "sweep"
DEFAULT = "run"
# name -> (the module with its main(argv, prog), what it does)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("sweep.cli.run", "fine-tune as a Ray Tune sweep (the default); its overrides are Hydra's key=value"),
    "submit": ("sweep.cli.submit", "the sweep as a Ray Job on a running cluster; status|logs|stop|list of its jobs"),
    "serve": ("sweep.cli.serve", "serve a fine-tuned model: KServe's v2 REST and gRPC, OpenAI completions"),
    "infer": ("sweep.cli.infer", "one inference call to a model server"),
    "upload": ("sweep.cli.upload", "pack folders and upload them to S3 for storage=s3"),
    "upload-mlflow": ("sweep.cli.upload_mlflow", "a sweep's sqlite MLflow store and its artifacts to S3, by hand"),
    "replay": ("sweep.cli.replay", "send the MLflow calls a sweep kept while its store did not answer"),
    "ui": ("sweep.cli.ui", "the MLflow UI on a sweep's store; prints the URL of its runs"),
}
# A first argument like these is meant as a command: no Hydra override (key=value, ~key) or flag (-m, --cfg).
_WORD = re.compile(r"[A-Za-z][\w.-]*")


def usage(prog: str = PROG) -> str:
    width = max(map(len, COMMANDS)) + 2
    lines = [f"usage: {prog} [run] [OVERRIDE ...]   the sweep: Hydra's overrides (key=value), flags (-m, --cfg job)",
             f"       {prog} COMMAND [ARG ...]      {prog} COMMAND --help: its options", "", "commands:"]
    lines += [f"  {name:<{width}}{summary}" for name, (_, summary) in COMMANDS.items()]
    lines += ["", f"`{prog} <overrides>` is `{prog} run <overrides>`. `sweep` and `python -m sweep` are the same",
              "command (python -m sweep serve ... is sweep serve ...).", "",
              f"{prog} run --help, the sweep's config groups and options:", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> None:
    try:
        run_command(argv, prog)
    except BrokenPipeError:  # `sweep --help | head`: the reader left; say nothing more (Python's advice)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    finally:
        # The command's work is written and closed. The interpreter's last collections would walk every object
        # torch, transformers, Ray and MLflow made, seconds at a sweep's exit on a busy machine
        # (docs/benchmarks.md: Behind the code's choices): frozen, they are skipped. atexit (Ray's shutdown) still runs,
        # and the OS takes the memory back.
        gc.freeze()


def run_command(argv: Sequence[str] | None, prog: str) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    name = args[0] if args and args[0] in COMMANDS else None
    if name is None and args and _WORD.fullmatch(args[0]) and "=" not in args[0]:
        print(f"error: {args[0]}: no such command ({', '.join(COMMANDS)}) nor an override (key=value); "
              f"`{prog} --help` lists both", file=sys.stderr)
        sys.exit(2)
    if name is None:
        name = DEFAULT
        if "--help" in args or "-h" in args:  # `sweep --help`: the commands, then the sweep's own help
            print(usage(prog), flush=True)
    else:
        args = args[1:]
    module = importlib.import_module(COMMANDS[name][0])
    if name == DEFAULT:
        sys.exit(module.main(args))  # Hydra's: its usage line names sys.argv[0]
    sys.exit(module.main(args, prog=f"{prog} {name}"))
