"""GLUE metrics as GLUE defines them (scikit-learn / scipy), and perplexity for causal LM.

Every function returns finite floats: degenerate predictions (one class everywhere, a constant
regression output) give a defined number, so picking the best seed never meets a NaN.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping

import numpy as np
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from sweep.config.metric_names import MetricFn
from sweep.config.tasks import TaskSpec

# Their names per task kind are registered in sweep/config/metric_names.py (the config checks a task's metric
# against them before any data is read); tests/test_metrics.py holds the two equal.


def _finite(x: float) -> float:
    # scipy returns NaN for a constant input: no correlation is the defined answer.
    return float(x) if math.isfinite(x) else 0.0


def classification_metrics(preds: np.ndarray, labels: np.ndarray, num_labels: int) -> dict[str, float]:
    """acc for every task; mcc (CoLA); f1 of the positive class for binary tasks (MRPC, QQP)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sklearn warns on degenerate input; the value is defined
        out = {
            "acc": float(accuracy_score(labels, preds)),
            "mcc": _finite(matthews_corrcoef(labels, preds)),
        }
        if num_labels == 2:
            out["f1"] = float(f1_score(labels, preds, zero_division=0.0))
            out["acc_and_f1"] = (out["acc"] + out["f1"]) / 2
    return out


def regression_metrics(preds: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """STS-B: Pearson and Spearman correlation, and their mean (``corr``)."""
    preds = np.asarray(preds, dtype=np.float64).reshape(-1)
    labels = np.asarray(labels, dtype=np.float64).reshape(-1)
    if len(preds) < 2 or np.ptp(preds) == 0 or np.ptp(labels) == 0:
        pearson = spearman = 0.0
    else:
        pearson = _finite(pearsonr(preds, labels)[0])
        spearman = _finite(spearmanr(preds, labels)[0])
    return {"pearson": pearson, "spearmanr": spearman, "corr": (pearson + spearman) / 2}


def perplexity(mean_loss: float) -> float:
    """exp(mean token loss); capped so a diverged run stays a comparable (huge) number."""
    return float(math.exp(min(mean_loss, 50.0)))


def task_metrics(spec: TaskSpec, predictions: np.ndarray, labels: np.ndarray,
                 own: Mapping[str, MetricFn] | None = None) -> dict[str, float]:
    """Metrics of one eval split. ``predictions`` are logits (N, num_labels) or class ids (N,). ``own``: the
    user's metrics (``sweep.run(metrics=...)``), given the same class ids (or values) and labels."""
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    if spec.kind == "regression":
        predictions = predictions.astype(np.float64).reshape(-1)
        built_in = regression_metrics(predictions, labels)
    else:
        if predictions.ndim == 2:
            predictions = predictions.argmax(axis=-1)
        built_in = classification_metrics(predictions, labels, spec.num_labels)
    return {**built_in, **own_metrics(own or {}, predictions, labels)}


def own_metrics(own: Mapping[str, MetricFn], predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """The user's metrics on one split, each a float (a non-number raises here, naming the metric)."""
    out: dict[str, float] = {}
    for name, fn in own.items():
        value = fn(predictions, labels)
        try:
            out[name] = float(value)
        except (TypeError, ValueError):
            raise TypeError(f"metric {name!r} returned {type(value).__name__}, not a float") from None
    return out


def merge_splits(spec: TaskSpec, per_split: dict[str, dict[str, float]]) -> dict[str, float]:
    """Flatten per-split metrics: the primary split unprefixed, others suffixed (acc_mismatched)."""
    out: dict[str, float] = {}
    for split, metrics in per_split.items():
        suffix = "" if split == spec.primary_eval else f"_{split}"
        out.update({f"{k}{suffix}": v for k, v in metrics.items()})
    return out


def selection_score(spec: TaskSpec, metrics: dict[str, float]) -> float:
    """The number that picks a task's best seed, oriented so that HIGHER is always better."""
    if spec.metric not in metrics:
        raise KeyError(f"task {spec.name}: metric {spec.metric!r} not among {sorted(metrics)}")
    value = float(metrics[spec.metric])
    return value if spec.mode == "max" else -value


def trivial_metrics(spec: TaskSpec, labels: np.ndarray,
                    own: Mapping[str, MetricFn] | None = None) -> dict[str, float] | None:
    """The eval split's metrics for a model that ignores its input: the constant answer the task's
    metric rates best (accuracy: the majority class; MCC: 0 for any; F1: answering the positive class;
    acc_and_f1 may prefer either), or the mean label (correlation 0). The best constant, not only the
    majority: a model stuck on the minority answer learned nothing either (QQP's acc_and_f1).
    None for causal LM, which has no such baseline here."""
    labels = np.asarray(labels)
    if spec.kind == "causal_lm" or labels.size == 0:
        return None
    if spec.kind == "regression":
        constant = np.full(labels.shape, float(labels.astype(np.float64).mean()))
        return task_metrics(spec, constant, labels, own)
    values, counts = np.unique(labels, return_counts=True)
    by_share = values[np.argsort(-counts, kind="stable")]  # majority first (a tie: the lower class id)
    answers = [task_metrics(spec, np.full(labels.shape, value), labels, own) for value in by_share]
    return max(answers, key=lambda metrics: selection_score(spec, metrics))  # equal scores: the majority's


def trivial_score(spec: TaskSpec, labels: np.ndarray, own: Mapping[str, MetricFn] | None = None) -> float | None:
    """The trivial metrics as a selection score (higher is better), or None (causal LM)."""
    metrics = trivial_metrics(spec, labels, own)
    return None if metrics is None else selection_score(spec, metrics)
