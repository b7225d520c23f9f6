"""The MLflow UI as a user sees a sweep in it, read by a real headless Chromium (tests/helpers/browser.py):
the experiment's runs table lists each trial run with its metric, and the registered model's page shows
the ``champion`` alias on its version. Ray-free: the runs are made with MlflowClient on the session's
``mlflow server`` (sqlite, proxied artifacts), as a sweep's tracking makes them."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.helpers.browser import (
    browser_page,
    chromium_path,
    grid_rows,
    mlflow_metric_text,
    open_mlflow_runs,
    registered_model_url,
    wait_for_rows,
    wait_for_text,
)

pytestmark = pytest.mark.slow

TRIALS = {42: 0.5312, 43: 0.6094, 44: 0.5781}  # seed: acc, three distinct values
TIMEOUT_S = 60


@pytest.fixture(scope="module")
def sweep_in_mlflow(mlflow_server) -> dict:
    """A sweep's traces in MLflow: a parent run, one nested child run per seed (param task, seed; metric
    acc), and a registered model of two versions, alias ``champion`` on version 2."""
    chromium_path()  # skip before writing anything when there is no browser
    client = MlflowClient(mlflow_server.url)
    suffix = uuid.uuid4().hex[:8]  # the server is shared by the session (test_mlflow_models registers tiny-RTE)
    experiment_id = client.create_experiment(
        f"ui-sweep-{suffix}", tags={"mlflow.experimentKind": "custom_model_development"})
    parent = client.create_run(experiment_id, run_name=f"RTE sweep {suffix}")
    runs = {}
    for seed, acc in TRIALS.items():
        run = client.create_run(experiment_id, run_name=f"RTE seed {seed}",
                                tags={"mlflow.parentRunId": parent.info.run_id})
        client.log_param(run.info.run_id, "task", "RTE")
        client.log_param(run.info.run_id, "seed", seed)
        client.log_metric(run.info.run_id, "acc", acc)
        client.log_text(run.info.run_id, f"RTE seed {seed}", "model/README.txt")
        client.set_terminated(run.info.run_id)
        runs[seed] = run.info.run_id
    client.set_terminated(parent.info.run_id)

    model = f"tiny-RTE-{suffix}"
    client.create_registered_model(model)
    for seed in (42, 43):
        client.create_model_version(model, f"runs:/{runs[seed]}/model", run_id=runs[seed])
    client.set_registered_model_alias(model, "champion", "2")
    return {"url": mlflow_server.url, "experiment_id": experiment_id, "parent": parent.info.run_name,
            "model": model}


def test_runs_table_and_model_page_show_the_sweep(sweep_in_mlflow: dict, tmp_path: Path) -> None:
    url = sweep_in_mlflow["url"]
    with browser_page(TIMEOUT_S) as page:
        # The runs table: the parent, expanded, with its three children, and the `acc` column shown.
        open_mlflow_runs(page, url, sweep_in_mlflow["experiment_id"], sweep_in_mlflow["parent"],
                         columns=["acc"], timeout_s=TIMEOUT_S)
        expected = [[f"RTE seed {seed}", mlflow_metric_text(acc)] for seed, acc in TRIALS.items()]
        assert mlflow_metric_text(0.5312) == "0.5312"  # shown as logged: every digit, no rounding
        rows = wait_for_rows(page, expected, TIMEOUT_S, screenshot=tmp_path / "runs.png")
        text = wait_for_text(page, [name for name, _ in expected], 5)

        # ... and fails when a run or a value is not there: an absent run, a value on the wrong run.
        assert "RTE seed 45" not in text
        with pytest.raises(AssertionError, match="RTE seed 45"):
            wait_for_text(page, ["RTE seed 45"], timeout_s=1)
        with pytest.raises(AssertionError, match="no row"):
            wait_for_rows(page, [["RTE seed 42", mlflow_metric_text(TRIALS[43])]], timeout_s=1)
        assert not any("RTE seed 42" in row and "0.6094" in row for row in grid_rows(page)), rows

        # The registered model: two versions, `champion` on version 2 (in its row, not version 1's).
        model_url = registered_model_url(url, sweep_in_mlflow["model"])
        page.goto(model_url, wait_until="domcontentloaded")
        wait_for_text(page, ["Version 2", "Version 1", "champion"], TIMEOUT_S, url=model_url,
                      screenshot=tmp_path / "model.png")
        rows = wait_for_rows(page, [["Version 2", "champion"]], TIMEOUT_S)
        assert not any("Version 1" in row and "champion" in row for row in rows), rows
