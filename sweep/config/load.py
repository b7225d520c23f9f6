"""``sweep.load_settings``: a sweep's validated ``Settings`` from the command line's overrides, in Python.

The overrides are exactly what ``sweep run`` takes (``task=[RTE,MRPC]``, ``train.lr=1e-4``,
``+sweep.grid.lr=[1e-5,2e-5]``, ``experiment=demo``), composed from the packaged conf/ with Hydra's
compose API and checked as the command checks them: each mistake is the same one-line ``ConfigError``.
The caller never touches Hydra. No torch, no Ray.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Sequence

from omegaconf import DictConfig

from sweep.config.settings import Settings


def plain_experiment(overrides: Iterable[str]) -> list[str]:
    """``experiment`` is in the defaults list (null), so Hydra takes ``experiment=demo``; the older
    ``+experiment=demo`` (an append, which Hydra now refuses as a second value) means the same."""
    return [a[1:] if a.startswith("+experiment=") else a for a in overrides]


def quoted(value: str) -> str:
    """``value`` as one quoted string of Hydra's override grammar (spaces, ``=`` or ``,`` in a path)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def compose_checked(overrides: Sequence[str]) -> DictConfig:
    """The config ``sweep run <overrides>`` runs with; a mistake is the command's one-line ConfigError."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException, OverrideParseException
    from omegaconf.errors import OmegaConfBaseException

    from sweep.config.command_line import composition_error_line, parse_error_line
    from sweep.config.tasks import CONF_DIR
    from sweep.errors import ConfigError

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        try:
            return compose("config", overrides=list(overrides))
        except OverrideParseException as e:
            raise ConfigError(parse_error_line(e)) from None
        except (HydraException, OmegaConfBaseException) as e:
            raise ConfigError(composition_error_line(e)) from None


def load_settings(*overrides: str, out_dir: str | os.PathLike[str] | None = None,
                  metrics: Collection[str] = ()) -> Settings:
    """The validated settings of ``sweep run <overrides>`` (``out_dir=``: the same as the override;
    ``metrics``: the names of your own metrics, which ``sweep.run(metrics=...)`` will compute, known beside the
    built-in ones, e.g. for ``task.RTE.metric=my_f1``).

    Paths are made absolute against the current folder, as the command does; the lengths each task
    tries are checked against the model. Raises ``sweep.errors.ConfigError`` (one line) on a mistake."""
    from sweep.config.model_limits import check_lengths
    from sweep.config.validate import validate

    args = plain_experiment(overrides)
    if out_dir is not None:
        args.append(f"out_dir={quoted(os.fspath(out_dir))}")
    settings = validate(compose_checked(args), metrics)
    check_lengths(settings)
    return settings
