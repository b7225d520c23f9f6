"""Results that learned nothing are called so: each task's trivial score (what a constant answer scores on
the eval rows the trials were scored on), the noise rule, and what the summary, the result files and the
plot say. Ray-free and model-free."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from sklearn.dummy import DummyClassifier
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from sweep.config.tasks import load_task
from sweep.config.validate import compose_settings
from sweep.outputs.trivial import task_trivial_score, trivial_scores
from sweep.results.chance import TrivialScore, learned, noise_margin
from sweep.results.records import TrialRecord, format_summary, format_unlearned, summarize, write_results
from sweep.results.report import seed_scores_figure
from sweep.storage.node_cache import MARKER
from sweep.storage.s3 import RemoteSource
from sweep.storage.staging import DriverSources, SourcePins, staged_target
from sweep.train.metrics import trivial_score

RTE, MRPC, COLA, QQP, STSB = (load_task(t) for t in ("RTE", "MRPC", "CoLA", "QQP", "STS-B"))
X = np.zeros((12, 1))  # DummyClassifier ignores its input: the point of the baseline


def _constant(strategy: str, labels: np.ndarray, **kw) -> np.ndarray:
    return DummyClassifier(strategy=strategy, **kw).fit(X[: len(labels)], labels).predict(X[: len(labels)])


# --- the trivial score of each metric, against scikit-learn's own constant predictors --------------

def test_trivial_accuracy_is_the_most_frequent_answers():
    labels = np.array([1, 0, 1, 1, 0, 1, 1, 0, 1, 1])
    expected = accuracy_score(labels, _constant("most_frequent", labels))
    assert trivial_score(RTE, labels) == pytest.approx(expected) == pytest.approx(0.7)


def test_trivial_mcc_is_zero_for_any_constant():
    labels = np.array([1, 0, 1, 1, 0, 1, 1, 0])
    assert trivial_score(COLA, labels) == matthews_corrcoef(labels, _constant("most_frequent", labels)) == 0.0


@pytest.mark.parametrize("labels", [np.array([1, 1, 1, 0, 1, 0]), np.array([0, 0, 0, 1, 0, 0, 1, 0])],
                         ids=["positive-majority", "negative-majority"])
def test_trivial_f1_is_the_f1_of_always_answering_positive(labels):
    always_positive = _constant("constant", labels, constant=1)
    assert trivial_score(MRPC, labels) == pytest.approx(f1_score(labels, always_positive))


def test_trivial_acc_and_f1_is_the_best_constant_answer():
    """QQP: the majority ("not duplicate") scores (acc + F1 0) / 2; always "duplicate" scores more."""
    labels = np.array([0, 0, 0, 0, 0, 1, 1, 1])
    scores = [(accuracy_score(labels, p) + f1_score(labels, p, zero_division=0.0)) / 2
              for p in (_constant("constant", labels, constant=c) for c in (0, 1))]
    assert trivial_score(QQP, labels) == pytest.approx(max(scores)) == pytest.approx((3 / 8 + 6 / 11) / 2)


def test_trivial_correlation_is_zero_and_causal_lm_has_none():
    assert trivial_score(STSB, np.array([0.5, 1.0, 4.0, 2.5])) == 0.0
    assert task_trivial_score(load_task("wikitext-2"), lambda: Path("/nowhere"), None) == TrivialScore(None)


def test_trivial_score_is_read_from_the_rows_the_trials_were_scored_on(shared_data_dir: Path):
    """Real RTE dev: 146 of 277 rows are not_entailment; max_eval_samples cuts the split as the loop does."""
    whole = task_trivial_score(RTE, lambda: shared_data_dir, None)
    assert whole.rows == 277 and whole.score == pytest.approx(146 / 277)
    cut = task_trivial_score(RTE, lambda: shared_data_dir, 128)
    assert cut.rows == 128 and cut.score != whole.score


def test_labels_that_cannot_be_read_leave_the_verdict_unknown_with_why(tmp_path: Path):
    settings = compose_settings("task=RTE", f"storage.data_dir={tmp_path}")  # no glue_data/RTE in it
    (unknown,) = trivial_scores(settings.tasks, None, settings.storage, None, ["RTE"]).values()
    assert unknown.score is None and "no data for task RTE" in unknown.unknown


def test_with_s3_the_driver_reads_the_labels_only_from_its_own_node_cache(tmp_path: Path, synthetic_glue_dir: Path):
    """The driver downloads nothing (docs/architecture.md §2): no staged copy here, no verdict, and why."""
    settings = compose_settings("task=WNLI", "storage=s3", "storage.bucket=data", f"storage.cache_dir={tmp_path}")
    data = RemoteSource("data", "glue_data", "archive", etag="e1", size=1)
    sources = DriverSources(pins=SourcePins(model=None, data=data))
    (unknown,) = trivial_scores(settings.tasks, None, settings.storage, sources, ["WNLI"]).values()
    assert unknown.score is None and "s3://data/glue_data is not staged on the driver's machine" in unknown.unknown
    target = staged_target(tmp_path, data)  # as a node of the sweep on this machine leaves it
    shutil.copytree(synthetic_glue_dir, target)
    (target / MARKER).write_text(json.dumps(data.version))
    (known,) = trivial_scores(settings.tasks, None, settings.storage, sources, ["WNLI"]).values()
    assert known == task_trivial_score(load_task("WNLI"), lambda: synthetic_glue_dir, None) and known.rows == 64


# --- the noise rule --------------------------------------------------------------------------------

def test_noise_is_two_binomial_standard_errors_for_shares_and_two_over_root_n_for_correlations():
    assert noise_margin("acc", 0.5, 100) == pytest.approx(2 * math.sqrt(0.25 / 100))  # 0.1
    assert noise_margin("f1", 0.8, 400) == pytest.approx(2 * math.sqrt(0.16 / 400))  # 0.04
    assert noise_margin("mcc", 0.0, 400) == pytest.approx(2 / 20)
    assert noise_margin("corr", 0.0, 100) == pytest.approx(0.2)
    assert noise_margin("acc", 1.0, 50) == pytest.approx(1 / 50)  # never below one row's worth
    assert noise_margin("acc", 0.5, 0) == math.inf  # no rows: nothing can be told apart


def test_learned_means_beyond_the_noise_in_the_tasks_direction():
    margin = noise_margin("acc", 0.5271, 277)  # real RTE dev: ±0.060
    assert not learned(0.5271, 0.5271, margin, "max")  # at the trivial score
    assert not learned(0.565, 0.5271, margin, "max")  # docs/benchmarks.md's "nothing learns beyond 0.565"
    assert learned(0.60, 0.5271, margin, "max")
    assert not learned(0.56, 0.6, 0.05, "min") and learned(0.5, 0.6, 0.05, "min")  # lower is better: below it


# --- what the summary, the files and the plot say ----------------------------------------------------

def _chance_records() -> list[TrialRecord]:
    return [TrialRecord("RTE", seed, score=s, metrics={"acc": s}, hparams={"lr": 5e-3})
            for seed, s in ((38, 0.5271), (39, 0.4729), (40, 0.5271))]


TRIVIAL = {"RTE": TrivialScore(0.5271, 277)}


def test_summary_and_result_files_carry_the_trivial_score_and_the_verdict(tmp_path: Path):
    records = _chance_records()
    (s,) = summarize(records, [RTE], trivial=TRIVIAL)
    assert (s.trivial_score, s.eval_rows, s.learned) == (0.5271, 277, False)
    assert s.noise == pytest.approx(noise_margin("acc", 0.5271, 277))
    assert "(within noise of the trivial 0.5271)" in format_summary([s])
    write_results(tmp_path, records, [s])
    (row,) = csv.DictReader((tmp_path / "summary.csv").open())
    assert (row["trivial_score"], row["learned"], row["eval_rows"]) == ("0.5271", "False", "277")
    (summary,) = json.loads((tmp_path / "results.json").read_text())["summary"]
    assert summary["trivial_score"] == 0.5271 and summary["learned"] is False


def test_a_task_beyond_the_noise_learned_and_one_without_a_trivial_score_is_not_judged():
    records = [TrialRecord("RTE", 38, score=0.70, metrics={"acc": 0.70})]
    (s,) = summarize(records, [RTE], trivial=TRIVIAL)
    assert s.learned is True and "within noise" not in format_summary([s])
    (s,) = summarize(records, [RTE])
    assert s.trivial_score is None and s.learned is None


def test_the_warning_names_the_task_the_scores_and_what_to_try():
    (s,) = summarize(_chance_records(), [RTE], trivial=TRIVIAL)
    train = compose_settings("task=RTE", "train=quick").train  # 256 rows, 4 epochs, lr 5e-3
    line = format_unlearned(s, train, {"lr": 1e-3}, registry=True)
    assert line == ("warning: RTE learned nothing: best acc 0.5271 is within noise (±0.0600 on 277 eval rows) of the "
                    "trivial 0.5271 a constant answer scores; not promoted to champion (registered as a version "
                    "without the alias); try more rows than train.max_train_samples=256, more epochs than "
                    "train.epochs=4 or another lr than train.lr=0.001")
    every_row = compose_settings("task=RTE").train  # max_train_samples null: more rows is no advice
    assert "more rows" not in format_unlearned(s, every_row, {}, registry=False)


def test_the_plot_draws_each_tasks_trivial_score_as_a_labelled_line():
    records = _chance_records() + [TrialRecord("CoLA", 38, score=0.01, metrics={"mcc": 0.01})]
    fig = seed_scores_figure(records, [RTE, COLA], {"RTE": 0.5271, "CoLA": 0.0})
    for ax, trivial in zip(fig.axes, (0.5271, 0.0)):
        (line,) = [line for line in ax.get_lines() if line.get_label().startswith("trivial")]
        assert line.get_label() == f"trivial {trivial:.4f}" and list(line.get_ydata()) == [trivial, trivial]
        assert [t.get_text() for t in ax.get_legend().get_texts()] == [f"trivial {trivial:.4f}"]
    plain = seed_scores_figure(records, [RTE, COLA])  # no trivial score known: no line
    assert not [line for ax in plain.axes for line in ax.get_lines() if line.get_label().startswith("trivial")]
