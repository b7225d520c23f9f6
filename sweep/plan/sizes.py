"""Each task's plan on a cluster: the size of its trials (workers, GPUs, CPUs), how many run at once,
where checkpoints go. Plain Python over the nodes' resources (no Ray import), so it is unit-tested
without a cluster; ``tuner.py`` feeds it what Ray reports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from sweep.config.settings import ClusterConfig, Settings
from sweep.errors import ResourceError
from sweep.plan.scale import AutoscalerView, ScalePlan, TrialResources, format_bundle, plan_scale, trials_fit_on
from sweep.remote_files import is_remote
from sweep.results.trial_reports import FOLDER as HISTORY_FOLDER, TrialHistories

EXPERIMENT = "tune"  # Tune's experiment folder under the storage path



@dataclass(frozen=True)
class TaskPlacement:
    """A task's trials on this cluster: each one's size, how many at once, what to launch for them."""

    size: TrialResources  # the same for every trial of the task, from here to Tune's request and the trial
    max_concurrent: int  # trials that fit on the cluster at once (alive nodes + what the autoscaler may add)
    warning: str | None = None  # e.g. "no GPU in the cluster: running on CPU"
    scale: ScalePlan | None = None  # on an autoscaling cluster: what fits now, at most, and what to launch

    @property
    def waiting(self) -> str | None:
        """'waiting for 2 GPU node(s) (type gpu_worker) from the autoscaler' (None: nothing to launch)."""
        return self.scale.waiting_text() if self.scale is not None else None


def plan_trials(settings: Settings, nodes: list[dict[str, float]], autoscaler: AutoscalerView | None = None,
                wanted: int | None = None, task: str | None = None,
                gpus_per_trial: float | None = None) -> TaskPlacement:
    """Derive per-trial resources and max concurrency from the alive nodes' total resources and, on
    an autoscaling cluster, the node types it can launch (up to their max counts).

    The trial's own driver (the Tune function) and the Train controller ask for no CPU, so what a
    trial holds is exactly its workers; concurrency never exceeds what fits, so no trial waits
    for a worker group that can never start (the 2-CPU deadlock of docs/architecture.md §6).
    ``wanted``: the trials the sweep would run at once (its trial count), which bounds what is asked
    of the autoscaler.
    ``task``: plan that task's trials (its own ``resources.tasks.<task>`` sizes); ``gpus_per_trial``:
    the share the dispatch chose for it (``resources.gpus_per_trial=auto``).
    """
    r = settings.resources
    if gpus_per_trial is None:
        gpus_per_trial = r.gpus_for(task) if task else r.gpus_per_trial
    gpus_per_trial, cpus = float(gpus_per_trial), float(r.cpus_for(task) if task else r.cpus_per_trial)
    own = task is not None and task in r.tasks and r.tasks[task].gpus_per_trial is not None
    key = f"resources.tasks.{task}.gpus_per_trial" if own else "resources.gpus_per_trial"
    workers = int(gpus_per_trial) if gpus_per_trial > 1 else 1
    gpus = gpus_per_trial / workers if gpus_per_trial > 0 else 0.0
    types = autoscaler.node_types if autoscaler is not None else ()
    warning = None
    if gpus > 0 and not any(n.get("GPU", 0) > 0 for n in nodes):
        launchable_gpu = [t for t in types if t.gpus > 0 and t.max_workers != 0]
        if launchable_gpu:
            pass  # the trials wait for GPU nodes: never silently on CPU
        elif settings.cluster.address:
            # A cluster someone else runs: GPU trials on its CPUs would be days of roberta-base on a head.
            raise ResourceError(
                f"{key}={gpus_per_trial:g}: the Ray cluster at {settings.cluster.address} "
                "has no GPU node and its autoscaler can launch none"
                + (f" (node types: {', '.join(f'{t.name} max {t.max_workers}' for t in types)})" if types else "")
                + f"; add a GPU worker group, or run on CPU on purpose with {key}=0"
            )
        else:  # the laptop: a local Ray the sweep started itself
            warning = f"{key}={gpus_per_trial:g} but the cluster has no GPU: trials run on CPU"
            gpus = 0.0
    needs = TrialResources(workers, cpus, gpus)
    fits_alive = sum(trials_fit_on(n, needs) for n in nodes)
    scale = plan_scale(nodes, types, autoscaler.alive_counts if autoscaler is not None else {}, needs,
                       wanted if wanted is not None else fits_alive or 1,
                       autoscaler.max_total_workers if autoscaler is not None else None)
    if scale.never_fits:
        biggest_cpu = max((n.get("CPU", 0) for n in nodes), default=0)
        biggest_gpu = max((n.get("GPU", 0) for n in nodes), default=0)
        need = ((f"{task}: " if task else "") + f"{workers} worker(s) x ({cpus:g} CPU"
                + (f", {gpus:g} GPU)" if gpus else ")"))
        launchable = f" and no node type the autoscaler can launch holds it ({_describe(types)})" if types else ""
        raise ResourceError(
            f"resources: one trial needs {need} on one node, but the largest node has "
            f"{biggest_cpu:g} CPU and {biggest_gpu:g} GPU{launchable}; lower {key} / "
            f"{key.replace('gpus_per_trial', 'cpus_per_trial')} or add bigger nodes"
        )
    # fits_at_max is the alive nodes' fit plus what launchable nodes add (no autoscaler: the alive fit)
    return TaskPlacement(needs, scale.fits_at_max, warning, scale if types else None)


def _describe(types) -> str:
    return ", ".join(f"{t.name}: {format_bundle(t.resources)} x max {t.max_workers}" for t in types)


def trial_count(settings: Settings) -> int:
    points = math.prod(len(v) for v in settings.sweep.grid.values()) if settings.sweep.grid else 1
    return len(settings.tasks) * len(settings.sweep.seeds) * points * settings.sweep.num_samples


def many_nodes(node_count: int, autoscaler: AutoscalerView | None, declared: list | None = None) -> str | None:
    """Why the cluster is (or can become) more than one node, as a phrase; None: one node for good.

    The nodes alive now, the node types its autoscaler can launch, and those the user declared in
    ``cluster.node_types`` (KubeRay's autoscaler, which the driver cannot read) all count: on an
    autoscaling cluster that starts as a head alone, every trial runs on a node launched later."""
    if node_count > 1:
        return f"has {node_count} nodes"
    launchable = [t.name for t in (autoscaler.node_types if autoscaler is not None else ()) if t.max_workers != 0]
    if launchable:
        return f"can launch nodes of type {', '.join(launchable)}"
    if declared:
        names = [str(t.get("name", "?")) if isinstance(t, dict) else str(t) for t in declared]
        return f"can launch nodes of type {', '.join(names)} (cluster.node_types)"
    return None


def storage_path(cluster: ClusterConfig, out_dir: Path, node_count: int,
                 autoscaler: AutoscalerView | None = None) -> str:
    """Where the trials write what the driver reads back (checkpoints, histories, Tune's state).

    On a cluster that is or can become several nodes, each with its own disk, that must be a place
    every node reaches: s3://…, or a folder the user says every node mounts (cluster.shared_storage)."""
    several = many_nodes(node_count, autoscaler, cluster.node_types)
    path = cluster.storage_path
    if several is None:
        return path or str(Path(out_dir) / "ray")
    if not path:
        raise ResourceError(
            f"cluster.storage_path: this Ray cluster {several}, each node with its own disk, and trials write "
            "checkpoints where the driver must read them; set cluster.storage_path=s3://bucket/prefix, or a folder "
            "every node mounts (NFS) with cluster.shared_storage=true"
        )
    if not is_remote(path) and not cluster.shared_storage:
        raise ResourceError(
            f"cluster.storage_path={path}: a folder on this machine, but this Ray cluster {several}, each node with "
            "its own disk, so checkpoints written on another node would not be here; if every node mounts this folder "
            "(NFS), say so with cluster.shared_storage=true, else use cluster.storage_path=s3://bucket/prefix"
        )
    return path


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
    def histories(self) -> TrialHistories:
        """The trials' own evaluation records, read back by the driver (a folder or s3://…, like the rest)."""
        return TrialHistories(self.under(HISTORY_FOLDER))

    @property
    def local_train_dir(self) -> Path | None:
        return None if self.remote else Path(self.train)


def sweep_storage(root: str) -> SweepStorage:
    return SweepStorage(root, is_remote(root))
