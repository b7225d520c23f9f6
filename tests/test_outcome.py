"""How a sweep's end is told, Ray-free: every path option absolute against the working folder; each failed
trial's one line (killed for memory, a process gone, grouped when the same); the exit code."""

from __future__ import annotations

from pathlib import Path

from sweep.config.paths import absolute_paths
from sweep.config.tasks import load_task
from sweep.config.validate import compose_settings
from sweep.failures import trial_failure_line
from sweep.results.outcome import EXIT_TASK_FAILED, SavedTrial, exit_code, failure_lines, resuming_line, verdict_line
from sweep.results.records import TrialRecord, summarize

# What Ray 2.60's memory monitor wrote for a trial it killed (tests/test_first_contact.py makes a real one).
RAY_OOM = ("1 worker(s) were killed due to the node running low on memory. Memory on the node (IP: 192.0.2.2, "
           "ID: 9bf89ed1bd5ea33514c6c401443a5b37) was 21.71GB used / 23.54GB limit (0.922)\n"
           "OOM kill reason: Memory usage 23310000000B exceeded threshold\nTop 10 memory users: ...")
RAY_WORKER_DIED = ("The actor is dead because its worker process has died. Worker exit type: UNEXPECTED_SYSTEM_EXIT "
                   "Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file. "
                   "There are some potential root causes. (1) The process is killed by SIGKILL by OOM killer")


def test_every_path_option_is_made_absolute_against_the_working_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = compose_settings("task=RTE", "storage.data_dir=../data", "storage.model_dir=models", "storage.cache_dir=c",
                         "model.path=m", "out_dir=out", "tracking.uri=sqlite:///db/mlflow.db",
                         "cluster.storage_path=store")
    root = tmp_path.parent
    assert (s.storage.data_dir, s.storage.model_dir, s.storage.cache_dir) == (
        str(root / "data"), str(tmp_path / "models"), str(tmp_path / "c"))
    assert (s.model.path, s.out_dir) == (str(tmp_path / "m"), str(tmp_path / "out"))
    assert s.tracking.uri == f"sqlite:///{tmp_path / 'db' / 'mlflow.db'}"
    assert s.cluster.storage_path == str(tmp_path / "store")


def test_uris_absolute_paths_and_unset_options_stay_as_they_are(tmp_path):
    s = compose_settings("task=RTE", "cluster.storage_path=s3://bucket/runs", "tracking.uri=http://mlflow:5000",
                         f"storage.data_dir={tmp_path}")
    again = absolute_paths(s, cwd="/elsewhere")
    assert again.cluster.storage_path == "s3://bucket/runs" and again.tracking.uri == "http://mlflow:5000"
    assert again.storage.data_dir == str(tmp_path) and again.model.path is None and again.out_dir is None


def test_a_trial_killed_by_rays_memory_monitor_is_one_line_with_the_numbers_and_what_to_do():
    assert trial_failure_line(RAY_OOM) == ("killed for memory: 21.7 of 23.5 GB used on node 192.0.2.2 (9bf89ed1); "
                                           "lower train.batch_size or give the trial more memory")
    older = "Memory on the node (IP: 10.0.0.5, ID: 8a27ff) where the task (pid=1) was running was 21.70GB / 23.47GB"
    assert trial_failure_line(older).startswith("killed for memory: 21.7 of 23.5 GB used on node 10.0.0.5")


def test_a_worker_gone_without_an_error_says_so_and_what_to_do_if_it_was_memory():
    line = trial_failure_line(RuntimeError(RAY_WORKER_DIED))
    assert line.startswith("killed: the trial's process died without an error (a SIGKILL")
    assert line.endswith("lower train.batch_size or give the trial more memory")
    assert trial_failure_line(ValueError("wrapped\nDataFormatError: row 3")) == "DataFormatError: row 3"


def records() -> list[TrialRecord]:
    killed = "killed for memory: 21.7 of 23.5 GB used on node 192.0.2.2 (9bf89ed1); lower train.batch_size …"
    return [TrialRecord("RTE", 38, status="ERROR", error=killed), TrialRecord("RTE", 39, status="ERROR", error=killed),
            TrialRecord("RTE", 40, status="ERROR", error="DataFormatError: train.tsv:4: unknown label 'maybe'"),
            TrialRecord("WNLI", 38, score=0.56), TrialRecord("WNLI", 39, status="ERROR", error=None)]


def test_each_reason_is_listed_once_with_its_seeds():
    assert failure_lines(records()) == [
        "failed: RTE 2 trials (seeds 38, 39): killed for memory: 21.7 of 23.5 GB used on node 192.0.2.2 (9bf89ed1); "
        "lower train.batch_size …",
        "failed: RTE seed 40: DataFormatError: train.tsv:4: unknown label 'maybe'",
        "failed: WNLI seed 39: no result reported",
    ]


def test_a_task_whose_every_trial_failed_fails_the_command_and_the_others_are_kept():
    summaries = summarize(records(), [load_task("RTE"), load_task("WNLI")])
    assert exit_code(summaries) == EXIT_TASK_FAILED == 3
    assert verdict_line(summaries) == ("error: every trial of RTE failed (the reasons above); exit code 3; "
                                       "the other tasks' results and models are kept")
    some_failed = summarize([r for r in records() if r.task == "WNLI"], [load_task("WNLI")])
    assert exit_code(some_failed) == 0 and verdict_line(some_failed) is None


def test_relative_paths_reach_a_trial_absolute(tmp_path, monkeypatch):
    """What a trial resolves in its own working folder is what the driver meant."""
    from sweep.storage.staging import local_data_dir

    (tmp_path / "data").mkdir()
    monkeypatch.chdir(tmp_path)
    settings = compose_settings("task=RTE", "storage.data_dir=data")
    monkeypatch.chdir(Path("/"))  # a Ray worker's folder
    assert local_data_dir(settings.storage) == tmp_path / "data"


def test_the_resume_line_of_a_failed_tune_run_names_the_same_command():
    from sweep.driver.stop import resume_command

    assert resume_command(["task=RTE", "out_dir=old", "train.lr=1e-5"], "/abs/out") == (
        "python -m sweep task=RTE train.lr=1e-5 out_dir=/abs/out resume=true")


def test_a_resumed_sweep_says_what_it_found_and_what_each_trial_will_do():
    done, paused, fresh, failed = (SavedTrial(True, False, True), SavedTrial(False, False, True),
                                   SavedTrial(False, False, False), SavedTrial(False, True, True))
    assert resuming_line("s3://b/ray/sweep", [done, done, paused, fresh, failed]) == (
        "resume: continuing the sweep in s3://b/ray/sweep: of its 5 saved trials 2 finished (not run again), "
        "1 restart from their checkpoints, 1 start from the beginning (no checkpoint yet), 1 failed (kept as they are)")
    assert resuming_line("/o/ray/sweep", [paused]) == (
        "resume: continuing the sweep in /o/ray/sweep: of its 1 saved trials 0 finished (not run again), "
        "1 restart from their checkpoints")
