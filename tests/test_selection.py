"""The selection split (sweep.selection, sweep/data/selection.py): what it carves, its checks when the config
loads, and the proof that no decision reads the report split: a report split whose labels are shuffled
changes no evaluation's score, no best checkpoint and no early stop (a real tiny model, no Ray)."""

from __future__ import annotations

import csv
import random
import shutil
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from datasets import ClassLabel, Dataset, DatasetDict, Features, Value

from sweep.config.tasks import load_task
from sweep.config.validate import compose_settings
from sweep.data.selection import SELECTION, Selection, carve_selection, report_splits, selection_of
from sweep.errors import ConfigError
from sweep.plan.rung_boards import EarlyStop
from sweep.train.loop import finetune
from tests.helpers.configs import train_config

RTE, MNLI = load_task("RTE"), load_task("MNLI")


def rows(n: int, positives: int, name: str) -> Dataset:
    labels = [1] * positives + [0] * (n - positives)
    features = Features({"text_a": Value("string"), "label": ClassLabel(names=["entailment", "not_entailment"])})
    return Dataset.from_dict({"text_a": [f"{name} {i}" for i in range(n)], "label": labels}, features=features)


def glue(n_train: int = 200, n_dev: int = 40) -> DatasetDict:
    return DatasetDict({"train": rows(n_train, n_train // 4, "train"), "dev": rows(n_dev, n_dev // 2, "dev")})


def test_train_carves_a_stratified_share_of_the_training_rows_the_same_for_every_trial() -> None:
    data, report = carve_selection(glue(), RTE, Selection("train", 0.1, seed=0))
    assert report == ["dev"] and len(data[SELECTION]) == 20 and len(data["train"]) == 180
    assert Counter(data[SELECTION]["label"]) == {1: 5, 0: 15}  # the training rows' 1:3, kept
    assert not set(data[SELECTION]["text_a"]) & set(data["train"]["text_a"])  # disjoint: none trains
    again, _ = carve_selection(glue(), RTE, Selection("train", 0.1, seed=0))
    other, _ = carve_selection(glue(), RTE, Selection("train", 0.1, seed=1))
    assert again[SELECTION]["text_a"] == data[SELECTION]["text_a"]  # the seed fixes the rows
    assert other[SELECTION]["text_a"] != data[SELECTION]["text_a"]


def test_train_takes_at_most_the_dev_splits_rows() -> None:
    data, _ = carve_selection(glue(n_train=2000, n_dev=30), RTE, Selection("train", 0.5))
    assert len(data[SELECTION]) == 30 and len(data["train"]) == 1970


def test_dev_half_and_a_named_split() -> None:
    data, report = carve_selection(glue(), RTE, Selection("dev_half"))
    assert report == ["dev"] and len(data[SELECTION]) == 20 and len(data["dev"]) == 20
    assert not set(data[SELECTION]["text_a"]) & set(data["dev"]["text_a"])
    assert len(data["train"]) == 200  # training rows untouched
    mnli = DatasetDict({"train": rows(100, 25, "t"), "matched": rows(20, 10, "m"), "mismatched": rows(20, 10, "mm")})
    data, report = carve_selection(mnli, MNLI, Selection("mismatched"))
    assert report == ["matched"] and data[SELECTION]["text_a"][0] == "mm 0" and "mismatched" not in data


def test_none_changes_nothing() -> None:
    data, report = carve_selection(glue(), RTE, Selection("none"))
    assert SELECTION not in data and report == ["dev"] and len(data["train"]) == 200


@pytest.mark.parametrize(("override", "says"), [
    ("sweep.selection_fraction=0", "sweep.selection_fraction: must be in (0, 0.5]"),
    ("sweep.selection_fraction=0.6", "sweep.selection_fraction: must be in (0, 0.5]"),
    ("sweep.selection=dev", "sweep.selection: 'dev' is task RTE's only eval split"),
    ("sweep.selection=matched",
     "sweep.selection: 'matched' is neither train, dev_half, none nor an eval split of task RTE"),
])
def test_a_bad_selection_is_one_line_when_the_config_loads(override: str, says: str) -> None:
    with pytest.raises(ConfigError) as error:
        compose_settings("task=RTE", override)
    assert str(error.value).startswith(says) and "\n" not in str(error.value)


def test_the_default_selects_on_training_rows_and_a_named_split_loads() -> None:
    assert selection_of(compose_settings("task=RTE").sweep) == Selection("train", 0.1, 0)
    named = compose_settings("task=MNLI", "sweep.selection=mismatched").sweep
    assert report_splits(MNLI, selection_of(named)) == ["matched"]


def shuffled_dev(data_dir: Path, to: Path) -> Path:
    """A copy of the synthetic GLUE folder whose RTE dev labels are shuffled (the rows' texts unchanged)."""
    shutil.copytree(data_dir, to)
    dev = to / "glue_data" / RTE.folder / "dev.tsv"
    with dev.open() as f:
        table = list(csv.reader(f, delimiter="\t"))
    header, body = table[0], table[1:]
    column = header.index(RTE.label_column)
    labels = [row[column] for row in body]
    random.Random(7).shuffle(labels)
    assert labels != [row[column] for row in body]
    for row, label in zip(body, labels):
        row[column] = label
    with dev.open("w", newline="") as f:
        csv.writer(f, delimiter="\t", lineterminator="\n").writerows([header, *body])
    return to


def test_a_report_split_with_shuffled_labels_changes_no_decision(synthetic_glue_dir: Path, tiny_roberta_dir: Path,
                                                                 cache_dir: Path, tmp_path: Path) -> None:
    """Every evaluation's score, the best evaluation and where a rung stops the trial come from the selection
    split alone: the same with the report split's labels shuffled; only the report metrics move."""
    cfg = train_config(lr=5e-3, batch_size=16, epochs=3, max_seq_length=64, max_train_samples=160,
                       max_eval_samples=64, evals_per_epoch=2)
    shuffled = shuffled_dev(synthetic_glue_dir, tmp_path / "shuffled")

    def run(data_dir: Path):
        seen = []

        def rung(evaluation, save) -> None:  # a decision the way the rungs make one: on the score alone
            seen.append(evaluation)
            if len(seen) >= 3 and evaluation.score < max(e.score for e in seen[:-1]):
                raise EarlyStop("below its best")

        try:
            result = finetune(RTE, tiny_roberta_dir, data_dir, cfg, seed=38, cache_dir=cache_dir, on_evaluation=rung,
                              selection=Selection("train", 0.1, 0))
        except EarlyStop:
            result = None
        return seen, result

    plain, plain_result = run(synthetic_glue_dir)
    other, other_result = run(shuffled)
    assert [e.score for e in plain] == [e.score for e in other]  # every decision's input, unchanged
    assert [e.metrics for e in plain] == [e.metrics for e in other]
    assert len(plain) == len(other)  # stopped (or not) at the same evaluation
    if plain_result is not None:
        assert plain_result.best_index == other_result.best_index
    best_reports = [(a.report_metrics, b.report_metrics) for a, b in zip(plain, other) if a.report_metrics]
    assert best_reports, "the report split was never evaluated"
    assert any(a != b for a, b in best_reports)  # the report split itself did see the shuffled labels
    assert all(e.report_metrics is None for e in plain if e is not plain[0] and e.score <= plain[0].score)


def test_without_a_selection_split_finetune_decides_on_the_eval_split_as_before(
        synthetic_glue_dir: Path, tiny_roberta_dir: Path, cache_dir: Path) -> None:
    cfg = train_config(lr=5e-3, batch_size=16, epochs=1, max_seq_length=64, max_train_samples=64, max_eval_samples=64)
    result = finetune(RTE, tiny_roberta_dir, synthetic_glue_dir, cfg, seed=38, cache_dir=cache_dir)
    assert result.best.report_metrics is None and "acc" in result.best.metrics
    chosen = finetune(RTE, tiny_roberta_dir, synthetic_glue_dir, replace(cfg, max_train_samples=None), seed=38,
                      cache_dir=cache_dir, selection=Selection("train", 0.1, 0))
    assert set(chosen.best.report_metrics) >= {"acc"}  # the best evaluation carries the report split's metrics


def test_the_summary_quotes_the_report_score_of_the_trial_picked_on_the_selection_split() -> None:
    from sweep.results.chance import TrivialScore
    from sweep.results.records import TrialRecord, format_summary, summarize

    # seed 2 wins on the selection split; its report score is what the summary quotes and judges
    records = [TrialRecord("RTE", seed, score=score, report_score=report, metrics={"acc": score},
                           report_metrics={"acc": report})
               for seed, score, report in ((1, 0.70, 0.66), (2, 0.80, 0.62))]
    (summary,) = summarize(records, [RTE], trivial={"RTE": TrivialScore(0.60, 64)})
    assert (summary.best_seed, summary.best_score, summary.best_report_score) == (2, 0.80, 0.62)
    assert summary.report_mean == pytest.approx(0.64)
    assert summary.learned is False  # 0.62 on the report rows is within noise of 0.60 (0.80 would not be)
    assert "(best on the report split: 0.6200)" in format_summary([summary])

