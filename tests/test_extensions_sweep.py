"""``sweep.run``'s extension points in one real tiny sweep: the user's own scheduler policy (its Tune scheduler
asked, the policy pickled to the trials), a Tune callback of theirs (it sees every trial end) and a metric of
theirs (computed in the trials, recorded, and the task's selection metric). Their Ray-free half:
tests/test_metric_names.py and tests/test_public_api.py."""

from __future__ import annotations

import csv

import pytest
from ray import tune

import sweep

pytestmark = pytest.mark.ray


def test_own_scheduler_callback_and_metric(local_ray, synthetic_glue_dir, cache_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SWEEP_CACHE_DIR", str(cache_dir))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)

    class OwnPolicy(sweep.SchedulerPolicy):  # defined here: Ray pickles it by value to the trials
        asked: list = []

        def tune_scheduler(self, rungs_board):
            OwnPolicy.asked.append(rungs_board)
            return None  # Tune's FIFO

    class CountEnded(tune.Callback):
        def __init__(self):
            self.ended: list[str] = []

        def on_trial_complete(self, iteration, trials, trial, **info):
            self.ended.append(trial.trial_id)

    def half_acc(predictions, labels) -> float:  # a number no built-in metric gives
        return float((predictions == labels).mean()) / 2

    metrics = {"half_acc": half_acc}
    settings = sweep.load_settings("experiment=demo", f"storage.data_dir={synthetic_glue_dir}", "sweep.seeds=[1,2]",
                                   "train.epochs=1", "train.max_train_samples=32", "tracking=none",
                                   "task.WNLI.metric=half_acc", metrics=metrics, out_dir="runs/ext")
    count = CountEnded()

    [summary] = sweep.run(settings, scheduler=OwnPolicy(settings.sweep), callbacks=[count], metrics=metrics)

    assert OwnPolicy.asked == [None]  # the tuner asked the user's policy (no rungs board)
    assert len(count.ended) == 2 == summary.n and summary.failed == 0
    rows = list(csv.DictReader((tmp_path / "runs" / "ext" / "results.csv").open()))
    values = [float(r["metric.half_acc"]) for r in rows]
    assert len(rows) == 2 and all(0 <= v <= 0.5 for v in values)
    assert (summary.metric, summary.best_score) == ("half_acc", pytest.approx(max(values)))
