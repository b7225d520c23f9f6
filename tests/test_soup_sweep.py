"""A LoRA sweep with seed soups on, as a person runs it: the soup's model loads, serves and predicts, with
its scores beside the seeds' in the summary and in MLflow."""

from __future__ import annotations

import csv
import json

import pytest
from mlflow import MlflowClient

from sweep.config.tasks import load_task
from sweep.results.export_layout import MADE_BY
from tests.helpers.sweeps import sweep_cmd


@pytest.mark.ray
@pytest.mark.slow
def test_a_lora_sweep_with_soups_leaves_a_soup_that_serves_with_its_scores_beside_the_seeds(tmp_path):
    from tests.helpers.serving import ask_a_pair, output

    out = tmp_path / "out"
    r = sweep_cmd("experiment=demo", "train.method=lora", "sweep.seeds=[38,39]", "sweep.soup=true", "train.init_seed=0",
                  "train.epochs=2", f"out_dir={out}", cwd=tmp_path, cache=tmp_path / "cache")
    assert r.returncode == 0, r.stderr[-3000:]
    soup = out / "soup" / "WNLI"
    assert {"config.json", "model.safetensors", "adapter", MADE_BY} <= {p.name for p in soup.iterdir()}
    assert json.loads((soup / MADE_BY).read_text())["soup_of_seeds"] == [38, 39]
    (line,) = [line for line in r.stdout.splitlines() if line.startswith("soup WNLI: the mean of seeds 38, 39")]
    assert "on the report split" in line and "best seed" in line

    (summary,) = list(csv.DictReader((out / "summary.csv").open()))
    assert summary["soup_seeds"] == "2" and summary["soup_score"] and summary["soup_report_score"]
    wins = summary["soup_wins"] == "True"
    assert wins == (float(summary["soup_score"]) > float(summary["best_score"]))

    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                "attributes.run_name = 'WNLI soup'")
    assert run.data.metrics["acc"] == float(summary["soup_score"])
    assert run.data.metrics["report.acc"] == float(summary["soup_report_score"])
    (version,) = client.search_model_versions("name='tiny-roberta-WNLI'")
    assert (version.run_id == run.info.run_id) is wins  # the soup is the task's model only where it won

    answer = ask_a_pair(soup, tmp_path / "serve.log", tmp_path / "cache")
    assert answer.status_code == 200, answer.text
    assert output(answer.json(), "label")[0] in load_task("WNLI").labels
