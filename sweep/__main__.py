"""python -m sweep task=WNLI model=roberta-base   (python -m sweep --help lists every option)"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from sweep.app import run
    from sweep.config import ConfigError
    from sweep.data import DataFormatError
    from sweep.models import ModelSourceError
    from sweep.staging import StagingError
    from sweep.tracking import TrackingError
    from sweep.tuner import ResourceError

    out_dir = Path(cfg.out_dir or HydraConfig.get().runtime.output_dir).resolve()
    try:
        run(cfg, out_dir)
    except (ConfigError, DataFormatError, ModelSourceError, StagingError, TrackingError, ResourceError) as e:
        # A user's mistake: one clear line, no traceback.
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
