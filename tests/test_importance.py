"""Which hyper-parameter mattered: fANOVA importances of the varied train keys, on synthetic records
whose score depends on one key and not on the other (plus seed noise). Ray-free."""

from __future__ import annotations

import csv
import io
import math
import random
from dataclasses import replace

import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from sweep.config.tasks import load_task
from sweep.results.importance import (
    MIN_TRIALS,
    format_importance,
    importance_csv,
    param_importances,
    report_importance,
    varied_space,
)
from sweep.results.records import TrialRecord
from tests.helpers.configs import demo_settings

RTE, MRPC = load_task("RTE"), load_task("MRPC")
GRID = {"lr": [1e-5, 2e-5, 5e-5], "batch_size": [16, 32]}
SEEDS = range(38, 48)


def grid_records(task: str, score, seeds=SEEDS, noise: float = 0.01, grid=GRID) -> list[TrialRecord]:
    """A record per (grid point, seed): ``score(point)`` plus the seed's noise."""
    rng = random.Random(f"{task}-{score.__name__}")
    return [TrialRecord(task=task, seed=seed, hparams={"lr": lr, "batch_size": bs},
                        score=score({"lr": lr, "batch_size": bs}) + rng.gauss(0, noise))
            for lr in grid["lr"] for bs in grid["batch_size"] for seed in seeds]


def lr_matters(p):  # a smaller learning rate is worse by 0.1 per step of the grid; batch_size changes nothing
    return 0.5 + 0.1 * GRID["lr"].index(p["lr"])


def batch_size_matters(p):
    return 0.5 + 0.2 * (p["batch_size"] == 32)


def test_the_key_that_changes_the_score_is_the_important_one():
    space = varied_space(GRID, {})
    [rte] = param_importances(grid_records("RTE", lr_matters), [RTE], space)
    assert list(rte.importances) == ["lr", "batch_size"] and rte.trials == 60
    assert rte.importances["lr"] > 0.9 and rte.importances["batch_size"] < 0.1
    assert sum(rte.importances.values()) == pytest.approx(1.0)
    assert format_importance(rte) == (f"importance RTE: lr {rte.importances['lr']:.2f}, batch_size "
                                      f"{rte.importances['batch_size']:.2f} (fANOVA over 60 trials)")


def test_the_reverse_case_ranks_the_other_key_first():
    """The grid names lr first: a function that ranks the first key first fails here."""
    [rte] = param_importances(grid_records("RTE", batch_size_matters), [RTE], varied_space(GRID, {}))
    assert list(rte.importances) == ["batch_size", "lr"]
    assert rte.importances["batch_size"] > 0.9 and rte.importances["lr"] < 0.1


def test_the_same_records_give_the_same_importances():
    records, space = grid_records("RTE", lr_matters, noise=0.05), varied_space(GRID, {})
    assert param_importances(records, [RTE], space) == param_importances(records, [RTE], space)


def test_a_min_mode_task():
    lm = load_task("wikitext-2-raw")
    assert lm.mode == "min"
    records = grid_records(lm.name, lambda p: 30.0 - 5.0 * (p["batch_size"] == 32), noise=0.5)
    [result] = param_importances(records, [lm], varied_space(GRID, {}))
    assert next(iter(result.importances)) == "batch_size" and result.importances["batch_size"] > 0.9


def test_a_search_space_with_loguniform():
    search = {"lr": {"dist": "loguniform", "low": 1e-6, "high": 1e-3},
              "weight_decay": {"dist": "uniform", "low": 0.0, "high": 0.1},
              "warmup_ratio": {"dist": "choice", "values": [0.0, 0.06, 0.1]}}
    space = varied_space({}, search)
    assert space["lr"] == FloatDistribution(1e-6, 1e-3, log=True)
    assert space["weight_decay"] == FloatDistribution(0.0, 0.1)
    assert space["warmup_ratio"] == CategoricalDistribution([0.0, 0.06, 0.1])
    rng = random.Random(0)
    records = []
    for seed in range(40):  # random search: every trial is its own point; the score peaks at lr 1e-4.5
        lr = 10 ** rng.uniform(-6, -3)
        hparams = {"lr": lr, "weight_decay": rng.uniform(0, 0.1), "warmup_ratio": rng.choice([0.0, 0.06, 0.1])}
        records.append(TrialRecord("RTE", seed, hparams, score=0.8 - 0.1 * (math.log10(lr) + 4.5) ** 2
                                   + rng.gauss(0, 0.005)))
    [rte] = param_importances(records, [RTE], space)
    assert next(iter(rte.importances)) == "lr" and rte.importances["lr"] > 0.8
    assert set(rte.importances) == {"lr", "weight_decay", "warmup_ratio"}


def test_grid_distributions():
    space = varied_space({"lr": [1e-5, 2e-5], "batch_size": [16, 32, 16], "group_by_length": [True, False],
                          "max_train_samples": [None, 100], "epochs": [3], "weight_decay": [0, 0.01]}, {})
    assert space == {"lr": FloatDistribution(1e-5, 2e-5), "batch_size": IntDistribution(16, 32),
                     "group_by_length": CategoricalDistribution([True, False]),
                     "max_train_samples": CategoricalDistribution([None, 100]),
                     "weight_decay": FloatDistribution(0.0, 0.01)}  # epochs: one value varies nothing


def test_too_few_trials_or_one_point_is_one_line_not_an_error():
    space = varied_space(GRID, {})
    few = grid_records("RTE", lr_matters, seeds=[38])[:MIN_TRIALS - 1]
    one_point = [r for r in grid_records("MRPC", lr_matters) if r.hparams == {"lr": 1e-5, "batch_size": 16}]
    failed = [replace(r, score=None, status="ERROR") for r in grid_records("RTE", lr_matters)]
    rte, mrpc = param_importances(few + failed + one_point, [RTE, MRPC], space)
    assert format_importance(rte) == (f"importance: RTE: needs at least {MIN_TRIALS} finished trials over 2+ "
                                      f"values of a varied key; has {MIN_TRIALS - 1}")
    assert not mrpc.importances and mrpc.skipped.endswith("has 10 at one point")


def test_every_trial_scoring_the_same_is_said_not_shared_out():
    records = grid_records("RTE", lambda p: 0.5, noise=0.0)
    [rte] = param_importances(records, [RTE], varied_space(GRID, {}))
    assert format_importance(rte) == "importance: RTE: every one of its 60 trials scored the same"


def test_records_outside_the_configured_space_or_without_a_finite_score_are_left_out():
    records = grid_records("RTE", lr_matters)
    records[0].hparams["lr"] = 1e-3  # from an older grid
    records[1].score = math.nan  # a diverged loss
    [rte] = param_importances(records, [RTE], varied_space(GRID, {}))
    assert rte.trials == 58 and next(iter(rte.importances)) == "lr"


def test_report_writes_the_csv_and_prints_a_line_per_task(tmp_path, capsys):
    settings = demo_settings("task=[RTE,MRPC]", "+sweep.grid.lr=[1e-5,2e-5,5e-5]", "+sweep.grid.batch_size=[16,32]")
    records = grid_records("RTE", lr_matters) + grid_records("MRPC", lr_matters, seeds=[38])[:2]
    path = report_importance(records, settings.tasks, settings.sweep, tmp_path)
    assert path == tmp_path / "importance.csv"
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    assert [(r["task"], r["param"], r["trials"]) for r in rows] == [("RTE", "lr", "60"), ("RTE", "batch_size", "60")]
    assert float(rows[0]["importance"]) > 0.9
    assert sum(float(r["importance"]) for r in rows) == pytest.approx(1.0, abs=1e-5)
    assert capsys.readouterr().out.splitlines() == [
        f"importance RTE: lr {float(rows[0]['importance']):.2f}, batch_size {float(rows[1]['importance']):.2f} "
        "(fANOVA over 60 trials)",
        f"importance: MRPC: needs at least {MIN_TRIALS} finished trials over 2+ values of a varied key; has 2",
    ]
    assert path.read_text() == importance_csv(param_importances(records, settings.tasks, varied_space(
        settings.sweep.grid, settings.sweep.search)))


@pytest.mark.parametrize("grid", [(), ("+sweep.grid.lr=[2e-5]",)])
def test_no_varied_key_no_output(tmp_path, capsys, grid):
    settings = demo_settings("task=RTE", *grid)
    records = [TrialRecord("RTE", seed, {"lr": 2e-5} if grid else {}, score=0.6 + seed / 1000) for seed in SEEDS]
    assert report_importance(records, settings.tasks, settings.sweep, tmp_path) is None
    assert capsys.readouterr().out == "" and not (tmp_path / "importance.csv").exists()
