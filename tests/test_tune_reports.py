"""A multi-worker trial's reports reach Tune from the trial's own thread (sweep/trial/tune_reports.py):
with a driver busy when the Train run reports and then fails, the trial still ends, its rows in order."""

from __future__ import annotations

import time

import pytest

DRIVER_BUSY_S = 8.0  # longer than Train takes to see the failed worker group and end fit


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_ddp_trial_reporting_then_failing_under_a_busy_driver_ends_with_every_row_in_order(tmp_path, local_ray):
    """Train's workers report twice, then raise; Tune's driver spends DRIVER_BUSY_S on the first row (as
    one logging to a slow MLflow store on a loaded machine), so the second is still queued when fit
    raises and the trainable reports its own last row. Through Ray's TuneReportCallback the trial
    process's main thread blocks for ever here (CI's 73-min hang); here the trial ends, Tune holding
    the workers' two rows then the trainable's, and no Train worker is left."""
    import ray.train
    from ray import tune
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from sweep.trial.tune_reports import fit_reporting_to_tune
    from tests.helpers.sweeps import TRAIN_WORKER, actors

    def loop(config):
        from ray.train.v2._internal.execution.context import get_train_context

        for step in range(2):
            ray.train.report({"step": step})
        # Raise only once Train's controller has taken this rank's last report: a rank that raises
        # while another's report is still unpolled ends the run without it (Ray drops it; CI saw
        # rows [0, failed] when one worker started a poll behind the other). The point here is
        # what happens to reports Train has passed on, not Train's own race.
        get_train_context().get_result_queue().join()
        raise ValueError("the trial's own data is bad")

    def trainable(config):
        try:
            fit_reporting_to_tune(lambda reports: TorchTrainer(
                loop, scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
                run_config=RunConfig(name="ddp", storage_path=str(tmp_path / "train"), callbacks=[reports],
                                     failure_config=FailureConfig(max_failures=0))))
        except Exception as error:  # WorkerGroupError: what train_driver_fn sorts and reports
            tune.report({"failed": "own data is bad" in str(error)})

    class BusyDriver(tune.Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):
            if result.get("step") == 0:
                time.sleep(DRIVER_BUSY_S)

    started = time.monotonic()
    grid = tune.Tuner(trainable, run_config=tune.RunConfig(
        storage_path=str(tmp_path / "tune"), callbacks=[BusyDriver()], verbose=0)).fit()
    took = time.monotonic() - started
    rows = grid[0].metrics_dataframe
    assert grid[0].error is None, grid[0].error
    assert list(rows["step"].iloc[:2]) == [0, 1] and bool(rows["failed"].iloc[2]) is True, rows
    assert took < 120, took  # not hung (pytest's timeout is the backstop)
    assert not actors(TRAIN_WORKER), "a Train worker outlived its trial"
