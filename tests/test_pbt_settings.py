"""sweep.scheduler=pbt without Ray: its settings refused one line each, the schedule a trial's
history gives, the range a perturbed value is kept in, a row's PBT fields and their MLflow curve."""

from __future__ import annotations

import math

import pytest

from sweep.config.validate import compose_settings
from sweep.errors import ConfigError
from sweep.results.records import format_schedule
from sweep.results.trial_reports import Report, pbt_schedule

LR = "+sweep.pbt.mutations.lr={dist:loguniform,low:1e-5,high:1e-2}"
PBT = ["experiment=demo", "sweep.scheduler=pbt", "sweep.seeds=[1,2,3,4]", "train.epochs=2"]


@pytest.mark.parametrize("overrides, says", [
    ([], r"sweep.pbt.mutations: PBT needs at least one train key to mutate, e.g. '\+sweep.pbt.mutations.lr="),
    (["+sweep.pbt.mutations.batch_size={dist:choice,values:[8,16]}"],
     "sweep.pbt.mutations.batch_size: cannot change in the middle of a trial"),
    (["+sweep.pbt.mutations.lr={dist:loguniform,low:0,high:1e-2}"],
     r"sweep.pbt.mutations.lr: needs numbers low < high \(both > 0 for loguniform\), got low=0"),
    ([LR, "+sweep.grid.lr=[1e-4,1e-3]"], "sweep.pbt.mutations.lr: is also a sweep.grid key"),
    ([LR, "sweep.pbt.interval=0"], "sweep.pbt.interval: must be >= 1 evaluation, got 0"),
    ([LR, "sweep.pbt.interval=2"], r"sweep.pbt.interval: 2 evaluation\(s\), but a trial evaluates only 2 time"),
    ([LR, "sweep.pbt.quantile=0.6"], r"sweep.pbt.quantile: must be in \(0, 0.5\], got 0.6"),
    ([LR, "sweep.pbt.resample_probability=2"], r"sweep.pbt.resample_probability: must be in \[0, 1\], got 2"),
    ([LR, "sweep.search_alg=optuna", "+sweep.search.weight_decay={dist:uniform,low:0,high:0.1}"],
     "sweep.search_alg: optuna cannot drive sweep.scheduler=pbt"),
    ([LR, "sweep.seeds=[1]"], "sweep.scheduler: pbt needs a population of at least 2 trials per task"),
    ([LR, "resources.gpus_per_trial=2"], r"sweep.scheduler: pbt cannot pause the multi-GPU \(DDP\) trials of WNLI"),
])
def test_bad_pbt_settings_are_one_line_each(overrides, says) -> None:
    with pytest.raises(ConfigError, match=f"^{says}") as error:
        compose_settings(*PBT, *overrides)
    assert "\n" not in str(error.value)


def test_good_pbt_settings_pass_and_a_search_key_may_also_be_mutated() -> None:
    s = compose_settings(*PBT, LR, "+sweep.search.lr={dist:loguniform,low:1e-5,high:1e-3}", "sweep.pbt.interval=1")
    assert s.sweep.pbt.mutations == {"lr": {"dist": "loguniform", "low": 1e-5, "high": 1e-2}}


def _row(step: int, lr: float, **extra) -> Report:
    return Report(trial_id="t1", step=step, score=0.5, pbt={"lr": lr}, **extra)


def test_the_schedule_is_each_stretch_of_values_and_an_exploit_starts_at_the_donors_step() -> None:
    rows = [_row(10, 1e-4), _row(20, 1e-4), _row(20, 2.4e-4, donor="t3", donor_step=10), _row(30, 2.4e-4),
            Report(trial_id="t1", trial_error="boom")]  # a row without values is no stretch
    schedule = pbt_schedule(rows)
    assert schedule == [{"from_step": 0, "values": {"lr": 1e-4}, "donor": None},
                        {"from_step": 10, "values": {"lr": 2.4e-4}, "donor": "t3"}]
    assert format_schedule(schedule) == "lr=0.0001 from step 0; lr=0.00024 from step 10 (cloned t3)"
    assert pbt_schedule([Report(trial_id="t", step=10, score=0.5)]) == []  # not a PBT trial


def test_a_rows_pbt_fields_go_through_tune_and_the_history_and_become_an_mlflow_curve() -> None:
    from sweep.hooks.mlflow_runs import evaluation_metrics
    from tests.helpers.configs import train_config

    row = _row(20, 2.4e-4, donor="t3", donor_step=10, epoch=1, steps_total=40, checkpoint_id="abc")
    flat = row.to_row()
    assert flat["pbt/lr"] == 2.4e-4 and flat["donor"] == "t3" and flat["checkpoint_id"] == "abc"
    assert Report.from_row(flat) == row
    step, metrics = evaluation_metrics(row, train_config(epochs=2, evals_per_epoch=2))
    assert (step, metrics["pbt.lr"]) == (20, 2.4e-4)


def test_a_perturbed_value_stays_in_its_range_and_still_moves() -> None:
    from sweep.schedulers.pbt import KeepInRange

    keep = KeepInRange({"lr": {"dist": "loguniform", "low": 1e-5, "high": 1e-2},
                        "warmup_ratio": {"dist": "uniform", "low": 0.0, "high": 0.5},
                        "weight_decay": {"dist": "choice", "values": [0.0, 0.1]}})
    donor = {"lr": 1e-2, "warmup_ratio": 0.4, "weight_decay": 0.1}
    # lr x1.2 past the upper bound goes x0.8 instead; a value in range is left as Tune made it
    assert keep(donor, {"lr": 1.2e-2, "warmup_ratio": 0.48, "weight_decay": 0.0}) == pytest.approx(
        {"lr": 0.8e-2, "warmup_ratio": 0.48, "weight_decay": 0.0})
    # a donor at the lower bound moves up, not onto the bound it sits on (that exploit would change nothing)
    assert keep({"lr": 1e-5}, {"lr": 0.8e-5})["lr"] == pytest.approx(1.2e-5)
    # a range narrower than a step: clamped to the bound
    narrow = KeepInRange({"warmup_ratio": {"dist": "uniform", "low": 0.1, "high": 0.11}})
    assert narrow({"warmup_ratio": 0.1}, {"warmup_ratio": 0.08}) == {"warmup_ratio": 0.11}


def test_pbt_ranks_equal_scores_by_eval_loss_and_a_diverged_trial_last() -> None:
    from types import SimpleNamespace

    from sweep.config.settings import PbtConfig
    from sweep.schedulers.pbt import make_pbt

    pbt = make_pbt(PbtConfig(mutations={"lr": {"dist": "loguniform", "low": 1e-5, "high": 1e-2}}))

    def rank(score: float, loss: float) -> float:
        state = SimpleNamespace()  # the fields PBT keeps of a trial
        pbt._save_trial_state(state, 1, {"score": score, "eval/eval_loss": loss}, trial=None)
        return state.last_score

    assert rank(0.75, 0.9) > rank(0.5, 0.69) > rank(0.5, 0.70) > rank(0.5, float("nan"))
    assert rank(0.75, float("inf")) == rank(0.5, float("nan")) == -math.inf


def test_each_task_and_grid_point_is_a_population_of_its_own() -> None:
    from sweep.results.trial_reports import point_of
    from sweep.schedulers.pbt import population_of

    def config(task, seed, grid):
        return {"trial": point_of(task, seed, grid), "hparams": {"lr": 1e-4}}

    assert population_of(config("RTE", 1, {"batch_size": 8})) == population_of(config("RTE", 2, {"batch_size": 8}))
    assert population_of(config("RTE", 1, {"batch_size": 8})) != population_of(config("RTE", 1, {"batch_size": 16}))
    assert population_of(config("RTE", 1, {})) != population_of(config("MRPC", 1, {}))


def _at(step: int, checkpoint: str, **extra) -> Report:
    return Report(trial_id="t1", step=step, score=0.5, checkpoint_id=checkpoint, **extra)


def test_the_history_a_trial_goes_on_with_is_cut_at_its_checkpoint_not_by_step() -> None:
    from sweep.results.trial_reports import history_to_go_on_from

    # t1 ran to step 20, cloned t3 at step 10 and went on to 20 again, then 30 (not registered: it crashed)
    rows = [_at(10, "a"), _at(20, "b"), _at(20, "c", donor="t3", donor_step=10), _at(30, "d")]
    mine = {"trial_id": "t1", "step": 20, "checkpoint_id": "c"}
    assert history_to_go_on_from(rows, mine, "t1") == rows[:3]  # a step cut would keep b and drop c
    # an exploit keeps the trial's past; an earlier start from the same donor checkpoint is dropped
    donor = {"trial_id": "t3", "step": 10, "checkpoint_id": "z"}
    assert history_to_go_on_from(rows[:2], donor, "t1") == rows[:2]
    assert history_to_go_on_from(rows, donor, "t1") == rows[:2]
    # markers older than checkpoint ids: by step, as before
    assert history_to_go_on_from([_at(10, None), _at(20, None)], {"step": 10}, "t1") == [_at(10, None)]


def test_a_pbt_trials_mlflow_run_is_named_without_the_values_pbt_changes() -> None:
    from sweep.hooks.mlflow_runs import TrialRuns

    settings = compose_settings(*PBT, LR, "+sweep.grid.batch_size=[8,16]")
    runs = TrialRuns(settings, None, "launch")
    assert runs.sampled and runs._named({"lr": 1e-4, "batch_size": 8}) == {"batch_size": 8}


def test_a_pbt_trials_steps_trained_count_each_stretch() -> None:
    from sweep.results.trial_reports import steps_trained

    plain = [_at(10, "a"), _at(20, "b")]
    assert steps_trained(plain) == 20
    # 10 + 10 of its own, then from the donor's step 10 to 20 and 30: 20 more
    assert steps_trained([*plain, _at(20, "c", donor="t3", donor_step=10), _at(30, "d")]) == 40


def test_an_exploit_copies_the_donors_values_but_never_its_identity() -> None:
    """Tune's PBT copies the donor's whole config: the trial keeps its point and its ledger keys (identity,
    round, the earlier launch's trial it goes on as), or a resume would count it as the donor."""
    from types import SimpleNamespace

    from sweep.results.trial_reports import point_of
    from sweep.schedulers.pbt import make_pbt

    settings = compose_settings("experiment=demo", "sweep.scheduler=pbt",
                                "+sweep.pbt.mutations.lr={dist:loguniform,low:1e-5,high:1e-3}")
    pbt = make_pbt(settings.sweep.pbt)
    donor = SimpleNamespace(config={"trial": point_of("WNLI", 1, {}), "hparams": {"lr": 1e-4}, "identity": "WNLI-1",
                                    "sample_round": 0, "continues": {"trial_id": "old_1"}})
    trial = SimpleNamespace(config={"trial": point_of("WNLI", 2, {}), "hparams": {"lr": 5e-4}, "identity": "WNLI-2",
                                    "sample_round": 0})
    config, _ = pbt._get_new_config(trial, donor)
    assert (config["trial"], config["identity"], config["sample_round"]) == (point_of("WNLI", 2, {}), "WNLI-2", 0)
    assert "continues" not in config and 1e-5 <= config["hparams"]["lr"] <= 1e-3
