"""Tune's results -> one record per trial (sweep/driver/tune_results.py), Ray-free on Tune's own ``Result`` objects:
a trial killed before its first report still names its task and seed, so the sweep's end can say that
every trial of that task failed (exit 3) rather than count it as a trial of no task."""

from __future__ import annotations

from ray.tune import Result

from sweep.config.validate import compose_settings
from sweep.driver.tune_results import records_from_results
from sweep.results.outcome import EXIT_TASK_FAILED, exit_code
from sweep.results.records import summarize
from sweep.results.trial_reports import point_of

FOLDER = "train_driver_fn_e2d65b53_2_seed=38,task=RTE_2026-12-04_17-41-50"


def killed_before_reporting() -> Result:
    """What Tune's ResultGrid holds for it: no metrics (so no config), the error, its folder."""
    return Result(metrics={}, checkpoint=None, error=RuntimeError("The actor died unexpectedly"),
                  path=f"/tmp/ray/tune/{FOLDER}")


def test_a_trial_killed_before_its_first_report_is_a_failed_trial_of_its_task() -> None:
    settings = compose_settings("task=RTE", "model=tiny-roberta")
    config = {"trial": point_of("RTE", 38, {})}
    (record,) = records_from_results([killed_before_reporting()], settings, {}, configs={FOLDER: config})
    assert (record.task, record.seed, record.status) == ("RTE", 38, "ERROR")
    assert record.error == "The actor died unexpectedly"  # its one line (sweep.failures.trial_failure_line)
    assert exit_code(summarize([record], settings.tasks)) == EXIT_TASK_FAILED
    # ... which, without the config Tune started it with, was a trial of no task: and the sweep exited 0
    (unknown,) = records_from_results([killed_before_reporting()], settings, {})
    assert (unknown.task, unknown.seed) == ("?", -1)
