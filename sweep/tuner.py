"""The Ray Tune run of a sweep: trials, resources, concurrency, scheduler, resume, and the records.

The plan (how many workers and GPUs per trial, how many trials at once) is plain Python over
the cluster's node resources, so it is unit-tested without Ray; ``run_tune`` is the thin part.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweep.config import ConfigError, Settings
from sweep.errors import SOURCE_ERRORS
from sweep.results import TrialRecord

log = logging.getLogger(__name__)
EXPERIMENT = "tune"  # Tune's experiment folder under the storage path


class ResourceError(ValueError):
    """The cluster can never run one trial as asked; the message says what to change."""


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


def param_space(settings: Settings) -> dict[str, Any]:
    """Tasks x seeds x grid points (x search samples): one Tune trial each, all in ONE run."""
    from ray import tune

    space: dict[str, Any] = {
        "task": tune.grid_search([t.name for t in settings.tasks]),
        "seed": tune.grid_search(list(settings.sweep.seeds)),
        "hparams": {k: tune.grid_search(list(v)) for k, v in settings.sweep.grid.items()},
    }
    for key, spec in settings.sweep.search.items():
        if spec["dist"] == "choice":
            space["hparams"][key] = tune.choice(list(spec["values"]))
        elif spec["dist"] == "loguniform":
            space["hparams"][key] = tune.loguniform(spec["low"], spec["high"])
        else:
            space["hparams"][key] = tune.uniform(spec["low"], spec["high"])
    return space


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


def records_from_results(grid, settings: Settings, plan: TrialPlan, history_dir: Path | None = None,
                         train_dir: Path | None = None) -> list[TrialRecord]:
    """One TrialRecord per Tune trial, with the best epoch's metrics and checkpoint."""
    from sweep.trial import CHECKPOINT_RANK

    records = []
    for result in grid:
        cfg = result.config or {}
        trial_id = _trial_id(result)
        df = _history(result, history_dir)
        record = TrialRecord(
            task=cfg.get("task", "?"), seed=int(cfg.get("seed", -1)), hparams=dict(cfg.get("hparams") or {}),
            gpus=plan.gpus_per_worker * plan.workers, trial_id=result.path.rsplit("/", 1)[-1] if result.path else "",
        )
        if df is not None and len(df) and CHECKPOINT_RANK in df:
            best = df.loc[df[CHECKPOINT_RANK].idxmax()]
            record.metrics = {k[5:]: float(best[k]) for k in df.columns if k.startswith("eval/")}
            spec = next(t for t in settings.tasks if t.name == record.task)
            record.score = record.metrics.get(spec.metric)
            record.best_epoch = int(best["epoch"])
            record.epochs_done = int(df["epoch"].max())
            record.wall_seconds = float(df["reported_at"].max() - df["driver_started"].min())
            record.loop_seconds = float((df["train_seconds"] + df["eval_seconds"]).sum())
            first = df.iloc[0]
            first_batch = first["reported_at"] - first["train_seconds"] - first["eval_seconds"]
            record.startup_seconds = float(first_batch - first["driver_started"])
            record.node = str(best.get("node", ""))
            run_id = best.get("mlflow_run_id")
            record.run_id = run_id if isinstance(run_id, str) else ""
            record.checkpoint = _best_checkpoint(best, train_dir / f"trial-{trial_id}" if train_dir and trial_id else None)
        if result.error is not None or record.score is None:
            record.status = "ERROR"
            record.error = _error_text(result.error) if result.error is not None else "trial reported no result"
        records.append(record)
    return records


TRIAL_ID = re.compile(r"_([0-9a-f]{5}_\d{5})_")  # in Tune's trial folder name: run_trial_<id>_<n>_...


def _trial_id(result) -> str | None:
    match = TRIAL_ID.search(Path(_local_path(result.path) or "").name)
    return match.group(1) if match else None


def _best_checkpoint(best_row, run_dir: Path | None) -> str | None:
    """The best epoch's checkpoint folder: from Tune's report, else found by the epoch marker."""
    from sweep.trial import CHECKPOINT_EPOCH

    path = _local_path(best_row.get("checkpoint_path"))
    if path and Path(path).is_dir():
        return path
    if run_dir is not None:
        for marker in run_dir.glob(f"checkpoint_*/{CHECKPOINT_EPOCH}"):
            if json.loads(marker.read_text())["epoch"] == int(best_row["epoch"]):
                return str(marker.parent)
    return None


def _history(result, history_dir: Path | None):
    """Every epoch a trial reported. The trial's own history file comes first: a driver killed
    mid-sweep loses Tune's last unflushed rows, and after ``Tuner.restore`` a finished trial's
    history is not in memory."""
    import pandas as pd

    trial_id = _trial_id(result)
    if history_dir is not None and trial_id:
        own = history_dir / f"{trial_id}.json"
        if own.is_file():
            return pd.DataFrame(json.loads(own.read_text()))
    return result.metrics_dataframe


def _local_path(path: Any) -> str | None:
    if not isinstance(path, str) or not path:
        return None
    return path[len("file://"):] if path.startswith("file://") else path


def _error_text(error: BaseException) -> str:
    # The root cause's last line is what a person needs; Ray wraps it in several layers.
    text = str(error).strip().splitlines()
    return text[-1][:500] if text else repr(error)


def quiet_ray() -> None:
    """Keep the known deprecation and Train-V2 notices out of the user's terminal."""
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    for name in ("ray", "ray.tune", "ray.train", "ray.data"):
        logging.getLogger(name).setLevel(logging.ERROR)


def connect(settings: Settings) -> None:
    """Join the cluster named by cluster.address, or start a local Ray."""
    import ray

    if ray.is_initialized():
        return
    kwargs: dict[str, Any] = {"log_to_driver": settings.cluster.verbose, "logging_level": logging.ERROR,
                              "configure_logging": True}
    if settings.cluster.address:
        ray.init(address=settings.cluster.address, **kwargs)
    else:
        ray.init(num_cpus=settings.cluster.num_cpus, include_dashboard=False, **kwargs)


def alive_nodes() -> list[dict[str, float]]:
    import ray

    return [n["Resources"] for n in ray.nodes() if n.get("Alive")]


ASHA_NAMESPACE = "sweep"


def start_asha_board(settings: Settings, launch_id: str):
    """The named actor that holds the ASHA rungs (sweep.scheduler=asha); trials ask it each epoch.

    Returns (name, handle); the caller keeps the handle for the sweep's duration (it owns the actor).
    """
    if settings.sweep.scheduler != "asha":
        return None, None
    import ray

    from sweep.schedulers import AshaRungs

    name = f"sweep-asha-{launch_id}"
    max_t = max([settings.train.epochs, *settings.sweep.grid.get("epochs", [])])
    handle = ray.remote(num_cpus=0)(AshaRungs).options(name=name, namespace=ASHA_NAMESPACE).remote(max_t=max_t)
    return name, handle


def run_tune(settings: Settings, out_dir: Path, tracking=None) -> tuple[list[TrialRecord], Path | None]:
    """Run every trial of the sweep in one Tune run (or resume it).

    Returns the records and the local folder of the trials' checkpoints (None on remote storage).
    """
    quiet_ray()
    from ray import tune

    from sweep.progress import SweepProgress
    from sweep.stage_nodes import StageOnNodes
    from sweep.trial import run_trial

    connect(settings)
    nodes = alive_nodes()
    plan = plan_trials(settings, nodes)
    if plan.warning:
        log.warning(plan.warning)
        print(f"warning: {plan.warning}")
    storage = storage_path(settings, out_dir, len(nodes))
    remote = "://" in storage
    train_storage = f"{storage}/train" if remote else str(Path(storage) / "train")
    launch_id = uuid.uuid4().hex[:8]
    asha_board, _board_handle = start_asha_board(settings, launch_id)  # the handle keeps the board alive
    trainable = tune.with_parameters(
        run_trial, settings=settings, storage_path=train_storage, workers=plan.workers,
        gpus_per_worker=plan.gpus_per_worker, launch_id=launch_id, asha_board=asha_board, tracking=tracking,
    )
    # The trial's driver holds no CPU (its workers do); Ray refuses an empty request, so it asks
    # for 1 MiB of logical memory: the 2-CPU deadlock of DESIGN §5 cannot happen.
    trainable = tune.with_resources(trainable, {"cpu": 0, "memory": 2**20})
    total = trial_count(settings)
    concurrency = min(plan.max_concurrent, total)
    print(f"sweep: {total} trials ({len(settings.tasks)} task(s) x {len(settings.sweep.seeds)} seed(s)"
          f"{' x grid' if settings.sweep.grid else ''}), {concurrency} at once on {len(nodes)} node(s); "
          f"{plan.workers} worker(s) x ({plan.cpus_per_worker:g} CPU, {plan.gpus_per_worker:g} GPU) each")
    progress = SweepProgress(settings, total)
    experiment = f"{storage}/{EXPERIMENT}" if remote else str(Path(storage) / EXPERIMENT)
    fresh = not remote and not Path(experiment).exists()  # before the Tuner writes tuner.pkl there
    if settings.resume and tune.Tuner.can_restore(experiment):
        print(f"resume: continuing the sweep in {experiment}; finished trials are not run again")
        tuner = tune.Tuner.restore(experiment, trainable=trainable, resume_unfinished=True, resume_errored=False)
        # Restore keeps the original run config; progress goes through our callback regardless.
    else:
        if settings.resume:
            print(f"resume: nothing to resume in {experiment}; starting the sweep")
        tuner = tune.Tuner(
            trainable,
            param_space=param_space(settings),
            tune_config=tune.TuneConfig(
                num_samples=settings.sweep.num_samples, max_concurrent_trials=concurrency,
                # A trial's driver process serves the next trial: no new process, no re-import.
                reuse_actors=True,
            ),
            run_config=tune.RunConfig(
                name=EXPERIMENT, storage_path=storage, verbose=0,
                # staging on every node first (before the first trial), then the progress lines
                callbacks=[StageOnNodes(settings), progress],
                failure_config=tune.FailureConfig(max_failures=0),  # retries happen in Train, from checkpoints
            ),
        )
    try:
        grid = tuner.fit()
    except (*SOURCE_ERRORS, ConfigError):
        # The nodes' staging refused before any trial ran: leave no experiment behind that a later
        # resume=true would try to restore.
        if fresh:
            shutil.rmtree(experiment, ignore_errors=True)
        raise
    progress.close()
    history_dir = None if remote else Path(storage) / "history"
    train_dir = None if remote else Path(train_storage)
    return records_from_results(grid, settings, plan, history_dir, train_dir), train_dir
