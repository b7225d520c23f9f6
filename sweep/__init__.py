"""sweep: fine-tune models as a Ray Tune sweep. The command is ``sweep`` (sweep/cli/); from Python::

    import sweep

    settings = sweep.load_settings("task=WNLI", "model=minilm", "train=quick", out_dir="runs/x")
    summaries = sweep.run(settings)  # what `sweep run task=WNLI model=minilm train=quick out_dir=runs/x` runs

``load_settings`` takes the command line's overrides and returns validated ``Settings`` (a mistake is
the command's one-line ``ConfigError``); ``run`` runs the sweep and returns each task's ``TaskSummary``.
The names load on first use (PEP 562): ``import sweep`` loads neither Hydra, torch nor Ray.

The public API is exactly ``__all__`` (docs/api.md): every other module and name of the package is internal
and may change (``sweep.testing``, the tests' and scripts' helpers, is not even installed).
``run``'s extension points take ``SchedulerPolicy`` subclasses and ``MetricFn`` functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sweep.app import run
    from sweep.config.load import load_settings
    from sweep.config.metric_names import MetricFn
    from sweep.config.settings import Settings
    from sweep.errors import ConfigError
    from sweep.results.records import TaskSummary
    from sweep.schedulers.policies import SchedulerPolicy

__all__ = ["ConfigError", "MetricFn", "SchedulerPolicy", "Settings", "TaskSummary", "load_settings", "run"]
# public name -> the module that defines it
_HOMES = {"run": "sweep.app", "load_settings": "sweep.config.load", "Settings": "sweep.config.settings",
          "ConfigError": "sweep.errors", "TaskSummary": "sweep.results.records",
          "SchedulerPolicy": "sweep.schedulers.policies", "MetricFn": "sweep.config.metric_names"}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'sweep' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value  # once: the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
