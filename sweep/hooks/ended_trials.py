"""Tune keeps, for every trial, a running analysis of every number it ever reported (max, min,
mean, last-5 and last-10 means, with their deques), and a JSON copy of it for its experiment
state. A trial reports some 40 numbers (``trials.Report``: the evaluation, where and when it ran),
so that analysis is most of what a finished trial costs the driver, and the driver grows with the
trials (docs/benchmarks.md: Behind the code's choices). The sweep never reads it (records come from the trials'
histories and last results), so a trial that has ended drops it.
"""

from __future__ import annotations

from typing import Any

from ray.tune import Callback


class ForgetEndedTrialMetrics(Callback):
    """Drops an ended trial's per-metric analysis (Tune's ``metric_analysis``, ``metric_n_steps``).
    Its last result, checkpoints and history stay: they are what the sweep's records read."""

    def on_trial_complete(self, iteration: int, trials: list, trial, **info: Any) -> None:
        forget_metric_analysis(trial)

    def on_trial_error(self, iteration: int, trials: list, trial, **info: Any) -> None:
        forget_metric_analysis(trial)


def forget_metric_analysis(trial) -> None:
    metadata = trial.run_metadata
    # assigning (not clearing in place) also drops Tune's cached JSON of the metadata (its __setattr__)
    metadata.metric_analysis = {}
    metadata.metric_n_steps = {}
