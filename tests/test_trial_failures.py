"""Fail fast on what a retry cannot fix: the classification (plain Python, the real errors our data,
torch and Ray raise, no Ray cluster) and a sweep on a real local Ray whose bad-label trial ends
after exactly one attempt while the other task's trial finishes."""

from __future__ import annotations

import pytest

from sweep.config.tasks import load_task
from sweep.errors import ConfigError, DataFormatError, DiskFullError, ModelSourceError, TrackingError
from sweep.failures import error_line, first_line, is_retryable, trial_error


def raised(fn) -> BaseException:
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - the point is to keep what was raised
        return e
    raise AssertionError("nothing was raised")


def bad_label_error(tmp_path) -> DataFormatError:
    """What loading RTE with a label it does not have raises (the real loader, real files)."""
    from sweep.data.glue import load_task_data
    from sweep.data.synthetic import write_synthetic_glue

    data = write_synthetic_glue(tmp_path / "data", ["RTE"], n_train=16, n_dev=8)
    write_bad_label(data, "RTE", 3)
    return raised(lambda: load_task_data(load_task("RTE"), data))


def write_bad_label(data, task: str, row: int, label: str = "maybe") -> None:
    train = data / "glue_data" / task / "train.tsv"
    lines = train.read_text().splitlines()
    lines[row] = lines[row].rsplit("\t", 1)[0] + f"\t{label}"
    train.write_text("\n".join(lines) + "\n")


def test_a_bad_label_is_the_trials_own_error_with_its_line(tmp_path):
    error = bad_label_error(tmp_path)
    assert isinstance(error, DataFormatError)
    assert trial_error(error) is error and not is_retryable(error)
    line = error_line(error)
    assert line.startswith("DataFormatError: ") and "train.tsv:4" in line and "'maybe'" in line


def test_an_error_whose_message_is_a_traceback_is_told_by_its_root_cause():
    """Tune ends its run on a callback's error with a TuneError whose message is the whole traceback: the
    sweep's one line said 'TuneError: Traceback (most recent call last):' and nothing of the cause."""
    from ray.tune.error import TuneError

    message = ("Traceback (most recent call last):\n  File \"tune_controller.py\", line 1442, in _stop_trial\n"
               "    callback.on_trial_complete(...)\n"
               "TypeError: finish() takes 2 positional arguments but 3 were given\n")
    assert error_line(TuneError(message)) == (
        "TuneError: TypeError: finish() takes 2 positional arguments but 3 were given")
    two_lines = message.replace("given\n", "given\nand a second line of its message\n")
    assert error_line(TuneError(two_lines)) == error_line(TuneError(message))
    assert error_line(ValueError("row 3: no label\nmore")) == "ValueError: row 3: no label"
    assert error_line(ValueError()) == "ValueError"


def test_first_line_is_the_messages_first_line_else_the_type_scrubbed_before_the_cut(monkeypatch):
    """The one-line reason the tracker, the uploads, the plan and the CLI print for a caught error."""
    assert first_line(ValueError("row 3: no label 'maybe'\nTraceback (most recent call last): ...")) == (
        "row 3: no label 'maybe'")
    assert first_line(ValueError()) == "ValueError"
    assert first_line(OSError("x" * 400), 300) == "x" * 300
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-" + "k" * 40)
    leaky = OSError("refused " + "y" * 280 + " s3cr3t-" + "k" * 40 + "\nmore")
    assert first_line(leaky, 300, scrubbed=True) == "refused " + "y" * 280 + " ***"
    assert "s3cr3t" in first_line(leaky, 300)  # unscrubbed where asked (costs, the Ray probe: no secrets there)
    assert first_line(OSError("sqlite://u:pw@host/db"), scrubbed=True) == "sqlite://u:***@host/db"


def test_a_sequence_longer_than_the_models_positions_is_not_retried():
    import torch

    positions = torch.nn.Embedding(8, 4)  # a model with 8 positions, asked for the 9th
    error = raised(lambda: positions(torch.arange(9)))
    assert isinstance(error, IndexError) and "index out of range in self" in str(error)
    assert not is_retryable(error)


@pytest.mark.parametrize("error", [
    ConfigError("train.lr: must be > 0"), ModelSourceError("model.path /m has no config.json"),
    KeyError("label"), ValueError("Expected input batch_size (4) to match target batch_size (3)"),
    TypeError("forward() got an unexpected keyword argument 'token_type_ids'"),
])
def test_data_config_and_model_errors_are_not_retried(error):
    assert trial_error(error) is error


@pytest.mark.parametrize("error", [
    ConnectionResetError("Connection reset by peer"), TimeoutError("read timed out"),
    OSError(28, "No space left on device"), MemoryError(), RuntimeError("CUDA error: unspecified launch failure"),
    TrackingError("MLflow at http://mlflow:5000 is unreachable"), DiskFullError("out_dir: the disk is full"),
    KeyboardInterrupt(),
])
def test_infrastructure_and_unknown_errors_are_retried(error):
    assert is_retryable(error)


def test_a_value_error_raised_from_a_network_fault_is_retried():
    def read():
        try:
            raise ConnectionError("S3 endpoint unreachable")
        except ConnectionError as e:
            raise ValueError("could not read the object") from e

    assert is_retryable(raised(read))


def test_our_own_verdict_wins_over_the_os_error_it_came_from(tmp_path):
    def load():
        try:
            (tmp_path / "missing.tsv").read_text()
        except FileNotFoundError as e:
            raise DataFormatError(f"{tmp_path / 'missing.tsv'}: file not found") from e

    assert not is_retryable(raised(load))


def test_found_inside_rays_wrappers(tmp_path):
    """A DDP trial's error reaches the trainable as Train's WorkerGroupError holding each rank's
    UserExceptionWithTraceback; a killed worker as an ActorDiedError among them."""
    from ray.exceptions import ActorDiedError
    from ray.train.v2._internal.exceptions import UserExceptionWithTraceback
    from ray.train.v2.api.exceptions import WorkerGroupError

    label = bad_label_error(tmp_path)
    wrapped = {rank: UserExceptionWithTraceback(label, f"Traceback ...\nDataFormatError: {label}") for rank in (0, 1)}
    assert trial_error(WorkerGroupError("Training failed", wrapped)) is label
    crash = RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer")
    assert trial_error(WorkerGroupError("Training failed",
                                        {0: wrapped[0], 1: UserExceptionWithTraceback(crash, "")})) is label
    assert is_retryable(WorkerGroupError("Training failed",
                                         {0: ActorDiedError(), 1: UserExceptionWithTraceback(crash, "")}))


@pytest.mark.ray
@pytest.mark.slow
def test_a_bad_label_trial_fails_after_exactly_one_attempt(cache_dir, tmp_path, monkeypatch, capsys):
    """sweep.max_failures=2, yet the trials of RTE (one worker, in Tune's trial process) and SST-2
    (a 2-worker DDP run: Train's workers) whose data hold a label the task does not have end at
    their first attempt, ERROR with the label's line; WNLI's trial finishes. Tune's record of each
    trial counts no failure (a retried trial counts one per retry; Train does not retry at all)
    and each bad trial's history holds the one failure row of its one attempt."""
    import ray
    from ray import tune

    from sweep.app import run
    from sweep.data.synthetic import write_synthetic_glue
    from sweep.plan.sizes import EXPERIMENT
    from sweep.results.records import load_records
    from sweep.results.trial_reports import TrialHistories
    from tests.helpers.configs import demo_config
    from tests.helpers.sweeps import TRAIN_WORKER, actors

    monkeypatch.setenv("SWEEP_CACHE_DIR", str(cache_dir))
    data = write_synthetic_glue(tmp_path / "data", ["WNLI", "RTE", "SST-2"], n_train=64, n_dev=32)
    write_bad_label(data, "RTE", 40)
    write_bad_label(data, "SST-2", 20, label="2")
    out = tmp_path / "out"
    cfg = demo_config("tracking=none", "task=[WNLI,RTE,SST-2]", "sweep.seeds=[38]", "train.epochs=1",
                      "sweep.max_failures=2", "+resources.tasks.SST-2.gpus_per_trial=2",  # no GPU: 2 CPU workers
                      f"storage.data_dir={data}", f"out_dir={out}")
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        summaries = run(cfg, out)
        # one attempt of the DDP trial: one group of 2 Train workers (a retry would start another)
        train_workers = actors(TRAIN_WORKER, alive_only=False)
    finally:
        ray.shutdown()
    assert len(train_workers) == 2, train_workers
    by_task = {r.task: r for r in load_records(out / "results.json")}
    assert by_task["WNLI"].status == "TERMINATED" and by_task["WNLI"].score is not None
    for task, line, label in (("RTE", 41, "'maybe'"), ("SST-2", 21, "'2'")):
        record = by_task[task]
        assert record.status == "ERROR" and record.error.startswith("DataFormatError: "), record.error
        assert f"{task}/train.tsv:{line}: unknown label {label}" in record.error and "\n" not in record.error
        summary = next(s for s in summaries if s.task == task)
        assert summary.failed == 1 and summary.best_seed is None
        assert not (out / "best" / task).exists()
    assert (out / "best" / "WNLI").is_dir()
    assert "3/3 done, 0 running, 0 pending, 2 failed" in capsys.readouterr().out  # the progress line counts them
    # Tune's saved state of each trial: no failure counted (before: max_failures=2 retries each)
    trials = {t.config["trial"]["task"]: t for t in tune.ExperimentAnalysis(str(out / "ray" / EXPERIMENT)).trials}
    assert {task: t.num_failures for task, t in trials.items()} == {"WNLI": 0, "RTE": 0, "SST-2": 0}
    # each bad trial's own history: the one failure row of its one attempt, no epoch
    histories = TrialHistories(str(out / "ray" / "history")).all().values()
    failed = sorted(([row.trial_error for row in h] for h in histories if any(row.trial_error for row in h)))
    assert failed == sorted([[by_task["RTE"].error], [by_task["SST-2"].error]])
