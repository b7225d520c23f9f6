"""Chaos: the same 12-trial sweep on a 3-node local Ray cluster, once without faults and once with
faults injected on a schedule, and whether both end with the same results.

The sweep (2 GLUE tasks x 6 seeds, a tiny model, staged from S3, logged to an ``mlflow server``) is
run by ``python -m sweep`` joined to a 3-node Ray cluster of one-CPU nodes whose two worker nodes
each have their OWN DISK, as pods do (``ray start`` inside ``unshare -m`` with a tmpfs over the
driver's folder: out_dir and the caches; sweep/testing/local_cluster.py): only the storage path and the MLflow
server are shared, so any shortcut through the driver's disk would show. The faults, each triggered
by the sweep's progress (epochs on record in the trials' histories) so both runs see them at the
same point:

1. a trial's process is SIGKILLed (the Train worker: one-worker trials run Train's loop in it);
2. S3 answers 503 to the next GETs, a replacement node joins, and a worker node that runs a trial
   dies (raylet and all its processes) — the replacement stages the sources through the outage;
3. the MLflow server is killed and started again on the same port and store a few seconds later.

Reports: rows, per-trial scores (the loop is deterministic on CPU: they must be equal), the best
seed per task, the wall time of each run and the cost of the faults, the trials restarted and the
epochs trained twice. Exit status 1 if the two runs disagree.

    python scripts/chaos.py                      # ~6 minutes on 2 cores (each run starts its own cluster)
    python scripts/chaos.py --epochs 3 --out chaos.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sweep.config.tasks import load_task
from sweep.data.synthetic import write_synthetic_glue
from sweep.models.local_folder import resolve_model_dir
from sweep.results.records import best_per_task, load_records
from sweep.testing.local_cluster import OwnDiskCluster, mount_namespace, namespace_refused
from sweep.testing.services import FaultyProxy, ServerProcess, s3_environment, start_moto, upload
from sweep.train.tiny_exports import TINY_ROBERTA

BUCKET = "sweep-chaos"
TASKS = ("WNLI", "RTE")
SEEDS = (1, 2, 3, 4, 5, 6)
FAST_HEALTH_CHECKS = {"health_check_period_ms": 500, "health_check_failure_threshold": 3}


def histories(storage: Path) -> dict[str, list[dict]]:
    found = {}
    for path in storage.rglob("history/*.json"):
        try:
            found[path.stem] = json.loads(path.read_text())
        except ValueError:  # being replaced this instant
            continue
    return found


class Faults:
    """Injects the three faults when the sweep has this many epochs on record. Runs in the main
    thread (Ray starts a node only from there) while the sweep's driver runs as its own process."""

    def __init__(self, cluster: OwnDiskCluster, storage: Path, proxy: FaultyProxy, mlflow: ServerProcess, epochs: int,
                 cache_root: Path, at: tuple[int, int, int]):
        self.cluster, self.storage, self.proxy, self.mlflow = cluster, storage, proxy, mlflow
        self.epochs, self.cache_root, self.at = epochs, cache_root, at
        self.log: list[str] = []
        self.driver: subprocess.Popen | None = None

    def running_trial(self, rows_by_trial, on_workers: bool = False):
        """A trial with epochs left, its last row (the process and node running it now); with
        ``on_workers`` only one whose process runs on a worker node (another mount namespace)."""
        here = mount_namespace(os.getpid())
        for trial, rows in sorted(rows_by_trial.items(), key=lambda kv: -kv[1][-1]["reported_at"]):
            last = rows[-1]
            on_worker = mount_namespace(int(last["pid"])) not in (None, here)
            if last["epoch"] <= self.epochs - 2 and (not on_workers or on_worker):
                return trial, last
        return None, None

    def wait_for(self, epochs_on_record: int, deadline: float) -> dict | None:
        while time.time() < deadline and self.driver.poll() is None:
            rows = histories(self.storage)
            if sum(len(r) for r in rows.values()) >= epochs_on_record:
                return rows
            time.sleep(0.1)
        return None

    def note(self, text: str) -> None:
        self.log.append(f"{time.strftime('%H:%M:%S')} {text}")
        print(f"chaos: {text}", flush=True)

    def when_running(self, epochs_on_record: int, deadline: float, on_workers: bool = False):
        """Once the sweep has this many epochs on record: the first trial seen with epochs left (on
        a worker node), as (trial, its last row); (None, None) if the sweep ends first."""
        while self.wait_for(epochs_on_record, deadline) is not None:
            trial, last = self.running_trial(histories(self.storage), on_workers)
            if last is not None:
                return trial, last
            time.sleep(0.05)
        return None, None

    def run(self, driver: subprocess.Popen) -> None:
        self.driver = driver
        deadline = time.time() + 1800
        trial, last = self.when_running(self.at[0], deadline)
        if last is not None:
            os.kill(int(last["pid"]), signal.SIGKILL)
            self.note(f"killed trial {trial}'s process (pid {last['pid']}) after its epoch {last['epoch']}")
        trial, last = self.when_running(self.at[1], deadline, on_workers=True)
        if last is not None:
            self.proxy.fail_left = 3  # within boto3's 5 attempts: an outage it rides out
            self.cluster.kill_node_of(int(last["pid"]))  # raylet and every process on that node's disk
            replacement = self.cluster.add_worker(cpus=1)
            self.note(f"node {last['node'][:8]} died with trial {trial} after its epoch {last['epoch']}; S3 answers "
                      f"503 to the next 3 GETs; node {replacement[:8]} joined")
        if self.wait_for(self.at[2], deadline) is not None:
            self.mlflow.kill()
            self.note("MLflow server killed")
            time.sleep(5)
            self.mlflow.start()
            self.note("MLflow server started again")


def run_sweep(name: str, work: Path, proxy: FaultyProxy, args, faults: bool) -> dict:
    base = work / name
    mlflow = ServerProcess(base / "mlflow").start()
    driver, storage = base / "driver", base / "storage"  # the driver's folder (hidden from the workers), shared storage
    driver.mkdir(parents=True)
    cluster = OwnDiskCluster(base, driver, storage).start(head_cpus=1, workers=((1, 0), (1, 0)),
                                                          system_config=FAST_HEALTH_CHECKS)
    out = driver / "out"
    per_trial = 2 * args.epochs
    injector = Faults(cluster, storage, proxy, mlflow, args.epochs, base, (3, len(SEEDS) * per_trial // 3 + 4,
                                                                          len(SEEDS) * per_trial // 2 + 6))
    command = [sys.executable, "-m", "sweep", "experiment=demo", f"task=[{','.join(TASKS)}]",
               f"sweep.seeds=[{','.join(map(str, SEEDS))}]", f"train.epochs={args.epochs}",
               "train.max_train_samples=null", "storage=s3", f"storage.bucket={BUCKET}",
               f"storage.cache_dir={driver / 'cache'}", "resources.gpus_per_trial=0",
               f"cluster.address={cluster.address}", f"cluster.storage_path={storage}", "cluster.shared_storage=true",
               f"tracking.uri={mlflow.url}", f"tracking.experiment=chaos-{name}", f"out_dir={out}"]
    print(f"chaos: {name}: {' '.join(command[3:])}", flush=True)
    started = time.monotonic()
    log = (base / "driver.log").open("w")
    driver = subprocess.Popen(command, cwd=base, stdout=log, stderr=subprocess.STDOUT, text=True, env=cluster.env)
    try:
        if faults:
            injector.run(driver)
        returncode = driver.wait(timeout=args.timeout)
        wall = time.monotonic() - started
        logged = logged_epochs(mlflow.url, f"chaos-{name}") if returncode == 0 else {}
    finally:
        driver.kill()
        log.close()
        cluster.stop()
        mlflow.kill()
    output = (base / "driver.log").read_text()
    if returncode != 0:
        raise SystemExit(f"chaos: the {name} sweep failed (exit {returncode}):\n{output[-3000:]}")
    records = load_records(out / "results.json")
    rows = histories(storage)
    trained = sum(len(r) for r in rows.values())
    unsent = [line for line in output.splitlines() if "could not be sent" in line]
    specs = [load_task(t) for t in TASKS]
    return {
        "wall_seconds": round(wall, 1),
        "rows": len(records),
        "status": sorted({r.status for r in records}),
        "scores": {f"{r.task}/{r.seed}": r.score for r in records},
        "best_seed": {task: r.seed for task, r in best_per_task(records, specs).items()},
        "epochs_on_record": trained,
        "epochs_trained_twice": trained - len({(t, row["epoch"]) for t, r in rows.items() for row in r}),
        "trials_restarted": sum(any(row["resumed"] for row in r) for r in rows.values()),
        "faults": injector.log,
        "unsent_mlflow_calls": unsent,
        "mlflow_epochs": logged,
    }


def logged_epochs(uri: str, experiment: str) -> dict[str, int]:
    """Per trial ("task/seed"): the evaluations its nested MLflow run holds (distinct steps of score)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id]) if exp is not None else []
    parents = {r.info.run_id for r in runs if "mlflow.parentRunId" not in r.data.tags}
    logged = {}
    for run in runs:
        if run.data.tags.get("mlflow.parentRunId") in parents and run.info.status == "FINISHED":
            steps = {m.step for m in client.get_metric_history(run.info.run_id, "score")}
            logged[f"{run.data.tags['sweep.task']}/{run.data.params['seed']}"] = len(steps)
    return logged


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--rows", type=int, default=400, help="training rows per task (synthetic)")
    p.add_argument("--timeout", type=int, default=1500, help="seconds each sweep may take")
    p.add_argument("--out", type=Path, default=None, help="write the report as JSON here")
    args = p.parse_args()
    refused = namespace_refused()
    if refused:
        raise SystemExit(f"chaos: worker nodes with their own disks need a mount namespace: {refused}")
    if subprocess.run([str(Path(sys.executable).with_name("ray")), "status"], capture_output=True).returncode == 0:
        raise SystemExit("chaos: a Ray cluster is already running on this machine; stop it first (ray stop)")

    with tempfile.TemporaryDirectory(prefix="sweep-chaos-") as tmp:
        work = Path(tmp)
        moto, s3 = start_moto(work / "moto.log")
        proxy = FaultyProxy(s3.endpoint, None, 503, 0)
        for key, value in s3_environment(s3.endpoint).items():  # this process and the clusters it starts
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        try:
            data = write_synthetic_glue(work / "src", list(TASKS), n_train=args.rows, n_dev=48)
            model = resolve_model_dir(TINY_ROBERTA, work / "model-cache")
            upload(BUCKET, (model, "tiny-roberta"), (data / "glue_data", "glue_data"))  # straight to S3
            os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint  # the sweep's nodes read through the outage proxy
            clean = run_sweep("clean", work, proxy, args, faults=False)
            chaos = run_sweep("faults", work, proxy, args, faults=True)
        finally:
            proxy.close()
            moto.terminate()
    same_scores = clean["scores"] == chaos["scores"]
    diff = max(abs(clean["scores"][k] - chaos["scores"].get(k, float("nan"))) for k in clean["scores"])
    report = {
        "clean": clean, "faults": chaos,
        "same_rows": clean["rows"] == chaos["rows"] == len(TASKS) * len(SEEDS),
        "same_scores": same_scores, "max_score_difference": diff,
        "same_best_seed": clean["best_seed"] == chaos["best_seed"],
        "fault_cost_seconds": round(chaos["wall_seconds"] - clean["wall_seconds"], 1),
        "fault_cost_ratio": round(chaos["wall_seconds"] / clean["wall_seconds"], 3),
        "s3_503_answered": proxy.failed,
        # every trial's run in MLflow, FINISHED, with every epoch's score (the MLflow server restarted mid-sweep)
        "mlflow_complete": all(r["mlflow_epochs"] == {k: args.epochs for k in r["scores"]} for r in (clean, chaos)),
    }
    print(f"\n{'run':8} {'rows':>4} {'wall s':>7} {'epochs':>6} {'twice':>5} {'restarted':>9}  best seed")
    for name, r in (("clean", clean), ("faults", chaos)):
        print(f"{name:8} {r['rows']:>4} {r['wall_seconds']:>7.1f} {r['epochs_on_record']:>6} "
              f"{r['epochs_trained_twice']:>5} {r['trials_restarted']:>9}  {r['best_seed']}")
    print("faults:\n  " + "\n  ".join(chaos["faults"]))
    print(f"same rows: {report['same_rows']}, same per-trial scores: {same_scores} (max difference {diff:.2e}), "
          f"same best seed per task: {report['same_best_seed']}; S3 answered 503 {proxy.failed} time(s)")
    print(f"cost of the faults: {report['fault_cost_seconds']:+.1f} s "
          f"({report['fault_cost_ratio']:.3f}x the clean run)")
    print(f"MLflow: every trial's run with all {args.epochs} epochs in both runs: {report['mlflow_complete']}")
    if chaos["unsent_mlflow_calls"]:
        print("\n".join(chaos["unsent_mlflow_calls"]))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
        print(f"written {args.out}")
    if not (report["same_rows"] and same_scores and report["same_best_seed"] and report["mlflow_complete"]):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
