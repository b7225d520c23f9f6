"""The registry's versions are MLflow Models: MLflow's own pyfunc API and ``mlflow models serve`` answer
as ``python -m sweep serve`` does on the same exported folder, and the server keeps loading
``models:/<name>@champion`` (a real ``mlflow server``, the real model server over HTTP)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import mlflow
import pandas as pd
import pytest
from mlflow import MlflowClient

from sweep.config.tasks import load_task
from sweep.testing.local_cluster import free_port
from sweep.tracking import ensure_experiment, register_best
from sweep.train.tiny_exports import export_tiny_classifier, export_tiny_lm
from tests.helpers.serving import Server, output, serving, start_server, texts

pytestmark = pytest.mark.slow

PAIRS = pd.DataFrame({"text": ["the cat sleeps", "a quiet river runs", "the doctor reads"],
                      "text_pair": ["a cat is asleep", "the water is loud", "nobody reads"]})
PROMPTS = ["The meaning of life is", "the old painter"]


@pytest.fixture(scope="module")
def registered(mlflow_server, tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> dict[str, Path]:
    """A tiny RTE classifier and a tiny wikitext LM, each registered (champion) from a finished run."""
    root = tmp_path_factory.mktemp("flavor")
    client = MlflowClient(mlflow_server.url, registry_uri=mlflow_server.url)
    experiment = ensure_experiment(client, "flavor-test", mlflow_server.url)
    exports = {"RTE": export_tiny_classifier(root / "best" / "RTE", cache_dir),
               "wikitext-2": export_tiny_lm(root / "best" / "wikitext-2", cache_dir)}
    for task, folder in exports.items():
        run = client.create_run(experiment, run_name=f"{task} seed 42")
        client.set_terminated(run.info.run_id)
        register_best(mlflow_server.url, "tiny", load_task(task), run.info.run_id, folder, 0.5)
    return exports


@pytest.fixture(scope="module")
def our_servers(registered, mlflow_server, tmp_path_factory, cache_dir) -> Iterator[dict[str, Server]]:
    """``python -m sweep serve`` on each exported folder, and one on the registry's champion."""
    root = tmp_path_factory.mktemp("flavor-serve")
    started = {
        "RTE": start_server("tiny-RTE", registered["RTE"], root / "rte.log", cache_dir),
        "wikitext-2": start_server("tiny-wikitext-2", registered["wikitext-2"], root / "lm.log", cache_dir),
        "champion": start_server("tiny-RTE", "models:/tiny-RTE@champion", root / "champion.log", root / "cache",
                                 f"tracking_uri={mlflow_server.url}"),
    }
    with serving(started):
        yield started


def _infer(server: Server, inputs: list, **parameters) -> dict:
    name = httpx.get(f"{server.url}/v1/models").json()["models"][0]  # the name the server publishes it under
    response = httpx.post(f"{server.url}/v2/models/{name}/infer", json={"inputs": inputs, "parameters": parameters},
                          timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def _load(uri: str, name: str):
    mlflow.set_tracking_uri(uri)
    try:
        return mlflow.pyfunc.load_model(f"models:/{name}@champion")
    finally:
        mlflow.set_tracking_uri(None)


def test_pyfunc_of_the_champion_labels_as_our_server_does(registered, our_servers, mlflow_server) -> None:
    served = _infer(our_servers["RTE"],
                    [texts("text", list(PAIRS.text)), texts("text_pair", list(PAIRS.text_pair))])
    predicted = _load(mlflow_server.url, "tiny-RTE").predict(PAIRS)
    assert list(predicted["label"]) == output(served, "label")
    assert list(predicted["score"]) == pytest.approx(output(served, "score"), abs=1e-4)
    # the pair matters (a model that dropped text_pair would answer the same for other second sentences)
    others = list(PAIRS.text_pair[1:]) + list(PAIRS.text_pair[:1])
    moved = _infer(our_servers["RTE"], [texts("text", list(PAIRS.text)), texts("text_pair", others)])
    assert output(moved, "score") != pytest.approx(output(served, "score"), abs=1e-6)


def test_pyfunc_of_the_champion_completes_as_our_server_does(our_servers, mlflow_server) -> None:
    served = _infer(our_servers["wikitext-2"], [texts("text", PROMPTS)], max_new_tokens=7)
    model = _load(mlflow_server.url, "tiny-wikitext-2")
    # the same tokens; MLflow's text-generation wrapper strips the whitespace at a completion's ends
    assert model.predict(PROMPTS, params={"max_new_tokens": 7}) == [t.strip() for t in output(served, "text")]
    assert model.metadata.signature.params is not None  # the request may change the generation settings


def test_our_server_still_loads_the_champion_from_the_registry(our_servers) -> None:
    pairs = [texts("text", list(PAIRS.text)), texts("text_pair", list(PAIRS.text_pair))]
    from_registry = _infer(our_servers["champion"], pairs)
    from_folder = _infer(our_servers["RTE"], pairs)
    assert output(from_registry, "label") == output(from_folder, "label")
    assert output(from_registry, "score") == pytest.approx(output(from_folder, "score"), abs=1e-6)


def test_mlflow_models_serve_answers_for_the_champion(our_servers, mlflow_server, tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_server.url, "HF_HUB_OFFLINE": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}  # its uvicorn
    log = tmp_path / "mlflow-serve.log"
    command = [sys.executable, "-m", "mlflow", "models", "serve", "-m", "models:/tiny-RTE@champion",
               "--env-manager", "local", "--host", "127.0.0.1", "--port", str(port)]
    with log.open("wb") as sink:
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"mlflow models serve not up after 120 s:\n{log.read_text()[-3000:]}"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/ping", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        response = httpx.post(f"http://127.0.0.1:{port}/invocations", timeout=60,
                              json={"dataframe_records": PAIRS.to_dict("records")})
        assert response.status_code == 200, response.text
        predictions = response.json()["predictions"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    served = _infer(our_servers["RTE"],
                    [texts("text", list(PAIRS.text)), texts("text_pair", list(PAIRS.text_pair))])
    assert [p["label"] for p in predictions] == output(served, "label")
    assert [p["score"] for p in predictions] == pytest.approx(output(served, "score"), abs=1e-4)


def test_the_logged_models_files_serve_as_a_folder(registered, mlflow_server, tmp_path: Path) -> None:
    """KServe's `mlflow` format: the storage initializer puts the version's files in /mnt/models, read-only."""
    from sweep.serving.model_location import published_name, resolve_model_source

    client = MlflowClient(mlflow_server.url, registry_uri=mlflow_server.url)
    version = client.get_model_version_by_alias("tiny-RTE", "champion")
    files = Path(mlflow.artifacts.download_artifacts(client.get_model_version_download_uri("tiny-RTE", version.version),
                                                     dst_path=str(tmp_path / "mnt"), tracking_uri=mlflow_server.url))
    assert (files / "MLmodel").is_file()
    files.chmod(0o555)
    folder = resolve_model_source(str(files), tmp_path / "cache")
    exported = registered["RTE"]
    assert {p.name for p in folder.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json",
                                                   "sweep_made_by.json"}
    assert (folder / "model.safetensors").read_bytes() == (exported / "model.safetensors").read_bytes()
    assert published_name(folder, str(files)) == published_name(exported, str(exported))
    assert resolve_model_source(str(files), tmp_path / "cache") == folder  # assembled once
