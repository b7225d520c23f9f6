"""The end of a sweep in MLflow never loses finished work: a registry that fails is one line saying
what was not recorded and how, and the parent run still gets its results (a real sqlite store)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow import MlflowClient

from sweep.config.validate import compose_settings
from sweep.outputs.end import end_of_sweep
from sweep.results.records import TrialRecord, summarize, write_results
from sweep.tracking import SweepTracker, TrialLogger
from sweep.tracking.session import NoTracking, TrackingSession


def session_over(tracker: SweepTracker, settings, out: Path) -> TrackingSession:
    """The sweep's tracking session over a parent run the test started."""
    return TrackingSession(settings.tracking, settings.storage, settings.model.name, settings.tasks, out,
                           resume=False, tracker=tracker)


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
    # no exception; not complete: the sweep's end is not marked done, so resume=true registers it
    session = session_over(tracker, settings, out)
    assert not session.end([record], summaries, {"WNLI": record}, None, failed=False)
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
    session = session_over(tracker, settings, out)
    assert not session.end([record], summaries, {}, None, failed=False)  # no exception, not complete
    printed = capsys.readouterr().out
    (line,) = [line for line in printed.splitlines() if line.startswith("tracking: ")]
    assert line.startswith(f"tracking: the sweep's results were not all recorded in MLflow at {uri} (MlflowException: ")
    assert line.endswith(f"they are in {out}")
    assert (out / "results.csv").is_file()


def test_an_analysis_that_fails_at_the_end_is_one_line_and_the_rest_goes_on(tmp_path: Path, cache_dir: Path,
                                                                            capsys, monkeypatch) -> None:
    import sweep.results.importance as importance
    from sweep.train.tiny_exports import export_tiny_classifier

    def broken(*args, **kwargs):
        raise RuntimeError("the analysis broke")

    monkeypatch.setattr(importance, "report_importance", broken)
    settings = compose_settings("task=WNLI", "model=tiny-roberta", "sweep.seeds=[38]", "sweep.keep_checkpoints=all")
    checkpoint = export_tiny_classifier(tmp_path / "checkpoint", cache_dir)
    record = TrialRecord(task="WNLI", seed=38, score=0.6, metrics={"acc": 0.6}, checkpoint=str(checkpoint))
    out = tmp_path / "out"
    end_of_sweep(settings, [record], out, [], NoTracking())  # no exception
    printed = capsys.readouterr().out
    assert "importance: not written (RuntimeError: the analysis broke)" in printed
    assert (out / "best" / "WNLI" / "config.json").is_file() and (out / "results.csv").is_file()
    assert (out / "expected_max.csv").is_file()  # the other analysis still ran


def test_a_sweep_that_learned_nothing_warns_and_registers_no_champion(tmp_path: Path, cache_dir: Path,
                                                                      synthetic_glue_dir: Path, capsys) -> None:
    """The end of a chance-level sweep (issue 18): every seed at what a constant answer scores on the
    eval rows. One warning line for the task; its model is registered as a version, never champion;
    a task of the same sweep that did learn still becomes champion (a real sqlite store)."""
    from sweep.config.tasks import load_task
    from sweep.outputs.trivial import task_trivial_score
    from sweep.tracking import CHAMPION
    from sweep.train.tiny_exports import export_tiny_classifier

    settings = compose_settings("task=[WNLI,RTE]", "model=tiny-roberta", "sweep.seeds=[38,39]",
                                f"storage.data_dir={synthetic_glue_dir}", "tracking.experiment=chance")
    trivial = task_trivial_score(load_task("WNLI"), lambda: synthetic_glue_dir, None).score
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    out = tmp_path / "out"
    tracker = SweepTracker(uri, "chance", spool_dir=out / "mlflow-unsent")
    tracker.start({"task": "WNLI,RTE"})
    checkpoint = str(export_tiny_classifier(tmp_path / "checkpoint", cache_dir))

    def record(task: str, seed: int, score: float) -> TrialRecord:
        trial = TrialLogger(uri, tracker.experiment_id, tracker.run_id, f"{task}-seed{seed}", {"task": task})
        trial.start()
        trial.end("FINISHED")
        return TrialRecord(task=task, seed=seed, score=score, metrics={"acc": score}, checkpoint=checkpoint,
                           run_id=trial.run_id)

    records = [record("WNLI", 38, trivial), record("WNLI", 39, trivial), record("RTE", 38, 0.99)]
    outcome = end_of_sweep(settings, records, out, [], session_over(tracker, settings, out))
    summaries = outcome.summaries
    assert outcome.complete  # every model exported and registered: a resume would have nothing to do

    printed = capsys.readouterr().out
    (warning,) = [line for line in printed.splitlines() if line.startswith("warning:")]
    assert warning.startswith(f"warning: WNLI learned nothing: best acc {trivial:.4f} is within noise")
    assert f"of the trivial {trivial:.4f}" in warning and "not promoted to champion" in warning
    assert "try more rows" not in warning and "more epochs than train.epochs=" in warning  # every row was used
    assert "registry: tiny-roberta-WNLI version 1, not promoted: it learned nothing" in printed
    assert "registry: tiny-roberta-RTE version 1, now champion" in printed
    client = MlflowClient(tracking_uri=uri)
    assert CHAMPION not in client.get_registered_model("tiny-roberta-WNLI").aliases
    assert client.get_model_version("tiny-roberta-WNLI", "1").tags["learned"] == "false"
    assert str(client.get_registered_model("tiny-roberta-RTE").aliases[CHAMPION]) == "1"
    assert [(s.task, s.learned) for s in summaries] == [("WNLI", False), ("RTE", True)]
    parent = client.get_run(tracker.run_id).data.metrics
    assert parent["WNLI.learned"] == 0.0 and parent["WNLI.trivial"] == pytest.approx(trivial)



def test_a_model_trained_on_synthetic_rows_is_registered_never_champion_unless_told(tmp_path: Path, cache_dir: Path,
                                                                                     capsys) -> None:
    """storage.synthetic_data=true (no data folder): the summary says SYNTHETIC, the version is registered and
    tagged data=synthetic, never champion; tracking.synthetic_champion=true lets it be."""
    from sweep.tracking import CHAMPION
    from sweep.train.tiny_exports import export_tiny_classifier

    checkpoint = str(export_tiny_classifier(tmp_path / "checkpoint", cache_dir))
    for run, told in (("asked", []), ("told", ["tracking.synthetic_champion=true"])):
        settings = compose_settings("task=RTE", "model=tiny-roberta", "sweep.seeds=[38]", "storage.synthetic_data=true",
                                    f"storage.cache_dir={cache_dir}", f"tracking.experiment=synthetic-{run}", *told)
        uri = f"sqlite:///{tmp_path}/{run}.db"
        tracker = SweepTracker(uri, f"synthetic-{run}", spool_dir=tmp_path / run / "mlflow-unsent")
        tracker.start({"task": "RTE"})
        trial = TrialLogger(uri, tracker.experiment_id, tracker.run_id, "RTE-seed38", {"task": "RTE"})
        trial.start()
        trial.end("FINISHED")
        record = TrialRecord(task="RTE", seed=38, score=0.99, metrics={"acc": 0.99}, checkpoint=checkpoint,
                             run_id=trial.run_id)
        end_of_sweep(settings, [record], tmp_path / run, [], session_over(tracker, settings, tmp_path / run))
        printed = capsys.readouterr().out
        assert "data: SYNTHETIC (storage.synthetic_data=true)" in printed
        aliases = MlflowClient(tracking_uri=uri).get_registered_model("tiny-roberta-RTE").aliases
        version = MlflowClient(tracking_uri=uri).get_model_version("tiny-roberta-RTE", "1")
        if told:
            assert "now champion" in printed and CHAMPION in aliases and "data" not in version.tags
        else:
            assert "not promoted: trained on synthetic data (tracking.synthetic_champion=true allows it)" in printed
            assert CHAMPION not in aliases and version.tags["data"] == "synthetic"
