"""``sweep.run``'s extension points as one typed value: the user's own scheduler policy, Tune callbacks and
metric functions, carried from ``sweep.run`` to the Tune run (``tuner.run_tune``) and, for the policy and the
metrics, to every trial (``trial/train_fn.TrialContext``). The default is today's sweep, exactly.

Plain Python: Ray only inside ``check`` (a callback's type), which runs before Ray starts.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from sweep.config.metric_names import MetricFn, check_metrics, check_own_metrics
from sweep.config.settings import Settings
from sweep.errors import ConfigError
from sweep.schedulers.policies import SchedulerPolicy


@dataclass(frozen=True)
class Extensions:
    scheduler: SchedulerPolicy | None = None  # None: the policy sweep.scheduler names
    callbacks: tuple[Any, ...] = ()  # ray.tune.Callback instances, after the sweep's own
    metrics: Mapping[str, MetricFn] = field(default_factory=dict)  # name -> fn(predictions, labels) -> float

    @classmethod
    def of(cls, scheduler: SchedulerPolicy | None = None, callbacks: Collection[Any] = (),
           metrics: Mapping[str, MetricFn] | None = None) -> Extensions:
        """``sweep.run``'s keyword arguments as one value (the callbacks a tuple, the metrics a copy: a plain
        dict, which Ray pickles to the trials)."""
        return cls(scheduler, tuple(callbacks), dict(metrics or {}))

    def check(self, settings: Settings) -> None:
        """Every mistake as one ConfigError line before Ray starts: a scheduler that is no SchedulerPolicy, a
        callback that is no Tune callback, a metric that is no function, a task metric nobody computes."""
        if self.scheduler is not None and not isinstance(self.scheduler, SchedulerPolicy):
            raise ConfigError(f"scheduler: {type(self.scheduler).__name__} is not a sweep.SchedulerPolicy; "
                              "subclass it and pass an instance")
        if self.callbacks:
            from ray.tune import Callback  # only a sweep given callbacks pays for the import, here

            wrong = [type(c).__name__ for c in self.callbacks if not isinstance(c, Callback)]
            if wrong:
                raise ConfigError(f"callbacks: {', '.join(wrong)} not ray.tune.Callback instances")
        check_own_metrics(dict(self.metrics))
        check_metrics(settings.tasks, self.metrics)
