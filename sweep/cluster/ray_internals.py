"""The trial's, the schedulers' and the hooks' uses of Ray's private modules, in one place (Ray 2.60): each
has no public equivalent, and a Ray upgrade that moves one breaks here, not in the tuner, the trial or a
hook. tests/test_architecture.py holds that only sweep/cluster/ (this module; autoscale.py and request.py
read the autoscaler's and the GCS's state) and sweep/testing/ import ``ray._private``, ``ray._raylet`` or an
``_internal`` module."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def trial_storage_path() -> Path:
    """In a Tune trial's process (Train's local mode): the trial's folder in the sweep's storage, where Ray
    copies its checkpoints. Tune's session has no public accessor for it."""
    from ray.train._internal.session import get_session

    return Path(get_session().storage.trial_fs_path)


def training_result(checkpoint: Any, metrics: dict[str, Any]) -> Any:
    """The value ``Trial.on_checkpoint`` and ``Trainable.restore`` take (a checkpoint and the metrics it was
    reported with)."""
    from ray.train._internal.session import _TrainingResult

    return _TrainingResult(checkpoint=checkpoint, metrics=metrics)


def actor_manager_class() -> type:
    """Tune's actor manager, whose ``_actor_task_failed`` decides what a dead trial process means."""
    from ray.air.execution._internal.actor_manager import RayActorManager

    return RayActorManager
