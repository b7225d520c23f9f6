"""The trials' history files, in a folder and on a real S3 endpoint (moto_server): the same rows
come back either way, a missing trial has none, and a write replaces the file whole."""

from __future__ import annotations

import pickle

import boto3
import pytest

from sweep.remote_files import fetch_folder, remove_folder
from sweep.trials import TrialHistories
from tests.helpers.s3 import s3_env

ROWS = [{"trial_id": "t1", "step": 5, "score": 0.5, "rung": False}, {"trial_id": "t1", "step": 10, "score": 0.75}]


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
    histories.write("t2", [{"trial_id": "t2", "trial_error": "DataFormatError: x"}])
    elsewhere = pickle.loads(pickle.dumps(histories))  # as it travels to a trial on another node
    assert elsewhere.read("t1") == ROWS
    assert list(elsewhere.all()) == ["t1", "t2"] and elsewhere.all()["t2"][0]["trial_error"].startswith("DataFormat")


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
