"""sweep.search_alg=optuna: Tune's ``Searcher`` over ``plan/task_studies`` (a TPE study per task).

It hands out the sweep's trial points (task, seed, grid point) in the dispatch order, each with the
search point its task's study asks for, and tells the study the trial's best score when it ends. Like
``gate.DdpFirst``, no trial follows a DDP one until its workers are placed. Tune saves it with the
experiment: a resumed driver goes on with the same studies.
"""

from __future__ import annotations

import math
import pickle
from typing import Any

from ray.tune.search import Searcher

from sweep.plan.task_studies import StudiesState, TaskStudies


class TaskOptunaSearch(Searcher):
    def __init__(self, trials: list[dict[str, Any]], search: dict[str, Any], seed: int | None,
                 ddp_tasks: set[str]) -> None:
        super().__init__(metric="score", mode="max")
        self.queue = list(trials)  # the trial points still to hand out, in order
        self.search, self.seed = search, seed
        self.budget = max((sum(1 for t in trials if t["task"] == task) for task in {t["task"] for t in trials}),
                          default=0)
        self.studies = TaskStudies(search, seed, self.budget)
        self.live: dict[str, tuple[str, int]] = {}  # Tune trial id -> (task, its number in the task's study)
        self.best: dict[str, float] = {}  # Tune trial id -> its best score so far
        self.ddp_tasks, self.placing = set(ddp_tasks), set()

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True  # the space is sweep.search, given at construction; param_space holds no search keys

    def suggest(self, trial_id: str):
        if self.placing:
            return None
        if not self.queue:
            return Searcher.FINISHED
        point = self.queue.pop(0)
        number, params = self.studies.ask(point["task"])
        self.live[trial_id] = (point["task"], number)
        if point["task"] in self.ddp_tasks:
            self.placing.add(trial_id)
        return {"trial": point, "hparams": params}

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        self.placing.discard(trial_id)  # any report comes from running workers
        score = result.get("score")
        if isinstance(score, (int, float)) and not math.isnan(score):
            self.best[trial_id] = max(self.best.get(trial_id, -math.inf), float(score))

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        self.placing.discard(trial_id)
        if result:
            self.on_trial_result(trial_id, result)
        task, number = self.live.pop(trial_id, (None, None))
        if task is not None:
            self.studies.tell(task, number, None if error else self.best.pop(trial_id, None))

    def save(self, checkpoint_path: str) -> None:
        state = {"queue": self.queue, "studies": self.studies.state, "live": self.live, "best": self.best,
                 "search": self.search, "seed": self.seed, "budget": self.budget, "ddp_tasks": self.ddp_tasks}
        with open(checkpoint_path, "wb") as f:
            pickle.dump(state, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            state = pickle.load(f)
        self.queue, self.search = state["queue"], state["search"]
        self.seed, self.budget = state["seed"], state["budget"]
        self.ddp_tasks, self.placing, self.best = state["ddp_tasks"], set(), state["best"]
        studies_state: StudiesState = state["studies"]
        self.studies, renumbered = TaskStudies.restored(self.search, self.seed, self.budget, studies_state)
        self.live = {trial_id: (task, renumbered[(task, number)]) for trial_id, (task, number) in state["live"].items()}
