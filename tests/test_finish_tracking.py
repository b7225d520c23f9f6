"""The end of a sweep in MLflow never loses finished work: a registry that fails is one line saying
what was not recorded and how, and the parent run still gets its results (a real sqlite store)."""

from __future__ import annotations

from pathlib import Path

from mlflow import MlflowClient

from sweep.app import record_in_mlflow
from sweep.config.validate import compose_settings
from sweep.results.records import TrialRecord, summarize, write_results
from sweep.tracking import SweepTracker, TrialLogger


def test_a_registry_that_fails_at_the_end_is_one_line_and_the_results_stay(tmp_path: Path, capsys) -> None:
    settings = compose_settings("task=WNLI", "model=tiny-roberta", "sweep.seeds=[38]", "tracking.experiment=finish")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    out = tmp_path / "out"
    tracker = SweepTracker(uri, "finish", spool_dir=out / "mlflow-unsent")
    tracker.start({"task": "WNLI"})
    trial = TrialLogger(uri, tracker.experiment_id, tracker.run_id, "WNLI-seed38-t0", {"task": "WNLI", "seed": 38})
    trial.start()
    trial.end("FINISHED")
    record = TrialRecord(task="WNLI", seed=38, score=0.6, metrics={"acc": 0.6}, run_id=trial.run_id)
    summaries = summarize([record], settings.tasks)
    write_results(out, [record], summaries)
    # out/best/WNLI was never exported: registering it fails inside MLflow's artifact logging
    record_in_mlflow(settings, tracker, [record], summaries, {"WNLI": record}, out, None)  # no exception
    printed = capsys.readouterr().out
    (line,) = [line for line in printed.splitlines() if line.startswith("registry: WNLI")]
    assert line.startswith(f"registry: WNLI: not registered: the MLflow store at {uri} refused it (FileNotFoundError")
    assert line.endswith("run the same command with resume=true to register it") and str(out / "best" / "WNLI") in line
    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(tracker.run_id)
    assert parent.info.status == "FINISHED"  # the rest of the end still happened
    assert "results.csv" in {a.path for a in client.list_artifacts(tracker.run_id)}
    assert (out / "results.csv").is_file()


def test_a_parent_run_the_store_refuses_at_the_end_is_one_line_and_the_results_stay(tmp_path: Path, capsys) -> None:
    """Someone deleted the sweep's parent run while it ran: MLflow refuses to log to it at the end;
    the sweep says so in one line and raises nothing (its results are on disk)."""
    settings = compose_settings("task=WNLI", "model=tiny-roberta", "sweep.seeds=[38]")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    out = tmp_path / "out"
    tracker = SweepTracker(uri, "finish-deleted", spool_dir=out / "mlflow-unsent")
    tracker.start({"task": "WNLI"})
    record = TrialRecord(task="WNLI", seed=38, score=0.6, metrics={"acc": 0.6})
    summaries = summarize([record], settings.tasks)
    write_results(out, [record], summaries)
    MlflowClient(tracking_uri=uri).delete_run(tracker.run_id)
    record_in_mlflow(settings, tracker, [record], summaries, {}, out, None)  # no exception
    printed = capsys.readouterr().out
    (line,) = [line for line in printed.splitlines() if line.startswith("tracking: ")]
    assert line.startswith(f"tracking: the sweep's results were not all recorded in MLflow at {uri} (MlflowException: ")
    assert line.endswith(f"they are in {out}")
    assert (out / "results.csv").is_file()


def test_an_analysis_that_fails_at_the_end_is_one_line_and_the_rest_goes_on(tmp_path: Path, cache_dir: Path,
                                                                            capsys, monkeypatch) -> None:
    import sweep.results.importance as importance
    from sweep.app import finish
    from sweep.train.tiny_exports import export_tiny_classifier

    def broken(*args, **kwargs):
        raise RuntimeError("the analysis broke")

    monkeypatch.setattr(importance, "report_importance", broken)
    settings = compose_settings("task=WNLI", "model=tiny-roberta", "sweep.seeds=[38]", "sweep.keep_checkpoints=all")
    checkpoint = export_tiny_classifier(tmp_path / "checkpoint", cache_dir)
    record = TrialRecord(task="WNLI", seed=38, score=0.6, metrics={"acc": 0.6}, checkpoint=str(checkpoint))
    out = tmp_path / "out"
    finish(settings, [record], out, [], tracker=None)  # no exception
    printed = capsys.readouterr().out
    assert "importance: not written (RuntimeError: the analysis broke)" in printed
    assert (out / "best" / "WNLI" / "config.json").is_file() and (out / "results.csv").is_file()
    assert (out / "expected_max.csv").is_file()  # the other analysis still ran
