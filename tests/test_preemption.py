"""A sweep that Kueue preempts, twice, and that finishes on a new cluster each time (resume=auto).

The KubeRay shape on this machine (tests/helpers/own_disks.py): a head on the driver's disk, a GPU worker
node on its own disk, S3 from moto_server for cluster.storage_path (Tune's state, checkpoints, the trials'
histories) and storage.output_prefix (the MLflow records' copies). A preemption deletes the whole
RayCluster: here every process of the driver and of Ray ends and both nodes' disks are wiped (the worker's
tmpfs goes with its namespace; the head's folders are deleted), then a new cluster starts and the same
command runs again, as KubeRay runs the RayJob's entrypoint on re-admission.

First preemption: SIGKILL (a node lost at once) after one trial finished and another has a checkpoint, as
Tune's saved state in S3 has them (what a resume restores).
Second, during the resumed run: SIGTERM (what a pod gets before deletion), which copies the records.
The third run finishes: every trial TERMINATED, the finished trial never run again, the checkpointed one
going on from its checkpoint (no epoch in its history twice), the MLflow store downloaded from
output_prefix holding one parent and one run per trial with every evaluation once, the champion registered.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sweep.data.synthetic import write_synthetic_glue
from sweep.results.records import load_records
from sweep.testing.local_cluster import namespace_refused
from sweep.testing.services import s3_environment, start_moto
from tests.helpers.own_disks import OwnDiskSweeps
from tests.helpers.sweeps import kill_session

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.ray_cluster, pytest.mark.timeout(1500)]

SEEDS = [1, 2, 3, 4]
EPOCHS = 3
BUCKET = "sweep-results"
WAIT_S = 400


class Preemptible:
    """The cluster, its S3, and the sweep's one command line (the RayJob's entrypoint)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "driver").mkdir()
        (root / "shared").mkdir()
        self.moto, server = start_moto(root / "moto.log")
        self.cluster = OwnDiskSweeps(root, root / "driver", root / "shared", extra_env=s3_environment(server.endpoint))
        import boto3

        env = self.cluster.env
        self.s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                               aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")
        self.s3.create_bucket(Bucket=BUCKET)
        # the input, as the image or a volume brings it: not one of the disks a preemption wipes
        self.data = write_synthetic_glue(root / "input", ["WNLI"], n_train=800)
        self.driver = self.cluster.driver
        self.overrides = [
            f"sweep.seeds={json.dumps(SEEDS).replace(' ', '')}", f"train.epochs={EPOCHS}",
            f"storage.data_dir={self.data}", f"tracking.uri=sqlite:///{self.driver / 'mlflow.db'}",
            "tracking.experiment=preempted", f"cluster.storage_path=s3://{BUCKET}/ray",
            f"storage.output_prefix=s3://{BUCKET}/out", "tracking.copy_every_s=2", "resume=auto",
        ]

    def new_cluster(self) -> float:
        """A new RayCluster (fresh disks); when it started."""
        self.cluster.workers = {}
        started = time.monotonic()
        self.cluster.start()
        return started

    def start_sweep(self, log: Path) -> subprocess.Popen:
        return self.cluster.sweep(*self.overrides, name="sweep", log=log)

    def preempt(self, proc: subprocess.Popen) -> None:
        """The RayCluster deleted: the driver and every Ray process end, the head's folders are gone."""
        kill_session(proc)
        self.cluster.stop()
        for path in self.driver.iterdir():
            shutil.rmtree(path) if path.is_dir() else path.unlink()

    def histories(self) -> dict[str, list[dict]]:
        """Each trial's history in S3 (what it has reported, each row with its checkpoint), by trial id."""
        found = self.s3.list_objects_v2(Bucket=BUCKET, Prefix="ray/history/").get("Contents", [])
        return {Path(o["Key"]).stem: json.loads(self.s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read())
                for o in found}

    def saved_trials(self) -> dict[str, tuple[str, int]]:
        """Tune's newest experiment state in S3 (what a resume restores): each trial's status and the
        epoch of its last result, by trial id."""
        found = self.s3.list_objects_v2(Bucket=BUCKET, Prefix="ray/tune/experiment_state-").get("Contents", [])
        if not found:
            return {}
        newest = max(found, key=lambda o: o["LastModified"])
        state = json.loads(self.s3.get_object(Bucket=BUCKET, Key=newest["Key"])["Body"].read())
        saved = {}
        for trial_json, metadata_json in state["trial_data"]:
            trial, metadata = json.loads(trial_json), json.loads(metadata_json)
            saved[trial["trial_id"]] = (trial["status"], int(metadata["last_result"].get("epoch") or 0))
        return saved

    def etags(self) -> dict[str, str]:
        found = self.s3.list_objects_v2(Bucket=BUCKET, Prefix="ray/history/").get("Contents", [])
        return {Path(o["Key"]).stem: o["ETag"] for o in found}

    def close(self) -> None:
        self.cluster.stop()
        self.moto.terminate()
        self.moto.wait(timeout=10)


def epochs(rows: list[dict]) -> list[int]:
    return [int(row["epoch"]) for row in rows if row.get("epoch") is not None]


def wait_until(proc: subprocess.Popen, log: Path, done, what: str):
    """Polls ``done()`` until it returns something; fails with the log when the sweep ended first."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        found = done()
        if found:
            return found
        if proc.poll() is not None:
            pytest.fail(f"the sweep ended (exit {proc.returncode}) before {what}:\n{log.read_text()[-4000:]}")
        time.sleep(0.3)
    pytest.fail(f"no {what} in {WAIT_S} s:\n{log.read_text()[-4000:]}")


@pytest.fixture
def preemptible(tmp_path: Path):
    refused = namespace_refused()
    if refused:
        pytest.skip(f"a node with its own disk needs a mount namespace: {refused}")
    setup = Preemptible(tmp_path)
    try:
        yield setup
    finally:
        setup.close()


def test_a_sweep_preempted_twice_finishes_on_new_clusters_with_one_mlflow_history(preemptible, tmp_path):
    from mlflow import MlflowClient

    p = preemptible
    p.new_cluster()

    # 1. Run until one trial finished and another has a checkpoint; then SIGKILL everything.
    log1 = tmp_path / "run1.log"
    proc = p.start_sweep(log1)

    def finished_and_checkpointed():
        rows, saved = p.histories(), p.saved_trials()
        # as Tune's saved state has them (a kill before its snapshot reaches S3 loses what came after it)
        finished = [t for t, r in rows.items() if len(epochs(r)) == EPOCHS and saved.get(t, ("",))[0] == "TERMINATED"]
        # a trial with two epochs still to train: on a busy machine one at its last epoch may finish before the kill
        going = [t for t, r in rows.items() if 0 < len(epochs(r)) < EPOCHS - 1 and t in saved
                 and saved[t][1] == len(epochs(r))]
        return (finished, going) if finished and going else None

    finished, going = wait_until(proc, log1, finished_and_checkpointed, "a finished and a checkpointed trial")
    time.sleep(0.1)  # the checkpointed trial's epoch count may move on; what is in S3 at the kill is what counts
    p.preempt(proc)
    at_first_kill = p.histories()
    finished = [t for t, r in at_first_kill.items() if len(epochs(r)) == EPOCHS]
    going = {t: len(epochs(r)) for t, r in at_first_kill.items() if 0 < len(epochs(r)) < EPOCHS}
    etag_of_finished = {t: e for t, e in p.etags().items() if t in finished}
    assert finished and going, at_first_kill

    # 2. A new cluster, the same command: it resumes. Preempted again (SIGTERM) once another trial finished.
    new_cluster_at = p.new_cluster()
    log2 = tmp_path / "run2.log"
    proc = p.start_sweep(log2)
    wait_until(proc, log2, lambda: "resume: continuing the sweep" in log2.read_text(), "the resume line")
    wait_until(
        proc, log2, lambda: any(len(epochs(p.histories().get(t, []))) > n for t, n in going.items()),
        "a report of the resumed trial")
    resumed_after_s = time.monotonic() - new_cluster_at
    wait_until(proc, log2, lambda: sum(len(epochs(r)) == EPOCHS for r in p.histories().values()) > len(finished),
               "another finished trial")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=180) == 128 + signal.SIGTERM, log2.read_text()[-3000:]
    out2 = log2.read_text()
    assert "Traceback" not in out2, out2[-3000:]
    assert "resume: restored the store (mlflow.db" in out2 and "and the parent run's id" in out2, out2[-3000:]
    resumed = re.search(rf"resume: continuing the sweep in s3://{BUCKET}/ray from its ledger: of its 4 trials "
                        r"(\d+) finished \(not run again\)", out2)
    # the ledger may lag a trial's own end by an instant: that trial starts, finds its history done, and ends
    assert resumed and 1 <= int(resumed.group(1)) <= len(finished), out2[-3000:]
    assert f"tracking: the records are copied to s3://{BUCKET}/out/mlflow/ for the resumed sweep" in out2, out2[-3000:]
    p.preempt(proc)

    # 3. A third cluster: the sweep finishes.
    p.new_cluster()
    log3 = tmp_path / "run3.log"
    proc = p.start_sweep(log3)
    assert proc.wait(timeout=WAIT_S) == 0, log3.read_text()[-4000:]
    out3 = log3.read_text()
    assert "Traceback" not in out3, out3[-3000:]

    records = load_records(p.driver / "sweep" / "results.json")
    assert sorted(r.seed for r in records) == SEEDS
    assert all(r.ok and r.steps_done == r.steps_total > 0 for r in records), records
    histories = p.histories()
    assert {t: e for t, e in p.etags().items() if t in finished} == etag_of_finished  # never run again
    for trial_id, rows in histories.items():  # no epoch trained twice past a checkpoint
        assert epochs(rows) == list(range(1, EPOCHS + 1)), (trial_id, epochs(rows))

    # The records, as storage.output_prefix keeps them: one parent, one run per trial, each evaluation once.
    laptop = tmp_path / "laptop"
    for key in [o["Key"] for page in p.s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="out/mlflow/")
                for o in page.get("Contents", [])]:
        (laptop / key).parent.mkdir(parents=True, exist_ok=True)
        p.s3.download_file(BUCKET, key, str(laptop / key))
    uri = f"sqlite:///{laptop / 'out' / 'mlflow' / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    experiment = client.get_experiment_by_name("preempted")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED", [(r.info.run_name, r.info.status) for r in runs]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert sorted(int(r.data.params["seed"]) for r in children) == SEEDS, [r.info.run_name for r in runs]
    for run in children:
        assert run.info.status == "FINISHED", run.info
        steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "score"))  # backfilled ones later
        assert steps == list(range(1, EPOCHS + 1)), (run.info.run_name, steps)
    assert {r.run_id for r in records} == {r.info.run_id for r in children}
    (summary,) = json.loads((p.driver / "sweep" / "results.json").read_text())["summary"]
    assert summary["learned"], summary  # 800 rows, 3 epochs: the task is learned
    champion = client.get_registered_model("tiny-roberta-WNLI").aliases.get("champion")
    assert champion is not None

    trained = sum(len(epochs(r)) for r in at_first_kill.values())
    print(f"the resumed trial's first report {resumed_after_s:.1f} s after the new cluster started; "
          f"epochs in S3 at the first kill: {trained} of {EPOCHS * len(SEEDS)}")
