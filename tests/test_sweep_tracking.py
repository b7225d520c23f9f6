"""A whole sweep tracked in MLflow: parent and nested runs from the Ray workers, the registry, secrets."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
from mlflow import MlflowClient

from sweep.app import run
from tests.helpers.configs import demo_config

SECRET = "s3cr3t-sweep-value-789"


compose_cfg = demo_config


def children(client: MlflowClient, parent) -> list:
    return client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("store", ["sqlite", "server"])
def test_sweep_logs_parent_nested_runs_and_registers_the_best(store, request, local_ray, cache_dir, tmp_path,
                                                               monkeypatch, capsys):
    monkeypatch.setenv("SWEEP_CACHE_DIR", str(cache_dir))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    uri = f"sqlite:///{tmp_path}/mlflow.db" if store == "sqlite" else request.getfixturevalue("mlflow_server").url
    experiment = f"exp-{store}-{tmp_path.name}"
    args = ["sweep.seeds=[38,39]", "train.epochs=2", f"tracking.uri={uri}", f"tracking.experiment={experiment}"]
    run(compose_cfg(*args, f"out_dir={tmp_path / 'one'}"), tmp_path / "one")
    first = capsys.readouterr().out

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    (parent,) = client.search_runs([exp.experiment_id], "tags.sweep.model = 'tiny-roberta'")
    assert parent.info.status == "FINISHED" and parent.data.params["train.lr"] == "0.005"
    trials = children(client, parent)
    assert sorted(r.data.params["seed"] for r in trials) == ["38", "39"]
    for t in trials:
        assert t.info.status == "FINISHED" and t.data.tags["sweep.task"] == "WNLI"
        assert [m.step for m in client.get_metric_history(t.info.run_id, "acc")] == [1, 2]
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"config.yaml", "results.csv", "summary.csv", "seed_scores.png", "expected_max.csv",
            "expected_max.png"} <= artifacts

    # two epochs of the demo leave every seed at the trivial score (0.5 on the balanced dev rows): the best
    # is registered as a version, never champion, and one line says why (issue 18)
    registered = re.search(r"registry: tiny-roberta-WNLI version (\d+), not promoted: it learned nothing", first)
    assert registered, first[-3000:]
    version = client.get_model_version("tiny-roberta-WNLI", registered[1])
    assert version.run_id in {t.info.run_id for t in trials} and version.tags["learned"] == "false"
    assert "champion" not in client.get_registered_model("tiny-roberta-WNLI").aliases
    # an MLflow Model (transformers flavor) logged on the best trial's run, its files once, no optimizer state
    model_id = version.source.removeprefix("models:/")
    assert client.get_logged_model(model_id).source_run_id == version.run_id
    files = {a.path for a in client.list_logged_model_artifacts(model_id, "model")}
    assert "model/config.json" in files and not any("training_state" in f for f in files)
    assert client.list_artifacts(version.run_id) == []
    # what the UI shows: a model-development experiment, trials named by task and seed, task and seed as params
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    assert sorted(t.info.run_name for t in trials) == ["WNLI seed 38", "WNLI seed 39"]
    assert all(t.data.params["task"] == "WNLI" for t in trials)
    assert "warning: WNLI learned nothing: best acc 0.5000 is within noise (±0.1250 on 64 eval rows) of the trivial " \
           "0.5000" in first
    if store == "server":  # what a user opens: the runs table and the model page, in a real browser
        see_it_in_the_browser(uri, exp.experiment_id, parent, trials, version.version, tmp_path)

    # the same sweep again learns nothing again: a second version, still no champion (the registry's rule is
    # the store's kind's business no more than the first version was: once, on sqlite)
    if store == "sqlite":
        run(compose_cfg(*args, f"out_dir={tmp_path / 'two'}"), tmp_path / "two")
        second = capsys.readouterr().out
        assert (f"registry: tiny-roberta-WNLI version {int(version.version) + 1}, not promoted: it learned nothing"
                in second)
        assert "champion" not in client.get_registered_model("tiny-roberta-WNLI").aliases

    # the secret is in the environment of every process, and nowhere in the store
    for run_ in client.search_runs([exp.experiment_id]):
        blob = str(run_.data.params) + str(run_.data.tags)
        assert SECRET not in blob
    if store == "sqlite":
        for path in tmp_path.rglob("*"):
            if path.is_file() and "mlartifacts" in str(path) or path.name == "mlflow.db":
                assert SECRET.encode() not in path.read_bytes(), path


def see_it_in_the_browser(url: str, experiment_id: str, parent, trials, version: str, tmp_path) -> None:
    """MLflow's UI (headless Chromium): each trial's row with its name and task metric under the sweep's
    parent, and the model page with the version the sweep registered (no champion: it learned nothing)."""
    from tests.helpers.browser import (
        browser_page,
        mlflow_metric_text,
        open_mlflow_runs,
        registered_model_url,
        wait_for_rows,
    )

    with browser_page(60) as page:
        open_mlflow_runs(page, url, experiment_id, parent.info.run_name, columns=["acc"], timeout_s=60)
        wait_for_rows(page, [[t.info.run_name, mlflow_metric_text(t.data.metrics["acc"])] for t in trials], 60,
                      screenshot=tmp_path / "runs.png")
        page.goto(registered_model_url(url, "tiny-roberta-WNLI"), wait_until="domcontentloaded")
        rows = wait_for_rows(page, [[f"Version {version}"]], 60, screenshot=tmp_path / "model.png")
        assert not any("champion" in row for row in rows), rows  # it learned nothing: no alias to show


def test_unreachable_tracking_server_stops_before_any_trial(tmp_path):
    env = {**os.environ, "SWEEP_CACHE_DIR": str(tmp_path / "cache")}
    t0 = time.time()
    r = subprocess.run([sys.executable, "-m", "sweep", "experiment=demo", "tracking.uri=http://127.0.0.1:9",
                        f"out_dir={tmp_path / 'out'}"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "cannot reach the MLflow tracking server at http://127.0.0.1:9" in r.stderr
    assert "sweep:" not in r.stdout  # no Tune run was started
    assert time.time() - t0 < 60
