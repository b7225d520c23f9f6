"""The command line checked before Hydra runs the job: every mistake one line, nothing written yet.

Hydra reports an unknown key (``train.lrr=3``), a key of another task (``task.path=x`` with
``task=RTE``) or an unknown group option (``model=nosuch``) over many lines with exit 1, and it
makes its run folder (``outputs/<date>/<time>``) before the job can refuse a bad value. So the same
overrides are composed here first, with Hydra's compose API on the config tree ``hydra.main`` reads,
then validated (with the lengths the model holds); each failure is a ``ConfigError`` naming the key
and what is allowed, which ``sweep run`` (sweep/cli/run.py) prints as one line, exit 2. Nothing here loads torch or Ray.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from sweep.config.settings import Settings
from sweep.errors import ConfigError

# A multirun's jobs beyond this many are left to Hydra (composing one takes a few tenths of a second).
MAX_JOBS_CHECKED = 16
GRAMMAR = "https://hydra.cc/docs/advanced/override_grammar/basic/"
# Lines of Hydra's and OmegaConf's messages that do not help on one line.
NOISE = ("full_key:", "object_type=", "reference_type=")
TRAILERS = ("Config search path:", "Search path:")
# Maps whose keys the user chooses (sweep.grid.lr, resources.tasks.MNLI): Hydra adds a key only with +.
OPEN_MAPS = ("sweep.grid", "sweep.search", "resources.tasks")


def check_command_line(argv: list[str]) -> list[Settings]:
    """Raise ConfigError for the first mistake in ``argv`` (without the program name) that Hydra's
    composition or ``validate`` would find; return the settings of each job checked when they may start
    (none when no job runs, or Hydra checks it itself)."""
    from hydra._internal.utils import get_args_parser  # the parser hydra.main reads the same argv with

    args = get_args_parser().parse_args(argv)
    if args.help or args.hydra_help or args.info or args.shell_completion or args.experimental_rerun:
        return []  # no job runs
    if args.config_path or args.config_name or args.config_dir:
        return []  # another config tree: Hydra reports on it itself
    jobs = job_overrides(args.overrides, args.multirun)
    if jobs is None:
        return []
    checked = []
    from hydra import compose, initialize_config_dir

    from sweep.config.tasks import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for overrides in itertools.islice(jobs, MAX_JOBS_CHECKED):
            try:
                cfg = compose("config", overrides=overrides)
            except OverrideParseException as e:
                raise ConfigError(parse_error_line(e)) from None
            except (HydraException, OmegaConfBaseException) as e:
                raise ConfigError(composition_error_line(e)) from None
            if args.cfg is None:  # a run (not --cfg): the config it runs with must be valid too
                settings = check_settings(cfg)
                if settings is not None:
                    checked.append(settings)
    return checked


def check_settings(cfg: DictConfig) -> Settings | None:
    from sweep.config.model_limits import check_lengths
    from sweep.config.validate import validate

    try:
        settings = validate(cfg)
    except OmegaConfBaseException:
        return None  # a value resolved only inside Hydra's run (${hydra:...}): the job validates it there
    check_lengths(settings)
    return settings


def job_overrides(overrides: list[str], multirun: bool) -> Iterator[list[str]] | None:
    """The override list of each job Hydra would run (one without --multirun); None when the sweep
    is one only a sweeper plugin expands (an interval)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException as e:
        raise ConfigError(parse_error_line(e)) from None
    if not multirun:
        return iter([list(overrides)])  # a sweep without --multirun: compose says what to do
    choices = []
    for o in parsed:
        if not o.is_sweep_override():
            choices.append([o.input_line])
        elif o.is_interval_sweep():
            return None
        elif o.is_hydra_override():
            raise ConfigError(f"{o.input_line}: Hydra's own settings cannot be swept; give one value")
        else:  # as Hydra's basic sweeper expands it: every combination of the swept values
            choices.append([f"{o.get_key_element()}={value}" for value in o.sweep_string_iterator()])
    return (list(job) for job in itertools.product(*choices))


def parse_error_line(e: OverrideParseException) -> str:
    reason = e.message.splitlines()[0] if e.message else "cannot be parsed"
    return f"{e.override}: not a valid override ({reason}); the grammar: {GRAMMAR}"


def composition_error_line(e: Exception) -> str:
    """Hydra's composition error on one line: the key or group, and what it allows."""
    if isinstance(e, MissingConfigException) and e.missing_cfg_file and "/" in e.missing_cfg_file:
        group = e.missing_cfg_file.rsplit("/", 1)[0]
        what = re.sub(r"^In 'config': ", "", _lines(str(e))[0])  # Could not find 'model/nosuch'
        options = ", ".join(e.options) if e.options else "none"
        return f"{group.replace('/', '.')}: {what}; available options in '{group}': {options}"
    cause = e.__cause__
    parent = getattr(cause, "parent_node", None)
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and isinstance(parent, DictConfig) and cause.full_key:
        where = cause.full_key.rpartition(".")[0] or "the config"
        keys = ", ".join(str(k) for k in parent.keys() if k != "hydra")
        append = [line.split(" use ", 1)[1] for line in _lines(str(e)) if line.startswith("To append")]
        if (where in OPEN_MAPS or not keys) and append:  # a map the user fills: a new key needs +
            return f"{cause.full_key}: not in {where} yet; add it with {append[0]}"
        return f"{cause.full_key}: no such key (keys of {where}: {keys})"
    lines = _lines(str(e))
    if isinstance(cause, OmegaConfBaseException):
        lines += _lines(str(cause))[:1]
    return "; ".join(line.rstrip(".") for line in lines) or type(e).__name__


def _lines(message: str) -> list[str]:
    """The message's lines that say something, up to Hydra's search-path listing."""
    kept = []
    for line in message.splitlines():
        line = line.strip()
        if line.startswith(TRAILERS):
            break
        if line and not line.startswith(NOISE):
            kept.append(line)
    return kept or [""]
