"""One copy of each model on disk: the registry's logged model and out_dir/best/<task> share their weights' bytes
(hard links) where the artifacts are a folder on the same disk, and either still loads without the other."""

from __future__ import annotations

import shutil
from pathlib import Path

import mlflow
from mlflow import MlflowClient
from transformers import AutoModelForSequenceClassification

from sweep.config.tasks import load_task
from sweep.tracking import ensure_experiment, register_best
from sweep.tracking.one_copy import local_folder, share_with_artifacts
from sweep.train.tiny_exports import export_tiny_classifier


def _bytes_on_disk(*roots: Path) -> int:
    """What ``du`` counts: each file's bytes once however many names it has."""
    seen, total = set(), 0
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and (path.stat().st_dev, path.stat().st_ino) not in seen:
                seen.add((path.stat().st_dev, path.stat().st_ino))
                total += path.stat().st_size
    return total


def test_the_registry_and_the_export_hold_the_weights_once(tmp_path: Path, cache_dir: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    experiment = ensure_experiment(client, "one-copy", uri)
    export = export_tiny_classifier(tmp_path / "out" / "best" / "RTE", cache_dir)
    weights = (export / "model.safetensors").stat().st_size
    (export / "model.safetensors").chmod(0o644)  # as the sweep's export leaves it (files.atomic_folder shares it)
    run = client.create_run(experiment)
    client.set_terminated(run.info.run_id)
    result = register_best(uri, "tiny", load_task("RTE"), run.info.run_id, export, 0.5)

    assert result.shared_bytes >= weights
    artifacts = tmp_path / "mlartifacts"
    (twin,) = [p for p in artifacts.rglob("model.safetensors")]
    assert (export / "model.safetensors").samefile(twin)
    assert (export / "model.safetensors").stat().st_mode & 0o044 == 0o044  # still readable by all, as exported
    # the weights are counted once between the registry and the export
    assert _bytes_on_disk(tmp_path / "out", artifacts) < _bytes_on_disk(artifacts) + weights // 2

    # neither needs the other: the export loads without the registry's files, the registry without the export
    moved = tmp_path / "moved"
    shutil.move(artifacts, moved)
    AutoModelForSequenceClassification.from_pretrained(export, local_files_only=True)
    shutil.move(moved, artifacts)
    shutil.rmtree(tmp_path / "out")
    mlflow.set_tracking_uri(uri)
    try:
        model = mlflow.pyfunc.load_model("models:/tiny-RTE@champion")
    finally:
        mlflow.set_tracking_uri(None)
    assert model.metadata is not None


def test_only_files_with_the_same_bytes_are_shared_and_twice_is_a_no_op(tmp_path: Path) -> None:
    export, artifacts = tmp_path / "export", tmp_path / "artifacts" / "model"
    export.mkdir()
    artifacts.mkdir(parents=True)
    same, other = b"w" * (1 << 17), b"v" * (1 << 17)
    (export / "model.safetensors").write_bytes(same)
    (artifacts / "model.safetensors").write_bytes(same)
    (export / "tokenizer.json").write_bytes(other)
    (artifacts / "tokenizer.json").write_bytes(same)  # same name and size, other bytes: kept apart
    assert share_with_artifacts(export, tmp_path / "artifacts") == len(same)
    assert (export / "model.safetensors").stat().st_nlink == 2
    assert (export / "tokenizer.json").read_bytes() == other and (export / "tokenizer.json").stat().st_nlink == 1
    assert share_with_artifacts(export, tmp_path / "artifacts") == 0  # a resumed end: linked already


def test_artifacts_that_are_not_a_local_folder_are_left_alone(tmp_path: Path) -> None:
    assert local_folder(tmp_path.as_uri()) == tmp_path
    assert local_folder(str(tmp_path)) == tmp_path
    for remote in ("mlflow-artifacts:/1/models/m-1/artifacts", "s3://bucket/mlflow/1", None,
                   (tmp_path / "gone").as_uri()):
        assert local_folder(remote) is None
