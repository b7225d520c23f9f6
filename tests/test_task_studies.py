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
