"""sweep.search_alg=optuna: Tune's ``Searcher`` over ``plan/task_studies`` (a TPE study per task).

It hands out the sweep's trial points (task, seed, grid point) in the dispatch order, each with the
search point its study asks for (one study per task and grid point), and tells the study the trial's
best score when it ends. With ``sweep.seeds_per_point=k`` a point is asked once and given to k trials
of its task and grid point (k consecutive seeds), and the study is told their aggregate once all k
have ended. Like ``gate.DdpFirst``,
no trial follows a DDP one until its workers are placed. Tune saves it with the experiment: a resumed
driver goes on with the same studies.
"""

from __future__ import annotations

import json
import math
import pickle
from typing import Any

from ray.tune.search import Searcher

from sweep.plan.task_studies import TaskStudies
from sweep.results.records import AGGREGATES


def group_key(point: dict[str, Any]) -> str:
    """A study, and the trials that share its points: the same task and grid point (a grid's values are
    not the study's to choose, and scores at different grid values must not pull each other)."""
    grid = point.get("grid") or {}
    return f"{point['task']} {json.dumps(grid, sort_keys=True)}" if grid else point["task"]


class TaskOptunaSearch(Searcher):
    def __init__(self, trials: list[dict[str, Any]], search: dict[str, Any], seed: int | None,
                 ddp_tasks: set[str], seeds_per_point: int = 1, aggregate: str = "mean") -> None:
        super().__init__(metric="score", mode="max")
        self.queue = list(trials)  # the trial points still to hand out, in order
        self.search, self.seed = search, seed
        self.k, self.aggregate = seeds_per_point, aggregate
        keys = [group_key(t) for t in trials]
        self.budget = max(map(keys.count, set(keys)), default=0) // seeds_per_point  # points each study is asked for
        self.studies = TaskStudies(search, seed, self.budget)
        self.live: dict[str, tuple[str, int]] = {}  # Tune trial id -> (its study's key, its point's number there)
        self.best: dict[str, float] = {}  # Tune trial id -> its best score so far
        self.open: dict[str, list] = {}  # group key -> [number, params, trials still to hand it]
        self.groups: dict[tuple[str, int], dict[str, Any]] = {}  # (key, number) -> trials left, scores so far
        self.ddp_tasks, self.placing = set(ddp_tasks), set()

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True  # the space is sweep.search, given at construction; param_space holds no search keys

    def suggest(self, trial_id: str):
        if self.placing:
            return None
        if not self.queue:
            return Searcher.FINISHED
        point = self.queue.pop(0)
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
        if point["task"] in self.ddp_tasks:
            self.placing.add(trial_id)
        return {"trial": point, "hparams": dict(params)}

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        self.placing.discard(trial_id)  # any report comes from running workers
        score = result.get("score")
        if isinstance(score, (int, float)) and not math.isnan(score):
            self.best[trial_id] = max(self.best.get(trial_id, -math.inf), float(score))

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        self.placing.discard(trial_id)
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

    def save(self, checkpoint_path: str) -> None:
        state = {key: getattr(self, key) for key in ("queue", "search", "seed", "k", "aggregate", "budget", "live",
                                                      "best", "open", "groups", "ddp_tasks")}
        state["studies"] = self.studies.state
        with open(checkpoint_path, "wb") as f:
            pickle.dump(state, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            state = pickle.load(f)
        studies = state.pop("studies")
        for key, value in state.items():
            setattr(self, key, value)
        self.placing = set()
        # the running points are asked again as they were, under new numbers in the rebuilt studies
        self.studies, new = TaskStudies.restored(self.search, self.seed, self.budget, studies)
        self.live = {trial_id: (key, new[(key, n)]) for trial_id, (key, n) in self.live.items()}
        self.open = {key: [new[(key, n)], params, left] for key, (n, params, left) in self.open.items()}
        self.groups = {(key, new[(key, n)]): group for (key, n), group in self.groups.items()}
