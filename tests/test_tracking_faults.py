"""A tracking server that goes away: calls wait on disk, training goes on, and they arrive later
(the server comes back, or `sweep replay FILE` into another one). Real
`mlflow server` processes, killed with SIGKILL and started again on the same port and store."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from sweep.config.tasks import load_task
from sweep.results.records import TrialRecord, load_records, summarize, write_results
from sweep.testing.services import ServerProcess as Server
from sweep.tracking import ORIGINAL_TAG, SweepTracker, TrialLogger
from sweep.tracking.spool import SPOOL_DIR, UNSENT_FILE, read_records, spool_files
from tests.helpers.configs import demo_config

WNLI = load_task("WNLI")


@pytest.fixture
def server(tmp_path: Path):
    srv = Server(tmp_path / "server")
    yield srv.start()
    srv.kill()


def history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float, int]]:
    return sorted((m.step, m.value, m.timestamp) for m in client.get_metric_history(run_id, key))


def children(client: MlflowClient, parent_id: str) -> list:
    experiment = client.get_run(parent_id).info.experiment_id
    return client.search_runs([experiment], f"tags.mlflow.parentRunId = '{parent_id}'")


def epoch_metrics(epoch: int) -> dict[str, float]:
    return {"score": 0.5 + epoch / 10, "train_loss": 1.0 / epoch}


def test_calls_wait_while_the_server_is_down_and_arrive_when_it_is_back(server: Server, tmp_path: Path) -> None:
    spool = tmp_path / "out" / SPOOL_DIR
    tracker = SweepTracker(server.url, "faults-back", spool)
    tracker.start({"model": {"name": "m"}})
    trial = TrialLogger(server.url, tracker.experiment_id, tracker.run_id, "WNLI-seed38", {"task": "WNLI", "seed": 38},
                        experiment_name="faults-back", spool_dir=spool)
    run_id = trial.start()
    trial.log_evaluation(1, epoch_metrics(1))

    server.kill()
    started = time.monotonic()
    for epoch in (2, 3):
        trial.log_evaluation(epoch, epoch_metrics(epoch))  # no exception: the calls are kept
    assert time.monotonic() - started < 15, "a dead server held up training"
    (kept,) = spool_files(spool)
    assert [(r["op"], r["metrics"][0][3]) for r in read_records(kept)] == [("metrics", 2), ("metrics", 3)]

    server.start()
    trial.end("FINISHED")  # sends what waits first, in order, then itself
    client = MlflowClient(server.url)
    assert ([(step, value) for step, value, _ in history(client, run_id, "score")]
            == [(e, epoch_metrics(e)["score"]) for e in (1, 2, 3)])
    assert [step for step, *_ in history(client, run_id, "train_loss")] == [1, 2, 3]
    assert client.get_run(run_id).info.status == "FINISHED"
    assert spool_files(spool) == [], "sent calls were kept"
    assert [r.info.run_id for r in children(client, tracker.run_id)] == [run_id]


def test_calls_left_unsent_replay_into_a_fresh_server_with_the_same_histories(server: Server, tmp_path: Path) -> None:
    out = tmp_path / "out"
    tracker = SweepTracker(server.url, "faults-down", out / SPOOL_DIR)
    parent_id = tracker.start({"model": {"name": "m"}})
    server.kill()  # and it stays down for the rest of the sweep

    trial = TrialLogger(server.url, tracker.experiment_id, parent_id, "WNLI-seed39",
                        {"task": "WNLI", "seed": 39, "lr": 0.01}, tags={"sweep.trial_id": "t39"},
                        experiment_name="faults-down", spool_dir=out / SPOOL_DIR)
    assert trial.start() is None  # no run yet: it is made once a store answers
    for epoch in (1, 2, 3):
        trial.log_evaluation(epoch, epoch_metrics(epoch))
    trial.end("FINISHED")
    records = [TrialRecord("WNLI", 39, score=0.8, best_epoch=3, epochs_done=3)]
    write_results(out, records, summarize(records, [WNLI]))
    tracker.finish(records, summarize(records, [WNLI]), out)
    left, path = tracker.close(out)
    assert path == out / UNSENT_FILE and left == len(read_records(path)) >= 5
    assert not (out / SPOOL_DIR).exists()  # merged into the one file
    logged = {(r["metrics"][0][3], r["metrics"][0][1], r["metrics"][0][2]) for r in read_records(path)
              if r["op"] == "metrics" and r["run_name"] == "WNLI-seed39" and r["metrics"][0][0] == "score"}
    copy = shutil.copy(path, tmp_path / "copy.jsonl")

    replay = [sys.executable, "-m", "sweep", "replay"]  # sweep replay
    r = subprocess.run([*replay, str(path)], capture_output=True, text=True, timeout=120)  # to the store still down
    assert r.returncode == 1
    assert f"replay: {left} calls not sent (the store did not answer or refused them); they stay in {path}" in r.stderr
    assert len(read_records(path)) == left

    fresh = Server(tmp_path / "fresh").start()
    try:
        r = subprocess.run([*replay, str(path), "--uri", fresh.url], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert f"replay: {left} MLflow calls sent to {fresh.url}" in r.stdout
        assert not path.exists()  # every call was sent

        client = MlflowClient(fresh.url)
        experiment = client.get_experiment_by_name("faults-down")
        (parent,) = client.search_runs([experiment.experiment_id], f"tags.{ORIGINAL_TAG} = '{parent_id}'")
        assert parent.info.status == "FINISHED" and parent.data.metrics["WNLI.best"] == pytest.approx(0.8)
        assert "results.csv" in {a.path for a in client.list_artifacts(parent.info.run_id)}
        (child,) = children(client, parent.info.run_id)
        assert child.info.run_name == "WNLI-seed39" and child.info.status == "FINISHED"
        assert child.data.params["lr"] == "0.01" and child.data.tags["sweep.trial_id"] == "t39"
        assert set(history(client, child.info.run_id, "score")) == logged and len(logged) == 3

        # replayed again (a second try, by hand): no second run, no repeated metric
        r = subprocess.run([*replay, str(copy), "--uri", fresh.url], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert len(client.search_runs([experiment.experiment_id])) == 2
        assert set(history(client, child.info.run_id, "score")) == logged
        assert len(client.get_metric_history(child.info.run_id, "score")) == 3
    finally:
        fresh.kill()


# --- a whole sweep on Ray whose server is killed after the first epoch, then started again ---------


@pytest.mark.ray
@pytest.mark.slow
def test_sweep_survives_a_server_restart_and_every_epoch_arrives(server: Server, local_ray,
                                                                 cache_dir, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("SWEEP_CACHE_DIR", str(cache_dir))
    out = tmp_path / "out"
    epochs = 3
    events: list[str] = []

    def lose_the_server() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not any(p.stat().st_size > 2 for p in out.rglob("history/*.json")):
            time.sleep(0.1)
        server.kill()  # an epoch has been logged: the next ones meet a dead server
        events.append("killed")
        while time.monotonic() < deadline and not spool_files(out / SPOOL_DIR):
            time.sleep(0.1)
        events.append("kept" if spool_files(out / SPOOL_DIR) else "nothing kept")
        server.start()
        events.append("back")

    killer = threading.Thread(target=lose_the_server, daemon=True)
    killer.start()
    from sweep.app import run

    run(demo_config("sweep.seeds=[38,39]", f"train.epochs={epochs}", f"tracking.uri={server.url}",
                    "tracking.experiment=faults-sweep", f"out_dir={out}"), out)
    killer.join(timeout=120)
    printed = capsys.readouterr().out
    assert events == ["killed", "kept", "back"], events

    assert sorted(r.seed for r in load_records(out / "results.json")) == [38, 39]
    assert "could not be sent" not in printed and not (out / UNSENT_FILE).exists() and not spool_files(out / SPOOL_DIR)
    client = MlflowClient(server.url)
    experiment = client.get_experiment_by_name("faults-sweep")
    (parent,) = client.search_runs([experiment.experiment_id], "tags.sweep.model = 'tiny-roberta'")
    assert parent.info.status == "FINISHED" and parent.data.metrics["trials.finished"] == 2
    trials = children(client, parent.info.run_id)
    assert sorted(t.data.params["seed"] for t in trials) == ["38", "39"]
    for t in trials:
        assert t.info.status == "FINISHED"
        assert [step for step, *_ in history(client, t.info.run_id, "score")] == list(range(1, epochs + 1))
