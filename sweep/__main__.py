"""python -m sweep task=WNLI model=roberta-base   (or the console script: sweep task=WNLI ...; --help lists every option)

Nothing heavy is imported before the config is validated: ``--help`` and every one-line error
reach the user without torch, transformers or Ray being loaded.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


@hydra.main(config_path="pkg://sweep.conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from sweep.app import run
    from sweep.errors import USER_ERRORS

    out_dir = Path(cfg.out_dir or HydraConfig.get().runtime.output_dir).resolve()
    try:
        run(cfg, out_dir)
    except USER_ERRORS as e:
        # A user's mistake: one clear line, no traceback.
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def plain_experiment(argv: list[str]) -> list[str]:
    """``experiment`` is in the defaults list (null), so Hydra takes ``experiment=demo``; the older
    ``+experiment=demo`` (an append, which Hydra now refuses as a second value) means the same."""
    return [a[1:] if a.startswith("+experiment=") else a for a in argv]


def cli() -> None:
    sys.argv = plain_experiment(sys.argv)
    main()


if __name__ == "__main__":
    cli()
