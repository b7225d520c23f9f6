"""The sweep's MLflow records kept in storage.output_prefix while it runs, and taken back by a resumed sweep on
a new head (sweep/tracking/store_copies.py), against a real S3 endpoint (moto_server) and real sqlite stores.
Ray-free: the Tune callback only calls ``StoreCopies``."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from sweep.tracking.store_copies import PARENT_FILE, StoreCopies, restore_store
from sweep.tracking.store_upload import ARTIFACTS, DB_NAME
from tests.helpers.s3 import s3_env
from tests.test_mlflow_upload import EXPERIMENT, empty_store, make_store  # noqa: F401 - the fixture

PREFIX = "s3://results/glue-tiny"


def save_parent(out_dir: Path, uri: str, run_id: str) -> None:
    """What the sweep's SweepTracker.save writes in out_dir (a test below checks they agree)."""
    from mlflow import MlflowClient

    experiment_id = MlflowClient(tracking_uri=uri).get_experiment_by_name(EXPERIMENT).experiment_id
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / PARENT_FILE).write_text(json.dumps({"run_id": run_id, "experiment_id": experiment_id,
                                                   "experiment": EXPERIMENT, "uri": uri}))


def wait_for(copies: StoreCopies, count: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while copies.copies < count and time.monotonic() < deadline:
        time.sleep(0.1)
    copies.close()
    assert copies.copies >= count


def test_the_parent_file_name_is_the_trackers() -> None:
    from sweep.tracking import PARENT_FILE as TRACKERS

    assert PARENT_FILE == TRACKERS


def test_a_new_head_takes_back_the_records_the_last_one_copied_and_reopens_its_parent(
        moto_server, monkeypatch, tmp_path: Path, empty_store: Path) -> None:  # noqa: F811
    import boto3
    from mlflow import MlflowClient

    from sweep.storage.s3 import make_client
    from sweep.tracking import saved_parent

    s3_env(monkeypatch, moto_server)
    boto3.client("s3").create_bucket(Bucket="results")
    uri, run_id = make_store(tmp_path / "head", empty_store)
    save_parent(tmp_path / "head" / "out", uri, run_id)

    copies = StoreCopies(uri, PREFIX, tmp_path / "head" / "out", every_s=3600)
    assert not copies.due()
    copies.request()
    copies.request()  # while the first runs: one more after it, never two at once
    wait_for(copies, 2)
    MlflowClient(tracking_uri=uri).log_metric(run_id, "eval/accuracy", 0.75, step=3)  # the sweep goes on
    copies.request()
    wait_for(copies, 3)

    # The cluster is gone (Kueue preempted it); the new head has the same entrypoint, another folder.
    new_head = tmp_path / "new-head"
    new_uri = f"sqlite:///{new_head / DB_NAME}"
    client = make_client()
    restored = restore_store(client, new_uri, PREFIX + "/", new_head / "out")
    assert restored == "the store (mlflow.db, 2 artifact files) and the parent run's id"
    mlflow = MlflowClient(tracking_uri=new_uri, registry_uri=new_uri)
    experiment = mlflow.get_experiment_by_name(EXPERIMENT)
    assert experiment.artifact_location == (new_head / ARTIFACTS).as_uri()  # this head's, not the old one's
    history = mlflow.get_metric_history(run_id, "eval/accuracy")
    assert [(m.step, m.value) for m in history] == [(2, 0.625), (3, 0.75)]  # the last copy's, each step once
    summary = mlflow.download_artifacts(run_id, "notes/summary.txt", str(tmp_path / "got"))
    assert Path(summary).read_text() == "the best epoch was 2\n"
    assert saved_parent(new_head / "out", new_uri, EXPERIMENT) == run_id  # the resumed sweep reopens it

    # A head that has its records keeps them: nothing is overwritten.
    mlflow.log_metric(run_id, "eval/accuracy", 0.8, step=4)
    assert restore_store(client, new_uri, PREFIX, new_head / "out") is None
    assert len(mlflow.get_metric_history(run_id, "eval/accuracy")) == 3
    # Nothing copied under another prefix: nothing restored, a fresh sweep.
    assert restore_store(client, f"sqlite:///{tmp_path / 'other' / DB_NAME}", "s3://results/other",
                         tmp_path / "other" / "out") is None
    assert not (tmp_path / "other").exists()


def test_a_failed_copy_is_a_warning_and_the_next_one_tries_again(moto_server, monkeypatch, tmp_path: Path,
                                                                 empty_store: Path, caplog) -> None:  # noqa: F811
    import boto3

    s3_env(monkeypatch, moto_server)
    uri, run_id = make_store(tmp_path / "head", empty_store)
    copies = StoreCopies(uri, PREFIX, tmp_path / "head" / "out", every_s=3600)
    copies.request()  # no bucket yet
    copies.close()
    assert copies.copies == 0
    assert "the MLflow store was not copied to s3://results/glue-tiny/mlflow/" in caplog.text
    assert "the next copy tries again" in caplog.text
    boto3.client("s3").create_bucket(Bucket="results")
    copies.request()
    wait_for(copies, 1)


@pytest.mark.parametrize("key", ["../outside.txt", "a/../../outside.txt"])
def test_a_key_that_leaves_the_artifacts_folder_is_refused(moto_server, monkeypatch, tmp_path: Path,
                                                          empty_store: Path, key: str) -> None:  # noqa: F811
    import boto3

    from sweep.storage.s3 import make_client

    s3_env(monkeypatch, moto_server)
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="results")
    uri, _ = make_store(tmp_path / "head", empty_store)
    copies = StoreCopies(uri, PREFIX, tmp_path / "head" / "out")
    copies.request()
    wait_for(copies, 1)
    s3.put_object(Bucket="results", Key=f"glue-tiny/mlflow/{ARTIFACTS}/{key}", Body=b"x")
    new_head = tmp_path / "new-head"
    with pytest.raises(ValueError, match="a key that leaves"):
        restore_store(make_client(), f"sqlite:///{new_head / DB_NAME}", PREFIX, new_head / "out")
    assert not (tmp_path / "outside.txt").exists() and not (new_head / DB_NAME).exists()


def test_s3_that_cannot_be_reached_on_resume_is_one_line_and_leaves_nothing(moto_server, monkeypatch,
                                                                            tmp_path: Path) -> None:
    """A new head whose S3 does not answer: one line naming the copy and the endpoint (no botocore
    traceback, no key), and no store or parent file half-made."""
    import os

    from sweep.storage.s3 import S3Error, make_client
    from sweep.testing.local_cluster import free_port

    s3_env(monkeypatch, moto_server)
    dead = make_client(f"http://127.0.0.1:{free_port()}", attempts=1, connect_timeout=2)
    new_head = tmp_path / "new-head"
    with pytest.raises(S3Error) as caught:
        restore_store(dead, f"sqlite:///{new_head / DB_NAME}", PREFIX, new_head / "out")
    message = str(caught.value)
    assert message.startswith("resume: the sweep's records were not taken back from s3://results/glue-tiny/mlflow/ ")
    assert "cannot reach the S3 endpoint http://127.0.0.1:" in message and "\n" not in message
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in message
    assert not (new_head / DB_NAME).exists() and not (new_head / "out" / PARENT_FILE).exists()


def test_a_resumed_sweep_makes_each_run_whole_from_the_trials_histories(tmp_path: Path,
                                                                       empty_store: Path) -> None:  # noqa: F811
    """The last copy missed a trial's first evaluations and its end: the run gets them from the history
    (by the id the trial reported with, not its folder's name), each step once, and a second pass adds none."""
    import shutil

    from mlflow import MlflowClient

    from sweep.config.validate import compose_settings
    from sweep.hooks.mlflow_runs import TrialRuns
    from sweep.results.records import TrialRecord
    from sweep.results.trial_reports import Report, TrialHistories
    from sweep.tracking import TrialTracking

    shutil.copy(empty_store, tmp_path / DB_NAME)
    uri = f"sqlite:///{tmp_path / DB_NAME}"
    client = MlflowClient(tracking_uri=uri)
    experiment_id = client.create_experiment("resumed")
    parent = client.create_run(experiment_id, run_name="WNLI sweep").info.run_id
    run = client.create_run(experiment_id, run_name="WNLI seed 2", tags={"mlflow.parentRunId": parent}).info.run_id
    client.log_metric(run, "score", 0.9, step=3)  # what the copy held: the resumed trial's last evaluation
    histories = TrialHistories(str(tmp_path / "history"))
    histories.write("4f3b445e_00002", [Report("4f3b445e_00002", task="WNLI", seed=2, epoch=e, step=10 * e,
                                              steps_total=30, score=s, train_loss=1.0 / e)
                                       for e, s in ((1, 0.5), (2, 0.7), (3, 0.9))])
    settings = compose_settings("experiment=demo", "train.epochs=3")
    runs = TrialRuns(settings, TrialTracking(uri, experiment_id, parent, "resumed"), launch_id="now")
    record = TrialRecord(task="WNLI", seed=2, trial_id="train_driver_fn_4f3b445e_2_seed=2", run_id=run)
    ids = {"train_driver_fn_4f3b445e_2_seed=2": "4f3b445e_00002"}

    assert runs.reconcile([record], histories, ids) == 2
    history = client.get_metric_history(run, "score")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.5), (2, 0.7), (3, 0.9)]
    assert [m.step for m in client.get_metric_history(run, "train_loss")] == [1, 2]  # the whole evaluation
    assert client.get_run(run).info.status == "FINISHED"  # it had ended: the copy missed its end
    assert runs.reconcile([record], histories, ids) == 0  # each step once
    assert len(client.get_metric_history(run, "score")) == 3

    # a trial that ended after the copy and is not run again: the store has no run of it; one is made, once
    histories.write("4f3b445e_00003", [Report("4f3b445e_00003", task="WNLI", seed=3, epoch=e, step=10 * e,
                                              steps_total=30, score=s) for e, s in ((1, 0.4), (2, 0.6), (3, 0.8))])
    ended = TrialRecord(task="WNLI", seed=3, trial_id="train_driver_fn_4f3b445e_3_seed=3")
    ids[ended.trial_id] = "4f3b445e_00003"
    assert runs.reconcile([ended], histories, ids) == 0  # a trial of this launch: its calls may wait in the spool
    assert runs.reconcile([ended], histories, ids, ended_before={ended.trial_id}) == 3
    made = client.get_run(ended.run_id)
    assert (made.info.run_name, made.data.tags["mlflow.parentRunId"], made.info.status) == (
        "WNLI seed 3", parent, "FINISHED")
    assert sorted(m.step for m in client.get_metric_history(ended.run_id, "score")) == [1, 2, 3]
    again = TrialRecord(task="WNLI", seed=3, trial_id=ended.trial_id)
    assert runs.reconcile([again], histories, ids, ended_before={ended.trial_id}) == 0 and again.run_id == ended.run_id


def test_with_a_tracking_server_the_parents_id_alone_crosses_and_is_found_again(moto_server, monkeypatch,
                                                                                tmp_path: Path) -> None:
    """tracking.uri=http(s)://…: the server keeps the records; the new head needs only the parent's id."""
    import boto3

    from sweep.storage.s3 import make_client
    from sweep.tracking import saved_parent

    s3_env(monkeypatch, moto_server)
    boto3.client("s3").create_bucket(Bucket="results")
    server = "http://mlflow.sweep.svc:5000"
    head = tmp_path / "head" / "out"
    head.mkdir(parents=True)
    (head / PARENT_FILE).write_text(json.dumps({"run_id": "a" * 32, "experiment_id": "3",
                                                "experiment": EXPERIMENT, "uri": server}))
    copies = StoreCopies(server, PREFIX, head)
    copies.request()
    wait_for(copies, 1)
    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket="results")["Contents"]]
    assert keys == [f"glue-tiny/mlflow/{PARENT_FILE}"]  # no store to copy: the server has it

    new_head = tmp_path / "new-head" / "out"
    assert restore_store(make_client(), server, PREFIX, new_head) == "the parent run's id"
    assert saved_parent(new_head, server, EXPERIMENT) == "a" * 32
