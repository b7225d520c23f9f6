"""python -m sweep task=WNLI model=roberta-base   (or the console script: sweep task=WNLI ...)

``--help`` lists every option.

Nothing heavy is imported before the config is validated: ``--help`` and every one-line error
reach the user without torch, transformers or Ray being loaded. A mistake in the overrides (an
unknown key or group option, a bad value) is found before Hydra makes its run folder
(sweep.config.command_line), so it is one line, exit 2, and nothing is written.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


@hydra.main(config_path="pkg://sweep.conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
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


def user_error(e: Exception) -> NoReturn:
    """A user's mistake: one clear line, no traceback."""
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


def plain_experiment(argv: list[str]) -> list[str]:
    """``experiment`` is in the defaults list (null), so Hydra takes ``experiment=demo``; the older
    ``+experiment=demo`` (an append, which Hydra now refuses as a second value) means the same."""
    return [a[1:] if a.startswith("+experiment=") else a for a in argv]


def cli() -> None:
    from sweep.config.command_line import check_command_line
    from sweep.errors import USER_ERRORS

    sys.argv = plain_experiment(sys.argv)
    if os.environ.get("HYDRA_FULL_ERROR") != "1":  # Hydra's debugging switch: its own full report
        try:
            check_command_line(sys.argv[1:])
        except USER_ERRORS as e:
            user_error(e)
    main()


if __name__ == "__main__":
    cli()
