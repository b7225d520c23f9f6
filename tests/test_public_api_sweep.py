"""``sweep.run(sweep.load_settings(...))`` in-process: a real tiny sweep, offline, as ``sweep run`` runs it
(the lock, the checks, the MLflow parent with the command's params, the Tune run, the best model, results).
The API's Ray-free half is tests/test_public_api.py."""

from __future__ import annotations

import copy

import pytest
from mlflow import MlflowClient
from omegaconf import OmegaConf

import sweep
from sweep.config.validate import compose
from sweep.tracking.store import clean_params

pytestmark = pytest.mark.ray


def test_run_from_python_is_the_commands_sweep(local_ray, synthetic_glue_dir, cache_dir, tmp_path, monkeypatch,
                                               capsys):
    monkeypatch.setenv("SWEEP_CACHE_DIR", str(cache_dir))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    overrides = ["experiment=demo", f"storage.data_dir={synthetic_glue_dir}", "sweep.seeds=[38,39]",
                 "train.epochs=1", "tracking.uri=sqlite:///mlflow.db", "tracking.experiment=from-python"]
    settings = sweep.load_settings(*overrides, out_dir="runs/py")
    before = copy.deepcopy(settings)

    summaries = sweep.run(settings)

    out = tmp_path / "runs" / "py"
    assert [(s.task, s.n, s.failed) for s in summaries] == [("WNLI", 2, 0)]
    assert all(isinstance(s, sweep.TaskSummary) for s in summaries)
    assert (out / "results.csv").is_file() and (out / "best" / "WNLI" / "config.json").is_file()
    assert settings == before and settings.composed == before.composed  # made once, never rewritten
    printed = capsys.readouterr().out
    assert "best WNLI: seed " in printed and f"results: {out / 'results.csv'}" in printed

    # the parent run's params: the config as the command composes it for the same overrides
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("from-python")
    (parent,) = client.search_runs([experiment.experiment_id], "tags.sweep.model = 'tiny-roberta'")
    expected = clean_params(OmegaConf.to_container(compose(*overrides, "out_dir=runs/py"), resolve=True))
    params = {k: v for k, v in parent.data.params.items() if not k.startswith("sources.")}
    assert parent.info.status == "FINISHED" and params == expected
    # ... and where the model and the data came from (docs/sources.md)
    assert (parent.data.params["sources.model.source"], parent.data.params["sources.data.source"],
            parent.data.params["sources.data.folder"]) == ("builder", "folder", str(synthetic_glue_dir))
    assert parent.data.params["out_dir"] == "runs/py" and parent.data.params["train.lr"] == "0.005"
