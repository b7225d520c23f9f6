"""Each task's trivial score, read on the driver from the eval labels the trials were scored on.

The same rows as the trials: the primary eval split, cut to ``train.max_eval_samples`` by the loop's
own rule (``loop.subsample_rows``), scored by the metric's own code (``metrics.trivial_metrics``). Plain
Python: no Ray, no model, no tokenizer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path

import numpy as np

from sweep.config.settings import StorageConfig
from sweep.config.tasks import TaskSpec
from sweep.data.glue import load_task_data
from sweep.errors import StagingError
from sweep.failures import error_line
from sweep.results.chance import TrivialScore
from sweep.storage.node_cache import is_staged
from sweep.storage.staging import DriverSources, cache_root, local_data_dir, staged_target
from sweep.train.loop import subsample_rows
from sweep.train.metrics import trivial_metrics


def eval_labels(spec: TaskSpec, data_dir: Path, max_eval_samples: int | None) -> np.ndarray:
    """The labels of the rows the trials were scored on (a GLUE-style task)."""
    split = subsample_rows(load_task_data(spec, data_dir)[spec.primary_eval], max_eval_samples)
    return np.asarray(split["label"])


def task_trivial_score(spec: TaskSpec, data_dir: Callable[[], Path], max_eval_samples: int | None) -> TrivialScore:
    """A task's trivial score and eval rows (``data_dir``: asked only for a task with labels). Causal LM
    gets none: a model that ignores its input has no single perplexity to compare with (a unigram
    model's would be a choice, not a fact), so its results carry no verdict rather than an invented one."""
    if spec.kind == "causal_lm":
        return TrivialScore(None)
    labels = eval_labels(spec, data_dir(), max_eval_samples)
    metrics = trivial_metrics(spec, labels)
    return TrivialScore(metrics[spec.metric] if metrics else None, len(labels))


def trivial_scores(specs: Iterable[TaskSpec], max_eval_samples: int | None, storage: StorageConfig,
                   sources: DriverSources | None, tasks: Iterable[str]) -> dict[str, TrivialScore]:
    """The trivial score of each of ``tasks``; one whose labels cannot be read here is unknown, saying why
    (the sweep's models and results are done by now: this never fails it)."""
    wanted = set(tasks)
    data_dir = cache(lambda: driver_data_dir(storage, sources))  # found once, and only if a task has labels
    out: dict[str, TrivialScore] = {}
    for spec in specs:
        if spec.name in wanted:
            try:
                out[spec.name] = task_trivial_score(spec, data_dir, max_eval_samples)
            except Exception as e:
                out[spec.name] = TrivialScore(None, unknown=error_line(e))
    return out


def driver_data_dir(storage: StorageConfig, sources: DriverSources | None) -> Path:
    """The data folder on this machine: the one the driver's check found, else the configured one. With
    storage=s3 the driver downloads nothing (docs/architecture.md §2): the pinned data only if this
    machine's node cache holds it already (a driver on a node of the sweep), else a StagingError."""
    if sources is not None and sources.local is not None:
        return sources.local.data_dir
    if storage.kind != "s3":
        return local_data_dir(storage)
    if sources is None or sources.pins is None:
        raise StagingError("storage=s3 without the driver's pins: the data's version is not known here")
    data = sources.pins.data
    target = staged_target(cache_root(storage), data)
    if not is_staged(target, data):
        raise StagingError(f"{data.uri} is not staged on the driver's machine, and the driver downloads nothing")
    return target
