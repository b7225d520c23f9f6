"""ASHA early stopping with one set of rungs per task.

All tasks of a sweep share one Tune run, but their scores are not comparable (a CoLA MCC of 0.3
is good, an SST-2 accuracy of 0.3 is awful): each task's trials compete only with each other.
"""

from __future__ import annotations

from ray.tune.schedulers import AsyncHyperBandScheduler
from ray.tune.schedulers.async_hyperband import _Bracket


class PerTaskASHA(AsyncHyperBandScheduler):
    def __init__(self, max_t: int, grace_period: int = 1, reduction_factor: float = 2):
        super().__init__(time_attr="epoch", max_t=max_t, grace_period=min(grace_period, max_t),
                         reduction_factor=reduction_factor)
        self._grace_period = min(grace_period, max_t)
        self._task_brackets: dict[str, _Bracket] = {}

    def on_trial_add(self, tune_controller, trial) -> None:
        super().on_trial_add(tune_controller, trial)  # checks metric and mode
        task = trial.config.get("task")
        if task not in self._task_brackets:
            self._task_brackets[task] = _Bracket(self._grace_period, self._max_t, self._reduction_factor, 0,
                                                 stop_last_trials=self._stop_last_trials)
        self._trial_info[trial.trial_id] = self._task_brackets[task]
