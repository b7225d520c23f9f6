"""The trial contract (sweep/results/trial_reports.py): a report row as Tune and the history hold it, and the
trials' history files, in a folder and on a real S3 endpoint (moto_server): the same rows come back
either way, a missing trial has none, and a write replaces the file whole."""

from __future__ import annotations

import pickle

import boto3
import pytest

from sweep.remote_files import fetch_folder, remove_folder
from sweep.results.trial_reports import Report, TrialHistories
from tests.helpers.s3 import s3_env

ROWS = [Report("t1", step=5, score=0.5, rung=False, metrics={"accuracy": 0.5}), Report("t1", step=10, score=0.75)]


@pytest.fixture(params=["folder", "s3"])
def histories(request, tmp_path, monkeypatch) -> TrialHistories:
    if request.param == "folder":
        return TrialHistories(str(tmp_path / "history"))
    s3_env(monkeypatch, request.getfixturevalue("moto_server"))
    boto3.client("s3").create_bucket(Bucket="sweep-storage")
    return TrialHistories("s3://sweep-storage/ray/history")


def test_rows_written_on_one_side_are_read_on_the_other(histories):
    assert histories.read("t1") == [] and histories.all() == {}
    histories.write("t1", ROWS[:1])
    histories.write("t1", ROWS)  # replaced whole
    histories.write("t2", [Report("t2", trial_error="DataFormatError: x", trial_done=True)])
    elsewhere = pickle.loads(pickle.dumps(histories))  # as it travels to a trial on another node
    assert elsewhere.read("t1") == ROWS
    assert list(elsewhere.all()) == ["t1", "t2"] and elsewhere.all()["t2"][0].trial_error.startswith("DataFormat")


def test_a_report_is_the_flat_row_tune_and_the_history_hold():
    """Only the fields that are set, each eval metric under eval/; read back from Tune's table its
    float columns are cast back, NaN is unset and Tune's own keys are ignored."""
    report = Report("t1", task="RTE", seed=38, epoch=1, step=10, score=0.75, end_of_epoch=True,
                    metrics={"accuracy": 0.75, "eval_loss": 0.6})
    row = report.to_row()
    assert row == {"trial_id": "t1", "task": "RTE", "seed": 38, "epoch": 1, "step": 10, "end_of_epoch": True,
                   "score": 0.75, "eval/accuracy": 0.75, "eval/eval_loss": 0.6}
    assert Report.from_row(row) == report
    from_table = {**row, "seed": 38.0, "step": 10.0, "trivial_score": float("nan"), "training_iteration": 3,
                  "config/trial": {"task": "RTE"}, "eval/f1": float("nan")}
    assert Report.from_row(from_table) == report and isinstance(Report.from_row(from_table).step, int)
    assert report.is_evaluation and not Report("t1", workers_ready=1).is_evaluation
    ended = report.ended(stopped="degenerate", stopped_at_step=10)
    assert ended.trial_done and ended.to_row()["stopped"] == "degenerate" and "trial_done" not in row


def test_a_checkpoint_folder_on_s3_is_fetched_whole(moto_server, monkeypatch, tmp_path):
    s3_env(monkeypatch, moto_server)
    client = boto3.client("s3")
    client.create_bucket(Bucket="sweep-storage")
    for key, body in (("ckpt/config.json", b"{}"), ("ckpt/sub/model.bin", b"weights")):
        client.put_object(Bucket="sweep-storage", Key=key, Body=body)
    got = fetch_folder("s3://sweep-storage/ckpt", tmp_path / "here")
    assert (got / "config.json").read_bytes() == b"{}" and (got / "sub" / "model.bin").read_bytes() == b"weights"
    remove_folder("s3://sweep-storage/ckpt")
    remove_folder("s3://sweep-storage/ckpt")  # already gone: no error
    assert client.list_objects_v2(Bucket="sweep-storage").get("KeyCount", 0) == 0


def test_a_trial_resumed_from_a_checkpoint_its_history_missed_gets_the_row_back():
    """A driver killed after a trial's last report registered its checkpoint but before the history row:
    the resumed trial goes on from that (final) checkpoint with no evaluation left to write the row, so
    the checkpoint's marker carries it; without it the trial's record ends an evaluation short."""
    import json

    from sweep.results.trial_reports import history_to_go_on_from

    rows = [Report("t1", epoch=1, step=5, end_of_epoch=True, checkpoint_id="a")]
    last = Report("t1", epoch=2, step=10, steps_total=10, end_of_epoch=True, checkpoint_id="b",
                  metrics={"accuracy": 0.75})
    marker = json.loads(json.dumps({"trial_id": "t1", "step": 10, "checkpoint_id": "b", "report": last.to_row()}))
    assert history_to_go_on_from(rows, marker, "t1") == [*rows, last]
    # a row the history holds is not added twice
    assert history_to_go_on_from([*rows, last], marker, "t1") == [*rows, last]
    # a marker without the row (written before it carried one): the rows up to its step, as before
    assert history_to_go_on_from(rows, {k: v for k, v in marker.items() if k != "report"}, "t1") == rows
