"""A resumed trial whose saved checkpoint is gone goes on from the newest whole one it kept.

Tune deletes a trial's older checkpoint as soon as it registers a newer one (``num_to_keep``), but it saves
the experiment's state (what ``resume`` restores: each trial's latest checkpoint) only every so often. A
sweep killed in between (a preemption's SIGKILL) leaves a state that names a deleted checkpoint, and Tune's
restore then fails the trial on every retry ("Could not recover from checkpoint as it does not exist on
storage anymore"): seen in a fresh-clone run of tests/test_preemption.py.

Which of the trial's other checkpoint folders is whole: the one whose marker's ``checkpoint_id`` is in the
trial's history, which the trial writes only once ``report`` has persisted that checkpoint (a folder still
being copied at the kill has no row). The trial goes on from the newest such; its history past it is
dropped as after any retry (sweep/results/trial_reports.py). None found: Tune's own error stands.
"""

from __future__ import annotations

import json
from typing import Any

from sweep.results.trial_reports import CHECKPOINT_MARKER, TrialHistories

CHECKPOINT_PREFIX = "checkpoint_"  # Tune's folder names: checkpoint_000000, checkpoint_000001, ...


def newest_recorded(markers: dict[str, dict[str, Any] | None], recorded: set[str]) -> str | None:
    """Of checkpoint folders by name, each with its marker (None: no marker yet), the newest whose
    checkpoint the history records."""
    for name in sorted(markers, reverse=True):
        marker = markers[name]
        if marker and marker.get("checkpoint_id") in recorded:
            return name
    return None


def kept_instead(checkpoint, trial_id: str, histories: TrialHistories):
    """``checkpoint`` (Train's or Tune's ``Checkpoint``) when it exists, else the trial's newest whole checkpoint
    beside it, else None."""
    import pyarrow.fs

    fs, path = checkpoint.filesystem, checkpoint.path.rstrip("/")
    if fs.get_file_info(path).type != pyarrow.fs.FileType.NotFound:
        return checkpoint
    parent = path.rsplit("/", 1)[0]
    found = fs.get_file_info(pyarrow.fs.FileSelector(parent, allow_not_found=True))
    markers = {info.base_name: _marker(fs, info.path) for info in found
               if info.base_name.startswith(CHECKPOINT_PREFIX) and info.type == pyarrow.fs.FileType.Directory}
    recorded = {row.checkpoint_id for row in histories.read(trial_id) if row.checkpoint_id}
    name = newest_recorded(markers, recorded)
    if name is None:
        return None
    return type(checkpoint)(f"{parent}/{name}", filesystem=fs)


def folder_exists(location: str) -> bool:
    """Whether a folder (a path, or a URI: s3://…) is there."""
    import pyarrow.fs

    fs, path = _filesystem(location)
    return fs.get_file_info(path).type == pyarrow.fs.FileType.Directory


def _filesystem(location: str):
    import pyarrow.fs

    if "://" not in location:
        return pyarrow.fs.LocalFileSystem(), location
    return pyarrow.fs.FileSystem.from_uri(location)


def _checkpoints_in(folders: list[str]) -> list[tuple[str, dict[str, Any] | None]]:
    """Every checkpoint folder in the trial folders given (paths or URIs), newest first within each folder
    and the later folders (a later launch) first: (its location, its marker or None)."""
    import pyarrow.fs

    from sweep.remote_files import uri_of

    found = []
    for folder in reversed(folders):
        fs, path = _filesystem(folder)
        infos = fs.get_file_info(pyarrow.fs.FileSelector(path.rstrip("/"), allow_not_found=True))
        named = sorted((i for i in infos if i.base_name.startswith(CHECKPOINT_PREFIX)
                        and i.type == pyarrow.fs.FileType.Directory), key=lambda i: i.base_name, reverse=True)
        local = "://" not in folder
        found += [(i.path if local else uri_of(fs, i.path), _marker(fs, i.path)) for i in named]
    return found


def checkpoint_locations(folders: list[str]) -> list[str]:
    """Every checkpoint folder in the trial folders given."""
    return [location for location, _ in _checkpoints_in(folders)]


def with_marker(folders: list[str], checkpoint_id: str | None, step: int | None) -> str | None:
    """The checkpoint that holds the evaluation ``checkpoint_id`` (by ``step`` for markers without ids)."""
    for location, marker in _checkpoints_in(folders):
        if not marker:
            continue
        if checkpoint_id and marker.get("checkpoint_id"):
            if marker["checkpoint_id"] == checkpoint_id:
                return location
        elif step is not None and marker.get("step") == step:
            return location
    return None


def newest_whole(folders: list[str], recorded: set[str]) -> tuple[str, str] | None:
    """The newest checkpoint whose evaluation the trial's history records (so it was whole when recorded):
    (its location, its checkpoint id)."""
    for location, marker in _checkpoints_in(folders):
        if marker and marker.get("checkpoint_id") in recorded:
            return location, marker["checkpoint_id"]
    return None


def _marker(fs, folder: str) -> dict[str, Any] | None:
    try:
        with fs.open_input_stream(f"{folder}/{CHECKPOINT_MARKER}") as f:
            return json.loads(f.read())
    except (OSError, ValueError):  # missing (FileNotFoundError is an OSError), or still being written
        return None


def restoring_kept_checkpoints(trainable, histories: TrialHistories) -> type:
    """``trainable`` (a function, as Tune wraps it, or a Trainable class) whose restore goes on from the
    trial's newest whole checkpoint when the one Tune saved is gone (the module's docstring)."""
    from ray.tune.trainable.function_trainable import wrap_function

    from sweep.cluster.ray_internals import training_result

    trainable_cls = trainable if isinstance(trainable, type) else wrap_function(trainable)

    class RestoresAKeptCheckpoint(trainable_cls):
        def restore(self, checkpoint_path):
            # Tune's result of the checkpoint (Ray 2.60): Train's or Tune's Checkpoint class, whichever made it
            saved = getattr(checkpoint_path, "checkpoint", None)
            if hasattr(saved, "filesystem") and hasattr(saved, "path"):
                kept = kept_instead(saved, self.trial_id, histories)
                if kept is not None and kept is not saved:
                    print(f"resume: trial {self.trial_id}: its saved checkpoint {saved.path.rsplit('/', 1)[-1]} "
                          f"is gone (Tune kept a newer one); going on from {kept.path.rsplit('/', 1)[-1]}")
                    checkpoint_path = training_result(kept, checkpoint_path.metrics)
            return super().restore(checkpoint_path)

    # Ray shows (and the tests find) a trial's process by its class name: Tune's own, as without this wrap;
    # its _name, inherited, names the trials and passes Tuner.restore's check
    RestoresAKeptCheckpoint.__name__ = trainable_cls.__name__
    RestoresAKeptCheckpoint.__qualname__ = trainable_cls.__name__
    return RestoresAKeptCheckpoint
