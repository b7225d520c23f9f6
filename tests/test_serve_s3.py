"""Serving a model straight from the bucket a sweep's ``storage.output_prefix`` wrote (real S3 over HTTP)."""

from __future__ import annotations

import subprocess
import sys

import boto3
import httpx
import pytest

from sweep.storage.s3 import make_client, upload_tree
from sweep.testing.services import SECRET_KEY
from sweep.train.tiny_exports import export_tiny_lm
from tests.helpers.s3 import s3_env
from tests.helpers.serving import LM_NAME, start_server, stop_server, wait_ready

pytestmark = pytest.mark.slow
BUCKET = "served"


def test_a_model_uploaded_by_a_sweep_is_served_from_s3(moto_server, monkeypatch, tmp_path, cache_dir):
    s3_env(monkeypatch, moto_server)
    boto3.client("s3").create_bucket(Bucket=BUCKET)
    exported = export_tiny_lm(tmp_path / "out" / "best" / "wikitext-2", cache_dir)
    # what storage.output_prefix=s3://served/runs/one uploads after a sweep
    upload_tree(make_client(), tmp_path / "out" / "best", f"s3://{BUCKET}/runs/one/best")
    server = start_server(LM_NAME, f"s3://{BUCKET}/runs/one/best/wikitext-2", tmp_path / "s3.log", tmp_path / "cache")
    try:
        wait_ready(server)
        assert httpx.get(f"{server.url}/v2/models/{LM_NAME}/ready", timeout=10).status_code == 200
        body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["The meaning of life is"]}],
                "parameters": {"max_new_tokens": 4}}
        r = httpx.post(f"{server.url}/v2/models/{LM_NAME}/infer", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert {o["name"] for o in r.json()["outputs"]} >= {"text", "completion_tokens"}
    finally:
        stop_server(server)
    staged = list((tmp_path / "cache").rglob("config.json"))
    assert len(staged) == 1 and staged[0].read_bytes() == (exported / "config.json").read_bytes()
    assert SECRET_KEY not in server.log_tail()


def test_a_missing_s3_model_is_one_line_and_exit_2(moto_server, monkeypatch, tmp_path):
    s3_env(monkeypatch, moto_server)
    boto3.client("s3").create_bucket(Bucket=BUCKET)
    r = subprocess.run([sys.executable, "-m", "sweep", "serve", f"model=s3://{BUCKET}/nothing/here",
                        f"cache_dir={tmp_path}"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert f"error: s3://{BUCKET}/nothing/here not found" in r.stderr and "Traceback" not in r.stderr
    assert SECRET_KEY not in r.stderr
