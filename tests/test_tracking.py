"""Tracking against real MLflow stores: a sqlite file, and a real ``mlflow server`` over HTTP."""

from __future__ import annotations

import multiprocessing
import os
import re
import sys
import time
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import mlflow
import pytest
import yaml
from mlflow import MlflowClient

from sweep.config.tasks import load_task
from sweep.config.validate import compose_settings
from sweep.results.records import TrialRecord, summarize, write_results
from sweep.results.report import plot_seed_scores
from sweep.secrets import scrub, secret_name, secret_values
from sweep.testing.local_cluster import free_port
from sweep.tracking import (
    FALLBACK_URI,
    SweepTracker,
    TrackingError,
    TrialLogger,
    check_reachable,
    register_best,
    saved_parent,
)
from sweep.train.tiny_exports import export_tiny_classifier
from tests.helpers.tracking import log_trial_in_process

WNLI = load_task("WNLI")
SECRET = "s3cr3t-value-123"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class Store:
    uri: str
    root: Path  # every file the store wrote lies under here


@pytest.fixture(params=["sqlite", "server"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "sqlite":
        return Store(f"sqlite:///{tmp_path}/store/mlflow.db", tmp_path / "store")
    server = request.getfixturevalue("mlflow_server")
    return Store(server.url, server.root)


def _unique(prefix: str) -> str:
    # The server is shared by the whole session: each test gets its own experiment and model names.
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _settings_dict(**storage: str) -> dict:
    """A resolved config as the driver has it: ``asdict`` of a real Settings."""
    settings = compose_settings("task=WNLI", "model=tiny-roberta", "train.epochs=3", "sweep.seeds=[38,39]")
    config = asdict(settings)
    config["storage"].update(storage)
    return config


def _trial(tracker: SweepTracker, seed: int, **params: object) -> TrialLogger:
    return TrialLogger(
        tracker.uri, tracker.experiment_id, tracker.run_id, f"WNLI-seed{seed}",
        {"task": "WNLI", "seed": seed, "lr": 2e-5, "batch_size": 8, "epochs": 3, **params},
        tags={"device": "cpu"},
    )


def _children(client: MlflowClient, tracker: SweepTracker) -> list:
    return client.search_runs([tracker.experiment_id], f"tags.mlflow.parentRunId = '{tracker.run_id}'")


def _steps(client: MlflowClient, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def test_sweep_has_a_parent_run_with_nested_trials_and_results(store: Store, tmp_path: Path) -> None:
    tracker = SweepTracker(store.uri, _unique("glue-tiny-roberta"))
    parent = tracker.start(_settings_dict())
    ok, bad = _trial(tracker, 38), _trial(tracker, 39)
    ok.start()
    for epoch in (1, 2, 3):
        ok.log_evaluation(epoch, {"eval_acc": 0.4 + epoch / 10, "train_loss": 1.0 / epoch})
    ok.end("FINISHED")
    bad.start()
    bad.log_evaluation(1, {"eval_acc": 0.5})
    bad.end("FAILED", "Traceback ...\nRuntimeError: CUDA out of memory")

    records = [
        TrialRecord("WNLI", 38, score=0.7, best_epoch=3, epochs_done=3),
        TrialRecord("WNLI", 39, status="ERROR", error="CUDA out of memory"),
    ]
    summaries = summarize(records, [WNLI])
    out = tmp_path / "out"
    write_results(out, records, summaries)
    plot = plot_seed_scores(records, [WNLI], out / "seeds.png")
    tracker.finish(records, summaries, out, plot)

    client = MlflowClient(store.uri)
    assert {r.info.run_id for r in _children(client, tracker)} == {ok.run_id, bad.run_id}
    assert _steps(client, ok.run_id, "eval_acc") == [1, 2, 3]
    assert _steps(client, ok.run_id, "train_loss") == [1, 2, 3]
    good = client.get_run(ok.run_id)
    assert good.info.status == "FINISHED"
    assert good.data.params["lr"] == "2e-05" and good.data.params["seed"] == "38"
    assert {good.data.tags[k] for k in ("sweep.task", "sweep.seed", "device")} == {"WNLI", "38", "cpu"}
    assert good.data.tags["host"] and good.data.tags["node"]
    failed = client.get_run(bad.run_id)
    assert failed.info.status == "FAILED"
    assert "CUDA out of memory" in failed.data.tags["error"]

    top = client.get_run(parent)
    assert top.info.status == "FINISHED"
    # MLflow's UI: the experiment opens on its runs; the parent is named for the sweep and described
    kind = client.get_experiment(tracker.experiment_id).tags["mlflow.experimentKind"]
    assert kind == "custom_model_development"
    # its start first, to the second: the runs table cuts a parent's name after about 18 characters, and two
    # sweeps of one experiment often differ in nothing else (tests/test_mlflow_ui.py sees two told apart)
    assert re.fullmatch(r"\d\d-\d\d \d\d:\d\d:\d\d · WNLI x 2 seeds · tiny-roberta", top.info.run_name)
    assert top.data.tags["mlflow.note.content"].startswith("`")
    assert top.data.tags["sweep.tasks"] == "WNLI" and top.data.tags["sweep.seeds"] == "38,39"
    assert top.data.tags["sweep.model"] == "tiny-roberta" and "sweep.command" in top.data.tags
    assert top.data.tags["sweep.metrics"] == "acc"  # the column sweep ui shows (sweep/tracking/ui_app.py)
    assert top.data.params["train.epochs"] == "3" and top.data.params["model.name"] == "tiny-roberta"
    assert top.data.metrics["WNLI.mean"] == pytest.approx(0.7) and top.data.metrics["WNLI.best"] == pytest.approx(0.7)
    assert top.data.metrics["trials.failed"] == 1
    artifacts = {a.path for a in client.list_artifacts(parent)}
    assert artifacts == {"config.yaml", "results.csv", "results.json", "summary.csv", "seeds.png"}
    config = yaml.safe_load(Path(client.download_artifacts(parent, "config.yaml", str(tmp_path))).read_text())
    assert config["model"]["name"] == "tiny-roberta" and config["tasks"][0]["name"] == "WNLI"


def test_a_retried_trial_resumes_its_own_run(store: Store) -> None:
    tracker = SweepTracker(store.uri, _unique("resume"))
    tracker.start({"model": {"name": "m"}})
    first = _trial(tracker, 38)
    run_id = first.start()
    first.log_evaluation(1, {"eval_acc": 0.5})
    first.end("FAILED", "worker died")

    again = _trial(tracker, 38)  # same run name under the same parent: Ray retried the trial
    assert again.start() == run_id
    client = MlflowClient(store.uri)
    assert client.get_run(run_id).info.status == "RUNNING"
    again.log_evaluation(2, {"eval_acc": 0.6})
    again.end("FINISHED")

    explicit = TrialLogger(store.uri, tracker.experiment_id, tracker.run_id, "ignored", {"task": "WNLI"}, run_id=run_id)
    assert explicit.start() == run_id
    explicit.end("FINISHED")
    assert client.get_run(run_id).info.status == "FINISHED"
    assert _steps(client, run_id, "eval_acc") == [1, 2]
    assert len(_children(client, tracker)) == 1


def test_an_evaluation_redone_after_a_checkpoint_is_logged_once(store: Store) -> None:
    """A trial that goes on from its checkpoint in a resumed launch evaluates again the steps past it; the store
    may have taken them before the kill: each step stays once, with its first value."""
    tracker = SweepTracker(store.uri, _unique("redone"))
    tracker.start({"model": {"name": "m"}})
    first = _trial(tracker, 38)
    run_id = first.start()
    first.log_evaluation(1, {"score": 0.5, "eval_acc": 0.5})
    first.log_evaluation(2, {"score": 0.6, "eval_acc": 0.6})  # then killed before its checkpoint was recorded

    again = _trial(tracker, 38)  # the resumed launch: its own logger, the same run, from the checkpoint at step 1
    assert again.start() == run_id
    again.log_evaluation(2, {"score": 0.6, "eval_acc": 0.6})
    again.log_evaluation(3, {"score": 0.7, "eval_acc": 0.7})
    again.end("FINISHED")
    client = MlflowClient(store.uri)
    assert _steps(client, run_id, "score") == [1, 2, 3] and _steps(client, run_id, "eval_acc") == [1, 2, 3]


def test_a_resumed_sweep_reopens_its_parent_run(store: Store, tmp_path: Path) -> None:
    name = _unique("reopen")
    first = SweepTracker(store.uri, name, tmp_path / "out" / "mlflow-unsent")
    parent = first.start({"model": {"name": "m"}, "resume": False})
    first.save(tmp_path / "out")
    _trial(first, 38).start()
    first.fail("KILLED")  # the driver was stopped

    assert saved_parent(tmp_path / "out", store.uri, name) == parent
    assert saved_parent(tmp_path / "out", store.uri, "another-experiment") is None  # a new parent there
    again = SweepTracker(store.uri, name, tmp_path / "out" / "mlflow-unsent")
    assert again.start({"model": {"name": "m"}, "resume": True}, reopen=parent) == parent and again.reopened
    client = MlflowClient(store.uri)
    top = client.get_run(parent)
    assert top.info.status == "RUNNING" and top.data.params["resume"] == "False"  # params are the first launch's
    retried = _trial(again, 38)
    retried.start()
    retried.end("FINISHED")
    assert len(_children(client, again)) == 1  # the trial found its run under the reopened parent

    gone = SweepTracker(store.uri, name)
    gone.start({"model": {"name": "m"}}, reopen="0" * 32)  # the saved run is not in this store
    assert not gone.reopened and gone.run_id != parent


def _finished_run(client: MlflowClient, experiment_id: str) -> str:
    run = client.create_run(experiment_id)
    client.set_terminated(run.info.run_id, "FINISHED")  # registration happens after the trial ended
    return run.info.run_id


def test_champion_alias_moves_only_on_a_better_score(store: Store, tmp_path: Path, cache_dir: Path) -> None:
    client = MlflowClient(store.uri, registry_uri=store.uri)
    tracker = SweepTracker(store.uri, _unique("registry"))
    tracker.start({"model": {"name": "m"}})
    model = _unique("roberta-base")
    folder = export_tiny_classifier(tmp_path / "best" / "WNLI", cache_dir)
    specs = {"WNLI": load_task("WNLI"), "STS-B": replace(load_task("STS-B"), mode="min")}

    def register(score: float, task: str = "WNLI"):
        run_id = _finished_run(client, tracker.experiment_id)
        return run_id, register_best(store.uri, model, specs[task], run_id, folder, score)

    run_id, first = register(0.5)
    assert ((first.name, first.version, first.promoted, first.previous_champion_score)
            == (f"{model}-WNLI", "1", True, None))
    version = client.get_model_version(first.name, "1")
    assert version.run_id == run_id and version.tags == {"score": "0.5", "metric": "acc", "mode": "max"}
    # An MLflow Model (the transformers flavor) on the trial's run, its files logged once: none as loose run artifacts
    logged = client.get_logged_model(version.source.removeprefix("models:/"))
    assert logged.source_run_id == run_id and logged.name == "model"
    assert client.list_artifacts(run_id) == []
    mlmodel = yaml.safe_load(Path(mlflow.artifacts.download_artifacts(
        f"{logged.artifact_location}/MLmodel", dst_path=str(tmp_path / "dl"), tracking_uri=store.uri)).read_text())
    assert mlmodel["flavors"]["transformers"]["task"] == "text-classification"
    assert mlmodel["signature"]["inputs"] and mlmodel["saved_input_example_info"]

    _, better = register(0.7)
    assert (better.version, better.promoted, better.previous_champion_score) == ("2", True, 0.5)
    _, worse = register(0.6)
    assert (worse.version, worse.promoted, worse.previous_champion_score) == ("3", False, 0.7)
    # the same run again (a sweep killed after its registry step, resumed): no second version
    again = register_best(store.uri, model, specs["WNLI"], version.run_id, folder, 0.5)
    assert (again.version, again.earlier, again.promoted) == ("1", True, False)
    assert len(client.search_model_versions(f"name='{first.name}'")) == 3
    assert str(client.get_model_version_by_alias(first.name, "champion").version) == "2"

    _, low = register(1.0, task="STS-B")
    _, higher = register(2.0, task="STS-B")
    assert low.promoted and not higher.promoted and higher.previous_champion_score == 1.0
    assert str(client.get_model_version_by_alias(low.name, "champion").version) == low.version


def test_unreachable_server_is_an_error_when_required() -> None:
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    with pytest.raises(TrackingError,
                       match=f"cannot reach the MLflow tracking server at {uri}.*tracking.required=false"):
        check_reachable(uri, required=True)
    assert time.monotonic() - started < 5


def test_unreachable_server_falls_back_to_sqlite_when_not_required(caplog: pytest.LogCaptureFixture) -> None:
    assert check_reachable(f"http://127.0.0.1:{free_port()}", required=False) == FALLBACK_URI
    assert "cannot reach" in caplog.text


def test_the_tests_tracking_server_runs_without_mlflows_job_consumers(mlflow_server) -> None:
    """As `sweep ui`'s server: MLflow's GenAI job consumers (seven huey processes) cost a server start
    ~15 CPU-s more and keep polling; nothing of sweep's uses them."""
    import psutil

    in_session = [p.cmdline() for p in psutil.process_iter() if _session_of(p) == mlflow_server.session]
    assert in_session and not [c for c in in_session if any("huey" in part for part in c)], in_session
    assert len(in_session) <= 2, in_session  # the mlflow CLI and its uvicorn


def _session_of(process) -> int | None:
    try:
        return os.getsid(process.pid)
    except OSError:
        return None


def test_reachable_stores_are_used_as_given(mlflow_server, tmp_path: Path) -> None:
    assert check_reachable(mlflow_server.url, required=True) == mlflow_server.url
    uri = f"sqlite:///{tmp_path}/a/b/mlflow.db"
    assert check_reachable(uri, required=True) == uri
    assert (tmp_path / "a" / "b").is_dir()


def _everything_stored(store: Store) -> bytes:
    """Every param, tag and metric key of every run, and the bytes of every file the store wrote."""
    client = MlflowClient(store.uri)
    seen = []
    for experiment in client.search_experiments():
        for run in client.search_runs([experiment.experiment_id], max_results=1000):
            seen += [*run.data.params.items(), *run.data.tags.items(), *run.data.metrics]
    files = [p.read_bytes() for p in sorted(store.root.rglob("*")) if p.is_file()]
    return repr(seen).encode() + b"".join(files)


def test_secrets_never_reach_the_store(store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setattr(sys, "argv", ["sweep", f"storage.endpoint=https://user:{SECRET}@s3.local", "task=WNLI"])
    tracker = SweepTracker(store.uri, _unique("secrets"))
    settings = _settings_dict(endpoint=f"https://s3.local/?sig={SECRET}", aws_secret_access_key=SECRET,
                              model_key="models/roberta-base", data_key="glue_data")
    parent = tracker.start(settings, tags={"note": f"run by {SECRET}"})
    trial = _trial(tracker, 38, comment=f"creds {SECRET}", hf_token=SECRET, tokenizer="bpe")
    trial.tags["note"] = SECRET
    trial.start()
    trial.end("FAILED", f"botocore.exceptions.ClientError: bad key {SECRET}")
    records = [TrialRecord("WNLI", 38, status="ERROR", error=f"bad key {SECRET}")]
    write_results(tmp_path / "out", records, summarize(records, [WNLI]))
    tracker.finish(records, summarize(records, [WNLI]), tmp_path / "out", status="FAILED")

    assert SECRET.encode() not in _everything_stored(store)
    client = MlflowClient(store.uri)
    top, child = client.get_run(parent), client.get_run(trial.run_id)
    assert top.data.params["storage.endpoint"] == "https://s3.local/?sig=***"
    assert "storage.aws_secret_access_key" not in top.data.params and "hf_token" not in child.data.params
    assert child.data.params["comment"] == "creds ***" and child.data.tags["note"] == "***"
    assert child.data.params["tokenizer"] == "bpe"  # a credential's key is a whole word, not a prefix
    # S3 object keys name what was trained on: recorded, unlike access keys
    assert ((top.data.params["storage.model_key"], top.data.params["storage.data_key"])
            == ("models/roberta-base", "glue_data"))
    assert child.data.tags["error"].endswith("bad key ***")


@pytest.mark.parametrize("name", ["aws_secret_access_key", "AWS_ACCESS_KEY_ID", "access_key", "api_key", "apikey",
                                  "hf_token", "password", "key", "private-key", "credentials", "secretkey"])
def test_credential_names_are_secret(name: str) -> None:
    assert secret_name(name)


@pytest.mark.parametrize("name", ["model_key", "data_key", "tokenizer", "max_tokens", "keyboard", "monkey",
                                  "sort_keys"])
def test_other_names_are_not_secret(name: str) -> None:
    assert not secret_name(name)


def test_secret_values_and_scrub(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_abcdef")
    monkeypatch.setenv("MY_API_KEY", "abc")  # too short to scrub safely: it would mangle ordinary text
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")  # a flag, not a credential
    assert {"hf_abcdef", "AKIAEXAMPLE"} <= secret_values() and not {"abc", "false"} & secret_values()
    assert scrub("token hf_abcdef, id AKIAEXAMPLE, abc, false") == "token ***, id ***, abc, false"
    assert scrub("http://alice:pa55@host:5000/x") == "http://alice:***@host:5000/x"


def test_eight_concurrent_trials_share_one_sqlite_store(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracker = SweepTracker(uri, "concurrent")
    tracker.start({"model": {"name": "m"}})
    # Separate processes with their own connections, as Ray workers; the fork server imports
    # mlflow once instead of eight times, which on two cores saves most of this test's time.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["sweep.tracking"])
    barrier = ctx.Barrier(8)
    procs = [
        ctx.Process(
            target=log_trial_in_process,
            args=(dict(uri=uri, experiment_id=tracker.experiment_id, parent_run_id=tracker.run_id,
                       run_name=f"trial-{i}", params={"task": "WNLI", "seed": i}), barrier, 5),
        )
        for i in range(8)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * 8

    client = MlflowClient(uri)
    children = _children(client, tracker)
    assert len(children) == 8 and {r.info.status for r in children} == {"FINISHED"}
    for run in children:
        assert _steps(client, run.info.run_id, "loss") == [1, 2, 3, 4, 5]
        assert _steps(client, run.info.run_id, "acc") == [1, 2, 3, 4, 5]


def test_plot_of_seed_scores_is_a_png(tmp_path: Path) -> None:
    specs = [WNLI, load_task("STS-B"), load_task("CoLA")]
    records = [
        TrialRecord("WNLI", 38, score=0.56), TrialRecord("WNLI", 39, score=0.44),
        TrialRecord("WNLI", 40, score=0.56), TrialRecord("WNLI", 41, status="ERROR", error="oom"),
        TrialRecord("STS-B", 38, score=0.81), TrialRecord("STS-B", 39, score=0.85),
        TrialRecord("CoLA", 38, status="ERROR", error="oom"),  # no finished trial at all
    ]
    path = plot_seed_scores(records, specs, tmp_path / "plots" / "seeds.png")
    assert path == tmp_path / "plots" / "seeds.png"
    assert path.read_bytes().startswith(PNG_MAGIC) and path.stat().st_size > 5000
    assert [p.name for p in path.parent.iterdir()] == ["seeds.png"]  # no temporary file left behind


def test_scrubbing_survives_another_thread_changing_the_environment():
    """MLflow's telemetry thread sets and removes variables while the driver scrubs a config: a
    plain walk over os.environ then raises KeyError between a name and its value (seen in
    scripts/chaos.py); the scrub takes its copy again."""
    import threading

    stop = threading.Event()

    def churn():
        while not stop.is_set():
            os.environ["_SWEEP_CHURN"] = "1"
            os.environ.pop("_SWEEP_CHURN", None)

    thread = threading.Thread(target=churn)
    thread.start()
    try:
        for _ in range(20000):
            assert scrub("token") == "token"
    finally:
        stop.set()
        thread.join()


def test_trial_run_names_read_as_the_table_shows_them_and_stay_unique() -> None:
    from sweep.hooks.mlflow_runs import run_name

    assert run_name("RTE", 42, {}, "a1b2c_00003", sampled=False) == "RTE seed 42"
    assert (run_name("RTE", 42, {"lr": 2e-5, "lora.r": 8}, "a1b2c_00003", sampled=False)
            == "RTE seed 42 · lora.r=8, lr=2e-05")
    # a search may sample one point twice at one seed: the trial's number keeps the names apart
    same = [run_name("RTE", 42, {"warmup": "linear"}, f"a1b2c_0000{i}", sampled=True) for i in (1, 2)]
    assert same == ["RTE seed 42 · warmup=linear #00001", "RTE seed 42 · warmup=linear #00002"]
