"""The metric registry (sweep/config/metric_names.py): a task's selection metric checked by name when the config
loads, the user's own metrics known once passed, and the names equal to what the metric functions report."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import sweep
from sweep.config.metric_names import BINARY, BUILT_IN, check_metric, check_own_metrics, metric_names
from sweep.config.tasks import load_task
from sweep.config.validate import compose, validate
from sweep.errors import ConfigError
from sweep.train.metrics import perplexity, selection_score, task_metrics, trivial_metrics


def test_a_typo_is_one_line_naming_the_task_the_name_the_closest_and_how_to_add_one():
    with pytest.raises(ConfigError) as e:
        sweep.load_settings("experiment=demo", "task.WNLI.metric=acuracy")
    line = str(e.value)
    assert "\n" not in line
    assert line.startswith("task.WNLI.metric: unknown metric 'acuracy' for a classification task; known: acc, ")
    assert "acc_and_f1" in line and line.endswith("metrics={'NAME': fn(predictions, labels) -> float})")


def test_the_closest_name_comes_first():
    spec = dataclasses.replace(load_task("STS-B"), metric="pearsn")
    with pytest.raises(ConfigError, match=r"known: pearson, "):
        check_metric(spec)


def test_every_shipped_task_and_its_later_splits_pass():
    for name in ("CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE", "WNLI", "wikitext-2"):
        check_metric(load_task(name))
    mnli = load_task("MNLI")
    assert "acc_mismatched" in metric_names(mnli) and "f1" not in metric_names(mnli)  # three labels
    check_metric(dataclasses.replace(mnli, metric="acc_mismatched"))
    assert "eval_loss" in metric_names(load_task("RTE"))


def test_own_metrics_are_known_when_passed():
    overrides = ("experiment=demo", "task.WNLI.metric=my_metric")
    with pytest.raises(ConfigError, match="unknown metric 'my_metric'"):
        sweep.load_settings(*overrides)
    settings = sweep.load_settings(*overrides, metrics={"my_metric": lambda p, y: 0.0})
    assert settings.tasks[0].metric == "my_metric"
    assert validate(compose(*overrides), metrics=["my_metric"]).tasks[0].metric == "my_metric"
    # a causal LM has no predictions to give them
    assert "my_metric" not in metric_names(load_task("wikitext-2"), ["my_metric"])


@pytest.mark.parametrize(("own", "match"), [
    ({"acc": len}, "'acc' is a built-in metric"),
    ({"my f1": len}, "'my f1' is not a metric name"),
    ({"mine": 3}, "'mine' is int, not fn"),
])
def test_own_metrics_are_checked(own, match):
    with pytest.raises(ConfigError, match=match):
        check_own_metrics(own)


def test_the_registry_is_what_the_functions_report():
    """BUILT_IN's names per kind are exactly the metric functions' keys (plus the evaluation's eval_loss)."""
    labels = np.array([0, 1, 1, 0])
    binary, three = load_task("RTE"), load_task("MNLI")
    assert set(task_metrics(binary, labels, labels)) | {"eval_loss"} == set(BUILT_IN["classification"] + BINARY)
    assert set(task_metrics(three, labels, labels)) | {"eval_loss"} == set(BUILT_IN["classification"])
    values = np.array([0.1, 2.0, 3.5, 4.0])
    assert set(task_metrics(load_task("STS-B"), values, values)) | {"eval_loss"} == set(BUILT_IN["regression"])
    assert {"eval_loss", "perplexity"} == set(BUILT_IN["causal_lm"]) and perplexity(0.0) == 1.0


def test_own_metrics_are_computed_beside_the_built_in_ones():
    spec = dataclasses.replace(load_task("RTE"), metric="ones")
    seen = []

    def ones(predictions, labels):
        seen.append((predictions.tolist(), labels.tolist()))
        return np.float32(np.mean(predictions == 1))

    logits = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]])
    metrics = task_metrics(spec, logits, np.array([1, 0, 0]), {"ones": ones})
    assert metrics["ones"] == pytest.approx(2 / 3) and type(metrics["ones"]) is float and "acc" in metrics
    assert seen == [([1, 0, 1], [1, 0, 0])]  # class ids, as the built-in ones get them
    assert selection_score(spec, metrics) == pytest.approx(2 / 3)
    # the trivial (constant) answer is scored by it too
    assert trivial_metrics(spec, np.array([1, 0, 0]), {"ones": ones})["ones"] in (0.0, 1.0)
    with pytest.raises(TypeError, match="metric 'bad' returned str"):
        task_metrics(spec, logits, np.array([1, 0, 0]), {"bad": lambda p, y: "high"})
