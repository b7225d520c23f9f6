"""Lose a node mid-sweep: its trials go on from their last checkpoints on the nodes left, and the
node that replaces it stages the sources once (a 3-node ``ray.cluster_utils.Cluster``, real S3)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ray.cluster_utils import Cluster

from sweep.data.synthetic import write_synthetic_glue
from sweep.results.records import load_records
from sweep.storage.node_cache import MARKER
from sweep.testing.services import upload
from tests.helpers.s3 import s3_env

pytestmark = [pytest.mark.slow, pytest.mark.ray]

BUCKET = "sweep-node-loss"
EPOCHS = 6
# A dead raylet is noticed in ~1.5 s instead of Ray's default ~30 s (the test waits on it).
FAST_HEALTH_CHECKS = {"health_check_period_ms": 500, "health_check_failure_threshold": 3}


@pytest.fixture
def three_nodes(moto_server, monkeypatch, tmp_path, tiny_roberta_dir):
    """A head and two workers, one CPU each, each with its own cache folder (as separate machines)."""
    s3_env(monkeypatch, moto_server)  # before the raylets start: their workers inherit it
    data = write_synthetic_glue(tmp_path / "src", ["WNLI"], n_train=600, n_dev=32)
    upload(BUCKET, (tiny_roberta_dir, "tiny-roberta"), (data / "glue_data", "glue_data"))
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "env_vars": {"SWEEP_NODE_CACHE_DIR": str(tmp_path / "node0")},
        "_system_config": FAST_HEALTH_CHECKS})
    for i in (1, 2):
        cluster.add_node(num_cpus=1, env_vars={"SWEEP_NODE_CACHE_DIR": str(tmp_path / f"node{i}")})
    cluster.wait_for_nodes()
    yield cluster, moto_server
    cluster.shutdown()


class NodeKiller:
    """A worker node whose trial has two epochs on record (and more to go) is killed (raylet and
    all), as when a machine dies; then a replacement node joins.
    Runs in the main thread while the sweep's driver runs as its own process (Ray starts a node
    only from a main thread)."""

    def __init__(self, cluster: Cluster, history_root: Path, replacement_cache: Path):
        self.cluster, self.history_root, self.replacement_cache = cluster, history_root, replacement_cache
        self.victim_trial: str | None = None
        self.epochs_at_kill = 0
        self.replacement_id: str | None = None
        self.removed_id: str | None = None

    def histories(self) -> dict[str, list[dict]]:
        found = {}
        for path in self.history_root.rglob("history/*.json"):
            try:
                found[path.stem] = json.loads(path.read_text())
            except ValueError:  # being replaced right now
                continue
        return found

    def run(self, driver: subprocess.Popen) -> None:
        deadline = time.time() + 240
        workers = {n.node_id: n for n in self.cluster.worker_nodes}
        while time.time() < deadline and driver.poll() is None and self.removed_id is None:
            for trial, rows in self.histories().items():
                if 2 <= len(rows) < EPOCHS - 1 and rows[-1]["node"] in workers:  # epochs left to lose
                    self.victim_trial, self.epochs_at_kill = trial, len(rows)
                    self.removed_id = rows[-1]["node"]
                    self.cluster.remove_node(workers[self.removed_id], allow_graceful=False)
                    break
            time.sleep(0.05)
        if driver.poll() is None:  # the machine that replaces it
            replacement = self.cluster.add_node(num_cpus=1,
                                                env_vars={"SWEEP_NODE_CACHE_DIR": str(self.replacement_cache)})
            self.replacement_id = replacement.node_id


def actor_nodes(cluster: Cluster, class_name: str) -> list[str]:
    """The nodes every actor of ``class_name`` lived on (dead ones too: the GCS keeps their records), from the
    GCS's actor table (the state API asks the head's dashboard, which a cluster beside this one may hold the
    port of)."""
    import ray

    from tests.helpers.sweeps import actors

    ray.init(address=cluster.address)
    try:
        return [a["Address"]["NodeID"] for a in actors(class_name, alive_only=False)]
    finally:
        ray.shutdown()


def test_a_lost_node_costs_only_the_epochs_since_the_last_checkpoint(three_nodes, tmp_path):
    cluster, server = three_nodes
    storage = tmp_path / "storage"  # cluster.storage_path: where every trial's checkpoints are kept
    out = tmp_path / "out"
    killer = NodeKiller(cluster, storage, tmp_path / "node3")
    driver = subprocess.Popen(
        [sys.executable, "-m", "sweep", "experiment=demo", "tracking=none", "storage=s3", f"storage.bucket={BUCKET}",
         f"storage.cache_dir={tmp_path / 'driver'}", "sweep.seeds=[1,2,3,4,5,6]", f"train.epochs={EPOCHS}",
         "train.max_train_samples=null", "resources.gpus_per_trial=0", f"cluster.address={cluster.address}",
         f"cluster.storage_path={storage}", "cluster.shared_storage=true", f"out_dir={out}"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        killer.run(driver)
        output, _ = driver.communicate(timeout=300)
    finally:
        driver.kill()
    # A dead node's raylet log is relayed to the driver's output: the sweep's own error lines come first
    said = [line for line in output.splitlines() if "error" in line.lower() and "[state-dump]" not in line]
    assert driver.returncode == 0, "\n".join(said)[-3000:] or output[-3000:]
    assert killer.removed_id, "no node was removed"
    assert killer.epochs_at_kill < EPOCHS, f"the node died after its trial's last epoch ({killer.epochs_at_kill})"

    records = load_records(out / "results.json")
    assert len(records) == 6
    assert all(r.status == "TERMINATED" and r.epochs_done == EPOCHS for r in records), [r.error for r in records]
    history = next(storage.rglob(f"history/{killer.victim_trial}.json"))
    rows = json.loads(history.read_text())
    before = [r["epoch"] for r in rows if not r["resumed"]]
    after = [r for r in rows if r["resumed"]]
    assert before[:2] == [1, 2] and after, rows
    # Restarted from a checkpoint (not epoch 1), losing at most the epoch in flight, on a node still alive
    # (the node dies a moment after the choice: its trial may report one more epoch before)
    assert before[-1] < EPOCHS and 2 <= after[0]["epoch"] <= before[-1] + 1 and after[-1]["epoch"] == EPOCHS, rows
    assert killer.removed_id not in {r["node"] for r in after}
    # The driver's own actors live beside it (the head), never on a node that can die under them
    assert actor_nodes(cluster, "ProgressRelay") == [cluster.head_node.node_id]
    # A node that joins stages on first use, once; the ones that stayed staged once at the start.
    # (Tune may give the retried and the waiting trials to the survivors' reused processes instead.)
    rows_by_node = {row["node"] for path in storage.rglob("history/*.json") for row in json.loads(path.read_text())}
    replacement_ran = killer.replacement_id in rows_by_node
    staged = 3 + replacement_ran
    assert (server.gets(BUCKET, "tiny-roberta"), server.gets(BUCKET, "glue_data")) == (staged, staged)
    for source in ("tiny-roberta", "glue_data"):
        assert (tmp_path / "node3" / "s3" / BUCKET / source / MARKER).is_file() == replacement_ran
