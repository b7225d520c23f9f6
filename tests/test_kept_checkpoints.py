"""A trial whose saved checkpoint a kill left deleted goes on from its newest whole one
(sweep/trial/kept_checkpoints.py), Ray-free: real folders, pyarrow's filesystem, Tune's own ``Checkpoint``.
The same restore in a running sweep: tests/test_sweep_ray.py's killed-trial test, ``stale-record``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ray.tune import Checkpoint

from sweep.results.trial_reports import CHECKPOINT_MARKER, Report, TrialHistories
from sweep.trial.kept_checkpoints import kept_instead, newest_recorded
from tests.helpers.s3 import s3_env

TRIAL = "e2d65b53"


def checkpoint_folder(trial_dir: Path, index: int, checkpoint_id: str | None) -> Path:
    folder = trial_dir / f"checkpoint_{index:06d}"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    if checkpoint_id is not None:  # None: a folder still being copied when the sweep was killed (no marker yet)
        (folder / CHECKPOINT_MARKER).write_text(json.dumps({"epoch": index + 1, "checkpoint_id": checkpoint_id}))
    return folder


@pytest.fixture
def trial(tmp_path: Path) -> tuple[Path, TrialHistories]:
    """A trial folder as Tune left it at a kill: checkpoint 0 deleted once 1 was registered, 1 whole and
    in the history, 2 half copied (its marker is there, its row is not), 3 without a marker."""
    histories = TrialHistories(str(tmp_path / "history"))
    histories.write(TRIAL, [Report(trial_id=TRIAL, epoch=1, step=10, checkpoint_id="id-0"),
                            Report(trial_id=TRIAL, epoch=2, step=20, checkpoint_id="id-1")])
    trial_dir = tmp_path / "tune" / f"train_driver_fn_{TRIAL}_1_seed=1,task=WNLI"
    checkpoint_folder(trial_dir, 1, "id-1")
    checkpoint_folder(trial_dir, 2, "id-2")
    checkpoint_folder(trial_dir, 3, None)
    return trial_dir, histories


def test_the_newest_folder_the_history_records_is_the_one() -> None:
    markers = {"checkpoint_000001": {"checkpoint_id": "a"}, "checkpoint_000002": {"checkpoint_id": "b"},
               "checkpoint_000003": None}
    assert newest_recorded(markers, {"a", "b"}) == "checkpoint_000002"
    assert newest_recorded(markers, {"a"}) == "checkpoint_000001"
    assert newest_recorded(markers, set()) is None


def test_a_deleted_saved_checkpoint_gives_way_to_the_newest_whole_one(trial) -> None:
    trial_dir, histories = trial
    saved = Checkpoint(str(trial_dir / "checkpoint_000000"))  # what Tune's saved state names: gone
    kept = kept_instead(saved, TRIAL, histories)
    assert isinstance(kept, Checkpoint) and Path(kept.path) == trial_dir / "checkpoint_000001"
    assert kept.filesystem.type_name == saved.filesystem.type_name
    with kept.as_directory() as folder:  # Tune's own reading of it works
        assert json.loads((Path(folder) / CHECKPOINT_MARKER).read_text())["checkpoint_id"] == "id-1"


def test_a_saved_checkpoint_that_exists_is_kept_as_it_is(trial) -> None:
    trial_dir, histories = trial
    saved = Checkpoint(str(trial_dir / "checkpoint_000002"))
    assert kept_instead(saved, TRIAL, histories) is saved


def test_nothing_whole_to_go_on_from_leaves_tunes_error_to_stand(trial, tmp_path: Path) -> None:
    trial_dir, _ = trial
    saved = Checkpoint(str(trial_dir / "checkpoint_000000"))
    assert kept_instead(saved, TRIAL, TrialHistories(str(tmp_path / "no-history"))) is None
    assert kept_instead(Checkpoint(str(tmp_path / "gone" / "checkpoint_000000")), TRIAL, trial[1]) is None


def test_the_same_in_s3(trial, tmp_path: Path, moto_server, monkeypatch) -> None:
    """As Tune sees a sweep's storage in S3 (cluster.storage_path=s3://…): folders are key prefixes there."""
    import boto3
    import pyarrow.fs

    s3_env(monkeypatch, moto_server)
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="sweep-results")
    for path in tmp_path.rglob("*"):
        if path.is_file() and path.name != "moto.log":
            s3.upload_file(str(path), "sweep-results", f"ray/{path.relative_to(tmp_path).as_posix()}")
    trial_dir, _ = trial
    fs, saved_path = pyarrow.fs.FileSystem.from_uri(
        f"s3://sweep-results/ray/tune/{trial_dir.name}/checkpoint_000000")
    kept = kept_instead(Checkpoint(saved_path, filesystem=fs), TRIAL, TrialHistories("s3://sweep-results/ray/history"))
    assert kept is not None and kept.path == f"sweep-results/ray/tune/{trial_dir.name}/checkpoint_000001"
