"""``sweep run <overrides>`` (also ``sweep <overrides>`` and ``python -m sweep <overrides>``): the sweep, Hydra's app.

``sweep run --help`` is Hydra's help: every config group and option. Nothing heavy is imported before
the config is validated: ``--help`` and every one-line error reach the user without torch,
transformers or Ray being loaded. A mistake in the overrides (an unknown key or group option, a bad
value) is found before Hydra makes its run folder (sweep.config.command_line), so it is one line,
exit 2, and nothing is written. ``HYDRA_FULL_ERROR=1`` (Hydra's debugging switch) skips that check
and gives Hydra's own full report.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


def run_sweep(cfg: DictConfig) -> None:
    """The composed config -> one sweep (sweep.app.run), its mistakes and its stop as one line each."""
    from sweep.app import run
    from sweep.errors import USER_ERRORS, SweepStopped

    out_dir = Path(cfg.out_dir or HydraConfig.get().runtime.output_dir).resolve()
    try:
        run(cfg, out_dir)
    except USER_ERRORS as e:
        user_error(e)
    except SweepStopped as e:  # SIGTERM/SIGINT: trials stopped, state saved; one line says how to finish
        from sweep.run.stop import stopped_line

        print(stopped_line(e, HydraConfig.get().overrides.task, str(out_dir)), file=sys.stderr)
        sys.exit(e.exit_code)


# Hydra names the job after its task function's module, last part: "__main__", as when this function
# was sweep/__main__.py's (the run folder's log file __main__.log, the first line of --help).
run_sweep.__module__ = "sweep.__main__"
hydra_main = hydra.main(config_path="pkg://sweep.conf", config_name="config", version_base="1.3")(run_sweep)


def user_error(e: Exception) -> NoReturn:
    """A user's mistake: one clear line, no traceback."""
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


def plain_experiment(argv: Sequence[str]) -> list[str]:
    """``experiment`` is in the defaults list (null), so Hydra takes ``experiment=demo``; the older
    ``+experiment=demo`` (an append, which Hydra now refuses as a second value) means the same."""
    return [a[1:] if a.startswith("+experiment=") else a for a in argv]


def main(argv: Sequence[str] | None = None) -> None:
    """The sweep on ``argv`` (default: ``sys.argv[1:]``): Hydra's command line, overrides and flags."""
    from sweep.config.command_line import check_command_line
    from sweep.errors import USER_ERRORS

    args = plain_experiment(sys.argv[1:] if argv is None else argv)
    if os.environ.get("HYDRA_FULL_ERROR") != "1":  # Hydra's debugging switch: its own full report
        try:
            check_command_line(args)
        except USER_ERRORS as e:
            user_error(e)
    sys.argv = [sys.argv[0], *args]  # hydra.main reads sys.argv; argv[0] names the program in its usage line
    hydra_main()
