"""The scheduler and searcher policies (sweep/schedulers/policies.py) without Ray: each name builds its
policy, each policy's answers and the checks validation keeps by name for them (that no module but the
policies compares a scheduler's or searcher's name: tests/test_architecture.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sweep.config.settings import HalvingConfig, PbtConfig, SweepConfig
from sweep.config.validate import CHOICES, LEARNING, MUTATING, PAUSING
from sweep.errors import ConfigError
from sweep.plan.rung_boards import AshaRungs, SeedHalving
from sweep.schedulers.policies import (
    SCHEDULERS,
    SEARCHERS,
    AshaPolicy,
    FifoPolicy,
    OptunaSearchPolicy,
    PbtPolicy,
    RandomSearchPolicy,
    SeedHalvingPolicy,
    policies_for,
)
from tests.helpers.configs import demo_settings
from tests.test_architecture import POLICY_NAMES

LR = {"dist": "loguniform", "low": 1e-5, "high": 1e-2}
WD = {"dist": "uniform", "low": 0.0, "high": 0.1}
PBT = ("sweep.scheduler=pbt", "sweep.seeds=[1,2,3,4]", "train.epochs=2",
       "+sweep.pbt.mutations.lr={dist:loguniform,low:1e-5,high:1e-2}")


@pytest.mark.parametrize("name, policy", [
    ("fifo", FifoPolicy), ("asha", AshaPolicy), ("seed_halving", SeedHalvingPolicy), ("pbt", PbtPolicy),
])
def test_each_scheduler_name_builds_its_policy(name: str, policy: type) -> None:
    assert type(policies_for(SweepConfig(scheduler=name)).scheduler) is policy


@pytest.mark.parametrize("name, policy", [("random", RandomSearchPolicy), ("optuna", OptunaSearchPolicy)])
def test_each_searcher_name_builds_its_policy(name: str, policy: type) -> None:
    assert type(policies_for(SweepConfig(search_alg=name)).searcher) is policy


def test_the_policies_cover_exactly_the_choices_validation_allows() -> None:
    assert tuple(SCHEDULERS) == CHOICES["sweep.scheduler"]
    assert tuple(SEARCHERS) == CHOICES["sweep.search_alg"]
    assert POLICY_NAMES == {*SCHEDULERS, *SEARCHERS}  # test_architecture's dispatch check looks for every name


def test_an_unknown_name_is_refused_by_validation_and_by_the_factory() -> None:
    unknown = r"^sweep.scheduler: got 'hyperband', allowed: fifo, asha, seed_halving, pbt$"
    with pytest.raises(ConfigError, match=unknown):
        demo_settings("sweep.scheduler=hyperband")
    with pytest.raises(ConfigError, match=r"^sweep.search_alg: got 'grid', allowed: random, optuna$"):
        demo_settings("sweep.search_alg=grid")
    with pytest.raises(ConfigError, match=unknown):
        policies_for(SweepConfig(scheduler="hyperband"))  # a SweepConfig made by hand, never validated


# --- each policy's answers --------------------------------------------------------------------------

def _scheduler(name: str, **sweep):
    return policies_for(SweepConfig(scheduler=name, **sweep)).scheduler


@pytest.mark.parametrize("name, pauses, keeps_all", [
    ("fifo", False, False), ("asha", False, False), ("seed_halving", True, False), ("pbt", True, True),
])
def test_which_schedulers_pause_trials_and_keep_every_checkpoint(name: str, pauses: bool, keeps_all: bool) -> None:
    scheduler = _scheduler(name)
    assert (scheduler.pauses_trials, scheduler.keeps_every_checkpoint) == (pauses, keeps_all)


def test_only_pbt_mutates_and_only_seed_halving_halves_seeds() -> None:
    halving, pbt = HalvingConfig(keep=2, at=0.5), PbtConfig(mutations={"lr": LR})
    answers = {name: (_scheduler(name, halving=halving, pbt=pbt).mutations,
                      _scheduler(name, halving=halving, pbt=pbt).halving) for name in SCHEDULERS}
    assert answers == {"fifo": ({}, None), "asha": ({}, None), "seed_halving": ({}, halving), "pbt": ({"lr": LR}, None)}


def test_the_rungs_board_each_scheduler_asks_for() -> None:
    settings = demo_settings("sweep.seeds=[1,2,3,4]", "sweep.halving.keep=2", "+sweep.grid.epochs=[2,6]")
    boards = {name: policies_for(replace(settings.sweep, scheduler=name)).scheduler.rung_board(settings, 8)
              for name in SCHEDULERS}
    assert boards == {
        "fifo": None, "pbt": None,
        "asha": (AshaRungs, {"max_t": 6}),  # the longest trial's epochs (the grid's)
        "seed_halving": (SeedHalving, {"trials_per_task": {"WNLI": 8}, "keep": 2, "at": 0.25}),
    }


def test_fifo_and_asha_leave_tune_its_default_scheduler() -> None:
    assert _scheduler("fifo").tune_scheduler(None) is None
    assert _scheduler("asha").tune_scheduler("sweep-rungs-x") is None


def test_seed_halving_and_pbt_build_their_tune_schedulers() -> None:
    from sweep.schedulers.pbt import TaskPbt
    from sweep.schedulers.seed_halving import SeedHalvingScheduler

    halving = _scheduler("seed_halving", halving=HalvingConfig(at=0.4)).tune_scheduler("sweep-rungs-x")
    assert isinstance(halving, SeedHalvingScheduler) and (halving.board_name, halving.at) == ("sweep-rungs-x", 0.4)
    assert isinstance(_scheduler("pbt", pbt=PbtConfig(mutations={"lr": LR})).tune_scheduler(None), TaskPbt)


def test_random_search_draws_pbts_first_population_from_the_mutations_the_search_overrides() -> None:
    sweep = SweepConfig(scheduler="pbt", pbt=PbtConfig(mutations={"lr": LR, "weight_decay": WD}),
                        search={"lr": {"dist": "uniform", "low": 1e-4, "high": 2e-4}})
    policies = policies_for(sweep)
    assert policies.searcher.space(policies.scheduler) == {"lr": sweep.search["lr"], "weight_decay": WD}
    fifo = policies_for(replace(sweep, scheduler="fifo"))
    assert fifo.searcher.space(fifo.scheduler) == sweep.search  # no mutations outside PBT


def test_optuna_learns_over_the_search_space_only() -> None:
    policies = policies_for(SweepConfig(search_alg="optuna", search={"lr": LR}))
    assert policies.searcher.space(policies.scheduler) == {"lr": LR}
    assert policies.searcher.learns_from_scores and not policies_for(SweepConfig()).searcher.learns_from_scores


def test_each_searcher_builds_its_tune_searcher_in_the_trials_order() -> None:
    from sweep.results.trial_reports import point_of
    from sweep.schedulers.gate import RandomSearch
    from sweep.schedulers.optuna_search import TaskOptunaSearch

    trials = [point_of("WNLI", seed, {}) for seed in (1, 2, 3, 4)]
    random = policies_for(SweepConfig(search={"lr": LR}, search_seed=3))
    searcher = random.searcher.tune_searcher(trials, {"WNLI"}, random.scheduler)
    assert isinstance(searcher, RandomSearch) and searcher.seed == 3 and set(searcher.space) == {"lr"}
    optuna = policies_for(SweepConfig(search_alg="optuna", search={"lr": LR}, seeds_per_point=2, aggregate="median"))
    searcher = optuna.searcher.tune_searcher(trials, set(), optuna.scheduler)
    assert isinstance(searcher, TaskOptunaSearch)
    assert (searcher.k, searcher.aggregate, searcher.budget) == (2, "median", 2)  # 4 seeds, 2 per point


# --- the names validation checks by (a layer below the policies: held to their answers) ----------------

def test_validations_facts_by_name_are_the_policies_answers() -> None:
    mutating = PbtConfig(mutations={"lr": LR})
    assert set(PAUSING) == {name for name in SCHEDULERS if _scheduler(name).pauses_trials}
    assert set(MUTATING) == {name for name in SCHEDULERS if _scheduler(name, pbt=mutating).mutations}
    assert set(LEARNING) == {name for name, policy in SEARCHERS.items() if policy.learns_from_scores}


@pytest.mark.parametrize("overrides, says", [
    (["sweep.search_alg=optuna"],
     "sweep.search_alg: optuna needs a search space to learn over, e.g. '+sweep.search.lr={dist: loguniform, "
     "low: 1e-5, high: 1e-3}' sweep.num_samples=20"),
    (["sweep.seeds_per_point=3"],
     "sweep.seeds_per_point: 3 needs sweep.search_alg=optuna (random search draws a new point for every trial)"),
    ([*PBT, "sweep.search_alg=optuna", "+sweep.search.weight_decay={dist:uniform,low:0,high:0.1}"],
     "sweep.search_alg: optuna cannot drive sweep.scheduler=pbt: PBT searches by itself (exploit and mutate); "
     "use sweep.search_alg=random for its first population"),
    (["sweep.scheduler=pbt"],
     "sweep.pbt.mutations: PBT needs at least one train key to mutate, e.g. "
     "'+sweep.pbt.mutations.lr={dist: loguniform, low: 1e-5, high: 1e-3}'"),
    ([*PBT, "resources.gpus_per_trial=2"],
     "sweep.scheduler: pbt cannot pause the multi-GPU (DDP) trials of WNLI; give them 1 GPU "
     "(resources.gpus_per_trial=1) or use sweep.scheduler=asha"),
    (["sweep.scheduler=seed_halving", "resources.gpus_per_trial=2"],
     "sweep.scheduler: seed_halving cannot pause the multi-GPU (DDP) trials of WNLI; give them 1 GPU "
     "(resources.gpus_per_trial=1) or use sweep.scheduler=asha"),
])
def test_a_bad_combination_of_a_policy_and_the_config_is_one_line_as_before(overrides: list[str], says: str) -> None:
    with pytest.raises(ConfigError) as e:
        demo_settings(*overrides)
    assert str(e.value) == says


def test_what_only_one_policy_needs_is_not_asked_of_the_others() -> None:
    # pbt's own options, a space for optuna, 1 GPU for the pausing schedulers: the others leave them alone
    demo_settings("sweep.scheduler=asha", "sweep.pbt.interval=0", "resources.gpus_per_trial=2")
    demo_settings(*PBT, "+sweep.search.weight_decay={dist:uniform,low:0,high:0.1}", "sweep.pbt.interval=1")
    demo_settings("sweep.search_alg=optuna", "+sweep.search.lr={dist:loguniform,low:1e-5,high:1e-3}",
                  "sweep.seeds=[1,2,3,4]", "sweep.seeds_per_point=2")
