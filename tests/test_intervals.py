"""The summary's 95% interval over seeds and the paired comparison of the best point with the runner-up
(sweep/results/intervals.py, issue 54), on plain records: no Ray."""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import numpy as np
import pytest

from sweep.config.tasks import load_task
from sweep.results.intervals import ALPHA, compare_paired, mean_interval, seeds_to_reject, sign_flip_p
from sweep.results.records import TaskSummary, TrialRecord, format_summary, format_verdict, summarize, write_results

RTE = load_task("RTE")
LM = type(RTE)(**{**RTE.__dict__, "name": "LM", "kind": "causal_lm", "metric": "perplexity", "mode": "min",
                  "labels": None})
SCORES = [0.61, 0.64, 0.58, 0.66, 0.62, 0.60]


def test_the_interval_holds_the_mean_and_is_the_same_each_time() -> None:
    low, high = mean_interval(SCORES)
    assert low < statistics.fmean(SCORES) < high
    assert mean_interval(SCORES) == (low, high)  # the resampling's seed is fixed
    assert mean_interval(list(reversed(SCORES))) == (low, high)  # nor the order the records came in


def test_a_wider_spread_gives_a_wider_interval() -> None:
    mean = statistics.fmean(SCORES)
    wide = [mean + 3 * (s - mean) for s in SCORES]
    (low, high), (wlow, whigh) = mean_interval(SCORES), mean_interval(wide)
    assert whigh - wlow > high - low


def test_too_few_or_equal_scores() -> None:
    assert mean_interval([0.6]) is None and mean_interval([]) is None
    assert mean_interval([0.6, 0.6, 0.6]) == (0.6, 0.6)  # no spread: a zero-width interval, no NaN, no warning
    assert mean_interval([0.5, 0.7]) == (0.5, 0.7)  # 2 scores: percentile (BCa needs 3), their range


def test_clearly_separated_points_are_distinguishable() -> None:
    best = {seed: 0.70 + 0.01 * (seed % 3) for seed in range(8)}
    runner = {seed: 0.60 + 0.01 * (seed % 2) for seed in range(8)}
    paired = compare_paired(best, runner, "max")
    assert paired.seeds == 8 and paired.p_value < ALPHA and paired.distinguishable
    assert 0 < paired.low <= paired.difference <= paired.high


def test_differences_symmetric_around_zero_are_within_noise() -> None:
    diffs = [0.05, -0.05, 0.02, -0.02, 0.04, -0.04, 0.01, -0.01]
    runner = {seed: 0.6 for seed in range(8)}
    paired = compare_paired({seed: 0.6 + d for seed, d in enumerate(diffs)}, runner, "max")
    assert paired.p_value > 0.5 and paired.distinguishable is False
    assert paired.low < 0 < paired.high
    assert sign_flip_p(np.zeros(5)) == 1.0  # identical points: nothing tells them apart


def test_lower_is_better_in_mode_min() -> None:
    best = {seed: 20.0 + seed % 2 for seed in range(8)}  # perplexity: lower
    runner = {seed: 30.0 + seed % 3 for seed in range(8)}
    paired = compare_paired(best, runner, "min")
    assert paired.difference > 0 and paired.distinguishable
    assert compare_paired(runner, best, "min").distinguishable is False  # the worse one first: not a win


def test_pairing_uses_only_the_shared_seeds() -> None:
    assert compare_paired({1: 0.7, 2: 0.8}, {2: 0.6, 3: 0.5}, "max").distinguishable is None  # 1 shared seed
    assert compare_paired({1: 0.7, 2: 0.8, 3: 0.9}, {2: 0.6, 3: 0.5}, "max").seeds == 2


def test_five_seeds_cannot_reject() -> None:
    """The sign-flip test's smallest p is 2/2^n: even 5 clear wins are p=0.0625, 6 are 0.031."""
    assert seeds_to_reject() == 6
    five = compare_paired({s: 0.9 for s in range(5)}, {s: 0.5 + s / 100 for s in range(5)}, "max")
    assert five.p_value == pytest.approx(0.0625) and not five.distinguishable
    six = compare_paired({s: 0.9 for s in range(6)}, {s: 0.5 + s / 100 for s in range(6)}, "max")
    assert six.p_value == pytest.approx(0.03125) and six.distinguishable


def _grid(task: str, points: dict[float, list[float]]) -> list[TrialRecord]:
    """Trials of a grid over lr, every point on the same seeds 0, 1, …"""
    return [TrialRecord(task=task, seed=seed, score=score, hparams={"lr": lr}, metrics={"x": score})
            for lr, scores in points.items() for seed, score in enumerate(scores)]


def test_summarize_compares_the_best_point_with_the_runner_up() -> None:
    records = _grid("RTE", {1e-5: [0.60, 0.61, 0.59, 0.62, 0.60, 0.61], 2e-5: [0.66, 0.68, 0.65, 0.67, 0.66, 0.69],
                            3e-5: [0.50] * 6})
    (s,) = summarize(records, [RTE])
    assert s.ci_low < s.mean < s.ci_high
    assert (s.best_point, s.runner_up, s.paired_seeds) == ("lr=2e-05", "lr=1e-05", 6)
    assert s.difference == pytest.approx(0.0633, abs=1e-4) and s.p_value < ALPHA and s.distinguishable
    verdict = format_verdict(s)
    assert verdict.startswith("RTE: best point lr=2e-05 beats the runner-up lr=1e-05 by 0.0633")
    assert "(paired over 6 seeds, p=0.031)" in verdict and verdict in format_summary([s])


def test_the_verdict_says_within_noise_and_names_no_winner() -> None:
    records = _grid("RTE", {1e-5: [0.60, 0.66, 0.59, 0.65, 0.61], 2e-5: [0.64, 0.62, 0.63, 0.61, 0.64]})
    (s,) = summarize(records, [RTE])
    assert s.distinguishable is False and s.p_value >= ALPHA
    assert format_verdict(s) == (f"RTE: the best point lr=2e-05 and the runner-up lr=1e-05 are within noise (paired "
                                 f"over 5 seeds, p={s.p_value:.2g}): no point is distinguishable; 5 seeds cannot "
                                 f"reach p<0.05, 6 can")
    assert "beats" not in format_summary([s])


def test_the_verdict_of_points_without_shared_seeds() -> None:
    records = [TrialRecord(task="RTE", seed=seed, score=0.6 + seed / 100, hparams={"lr": seed * 1e-5})
               for seed in (1, 2, 3)]  # random search, a seed each
    (s,) = summarize(records, [RTE])
    assert s.runner_up is not None and s.paired_seeds == 0 and s.p_value is None and s.distinguishable is None
    assert "share 0 seed(s): not compared" in format_summary([s])


def test_mode_min_picks_the_lower_point() -> None:
    records = _grid("LM", {1e-5: [30.0, 31.0, 29.5, 30.5, 30.2, 31.1], 2e-5: [20.0, 21.0, 20.5, 19.8, 20.1, 20.7]})
    (s,) = summarize(records, [LM])
    assert s.best_point == "lr=2e-05" and s.difference > 0 and s.distinguishable


def test_one_point_one_score_has_no_interval_nor_verdict() -> None:
    (s,) = summarize([TrialRecord(task="RTE", seed=1, score=0.6)], [RTE])
    assert (s.ci_low, s.ci_high, s.runner_up, s.distinguishable) == (None, None, None, None)
    table = format_summary([s])
    assert len(table.splitlines()) == 3 and " 0.6000 ± 0.0000                  - " in table


def test_the_files_carry_the_new_fields_and_read_back(tmp_path: Path) -> None:
    records = _grid("RTE", {1e-5: [0.60, 0.61, 0.59], 2e-5: [0.66, 0.68, 0.65]})
    summaries = summarize(records, [RTE])
    write_results(tmp_path, records, summaries)
    (row,) = csv.DictReader((tmp_path / "summary.csv").open())
    for column in ("ci_low", "ci_high", "best_point", "runner_up", "paired_seeds", "p_value", "distinguishable"):
        assert column in row
    assert row["runner_up"] == "lr=1e-05" and row["distinguishable"] == "False"  # 3 seeds: p >= 0.25
    saved = json.loads((tmp_path / "results.json").read_text())["summary"]
    assert [TaskSummary(**s) for s in saved] == summaries  # what a resumed sweep's ended_before rebuilds
    old = {k: v for k, v in saved[0].items() if k not in ("ci_low", "ci_high", "runner_up", "p_value")}
    assert TaskSummary(**old).ci_low is None  # a results.json written before these fields still reads


def test_the_parent_run_has_the_interval_and_the_verdict(tmp_path: Path) -> None:
    """MLflow has what the summary says: <task>.ci_low / .ci_high, .p_value_runner_up, .distinguishable (1/0)."""
    from mlflow import MlflowClient

    from sweep.tracking import SweepTracker

    records = _grid("RTE", {1e-5: [0.60, 0.61, 0.59, 0.62, 0.60, 0.61], 2e-5: [0.66, 0.68, 0.65, 0.67, 0.66, 0.69]})
    records += [TrialRecord(task="LM", seed=1, score=20.0)]  # one score: no interval, no comparison
    summaries = summarize(records, [RTE, LM])
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracker = SweepTracker(uri, "intervals", spool_dir=tmp_path / "mlflow-unsent")
    tracker.start({"task": "RTE,LM"})
    tracker.finish(records, summaries, tmp_path)
    metrics = MlflowClient(tracking_uri=uri).get_run(tracker.run_id).data.metrics
    rte = summaries[0]
    assert (metrics["RTE.ci_low"], metrics["RTE.ci_high"]) == pytest.approx((rte.ci_low, rte.ci_high))
    assert metrics["RTE.p_value_runner_up"] == pytest.approx(rte.p_value) and metrics["RTE.distinguishable"] == 1.0
    assert not [k for k in metrics if k.startswith("LM.") and k.split(".")[1] in ("ci_low", "distinguishable")]
