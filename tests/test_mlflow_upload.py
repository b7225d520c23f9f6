"""The sweep's sqlite MLflow store to S3 after the sweep (sweep/tracking/store_upload.py), against a real
S3 endpoint (moto_server): uploaded, downloaded elsewhere, opened with MLflow; a failed upload is one line."""

from __future__ import annotations

import json
import shlex
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from sweep.testing.services import ACCESS_KEY, SECRET_KEY
from sweep.tracking.store_upload import (
    ARTIFACTS,
    DB_NAME,
    relocate,
    snapshot,
    sqlite_file,
    sweep_store,
    upload_mlflow,
)
from tests.helpers.s3 import s3_env

EXPERIMENT = "glue-tiny-roberta"


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty MLflow database, its schema made once (MLflow's migrations take seconds) and copied per test."""
    from mlflow import MlflowClient

    db = tmp_path_factory.mktemp("empty-store") / DB_NAME
    MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()
    return db


def make_store(head: Path, empty: Path) -> tuple[str, str]:
    """A store as the sweep makes it on the head (experiment via sweep.tracking's own rule for its artifacts):
    one run with a metric, a text artifact, and a registered model version from the run's artifacts."""
    from mlflow import MlflowClient

    from sweep.tracking import ensure_experiment

    head.mkdir(parents=True)
    shutil.copy(empty, head / DB_NAME)
    uri = f"sqlite:///{head / DB_NAME}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    experiment_id = ensure_experiment(client, EXPERIMENT, uri)
    run = client.create_run(experiment_id, run_name="RTE seed 42")
    client.log_metric(run.info.run_id, "eval/accuracy", 0.625, step=2)
    client.log_text(run.info.run_id, "the best epoch was 2\n", "notes/summary.txt")
    client.log_text(run.info.run_id, "weights\n", "model/weights.txt")
    client.set_terminated(run.info.run_id)
    client.create_registered_model("tiny-roberta-RTE")
    # as sweep.tracking's register_best: the run's model/ folder, by a runs:/ source
    client.create_model_version("tiny-roberta-RTE", f"runs:/{run.info.run_id}/model", run_id=run.info.run_id)
    return uri, run.info.run_id


def download(prefix_uri: str, target: Path) -> list[str]:
    """Every object below ``s3://bucket/key/`` into ``target`` (as `aws s3 cp --recursive` would)."""
    import boto3

    bucket, key = prefix_uri.removeprefix("s3://").split("/", 1)
    client = boto3.client("s3")
    keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key + "/")
            for o in page.get("Contents", [])]
    for k in keys:
        dest = target / k[len(key) + 1:]
        dest.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(bucket, k, str(dest))
    return keys


def test_store_uploaded_downloaded_and_opened_with_mlflow(moto_server, monkeypatch, tmp_path: Path,
                                                          empty_store) -> None:
    import boto3
    from mlflow import MlflowClient
    from mlflow.artifacts import download_artifacts

    s3_env(monkeypatch, moto_server)
    boto3.client("s3").create_bucket(Bucket="results")
    head = tmp_path / "head"
    uri, run_id = make_store(head, empty_store)
    live_location = MlflowClient(tracking_uri=uri).get_experiment_by_name(EXPERIMENT).artifact_location
    assert live_location == (head / ARTIFACTS).as_uri()  # sweep.tracking's rule: what the upload takes

    lines: list[str] = []
    done = upload_mlflow(uri, "s3://results/glue-tiny/", emit=lines.append)
    assert done is not None and done.artifact_files == 2
    assert done.relocated == 2  # the experiment's artifact location and the run's
    [line] = lines
    assert line.startswith("uploaded: MLflow store (mlflow.db, 2 artifact files) -> s3://results/glue-tiny/mlflow/;")
    assert ("aws s3 cp --recursive --endpoint-url " + moto_server.endpoint + " s3://results/glue-tiny/mlflow/ mlflow/"
            in line)
    assert line.endswith("cd mlflow && mlflow ui --backend-store-uri sqlite:///mlflow.db")
    assert SECRET_KEY not in line and ACCESS_KEY not in line
    # The live store is not touched: only the copy is relocated.
    assert MlflowClient(tracking_uri=uri).get_experiment_by_name(EXPERIMENT).artifact_location == live_location

    keys = download("s3://results/glue-tiny/mlflow", tmp_path / "laptop" / "mlflow")
    assert f"glue-tiny/mlflow/{DB_NAME}" in keys
    shutil.rmtree(head)  # the cluster is gone: nothing may be read from the head's paths any more
    opened = tmp_path / "laptop" / "mlflow"
    monkeypatch.chdir(opened)  # as `cd mlflow && mlflow ui --backend-store-uri sqlite:///mlflow.db`
    client = MlflowClient(tracking_uri=f"sqlite:///{opened / DB_NAME}", registry_uri=f"sqlite:///{opened / DB_NAME}")
    experiment = client.get_experiment_by_name(EXPERIMENT)
    assert experiment.artifact_location == ARTIFACTS  # was file:///…/head/mlartifacts
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.run_id == run_id and run.data.metrics["eval/accuracy"] == 0.625
    assert [m.step for m in client.get_metric_history(run_id, "eval/accuracy")] == [2]
    assert {a.path for a in client.list_artifacts(run_id)} == {"notes", "model"}
    summary = client.download_artifacts(run_id, "notes/summary.txt", str(tmp_path / "got"))
    assert Path(summary).read_text() == "the best epoch was 2\n"
    # The registry's version resolves to the downloaded artifacts too.
    # (runs:/ in the registry, resolved through the run's relocated artifact location)
    model = download_artifacts("models:/tiny-roberta-RTE/1", dst_path=str(tmp_path / "model"),
                               tracking_uri=f"sqlite:///{opened / DB_NAME}")
    assert (Path(model) / "weights.txt").read_text() == "weights\n"


def test_a_failed_upload_is_one_line_and_the_printed_command_does_it(moto_server, monkeypatch,
                                                                     tmp_path: Path, empty_store) -> None:
    import boto3

    s3_env(monkeypatch, moto_server)
    uri, _ = make_store(tmp_path / "head", empty_store)
    lines: list[str] = []
    assert upload_mlflow(uri, "s3://no-such-bucket/run1", region="us-east-1", emit=lines.append) is None  # no raise
    [line] = lines
    assert line.startswith(f"warning: the MLflow store {uri} was not uploaded to s3://no-such-bucket/run1/mlflow/ (")
    assert "bucket 'no-such-bucket' does not exist at " + moto_server.endpoint in line
    assert SECRET_KEY not in line and ACCESS_KEY not in line
    command = line.split("upload it by hand, on the head before the cluster goes: ", 1)[1]
    words = shlex.split(command)
    assert words[:4] == ["python", "-m", "sweep", "upload-mlflow"]
    assert words[4:] == [uri, "s3://no-such-bucket/run1/mlflow", "--region", "us-east-1"]
    # The command, once the bucket exists, uploads what the sweep could not.
    boto3.client("s3").create_bucket(Bucket="no-such-bucket")
    done = subprocess.run([sys.executable, *words[1:]], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "uploaded: mlflow.db and 2 artifact files -> s3://no-such-bucket/run1/mlflow/" in done.stdout
    keys = download("s3://no-such-bucket/run1/mlflow", tmp_path / "down")
    assert sorted(k.rsplit("/", 1)[-1] for k in keys) == ["mlflow.db", "summary.txt", "weights.txt"]


def test_an_unreachable_endpoint_does_not_fail_either(monkeypatch, tmp_path: Path) -> None:
    from sweep.testing.local_cluster import free_port

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    db = tmp_path / DB_NAME
    sqlite3.connect(db).close()
    lines: list[str] = []
    endpoint = f"http://127.0.0.1:{free_port()}"
    assert upload_mlflow(f"sqlite:///{db}", "s3://bkt/p", endpoint=endpoint, emit=lines.append) is None
    [line] = lines
    assert line.startswith("warning: the MLflow store") and "cannot reach the S3 endpoint" in line
    assert f"--endpoint {endpoint}" in line and SECRET_KEY not in line


def test_a_missing_store_is_a_line_not_a_new_empty_database(tmp_path: Path) -> None:
    lines: list[str] = []
    assert upload_mlflow(f"sqlite:///{tmp_path / 'gone.db'}", "s3://bkt/p", emit=lines.append) is None
    assert "no sqlite store at" in lines[0] and not (tmp_path / "gone.db").exists()


def test_other_stores_are_not_uploaded_and_say_nothing() -> None:
    lines: list[str] = []
    for uri in ("http://mlflow:5000", "postgresql://u:p@db/mlflow", "sqlite:///:memory:", None):
        assert upload_mlflow(uri, "s3://bkt/p", emit=lines.append) is None
    assert lines == []


def test_sqlite_file() -> None:
    assert sqlite_file("sqlite:///mlflow.db") == Path("mlflow.db")
    assert sqlite_file("sqlite:////data/m.db?timeout=30") == Path("/data/m.db")
    assert sqlite_file("http://h:5000") is None and sqlite_file(None) is None


def test_the_store_the_sweep_really_used(tmp_path: Path) -> None:
    """tracking.required=false and a server that did not answer: the parent run went to the local fallback,
    and the parent file in out_dir says so."""
    from sweep.tracking import PARENT_FILE

    assert sweep_store("http://mlflow:5000", tmp_path) == "http://mlflow:5000"  # no parent file
    (tmp_path / PARENT_FILE).write_text(json.dumps({"run_id": "r", "uri": "sqlite:////work/mlflow.db"}))
    assert sweep_store("http://mlflow:5000", tmp_path) == "sqlite:////work/mlflow.db"
    assert sweep_store("http://mlflow:5000", None) == "http://mlflow:5000"
    (tmp_path / PARENT_FILE).write_text("{not json")
    assert sweep_store("sqlite:///a.db", tmp_path) == "sqlite:///a.db"


def test_snapshot_is_consistent_while_a_writer_holds_a_transaction(tmp_path: Path) -> None:
    db = tmp_path / "live.db"
    writer = sqlite3.connect(db, isolation_level=None)
    writer.execute("CREATE TABLE metrics (v REAL)")
    writer.execute("INSERT INTO metrics VALUES (1.0)")
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("INSERT INTO metrics VALUES (2.0)")  # not committed while the copy is made
    snapshot(db, tmp_path / "copy.db")
    writer.execute("COMMIT")
    writer.close()
    with sqlite3.connect(tmp_path / "copy.db") as copy:
        assert copy.execute("SELECT v FROM metrics").fetchall() == [(1.0,)]
        assert copy.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_relocate_rewrites_only_locations_under_the_artifacts_root(tmp_path: Path) -> None:
    root = tmp_path / "head" / ARTIFACTS
    db = tmp_path / "copy.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE runs (artifact_uri VARCHAR(200), n INTEGER)")
        conn.executemany("INSERT INTO runs VALUES (?, 1)", [
            (f"{root.as_uri()}/1/abc/artifacts",), (f"{root}/2/def/artifacts",), (root.as_uri(),),
            (f"{root.as_uri()}-other/1",), ("s3://bkt/artifacts/1",), (None,)])
    assert relocate(db, root) == 3
    with sqlite3.connect(db) as conn:
        got = [row[0] for row in conn.execute("SELECT artifact_uri FROM runs")]
    assert got == ["mlartifacts/1/abc/artifacts", "mlartifacts/2/def/artifacts", "mlartifacts",
                   f"{root.as_uri()}-other/1", "s3://bkt/artifacts/1", None]


@pytest.mark.parametrize("kind", ["mlflow", "none"])
def test_upload_outputs_sends_the_store_beside_the_results(kind, moto_server, monkeypatch,
                                                           tmp_path: Path, empty_store) -> None:
    """The end's upload step: the best models (and soups) and results, then (tracking=mlflow) the session's store."""
    import boto3

    from sweep.config.validate import compose_settings
    from sweep.outputs.publish import UploadOutputs
    from sweep.outputs.steps import Outcome
    from sweep.tracking.session import tracking_session

    s3_env(monkeypatch, moto_server)
    boto3.client("s3").create_bucket(Bucket="results")
    uri, _ = make_store(tmp_path / "head", empty_store)
    out_dir = tmp_path / "out"
    (out_dir / "best" / "RTE").mkdir(parents=True)
    (out_dir / "best" / "RTE" / "config.json").write_text("{}")
    (out_dir / "soup" / "RTE").mkdir(parents=True)  # sweep.soup: the soup goes beside the best seed
    (out_dir / "soup" / "RTE" / "config.json").write_text("{}")
    (out_dir / "results.json").write_text("[]")
    settings = compose_settings("experiment=demo", f"tracking={kind}",
                                *([f"tracking.uri={uri}"] if kind == "mlflow" else []),
                                "storage.output_prefix=s3://results/run1")
    storage = settings.storage
    session = tracking_session(settings.tracking, storage, settings.model.name, settings.tasks, out_dir, False)
    UploadOutputs(storage.output_prefix, storage.endpoint, storage.region, session).run(Outcome([], out_dir))
    keys = {o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket="results")["Contents"]}
    assert {"run1/best/RTE/config.json", "run1/soup/RTE/config.json", "run1/results.json"} <= keys
    assert ("run1/mlflow/mlflow.db" in keys) == (kind == "mlflow")
