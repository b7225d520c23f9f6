"""The plan of a sweep on a cluster: how many workers and GPUs per trial, how many trials at once,
where checkpoints go. Plain Python over the nodes' resources (no Ray import), so it is unit-tested
without a cluster; ``tuner.py`` feeds it what Ray reports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from sweep.config import Settings
from sweep.errors import ResourceError

EXPERIMENT = "tune"  # Tune's experiment folder under the storage path


def is_remote(path: str) -> bool:
    """s3://…, gs://…: a storage path Ray reaches through pyarrow, not this machine's disk."""
    return "://" in path



@dataclass(frozen=True)
class TrialPlan:
    workers: int  # Ray Train workers per trial (DDP when > 1)
    gpus_per_worker: float
    cpus_per_worker: float
    max_concurrent: int  # trials that fit on the cluster at once
    warning: str | None = None  # e.g. "no GPU in the cluster: running on CPU"


def _fits(node: dict[str, float], workers: int, cpus: float, gpus: float) -> int:
    """How many trials (all of a trial's workers on this one node) fit on the node."""
    fit = math.floor(node.get("CPU", 0) / (cpus * workers) + 1e-9)
    if gpus > 0:
        fit = min(fit, math.floor(node.get("GPU", 0) / (gpus * workers) + 1e-9))
    return fit


def plan_trials(settings: Settings, nodes: list[dict[str, float]]) -> TrialPlan:
    """Derive per-trial resources and max concurrency from the alive nodes' total resources.

    The trial's own driver (the Tune function) and the Train controller ask for no CPU, so what a
    trial holds is exactly its workers; concurrency never exceeds what fits, so no trial waits
    for a worker group that can never start (the 2-CPU deadlock of DESIGN §5).
    """
    r = settings.resources
    gpus_per_trial, cpus = float(r.gpus_per_trial), float(r.cpus_per_trial)
    workers = int(gpus_per_trial) if gpus_per_trial > 1 else 1
    gpus = gpus_per_trial / workers if gpus_per_trial > 0 else 0.0
    warning = None
    if gpus > 0 and not any(n.get("GPU", 0) > 0 for n in nodes):
        warning = f"resources.gpus_per_trial={r.gpus_per_trial} but the cluster has no GPU: trials run on CPU"
        gpus = 0.0
    per_node = [_fits(n, workers, cpus, gpus) for n in nodes]
    if not any(per_node):
        biggest_cpu = max((n.get("CPU", 0) for n in nodes), default=0)
        biggest_gpu = max((n.get("GPU", 0) for n in nodes), default=0)
        need = f"{workers} worker(s) x ({cpus:g} CPU" + (f", {gpus:g} GPU)" if gpus else ")")
        raise ResourceError(
            f"resources: one trial needs {need} on one node, but the largest node has "
            f"{biggest_cpu:g} CPU and {biggest_gpu:g} GPU; lower resources.gpus_per_trial / "
            "resources.cpus_per_trial or add bigger nodes"
        )
    return TrialPlan(workers, gpus, cpus, sum(per_node), warning)


def trial_count(settings: Settings) -> int:
    points = math.prod(len(v) for v in settings.sweep.grid.values()) if settings.sweep.grid else 1
    return len(settings.tasks) * len(settings.sweep.seeds) * points * settings.sweep.num_samples


def storage_path(settings: Settings, out_dir: Path, node_count: int) -> str:
    if settings.cluster.storage_path:
        return settings.cluster.storage_path
    if node_count > 1:
        raise ResourceError(
            f"cluster.storage_path: this Ray cluster has {node_count} nodes, and trials write checkpoints "
            "where the driver must read them; set cluster.storage_path to a folder every node can reach "
            "(NFS) or to s3://bucket/prefix"
        )
    return str(Path(out_dir) / "ray")




@dataclass(frozen=True)
class SweepStorage:
    """Where a sweep's Ray files go, derived once from the storage path (a folder or s3://…)."""

    root: str
    remote: bool

    def under(self, name: str) -> str:
        return f"{self.root.rstrip('/')}/{name}" if self.remote else str(Path(self.root) / name)

    @property
    def train(self) -> str:
        return self.under("train")  # the trials' Train runs and checkpoints

    @property
    def experiment(self) -> str:
        return self.under(EXPERIMENT)  # Tune's experiment (what resume=true restores)

    @property
    def history_dir(self) -> Path | None:
        """The trials' own epoch records, read back by the driver: only on a disk it can read."""
        return None if self.remote else Path(self.root) / "history"

    @property
    def local_train_dir(self) -> Path | None:
        return None if self.remote else Path(self.train)


def sweep_storage(root: str) -> SweepStorage:
    return SweepStorage(root, is_remote(root))
