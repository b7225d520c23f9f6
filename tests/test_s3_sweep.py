"""A sweep staged from S3 on a 3-node Ray cluster: each object reaches each node exactly once."""

from __future__ import annotations

import subprocess
import sys

import boto3
import pytest
import ray
from ray.cluster_utils import Cluster

from sweep.app import run
from sweep.data.synthetic import write_synthetic_glue
from sweep.results.records import load_records
from sweep.storage.node_cache import MARKER
from sweep.testing.services import SECRET_KEY, upload
from sweep.train.tiny_exports import TINY_GPT2, TINY_ROBERTA
from tests.helpers.configs import demo_config
from tests.helpers.s3 import s3_env

pytestmark = [pytest.mark.slow, pytest.mark.ray]

BUCKET = "sweep-nodes"


@pytest.fixture
def three_nodes(moto_server, monkeypatch, tmp_path, tiny_roberta_dir):
    """Three raylets with one CPU each and their own cache folder, sharing one S3 endpoint."""
    s3_env(monkeypatch, moto_server)  # before the raylets start: their workers inherit it
    data = write_synthetic_glue(tmp_path / "src", ["WNLI"])
    upload(BUCKET, (tiny_roberta_dir, "tiny-roberta"), (data / "glue_data", "glue_data"))
    caches = [tmp_path / f"node{i}" for i in range(3)]
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 1, "env_vars": {"SWEEP_NODE_CACHE_DIR": str(caches[0])}})
    for cache in caches[1:]:
        cluster.add_node(num_cpus=1, env_vars={"SWEEP_NODE_CACHE_DIR": str(cache)})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    yield moto_server, caches
    ray.shutdown()
    cluster.shutdown()


def sweep(tmp_path, name: str, seeds: str, *extra: str):
    out = tmp_path / name
    cfg = demo_config(
        "tracking=none", "storage=s3", f"storage.bucket={BUCKET}",
        f"storage.cache_dir={tmp_path / 'driver-cache'}", f"sweep.seeds={seeds}", "train.epochs=1",
        "train.max_train_samples=32", f"cluster.storage_path={tmp_path / 'storage' / name}",
        "cluster.shared_storage=true", f"out_dir={out}", *extra,
    )
    run(cfg, out)
    return out


def test_each_object_is_staged_once_per_node_across_sweeps(three_nodes, tmp_path, capsys):
    server, caches = three_nodes
    out = sweep(tmp_path, "first", "[1,2,3,4,5,6,7,8,9]", f"storage.output_prefix=s3://{BUCKET}/runs/first")
    records = load_records(out / "results.json")
    assert len(records) == 9 and all(r.status == "TERMINATED" for r in records)
    assert len({r.node for r in records}) == 3, "the trials did not spread over the three nodes"
    # Exactly one GET per object per node: 9 trials, 3 nodes.
    assert (server.gets(BUCKET, "tiny-roberta"), server.gets(BUCKET, "glue_data")) == (3, 3)
    for cache in caches:
        assert (cache / "s3" / BUCKET / "glue_data" / MARKER).is_file()
        assert (cache / "s3" / BUCKET / "tiny-roberta" / MARKER).is_file()
    assert not (tmp_path / "driver-cache").exists(), "the driver downloaded what only the nodes need"
    printed = capsys.readouterr().out
    assert printed.count("MiB downloaded in") == 3
    # The best model and the results went to the output prefix.
    keys = {o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=BUCKET, Prefix="runs/first/")["Contents"]}
    assert {"runs/first/best/WNLI/config.json", "runs/first/results.csv", "runs/first/summary.csv"} <= keys
    assert not [k for k in keys if k.endswith("training_state.pt")]  # the optimizer state stays in checkpoints

    sweep(tmp_path, "second", "[1,2,3]")  # the same objects: nothing downloaded anywhere
    assert (server.gets(BUCKET, "tiny-roberta"), server.gets(BUCKET, "glue_data")) == (3, 3)
    assert capsys.readouterr().out.count("already staged") == 3

    new = write_synthetic_glue(tmp_path / "src2", ["WNLI", "RTE"])  # a new version of the data
    subprocess.run([sys.executable, "-m", "sweep", "upload", str(new / "glue_data"), "--bucket", BUCKET],
                   check=True, capture_output=True, timeout=120)
    sweep(tmp_path, "third", "[1]")
    assert (server.gets(BUCKET, "tiny-roberta"), server.gets(BUCKET, "glue_data")) == (3, 6)
    for cache in caches:
        assert (cache / "s3" / BUCKET / "glue_data" / "glue_data" / "RTE" / "train.tsv").is_file()
    assert SECRET_KEY not in server.log.read_text() + (out / "results.json").read_text()


@pytest.mark.parametrize("task, message", [
    ("WNLI", f"error: s3://{BUCKET}/tiny-roberta not found"),  # the driver's preflight, Ray not even started
    ("CoLA", "error: no data for task CoLA: looked in"),  # the nodes' check of the staged data, before any trial
    ("wikitext-2", "error: train.block_size: 4096 is more than tiny-gpt2 holds (256 positions)"),
])
def test_what_is_missing_fails_the_cli_before_any_trial(moto_server, monkeypatch, tmp_path, cache_dir,
                                                         task, message):
    from sweep.data.synthetic import write_synthetic_wikitext
    from sweep.models.local_folder import resolve_model_dir

    s3_env(monkeypatch, moto_server)
    extra = []
    uploads = []
    if task == "CoLA":  # the model is there, the data holds WNLI only
        data = write_synthetic_glue(tmp_path / "src", ["WNLI"])
        uploads = [(resolve_model_dir(TINY_ROBERTA, cache_dir), "tiny-roberta"),
                   (data / "glue_data", "glue_data")]
    elif task == "wikitext-2":  # a block longer than the staged model's positions
        uploads = [(resolve_model_dir(TINY_GPT2, cache_dir), "tiny-gpt2"),
                   (write_synthetic_wikitext(tmp_path / "src") / "wikitext-2", "wikitext-2")]
        extra = ["model=tiny-gpt2", "storage.data_key=wikitext-2", "train.block_size=4096"]
    upload(BUCKET, *uploads)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "sweep", "experiment=demo", "tracking=none", "storage=s3",
                        f"task={task}", f"storage.bucket={BUCKET}", f"storage.cache_dir={tmp_path / 'cache'}",
                        f"out_dir={out}", *extra],
                       capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert message in r.stderr and "Traceback" not in r.stderr
    assert "epoch" not in r.stdout and not (out / "results.csv").exists() and not (out / "best").exists()
    assert not (out / "ray" / "tune").exists()  # no experiment left for a later resume=true to restore
    assert SECRET_KEY not in r.stdout + r.stderr
