"""The sweep's own Tune searchers (schedulers/gate.py) without a cluster: the trial points in the given order,
each drawn from the space by (seed, position), the DDP gate, and a saved state that is a position,
not a copy of every trial (Tune saves the searcher with each experiment snapshot)."""

from __future__ import annotations

import pickle

import pytest
from ray.tune.search import Searcher

from sweep.schedulers.gate import RandomSearch
from sweep.schedulers.optuna_search import TaskOptunaSearch

SPACE = {"lr": {"dist": "loguniform", "low": 1e-5, "high": 1e-2},
         "batch_size": {"dist": "choice", "values": [8, 16, 32]}}


def _points(n: int, task: str = "RTE") -> list[dict]:
    return [{"task": task, "seed": i, "grid": {}} for i in range(n)]


def _hand_out(searcher, n: int) -> list[dict]:
    configs = [searcher.suggest(f"t{i}") for i in range(n)]
    assert all(isinstance(c, dict) for c in configs)
    return configs


def test_random_search_hands_out_the_points_in_order_with_draws_in_the_space_then_finishes():
    search = RandomSearch(_points(20), set(), SPACE, seed=0)
    configs = _hand_out(search, 20)
    assert [c["trial"]["seed"] for c in configs] == list(range(20))
    lrs = [c["hparams"]["lr"] for c in configs]
    assert all(1e-5 <= lr <= 1e-2 for lr in lrs) and len(set(lrs)) == 20
    assert {c["hparams"]["batch_size"] for c in configs} <= {8, 16, 32}
    assert all(type(c["hparams"]["lr"]) is float for c in configs)  # plain Python for JSON and MLflow
    assert search.suggest("t20") == Searcher.FINISHED


def test_a_seed_repeats_the_draws_and_another_seed_does_not():
    first = [c["hparams"] for c in _hand_out(RandomSearch(_points(8), set(), SPACE, seed=3), 8)]
    again = [c["hparams"] for c in _hand_out(RandomSearch(_points(8), set(), SPACE, seed=3), 8)]
    other = [c["hparams"] for c in _hand_out(RandomSearch(_points(8), set(), SPACE, seed=4), 8)]
    assert first == again and first != other
    # no seed given: a fresh one each sweep
    assert RandomSearch(_points(1), set(), SPACE, None).seed != RandomSearch(_points(1), set(), SPACE, None).seed


def test_a_restored_search_goes_on_where_it_was_with_the_draws_it_would_have_made(tmp_path):
    whole = _hand_out(RandomSearch(_points(10), set(), SPACE, seed=7), 10)
    killed = RandomSearch(_points(10), set(), SPACE, seed=7)
    _hand_out(killed, 4)
    killed.save(str(tmp_path / "state.pkl"))
    resumed = RandomSearch(_points(10), set(), SPACE, seed=7)
    resumed.restore(str(tmp_path / "state.pkl"))
    assert _hand_out(resumed, 6) == whole[4:]
    assert resumed.suggest("t10") == Searcher.FINISHED
    # a fresh seed is saved with the state: the resumed sweep draws as the killed one would have
    unseeded = RandomSearch(_points(10), set(), SPACE, seed=None)
    unseeded.save(str(tmp_path / "fresh.pkl"))
    later = RandomSearch(_points(10), set(), SPACE, seed=None)
    later.restore(str(tmp_path / "fresh.pkl"))
    assert _hand_out(later, 10) == _hand_out(unseeded, 10)


def test_the_saved_state_does_not_grow_with_the_number_of_trials(tmp_path):
    sizes = {}
    for n in (10, 1000):
        search = RandomSearch(_points(n), set(), SPACE, seed=1)
        _hand_out(search, 5)
        search.save(str(tmp_path / f"{n}.pkl"))
        sizes[n] = (tmp_path / f"{n}.pkl").stat().st_size
    assert sizes[1000] <= sizes[10] + 8, sizes  # the count is one int either way
    # a sweep whose points differ from the saved ones is refused, not silently misaligned
    other = RandomSearch(_points(11), set(), SPACE, seed=1)
    with pytest.raises(RuntimeError, match="the saved search covered 10 trials, this sweep has 11"):
        other.restore(str(tmp_path / "10.pkl"))


def test_nothing_follows_a_ddp_trial_until_its_workers_report_or_it_ends():
    points = [{"task": "MNLI", "seed": 1, "grid": {}}, *_points(2)]
    search = RandomSearch(points, {"MNLI"}, SPACE, seed=0)
    assert search.suggest("ddp")["trial"]["task"] == "MNLI"
    assert search.suggest("next") is None  # held: the DDP trial's workers are not placed yet
    search.on_trial_result("ddp", {"workers_ready": 1})
    assert search.suggest("next")["trial"]["seed"] == 0
    search.on_trial_complete("next")
    assert search.suggest("last")["trial"]["seed"] == 1


def test_optuna_search_saves_its_position_and_studies_not_the_trial_list(tmp_path):
    search = TaskOptunaSearch(_points(6), {"lr": SPACE["lr"]}, seed=0, ddp_tasks=set())
    configs = _hand_out(search, 3)
    for i in range(len(configs)):
        search.on_trial_complete(f"t{i}", {"score": float(i)})
    search.save(str(tmp_path / "optuna.pkl"))
    state = pickle.loads((tmp_path / "optuna.pkl").read_bytes())
    assert state["position"] == 3 and state["count"] == 6 and "trials" not in state
    resumed = TaskOptunaSearch(_points(6), {"lr": SPACE["lr"]}, seed=0, ddp_tasks=set())
    resumed.restore(str(tmp_path / "optuna.pkl"))
    rest = _hand_out(resumed, 3)
    assert [c["trial"]["seed"] for c in rest] == [3, 4, 5]
    assert len({c["hparams"]["lr"] for c in configs + rest}) == 6  # no point asked twice
    assert resumed.suggest("t6") == Searcher.FINISHED


def test_a_resumed_search_goes_on_from_the_restored_trials_not_a_torn_snapshot_of_itself(tmp_path):
    """Tune uploads its snapshot file by file: the searcher's file may be newer (it handed out a trial the
    restored list lacks) or older than the trial list, and the limiter's may count a trial that is not there."""
    from ray.tune.search import ConcurrencyLimiter

    from sweep.hooks.resumed_search import reconcile

    whole = _hand_out(RandomSearch(_points(4), set(), SPACE, seed=5), 4)
    newer = RandomSearch(_points(4), set(), SPACE, seed=5)
    _hand_out(newer, 2)  # it handed out seeds 0 and 1 ...
    limiter = ConcurrencyLimiter(newer, max_concurrent=1)
    limiter.live_trials, limiter.num_unfinished_live_trials = {"lost"}, 1  # ... and counts the lost one as live
    reconcile(limiter, [("t0", "TERMINATED")])  # ... but the trial list holds seed 0 only, finished
    again = limiter.suggest("t1")
    assert again == whole[1]  # seed 1 is handed out again, with the draw it had
    assert limiter.suggest("t2") is None  # one at a time: t1 is the one live trial
    limiter.on_trial_complete("t1", {"score": 0.5})
    assert [limiter.suggest(f"t{i}") for i in (2, 3)][0] == whole[2]

    older = RandomSearch(_points(4), set(), SPACE, seed=5)  # handed out nothing, the list holds three trials
    reconcile(ConcurrencyLimiter(older, max_concurrent=2), [("t0", "TERMINATED"), ("t1", "RUNNING"), ("t2", "PENDING")])
    assert older.suggest("t3") == whole[3] and older.suggest("t4") == Searcher.FINISHED
