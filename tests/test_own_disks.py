"""Sweeps on a cluster whose GPU worker node has its own disk (tests/helpers/own_disks.py): every trial's
MLflow run reaches the driver's store, the best model is exported and registered, the driver's own
data folder is shipped to the node that lacks it, and an MLflow server restarted mid-sweep loses
nothing. A shortcut through a shared disk fails these tests: the worker never sees the driver's folder.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from sweep.config.tasks import load_task
from sweep.data.synthetic import write_synthetic_glue
from sweep.results.records import load_records, rank_key
from sweep.testing.services import ServerProcess

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.ray_cluster, pytest.mark.timeout(900)]


def trial_runs(uri: str, experiment: str) -> tuple[object, list]:
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id])
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    return parent, [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]


def assert_every_trial_logged(uri: str, experiment: str, records: list, evaluations: int,
                              per_epoch: bool = True) -> list:
    """Each trial's nested run: finished, its params, every evaluation's score at its step."""
    client = MlflowClient(tracking_uri=uri)
    parent, children = trial_runs(uri, experiment)
    assert parent.info.status == "FINISHED"
    assert sorted(int(r.data.params["seed"]) for r in children) == sorted(r.seed for r in records)
    for run in children:
        assert run.info.status == "FINISHED", run.info
        assert run.data.tags["sweep.task"] == "WNLI" and run.data.tags["device"] == "cpu"
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "score")]
        record = next(r for r in records if r.seed == int(run.data.params["seed"]))
        # the step is the epoch with one evaluation per epoch, else the training step, up to the last
        expected = list(range(1, evaluations + 1)) if per_epoch else sorted(set(steps))
        assert steps == expected and len(steps) == evaluations, steps
        assert per_epoch or steps[-1] == record.steps_total
    assert {r.run_id for r in records} == {r.info.run_id for r in children}
    return children


def test_a_sweep_on_a_node_with_its_own_disk_logs_every_trial_ships_the_data_and_keeps_checkpoints_in_s3(
        own_disk_cluster):
    """The KubeRay shape: sqlite in the driver's folder, the data only there (storage=local),
    cluster.storage_path=s3://…. The worker gets the data through Ray, every trial runs there and
    writes its checkpoints and history to S3 only; the driver reads them back from there (records,
    the best model fetched and exported, the rest pruned), and every trial's run and metric history
    reach the driver's store; the best model is registered."""
    import boto3

    cluster = own_disk_cluster
    env = cluster.env  # the moto_server every node reaches, and its keys
    s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")
    s3.create_bucket(Bucket="sweep-results")
    data = write_synthetic_glue(cluster.driver / "data", ["WNLI"])  # on the driver's side only
    uri = f"sqlite:///{cluster.driver / 'mlflow.db'}"
    done = cluster.sweep("sweep.seeds=[1,2]", "train.epochs=2", f"storage.data_dir={data}", f"tracking.uri={uri}",
                         "tracking.experiment=own-disk", "cluster.storage_path=s3://sweep-results/ray", name="one")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert f"storage.data_dir={data} (" in done.stdout  # packed on the driver
    assert f"staging: node {cluster.worker_node[:8]} (" in done.stdout and "received from the driver" in done.stdout
    records = load_records(cluster.driver / "one" / "results.json")
    assert len(records) == 2 and all(r.ok and r.steps_done == r.steps_total > 0 for r in records), records
    assert {r.node for r in records} == {cluster.worker_node}  # every trial ran on the node with its own disk
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="sweep-results", Prefix="ray/").get("Contents", [])]
    assert len([k for k in keys if k.startswith("ray/history/")]) == 2, keys
    assert not any("/checkpoint_" in k for k in keys), keys  # pruned there once the best was exported
    best = max(records, key=lambda r: rank_key(load_task("WNLI").mode, r.score, r.seed))
    made_by = json.loads((cluster.driver / "one" / "best" / "WNLI" / "sweep_made_by.json").read_text())
    assert made_by["seed"] == best.seed and made_by["score"] == best.score
    assert (cluster.driver / "one" / "best" / "WNLI" / "config.json").is_file()
    assert not (cluster.driver / "one" / "ray").exists()  # nothing of the trials' on the driver's disk
    children = assert_every_trial_logged(uri, "own-disk", records, evaluations=2)
    # the best is registered from the driver; champion only if it learned (two epochs of the demo leave
    # these seeds at the trivial score: issue 18), its version pointing at the best trial's run either way
    client = MlflowClient(tracking_uri=uri)
    (version,) = client.search_model_versions("name='tiny-roberta-WNLI'")
    assert version.run_id == best.run_id and version.run_id in {r.info.run_id for r in children}
    (summary,) = json.loads((cluster.driver / "one" / "results.json").read_text())["summary"]
    aliases = client.get_registered_model("tiny-roberta-WNLI").aliases
    assert (aliases.get("champion") is not None) == summary["learned"], (aliases, summary)
    assert ("now champion" if summary["learned"] else "not promoted: it learned nothing") in done.stdout


def test_a_node_that_lacks_the_data_is_named_when_shipping_is_off(own_disk_cluster):
    cluster = own_disk_cluster
    data = write_synthetic_glue(cluster.driver / "data-unshipped", ["WNLI"])
    done = cluster.sweep("tracking=none", f"storage.data_dir={data}", "storage.ship_to_nodes=false",
                         f"cluster.storage_path={cluster.shared / 'two'}", "cluster.shared_storage=true", name="two")
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert (f"storage.data_dir={data}: a folder on the driver's machine, but not on node {cluster.worker_node[:8]}"
            in errors[0])
    assert "storage=s3" in errors[0]
    assert not (cluster.driver / "two" / "results.json").exists()  # before any trial
    assert not (cluster.shared / "two" / "history").exists()


def test_an_mlflow_server_restarted_mid_sweep_loses_nothing(own_disk_cluster):
    """The worker node never talks to MLflow; the driver keeps what the server did not take while it
    was down and sends it when it is back: every run and every evaluation arrives, nothing is left."""
    cluster = own_disk_cluster
    server = ServerProcess(cluster.root / "mlflow-server").start()
    try:
        outage = threading.Thread(target=_outage, args=(server, cluster.shared / "three" / "history"), daemon=True)
        outage.start()
        done = cluster.sweep("sweep.seeds=[1,2]", "train.epochs=3", "train.evals_per_epoch=2",
                             f"tracking.uri={server.url}", "tracking.experiment=own-disk-server",
                             f"cluster.storage_path={cluster.shared / 'three'}", "cluster.shared_storage=true",
                             name="three")
        outage.join(timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "did not answer" in done.stdout + done.stderr  # the outage fell inside the sweep
        assert not (cluster.driver / "three" / "mlflow-unsent.jsonl").exists()  # nothing left unsent
        records = load_records(cluster.driver / "three" / "results.json")
        assert {r.node for r in records} == {cluster.worker_node}
        assert_every_trial_logged(server.url, "own-disk-server", records, evaluations=6, per_epoch=False)
    finally:
        server.kill()


def test_the_hub_is_fetched_once_per_node_and_a_node_without_it_gets_the_drivers_copy(own_disk_cluster):
    """`model=roberta-base task=RTE` from the stand-in Hub on a cluster: the driver's node fetches each file once,
    the worker node (its own Hugging Face cache) once more and its trials share that copy; a node that cannot
    reach the Hub takes the driver's copy through Ray and makes no request."""
    from sweep.testing.hub_repos import fetched

    cluster, hub = own_disk_cluster, own_disk_cluster.hub
    offline = cluster.add_worker(1, 0, env={"HF_HUB_OFFLINE": "1"})  # this node may not reach the Hub
    try:
        done = cluster.sweep("model=roberta-base", "task=RTE", "storage.synthetic_data=false", "sweep.seeds=[1,2]",
                             "train.epochs=1", "tracking=none", f"cluster.storage_path={cluster.shared / 'hub'}",
                             "cluster.shared_storage=true", name="hub")
    finally:
        cluster.remove_worker(offline)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    gets = fetched(hub, "model", "roberta-base") | fetched(hub, "dataset", "nyu-mll/glue")
    assert "model.safetensors" in gets and "rte/train-00000-of-00001.parquet" in gets
    assert set(gets.values()) == {2}, gets  # the head's and the GPU node's, never the trials' or the offline node's
    assert f"staging: node {offline[:8]}: hf://roberta-base@" in done.stdout and "received from the driver" in \
        done.stdout, done.stdout[-3000:]
    records = load_records(cluster.driver / "hub" / "results.json")
    assert len(records) == 2 and {r.node for r in records} == {cluster.worker_node} and all(r.ok for r in records)
    assert {r.sources["model.sha"] for r in records} == {hub.repos[("model", "roberta-base")].sha}


def test_a_node_that_joins_mid_sweep_stages_there_and_the_driver_shows_it(own_disk_cluster):
    """The head alone at the start (no GPU) with a GPU node type declared: the sweep waits; a GPU
    node with its own disk joins; the trial there receives the driver's data and its staging line
    reaches the driver's terminal. (Last in the module: it replaces the cluster's worker node.)"""
    cluster = own_disk_cluster
    cluster.remove_worker(cluster.worker_node)
    data = write_synthetic_glue(cluster.driver / "data-late", ["WNLI"])
    log = cluster.driver / "late.log"
    sweep = cluster.sweep("sweep.seeds=[1]", "train.epochs=1", "tracking=none", f"storage.data_dir={data}",
                          f"cluster.storage_path={cluster.shared / 'late'}", "cluster.shared_storage=true",
                          "cluster.node_types=[{name:gpu,resources:{CPU:2,GPU:1},max_workers:1}]",
                          "cluster.scale_timeout_s=300", name="late", log=log)
    deadline = time.monotonic() + 240
    while "waiting for" not in log.read_text() and sweep.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert sweep.poll() is None, log.read_text()[-3000:]
    late = cluster.add_worker(2, 1)
    assert sweep.wait(timeout=400) == 0, log.read_text()[-3000:]
    out = log.read_text()
    assert f"staging: node {late[:8]}: storage.data_dir: " in out and "MiB received from the driver" in out, out[-3000:]
    assert f"staging: node {late[:8]} (" in out  # the late node's summary line, like those of the nodes staged at start
    (record,) = load_records(cluster.driver / "late" / "results.json")
    assert record.ok and record.node == late


def _outage(server: ServerProcess, history: Path, within_s: float = 240) -> None:
    """Kill the server once a trial has reported its first evaluation; start it again 8 s later."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and not any(history.glob("*.json")):
        time.sleep(0.2)
    server.kill()
    time.sleep(8)
    server.start()
