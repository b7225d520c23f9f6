"""The Ray Tune run of a sweep: connect, plan, run every trial in one Tuner (or resume it), and
turn Tune's results into records. The plan itself is plain Python in ``plan.py``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
import warnings
from pathlib import Path
from typing import Any

from sweep.config import Settings
from sweep.errors import SOURCE_ERRORS, ConfigError
from sweep.run.plan import EXPERIMENT, TrialPlan, plan_trials, storage_path, sweep_storage, trial_count
from sweep.results import TrialRecord

log = logging.getLogger(__name__)


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


def records_from_results(grid, settings: Settings, plan: TrialPlan, history_dir: Path | None = None,
                         train_dir: Path | None = None) -> list[TrialRecord]:
    """One TrialRecord per Tune trial, with the best epoch's metrics and checkpoint."""
    from sweep.run.trial import CHECKPOINT_RANK

    records = []
    histories = [(result, _history(result, history_dir)) for result in grid]
    first_in_process = _first_trial_per_process([df for _, df in histories])
    for result, df in histories:
        cfg = result.config or {}
        trial_id = _trial_id(result)
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
            first = df.iloc[0]
            started = _trial_started(first, first_in_process)
            record.wall_seconds = float(df["reported_at"].max() - started)
            record.loop_seconds = float((df["train_seconds"] + df["eval_seconds"]).sum())
            first_batch = first["reported_at"] - first["train_seconds"] - first["eval_seconds"]
            record.startup_seconds = float(first_batch - started)
            record.started_at = started
            record.pid = int(first["pid"]) if "pid" in first and first["pid"] == first["pid"] else None
            record.node = str(best.get("node", ""))
            run_id = best.get("mlflow_run_id")
            record.run_id = run_id if isinstance(run_id, str) else ""
            record.checkpoint = _best_checkpoint(best, _checkpoint_dirs(result, train_dir, trial_id))
        if result.error is not None or record.score is None:
            record.status = "ERROR"
            record.error = _error_text(result.error) if result.error is not None else "trial reported no result"
        records.append(record)
    return records


def _first_trial_per_process(histories) -> dict[int, float]:
    """pid -> the driver start of the first trial that process ran (a reused process runs several)."""
    first: dict[int, float] = {}
    for df in histories:
        if df is not None and len(df) and "pid" in df and df.iloc[0]["pid"] == df.iloc[0]["pid"]:  # not NaN
            row = df.iloc[0]
            pid = int(row["pid"])
            first[pid] = min(first.get(pid, row["driver_started"]), row["driver_started"])
    return first


def _trial_started(first_row, first_in_process: dict[int, float]) -> float:
    """When the trial began costing time: the process start for the first trial a process ran (it
    paid for starting the process and importing torch), the trial's own start for a reused one."""
    started = float(first_row["driver_started"])
    pid = first_row.get("pid")
    if pid is not None and pid == pid and first_in_process.get(int(pid)) == started:
        started = min(started, float(first_row["process_started"]))
    return started


def _trial_id(result) -> str | None:
    """The id the trial reported with every epoch (None: it never reported)."""
    return (result.metrics or {}).get("trial_id")


def _checkpoint_dirs(result, train_dir: Path | None, trial_id: str | None) -> list[Path]:
    """Where a trial's checkpoints are: its Tune trial folder (a trial run in its own process) and
    its Train run folder (a DDP trial); only on local storage."""
    local = _local_path(result.path)
    if train_dir is None or not local:  # remote storage: nothing on this machine's disk
        return []
    return [Path(local)] + ([train_dir / f"trial-{trial_id}"] if trial_id else [])


def checkpoint_folders(grid, train_dir: Path | None) -> list[Path]:
    """Every local folder holding the sweep's checkpoints (pruned once the best models are exported):
    Train's runs (DDP trials) and the ``checkpoint_*`` folders in Tune's trial folders."""
    if train_dir is None:
        return []
    folders = [train_dir] if train_dir.exists() else []
    for result in grid:
        local = _local_path(result.path)
        if local:
            folders += sorted(Path(local).glob("checkpoint_*"))
    return folders


def _best_checkpoint(best_row, run_dirs: list[Path]) -> str | None:
    """The best epoch's checkpoint folder: from Tune's report, else found by the epoch marker."""
    from sweep.run.trial import CHECKPOINT_EPOCH

    path = _local_path(best_row.get("checkpoint_path"))
    if path and Path(path).is_dir():
        return path
    for run_dir in run_dirs:
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


def trial_process_resources(plan: TrialPlan, placement) -> dict[str, float]:
    """What the Tune trial's own process asks for. One worker: the trial's CPU/GPU, since the loop
    runs there (Train's local mode). DDP: nothing (its Train workers hold the resources); Ray refuses
    an empty request, so 1 MiB of logical memory, and the 2-CPU deadlock of DESIGN §5 cannot happen."""
    if placement.in_trial_process:
        return {"cpu": plan.cpus_per_worker, "gpu": plan.gpus_per_worker}
    return {"cpu": 0, "memory": 2**20}


def retries_and_checkpoints(settings: Settings, placement) -> dict[str, Any]:
    """Who keeps the checkpoints and retries a killed trial from the latest: Tune for a trial running
    in its own process, Train (per trial, in trial.py) for a DDP worker group."""
    from ray import tune

    from sweep.run.trial import CHECKPOINT_RANK

    if not placement.in_trial_process:
        return {"failure_config": tune.FailureConfig(max_failures=0)}
    return {
        "failure_config": tune.FailureConfig(max_failures=settings.sweep.max_failures),
        # the best by score, plus always the latest (Tune keeps it for a retry)
        "checkpoint_config": tune.CheckpointConfig(num_to_keep=1, checkpoint_score_attribute=CHECKPOINT_RANK,
                                                   checkpoint_score_order="max"),
    }


def start_asha_board(settings: Settings, launch_id: str):
    """The named actor that holds the ASHA rungs (sweep.scheduler=asha); trials ask it each epoch.

    Returns (name, handle); the caller keeps the handle for the sweep's duration (it owns the actor).
    """
    if settings.sweep.scheduler != "asha":
        return None, None
    import ray

    from sweep.run.schedulers import ASHA_NAMESPACE, AshaRungs

    name = f"sweep-asha-{launch_id}"
    max_t = max([settings.train.epochs, *settings.sweep.grid.get("epochs", [])])
    handle = ray.remote(num_cpus=0)(AshaRungs).options(name=name, namespace=ASHA_NAMESPACE).remote(max_t=max_t)
    return name, handle


def run_tune(settings: Settings, out_dir: Path, tracking=None) -> tuple[list[TrialRecord], list[Path]]:
    """Run every trial of the sweep in one Tune run (or resume it).

    Returns the records and the local folders holding the trials' checkpoints ([] on remote storage).
    """
    quiet_ray()
    from ray import tune

    from sweep.run.autoscale import NodeWait, declared_view, read_autoscaler, trial_bundles
    from sweep.run.cluster_request import request_trial_resources
    from sweep.run.progress import SweepProgress, WaitForNodes
    from sweep.run.stage_nodes import StageOnNodes
    from sweep.run.trial import Placement, train_driver_fn

    connect(settings)
    nodes = alive_nodes()
    total = trial_count(settings)
    # Only a cluster the sweep joined can have an autoscaler; the local Ray it starts itself has none.
    autoscaler = read_autoscaler() if settings.cluster.address else None
    if autoscaler is not None and not autoscaler.node_types and settings.cluster.node_types:
        autoscaler = declared_view(autoscaler, settings.cluster.node_types)
    plan = plan_trials(settings, nodes, autoscaler, wanted=total)
    if plan.warning:
        print(f"warning: {plan.warning}")
    storage = sweep_storage(storage_path(settings, out_dir, len(nodes)))
    launch_id = uuid.uuid4().hex[:8]
    asha_board, _board_handle = start_asha_board(settings, launch_id)  # the handle keeps the board alive
    placement = Placement(plan.workers, plan.gpus_per_worker, storage.train,
                          str(storage.history_dir) if storage.history_dir else None)
    trainable = tune.with_parameters(
        train_driver_fn, settings=settings, placement=placement, launch_id=launch_id,
        asha_board=asha_board, tracking=tracking,
    )
    trainable = tune.with_resources(trainable, trial_process_resources(plan, placement))
    concurrency = min(plan.max_concurrent, total)
    grows = f" (+ up to {plan.scale.fits_at_max - plan.scale.fits_now} trial(s) on launched nodes)" if plan.scale else ""
    print(f"sweep: {total} trials ({len(settings.tasks)} task(s) x {len(settings.sweep.seeds)} seed(s)"
          f"{' x grid' if settings.sweep.grid else ''}), {concurrency} at once on {len(nodes)} node(s){grows}; "
          f"{plan.workers} worker(s) x ({plan.cpus_per_worker:g} CPU, {plan.gpus_per_worker:g} GPU) each")
    progress = SweepProgress(settings, total)
    callbacks = [StageOnNodes(settings), progress]  # staging on every node first, then the progress lines
    if plan.waiting:
        print(plan.waiting)
        callbacks.append(WaitForNodes(NodeWait(plan.scale, autoscaler.alive_counts, settings.cluster.scale_timeout_s), progress))
    # Ask the autoscaler for every concurrent trial up front (added to other sweeps' requests);
    # withdrawn when the sweep ends, however it ends.
    asked = trial_bundles(plan.needs, concurrency) if autoscaler is not None and autoscaler.can_launch else []
    experiment = storage.experiment
    fresh = not storage.remote and not Path(experiment).exists()  # before the Tuner writes tuner.pkl there
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
                name=EXPERIMENT, storage_path=storage.root, verbose=0,
                callbacks=callbacks, **retries_and_checkpoints(settings, placement),
            ),
        )
    try:
        with request_trial_resources(launch_id, asked):
            grid = tuner.fit()
    except (*SOURCE_ERRORS, ConfigError):
        # The nodes' staging refused before any trial ran: leave no experiment behind that a later
        # resume=true would try to restore.
        if fresh:
            shutil.rmtree(experiment, ignore_errors=True)
        raise
    progress.close()
    train_dir = storage.local_train_dir
    return records_from_results(grid, settings, plan, storage.history_dir, train_dir), checkpoint_folders(grid, train_dir)
