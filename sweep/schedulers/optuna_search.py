"""sweep.search_alg=optuna: Tune's ``Searcher`` over ``plan/task_studies`` (a TPE study per task).

It hands out the sweep's trial points (task, seed, grid point) in the dispatch order, each with the
search point its study asks for (one study per task and grid point), and tells the study the trial's
best score when it ends. With ``sweep.seeds_per_point=k`` a point is asked once and given to k trials
of its task and grid point (k consecutive seeds), and the study is told their aggregate once all k
have ended. Its order, its DDP gate and its saved position are ``gate.OrderedTrials``'. Tune saves
it with the experiment: a resumed driver goes on with the same studies.
"""

from __future__ import annotations

import json
import math
from typing import Any

from sweep.plan.task_studies import TaskStudies
from sweep.results.records import AGGREGATES
from sweep.schedulers.gate import OrderedTrials


def group_key(point: dict[str, Any]) -> str:
    """A study, and the trials that share its points: the same task and grid point (a grid's values are
    not the study's to choose, and scores at different grid values must not pull each other)."""
    grid = point.get("grid") or {}
    return f"{point['task']} {json.dumps(grid, sort_keys=True)}" if grid else point["task"]


class TaskOptunaSearch(OrderedTrials):
    def __init__(self, trials: list[dict[str, Any]], search: dict[str, Any], seed: int | None,
                 ddp_tasks: set[str], seeds_per_point: int = 1, aggregate: str = "mean") -> None:
        super().__init__(trials, ddp_tasks)
        self.search, self.seed = search, seed
        self.k, self.aggregate = seeds_per_point, aggregate
        keys = [group_key(t) for t in trials]
        self.budget = max(map(keys.count, set(keys)), default=0) // seeds_per_point  # points each study is asked for
        self.studies = TaskStudies(search, seed, self.budget)
        self.live: dict[str, tuple[str, int]] = {}  # Tune trial id -> (its study's key, its point's number there)
        self.best: dict[str, float] = {}  # Tune trial id -> its best score so far
        self.open: dict[str, list] = {}  # group key -> [number, params, trials still to hand it]
        self.groups: dict[tuple[str, int], dict[str, Any]] = {}  # (key, number) -> trials left, scores so far

    def config_of(self, trial_id: str, point: dict[str, Any]) -> dict[str, Any]:
        key = group_key(point)
        if key not in self.open:
            number, params = self.studies.ask(key)
            self.open[key] = [number, params, self.k]
            self.groups[(key, number)] = {"left": self.k, "scores": []}
        number, params, _ = opened = self.open[key]
        opened[2] -= 1
        if not opened[2]:
            del self.open[key]
        self.live[trial_id] = (key, number)
        return {"trial": point, "hparams": dict(params)}

    def config_known(self, trial_id: str, point: dict[str, Any], hparams: dict[str, Any]) -> dict[str, Any]:
        """An earlier launch's trial going on with its params: asked again as it was, its own group of one
        (its seeds' other trials may have ended in that launch)."""
        key = group_key(point)
        number, params = self.studies.ask(key, hparams)
        self.groups[(key, number)] = {"left": 1, "scores": []}
        self.live[trial_id] = (key, number)
        return {"trial": point, "hparams": dict(params)}

    def learn_from(self, ended: list[tuple[dict[str, Any], dict[str, Any], float | None]]) -> None:
        """Each study told the points an earlier launch finished: their seeds' aggregate, as when they ended."""
        scores: dict[tuple[str, str], list[float | None]] = {}
        params_of: dict[tuple[str, str], dict[str, Any]] = {}
        for point, hparams, score in ended:
            at = (group_key(point), json.dumps(hparams, sort_keys=True))
            scores.setdefault(at, []).append(score)
            params_of[at] = hparams
        for at, values in scores.items():
            ok = [v for v in values if v is not None]
            self.studies.add_finished(at[0], params_of[at], AGGREGATES[self.aggregate](ok) if ok else None)

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        super().on_trial_result(trial_id, result)
        score = result.get("score")
        if isinstance(score, (int, float)) and not math.isnan(score):
            self.best[trial_id] = max(self.best.get(trial_id, -math.inf), float(score))

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        super().on_trial_complete(trial_id, result=result, error=error)
        if result:
            self.on_trial_result(trial_id, result)
        key, number = self.live.pop(trial_id, (None, None))
        if key is None:
            return
        score = self.best.pop(trial_id, None)
        group = self.groups[(key, number)]
        if score is not None and not error:
            group["scores"].append(score)
        group["left"] -= 1
        if not group["left"]:  # every seed of the point has ended: the study learns their aggregate
            del self.groups[(key, number)]
            scores = group["scores"]
            self.studies.tell(key, number, AGGREGATES[self.aggregate](scores) if scores else None)

    def saved_state(self) -> dict[str, Any]:
        state = {key: getattr(self, key) for key in ("search", "seed", "k", "aggregate", "budget", "live",
                                                      "best", "open", "groups")}
        return {**super().saved_state(), **state, "studies": self.studies.state}

    def restore_state(self, state: dict[str, Any]) -> None:
        super().restore_state(state)
        state = dict(state)
        studies = state.pop("studies")
        for key in ("search", "seed", "k", "aggregate", "budget", "live", "best", "open", "groups"):
            setattr(self, key, state[key])
        # the running points are asked again as they were, under new numbers in the rebuilt studies
        self.studies, new = TaskStudies.restored(self.search, self.seed, self.budget, studies)
        self.live = {trial_id: (key, new[(key, n)]) for trial_id, (key, n) in self.live.items()}
        self.open = {key: [new[(key, n)], params, left] for key, (n, params, left) in self.open.items()}
        self.groups = {(key, new[(key, n)]): group for (key, n), group in self.groups.items()}
