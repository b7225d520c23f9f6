"""GLUE metrics against hand-computed values and degenerate predictions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sweep.config.tasks import load_task
from sweep.train.metrics import (
    classification_metrics,
    merge_splits,
    perplexity,
    regression_metrics,
    selection_score,
    task_metrics,
)


def test_accuracy_f1_mcc_by_hand():
    labels = np.array([1, 1, 1, 0, 0, 0])
    preds = np.array([1, 1, 0, 0, 0, 1])
    m = classification_metrics(preds, labels, num_labels=2)
    # tp=2 fp=1 fn=1 tn=2: acc 4/6, precision = recall = 2/3 -> f1 2/3, mcc (4-1)/sqrt(3*3*3*3) = 1/3
    assert m["acc"] == pytest.approx(4 / 6)
    assert m["f1"] == pytest.approx(2 / 3)
    assert m["mcc"] == pytest.approx(1 / 3)
    assert m["acc_and_f1"] == pytest.approx((4 / 6 + 2 / 3) / 2)


def test_negative_mcc_is_kept_and_comparable():
    labels = np.array([1, 0, 1, 0])
    m = classification_metrics(np.array([0, 1, 0, 1]), labels, 2)
    assert m["mcc"] == pytest.approx(-1.0)
    cola = load_task("CoLA")
    worse = selection_score(cola, {"mcc": -0.5})
    better = selection_score(cola, {"mcc": -0.1})
    assert better > worse


def test_one_class_everywhere_is_defined():
    labels = np.array([1, 0, 1, 0])
    m = classification_metrics(np.zeros(4, dtype=int), labels, 2)
    assert m == {"acc": 0.5, "mcc": 0.0, "f1": 0.0, "acc_and_f1": 0.25}


def test_regression_pearson_spearman_by_hand():
    preds = np.array([1.0, 2.0, 3.0, 4.0])
    labels = np.array([1.0, 2.0, 3.0, 5.0])
    m = regression_metrics(preds, labels)
    # ranks agree exactly -> spearman 1; pearson by formula
    x, y = preds - preds.mean(), labels - labels.mean()
    assert m["pearson"] == pytest.approx((x @ y) / math.sqrt((x @ x) * (y @ y)))
    assert m["spearmanr"] == pytest.approx(1.0)
    assert m["corr"] == pytest.approx((m["pearson"] + 1.0) / 2)


def test_constant_regression_output_is_zero_not_nan():
    m = regression_metrics(np.full(5, 2.5), np.array([0.0, 1, 2, 3, 4]))
    assert m == {"pearson": 0.0, "spearmanr": 0.0, "corr": 0.0}


def test_task_metrics_take_logits_and_pick_argmax():
    logits = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]])
    m = task_metrics(load_task("RTE"), logits, np.array([1, 0, 0]))
    assert m["acc"] == pytest.approx(2 / 3)


def test_mnli_three_classes_has_no_binary_f1():
    m = task_metrics(load_task("MNLI"), np.array([0, 1, 2, 2]), np.array([0, 1, 2, 1]))
    assert m["acc"] == pytest.approx(0.75) and "f1" not in m


def test_merge_splits_keeps_primary_unprefixed():
    mnli = load_task("MNLI")
    merged = merge_splits(mnli, {"matched": {"acc": 0.8}, "mismatched": {"acc": 0.7}})
    assert merged == {"acc": 0.8, "acc_mismatched": 0.7}
    assert selection_score(mnli, merged) == 0.8


def test_selection_score_orients_min_metrics():
    spec = load_task("WNLI")
    lm = type(spec)(**{**spec.__dict__, "kind": "causal_lm", "metric": "perplexity", "mode": "min", "labels": None})
    assert selection_score(lm, {"perplexity": 10.0}) > selection_score(lm, {"perplexity": 20.0})


def test_selection_score_missing_metric_names_it():
    with pytest.raises(KeyError, match="metric 'mcc' not among"):
        selection_score(load_task("CoLA"), {"acc": 1.0})


def test_perplexity_is_exp_of_loss_and_finite_when_diverged():
    assert perplexity(math.log(7.0)) == pytest.approx(7.0)
    assert math.isfinite(perplexity(1e6))
