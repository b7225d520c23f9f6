"""sweep.search_alg=optuna's studies without Ray: TPE learns per task, and a resumed driver's studies go
on from the saved state (no point asked twice, every finished score kept)."""

from __future__ import annotations

import math
import pickle
import statistics

import pytest

from sweep.config.validate import compose_settings
from sweep.errors import ConfigError
from sweep.plan.task_studies import TaskStudies

SEARCH = {"lr": {"dist": "loguniform", "low": 1e-6, "high": 1e-1}}


def score_of(lr: float) -> float:
    """A task that learns only near lr=1e-3 (one end of the range cannot learn, the other diverges)."""
    return 0.5 + 0.4 * math.exp(-((math.log10(lr) + 3) ** 2))


def run_study(studies: TaskStudies, task: str, n: int) -> list[float]:
    scores = []
    for _ in range(n):
        number, params = studies.ask(task)
        scores.append(score_of(params["lr"]))
        studies.tell(task, number, scores[-1])
    return scores


def test_tpe_concentrates_where_the_score_is_high() -> None:
    for seed in range(5):  # not one lucky sampler seed
        scores = run_study(TaskStudies(SEARCH, seed=seed, budget=24), "RTE", 24)
        first, second = scores[:12], scores[12:]
        assert statistics.mean(second) > statistics.mean(first), (seed, first, second)
        assert max(scores) > 0.85


def test_each_task_learns_alone() -> None:
    studies = TaskStudies(SEARCH, seed=0, budget=12)
    run_study(studies, "RTE", 12)
    # a task whose best lr is elsewhere: RTE's results must not pull it (its own study starts from random)
    number, _ = studies.ask("CoLA")
    assert number == 0 and studies.finished("CoLA") == 0 and studies.finished("RTE") == 12


def test_a_failed_trial_is_told_as_failed_and_counted() -> None:
    studies = TaskStudies(SEARCH, seed=0)
    number, _ = studies.ask("RTE")
    studies.tell("RTE", number, None)
    assert studies.finished("RTE") == 1
    assert studies.studies["RTE"].trials[0].state.name == "FAIL"


@pytest.mark.parametrize("done", [1, 8])  # killed in TPE's random start-up, and after it
def test_restored_studies_go_on_without_repeating_a_point(done: int) -> None:
    studies = TaskStudies(SEARCH, seed=1, budget=20)
    run_study(studies, "RTE", done)
    running = [studies.ask("RTE") for _ in range(2)]  # in flight when the driver died
    saved = pickle.loads(pickle.dumps(studies.state))  # what the searcher's checkpoint holds

    again, renumbered = TaskStudies.restored(SEARCH, 1, 20, saved)
    assert again.finished("RTE") == done
    study = again.studies["RTE"]
    assert sorted(t.value for t in study.trials if t.value is not None) == sorted(
        score for _, score in studies.state.finished["RTE"])
    for old, params in running:  # re-asked as they were, under new numbers
        new = renumbered[("RTE", old)]
        assert study.trials[new].params == params
        again.tell("RTE", new, score_of(params["lr"]))
    run_study(again, "RTE", 18 - done)
    points = [round(t.params["lr"], 15) for t in again.studies["RTE"].trials]
    assert len(points) == 20 and len(set(points)) == 20  # the count right, no point asked twice


@pytest.mark.parametrize("overrides, says", [
    (["sweep.search_alg=tpe"], "sweep.search_alg: got 'tpe', allowed: random, optuna"),
    (["sweep.search_alg=optuna"], "sweep.search_alg: optuna needs a search space"),
])
def test_bad_search_settings_are_one_line_each(overrides, says) -> None:
    with pytest.raises(ConfigError, match=says.replace("(", r"\(")):
        compose_settings("experiment=demo", *overrides)


# --- the Tune searcher over the studies, driven as Tune drives it (no Ray cluster needed) -----------

def trial_points(tasks=("RTE", "CoLA"), seeds=(1, 2, 3, 4, 5, 6), samples=2) -> list[dict]:
    return [{"task": t, "seed": s, "grid": {}} for _ in range(samples) for t in tasks for s in seeds]


def searcher(k: int = 1, aggregate: str = "mean", **kwargs):
    from sweep.schedulers.optuna_search import TaskOptunaSearch

    return TaskOptunaSearch(trial_points(**kwargs), SEARCH, 0, set(), seeds_per_point=k, aggregate=aggregate)


def finish(search, trial_id: str, config: dict, noise: float = 0.0) -> float:
    score = score_of(config["hparams"]["lr"]) + noise
    search.on_trial_result(trial_id, {"score": score - 0.1})  # an earlier, worse evaluation
    search.on_trial_complete(trial_id, {"score": score})
    return score


@pytest.mark.parametrize("aggregate", ["mean", "median"])
def test_seeds_per_point_share_a_point_and_the_study_gets_their_aggregate(aggregate) -> None:
    search = searcher(k=3, aggregate=aggregate)
    configs = {f"t{i}": search.suggest(f"t{i}") for i in range(24)}
    assert search.suggest("t24") == "FINISHED"
    for task in ("RTE", "CoLA"):  # 12 trials per task: 4 points of 3 consecutive seeds each
        mine = [c for c in configs.values() if c["trial"]["task"] == task]
        points = [mine[i]["hparams"]["lr"] for i in range(0, 12, 3)]
        assert all(mine[i]["hparams"]["lr"] == points[i // 3] for i in range(12)) and len(set(points)) == 4
        assert [c["trial"]["seed"] for c in mine[:3]] == [1, 2, 3]
    scores: dict[tuple[str, float], list[float]] = {}
    for i, (trial_id, config) in enumerate(configs.items()):
        point = (config["trial"]["task"], config["hparams"]["lr"])
        scores.setdefault(point, []).append(finish(search, trial_id, config, noise=0.01 * (i % 3)))
    told = search.studies.state.finished
    assert {task: len(points) for task, points in told.items()} == {"RTE": 4, "CoLA": 4}
    combine = statistics.fmean if aggregate == "mean" else statistics.median
    for task, points in told.items():
        for params, value in points:
            assert value == pytest.approx(combine(scores[(task, params["lr"])]))  # their best scores, combined


def test_a_point_is_told_only_when_all_its_seeds_have_ended_and_failures_are_left_out() -> None:
    search = searcher(k=3, tasks=("RTE",), samples=1)
    configs = [search.suggest(f"t{i}") for i in range(3)]
    first = finish(search, "t0", configs[0])
    search.on_trial_complete("t1", None, error=True)  # a seed that failed
    assert search.studies.finished("RTE") == 0  # one seed still running
    third = finish(search, "t2", configs[2])
    assert search.studies.state.finished["RTE"][0][1] == pytest.approx(statistics.fmean([first, third]))


def test_the_searcher_saved_mid_sweep_goes_on_in_a_new_driver(tmp_path) -> None:
    search = searcher(k=3)
    configs = {f"t{i}": search.suggest(f"t{i}") for i in range(8)}  # RTE's 6 seeds, 2 of CoLA's
    for trial_id in ("t0", "t1", "t2", "t3"):
        finish(search, trial_id, configs[trial_id])
    search.save(str(tmp_path / "searcher.pkl"))

    again = searcher(k=3)  # what Tune.restore builds, then restores into
    again.restore(str(tmp_path / "searcher.pkl"))
    for trial_id in ("t4", "t5", "t6", "t7"):  # the trials that were running go on, told to the same points
        finish(again, trial_id, configs[trial_id])
    rest = {f"n{i}": again.suggest(f"n{i}") for i in range(16)}
    assert again.suggest("n16") == "FINISHED"
    cola = [c for c in rest.values() if c["trial"]["task"] == "CoLA"]
    assert cola[0]["hparams"] == configs["t6"]["hparams"]  # CoLA's open point keeps its third seed
    for trial_id, config in rest.items():
        finish(again, trial_id, config)
    told = again.studies.state.finished
    assert {task: len(points) for task, points in told.items()} == {"RTE": 4, "CoLA": 4}
    lrs = [params["lr"] for points in told.values() for params, _ in points]
    assert len(set(lrs)) == 8  # no point asked twice across the restart


@pytest.mark.parametrize("overrides, says", [
    (["sweep.seeds_per_point=0"], "sweep.seeds_per_point: must be >= 1, got 0"),
    (["sweep.seeds_per_point=2", "sweep.seeds=[1,2,3]", "sweep.search_alg=optuna",
      "+sweep.search.lr={dist:loguniform,low:1e-6,high:1e-3}"], "sweep.seeds_per_point: 2 must divide the number"),
    (["sweep.seeds_per_point=2", "sweep.seeds=[1,2]"], "sweep.seeds_per_point: 2 needs sweep.search_alg=optuna"),
    (["sweep.aggregate=max"], "sweep.aggregate: got 'max', allowed: mean, median"),
])
def test_bad_seeds_per_point_settings_are_one_line_each(overrides, says) -> None:
    with pytest.raises(ConfigError, match=says):
        compose_settings("experiment=demo", *overrides)


def test_the_best_model_is_the_best_seed_of_the_best_point_and_the_points_are_ranked() -> None:
    from sweep.config.tasks import load_task
    from sweep.results.records import TrialRecord, best_per_task, format_points

    spec = load_task("RTE")
    # a steady point (0.70 on every seed) and a lucky one (one seed at 0.80, the rest at chance)
    steady = [TrialRecord("RTE", s, hparams={"lr": 1e-4}, score=0.70 + s / 1000) for s in (1, 2, 3)]
    lucky = [TrialRecord("RTE", s, hparams={"lr": 1e-2}, score=score) for s, score in ((4, 0.80), (5, 0.5), (6, 0.5))]
    records = steady + lucky
    assert best_per_task(records, [spec])["RTE"].seed == 4  # single runs: the luckiest seed
    assert best_per_task(records, [spec], "mean")["RTE"].seed == 3  # over seeds: the steady config's best seed
    assert format_points(records, [spec], "mean") == (
        "points RTE by the mean of their seeds: lr=0.0001: 0.7020 ± 0.0010 (3 seeds); "
        "lr=0.01: 0.6000 ± 0.1732 (3 seeds)")
    assert best_per_task(records, [spec], "median")["RTE"].seed == 3


def test_each_grid_point_of_a_task_has_its_own_study() -> None:
    from sweep.schedulers.optuna_search import TaskOptunaSearch

    trials = [{"task": "RTE", "seed": s, "grid": {"batch_size": b}} for b in (8, 16) for s in (1, 2)]
    search = TaskOptunaSearch(trials, SEARCH, 0, set())
    for i in range(4):
        finish(search, f"t{i}", search.suggest(f"t{i}"))
    assert sorted(search.studies.state.finished) == ['RTE {"batch_size": 16}', 'RTE {"batch_size": 8}']
    assert all(len(points) == 2 for points in search.studies.state.finished.values())
