"""The metric registry by name: which metrics a task's evaluation gives, so that a task's selection
``metric`` is checked when the config loads (before any data is read) instead of failing as a KeyError
inside a trial. Names only: the functions are in ``sweep/train/metrics.py`` (torch, scikit-learn), a layer
above, and ``tests/test_metrics.py`` holds the two equal.

A user's own metrics (``sweep.run(settings, metrics={name: fn})``) count as known once passed.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Collection, Iterable
from typing import Any

from sweep.config.tasks import TaskSpec
from sweep.errors import ConfigError

# fn(predictions, labels) -> float: the eval split's predictions as the built-in metrics get them (class
# ids for classification, the predicted values for regression) and its labels, both numpy arrays
MetricFn = Callable[[Any, Any], float]

# every metric each task kind's evaluation reports (train/metrics.py, train/evaluate.py)
BUILT_IN: dict[str, tuple[str, ...]] = {
    "classification": ("acc", "mcc", "eval_loss"),
    "regression": ("pearson", "spearmanr", "corr", "eval_loss"),
    "causal_lm": ("eval_loss", "perplexity"),
}
BINARY = ("f1", "acc_and_f1")  # a two-label classification task's, beside the classification ones
HOW_TO_ADD = "or pass your own: sweep.run(settings, metrics={'NAME': fn(predictions, labels) -> float})"


def metric_names(spec: TaskSpec, own: Collection[str] = ()) -> tuple[str, ...]:
    """The metric names a task's evaluation reports: its kind's built-in ones (the binary ones with two
    labels), the user's ``own`` (not for causal LM: it has no predictions to give them), and each again with
    a later eval split's suffix (``acc_mismatched``), as ``merge_splits`` names them."""
    base = BUILT_IN[spec.kind] + (BINARY if spec.num_labels == 2 and spec.kind == "classification" else ())
    if spec.kind != "causal_lm":
        base += tuple(n for n in own if n not in base)
    later = [split for split in spec.eval_files if split != spec.primary_eval]
    return base + tuple(f"{name}_{split}" for split in later for name in base)


def check_metric(spec: TaskSpec, own: Collection[str] = ()) -> None:
    """A task's selection metric is one its evaluation reports; else one line: the task, the wrong name, the
    known ones (the closest first) and how to add one."""
    known = metric_names(spec, own)
    if spec.metric in known:
        return
    close = difflib.get_close_matches(spec.metric, known, n=len(known), cutoff=0.5)
    ordered = [*close, *sorted(set(known) - set(close))]
    raise ConfigError(f"task.{spec.name}.metric: unknown metric {spec.metric!r} for a {spec.kind} task; known: "
                      f"{', '.join(ordered)}; {HOW_TO_ADD}")


def check_metrics(tasks: Iterable[TaskSpec], own: Collection[str] = ()) -> None:
    for spec in tasks:
        check_metric(spec, own)


def check_own_metrics(own: dict[str, Any]) -> None:
    """The user's metrics: each a callable under a name of its own (a built-in's name would be two values)."""
    built_in = {name for names in (*BUILT_IN.values(), BINARY) for name in names}
    for name, fn in own.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigError(f"metrics: {name!r} is not a metric name; use letters, digits and _ (e.g. 'my_f1')")
        if name in built_in:
            raise ConfigError(f"metrics: {name!r} is a built-in metric; give yours another name")
        if not callable(fn):
            raise ConfigError(f"metrics: {name!r} is {type(fn).__name__}, not fn(predictions, labels) -> float")
