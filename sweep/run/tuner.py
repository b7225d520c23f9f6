"""The Ray Tune run of a sweep: connect, plan, run every trial in one Tuner (or resume it), and
turn Tune's results into records. The plan itself is plain Python in ``plan.py``.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sweep.config.settings import AUTO, Settings
from sweep.plan.costs import grid_points
from sweep.plan.makespan import TrialWork
from sweep.plan.sizes import EXPERIMENT, TrialPlan, many_nodes, plan_trials, storage_path, sweep_storage, trial_count
from sweep.results.records import TrialRecord

log = logging.getLogger(__name__)


def param_space(settings: Settings, order: Sequence[TrialWork]) -> dict[str, Any]:
    """One Tune trial per (task, seed, grid point) in the dispatch order (x search samples), all in
    ONE run. Tune generates grid trials in list order and starts them in that order, so the order
    is one grid over the trial points, not a grid per key (whose product order is Tune's)."""
    from ray import tune

    points = grid_points(settings)
    trials = [point_of(t, points) for t in order]
    space: dict[str, Any] = {"trial": tune.grid_search(trials), "hparams": {}}
    for key, spec in settings.sweep.search.items():
        if spec["dist"] == "choice":
            space["hparams"][key] = tune.choice(list(spec["values"]))
        elif spec["dist"] == "loguniform":
            space["hparams"][key] = tune.loguniform(spec["low"], spec["high"])
        else:
            space["hparams"][key] = tune.uniform(spec["low"], spec["high"])
    return space


def point_of(trial: TrialWork, points: list[dict[str, Any]]) -> dict[str, Any]:
    """A trial's entry in the param space: what ``trial.trial_of`` reads back."""
    return {"task": trial.task, "seed": trial.seed, "grid": points[trial.point]}


def records_from_results(grid, settings: Settings, plans: dict[str, TrialPlan], histories=None,
                         train_dir: Path | None = None, run_id_of=None) -> list[TrialRecord]:
    """One TrialRecord per Tune trial (``plans``: each task's), with the best epoch's metrics and checkpoint.

    ``run_id_of(tune trial id, task, seed)``: the id of the trial's MLflow run (the driver logged it)."""
    from sweep.run.trial import CHECKPOINT_RANK, trial_of

    records = []
    tables = [(result, _history(result, histories)) for result in grid]
    first_in_process = _first_trial_per_process([df for _, df in tables])
    for result, df in tables:
        task, seed, hparams = trial_of(result.config) if result.config and "trial" in result.config else ("?", -1, {})
        plan = plans.get(task)
        trial_id = _trial_id(result)
        record = TrialRecord(
            task=task, seed=seed, hparams=hparams, gpus=plan.gpus_per_worker * plan.workers if plan else 0.0,
            trial_id=result.path.rsplit("/", 1)[-1] if result.path else "",
        )
        if df is not None and len(df) and CHECKPOINT_RANK in df:
            best = df.loc[df[CHECKPOINT_RANK].idxmax()]
            record.metrics = {k[5:]: float(best[k]) for k in df.columns if k.startswith("eval/")}
            spec = next(t for t in settings.tasks if t.name == record.task)
            record.score = record.metrics.get(spec.metric)
            record.best_epoch = int(best["epoch"])
            _steps_and_stop(record, df, best)
            first = df.iloc[0]
            started = _trial_started(first, first_in_process)
            record.wall_seconds = float(df["reported_at"].max() - started)
            record.loop_seconds = float((df["train_seconds"] + df["eval_seconds"]).sum())
            first_batch = first["reported_at"] - first["train_seconds"] - first["eval_seconds"]
            record.startup_seconds = float(first_batch - started)
            record.started_at = started
            record.pid = int(first["pid"]) if "pid" in first and first["pid"] == first["pid"] else None
            record.node = str(best.get("node", ""))
            record.run_id = run_id_of(trial_id, task, seed) if run_id_of is not None and trial_id else ""
            record.checkpoint = (_best_checkpoint(best, _checkpoint_dirs(result, train_dir, trial_id))
                                 if train_dir is not None else _remote_best_checkpoint(result, best))
        own_error = _own_error(result, df)
        if own_error is not None:  # failed on its own data/config/model: ended at once, not retried
            record.status, record.error = "ERROR", own_error
        elif result.error is not None or record.score is None:
            record.status = "ERROR"
            record.error = _error_text(result.error) if result.error is not None else "trial reported no result"
        records.append(record)
    return records


def _steps_and_stop(record: TrialRecord, df, best) -> None:
    """The compute a trial spent (steps trained, whole epochs) and, if the rungs stopped it, why and when."""
    from sweep.run.trial import STOPPED

    if "step" not in df or df["step"].isna().all():  # rows of an older sweep: one per epoch
        record.epochs_done = int(df["epoch"].max())
        return
    record.best_step = int(best["step"])
    record.steps_done = int(df["step"].max())
    record.steps_total = int(df["steps_total"].max())
    ends = df[df["end_of_epoch"].astype(bool)]
    record.epochs_done = int(ends["epoch"].max()) if len(ends) else 0
    last = df.iloc[-1]
    if STOPPED in df and isinstance(last.get(STOPPED), str) and last[STOPPED]:
        record.stopped = last[STOPPED]
        record.stopped_at_step = int(last["step"])


def _own_error(result, df) -> str | None:
    """The error line of a trial that ended on its own data, config or model (trial.TRIAL_ERROR):
    in its last report, or (Tune's state lost with a killed driver) its history's last row."""
    from sweep.run.trial import TRIAL_ERROR

    text = (result.metrics or {}).get(TRIAL_ERROR)
    if not isinstance(text, str) and df is not None and len(df) and TRIAL_ERROR in df:
        text = df.iloc[-1][TRIAL_ERROR]
    return text if isinstance(text, str) and text else None


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


def checkpoint_folders(grid, train_dir: Path | None, remote_train: str | None = None) -> list[Path | str]:
    """Every folder holding the sweep's checkpoints (pruned once the best models are exported):
    Train's runs (DDP trials) and the ``checkpoint_*`` folders in Tune's trial folders; on remote
    storage (``train_dir`` None) their URIs."""
    if train_dir is None:
        return _remote_checkpoint_folders(grid, remote_train)
    folders = [train_dir] if train_dir.exists() else []
    for result in grid:
        local = _local_path(result.path)
        if local:
            folders += sorted(Path(local).glob("checkpoint_*"))
    return folders


def _remote_checkpoint_folders(grid, remote_train: str | None) -> list[str]:
    import pyarrow.fs

    from sweep.remote_files import uri_of

    folders = [remote_train] if remote_train else []
    for result in grid:
        fs = result.filesystem
        if fs is None or not result.path:
            continue
        found = fs.get_file_info(pyarrow.fs.FileSelector(result.path, allow_not_found=True))
        folders += sorted(uri_of(fs, i.path) for i in found
                          if i.type == pyarrow.fs.FileType.Directory and i.base_name.startswith("checkpoint_"))
    return folders


def _best_checkpoint(best_row, run_dirs: list[Path]) -> str | None:
    """The best epoch's checkpoint folder: from Tune's report, else found by the epoch marker."""
    from sweep.run.trial import CHECKPOINT_MARKER

    path = _local_path(best_row.get("checkpoint_path"))
    if path and Path(path).is_dir():
        return path
    for run_dir in run_dirs:
        for marker in run_dir.glob(f"checkpoint_*/{CHECKPOINT_MARKER}"):
            held = json.loads(marker.read_text())
            if "step" in held and "step" in best_row and best_row["step"] == best_row["step"]:  # not NaN
                if held["step"] == int(best_row["step"]):
                    return str(marker.parent)
            elif held["epoch"] == int(best_row["epoch"]):  # a checkpoint of an older sweep: one per epoch
                return str(marker.parent)
    return None


def _remote_best_checkpoint(result, best_row) -> str | None:
    """The URI of the best evaluation's checkpoint on remote storage (s3://…): Tune keeps it among
    the trial's best checkpoints, each with the report it came with."""
    from sweep.remote_files import uri_of

    step = best_row.get("step")
    for checkpoint, metrics in result.best_checkpoints or []:
        if step is not None and step == step and metrics.get("step") == int(step):
            return uri_of(checkpoint.filesystem, checkpoint.path)
    return None


def _history(result, histories):
    """Every epoch a trial reported. The trial's own history file comes first: a driver killed
    mid-sweep loses Tune's last unflushed rows, and after ``Tuner.restore`` a finished trial's
    history is not in memory."""
    import pandas as pd

    trial_id = _trial_id(result)
    rows = histories.read(trial_id) if histories is not None and trial_id else []
    if rows:
        return pd.DataFrame(rows)
    df = result.metrics_dataframe
    if df is not None:  # only epochs: a DDP trial's first report only says its workers are up
        df = df[df["epoch"].notna()] if "epoch" in df else df.iloc[0:0]
    return df


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


def connect(settings: Settings) -> bool:
    """Join the cluster named by cluster.address, or start a local Ray; True: this call started Ray."""
    import ray

    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"log_to_driver": settings.cluster.verbose, "logging_level": logging.ERROR,
                              "configure_logging": True}
    if settings.cluster.address:
        ray.init(address=settings.cluster.address, **kwargs)
    else:
        ray.init(num_cpus=settings.cluster.num_cpus, include_dashboard=False, **kwargs)
    return True


def alive_nodes() -> list[dict[str, float]]:
    import ray

    return [n["Resources"] for n in ray.nodes() if n.get("Alive")]


def trial_process_resources(placement) -> dict[str, float]:
    """What the Tune trial's own process asks for. One worker: the trial's CPU/GPU, since the loop
    runs there (Train's local mode). DDP: nothing (its Train workers hold the resources); Ray refuses
    an empty request, so 1 MiB of logical memory, and the 2-CPU deadlock of docs/architecture.md §6
    cannot happen."""
    if placement.in_trial_process:
        return {"CPU": placement.cpus_per_worker, "GPU": placement.gpus_per_worker}
    return {"CPU": 0, "memory": 2**20}


class ResourcesByTask:
    """``tune.with_resources``' per-trial request: the trial's task decides (each task has its size)."""

    def __init__(self, placements: dict[str, Any]):
        self.requests = {task: trial_process_resources(p) for task, p in placements.items()}

    def __call__(self, config: dict[str, Any]):
        from ray.tune.execution.placement_groups import resource_dict_to_pg_factory

        from sweep.run.trial import trial_of

        return resource_dict_to_pg_factory(self.requests[trial_of(config)[0]])


def retries_and_checkpoints(settings: Settings, placements: dict[str, Any]) -> dict[str, Any]:
    """Tune retries every failed trial from its latest checkpoint (the trainable has already ended
    the trials that failed on their own data, config or model without raising: those are not
    retried). Tune keeps the checkpoints of a trial running in its own process; Train (per trial,
    in trial.py) those of a DDP worker group, whose retry by Tune resumes its Train run."""
    from ray import tune

    from sweep.run.trial import CHECKPOINT_RANK

    retries = {"failure_config": tune.FailureConfig(max_failures=settings.sweep.max_failures)}
    if not any(p.in_trial_process for p in placements.values()):
        return retries
    return {
        **retries,
        # the best by score, plus always the latest (Tune keeps it for a retry)
        "checkpoint_config": tune.CheckpointConfig(num_to_keep=1, checkpoint_score_attribute=CHECKPOINT_RANK,
                                                   checkpoint_score_order="max"),
    }


def start_rungs_board(settings: Settings, experiment: str, total: int, histories):
    """The named actor that holds the rungs of sweep.scheduler (asha, seed_halving); trials ask it
    after each evaluation. A resumed sweep's board learns again what the trials' histories say.

    Returns (name, handle); the caller keeps the handle for the sweep's duration (it owns the actor).
    """
    from sweep.plan.rung_boards import ASHA_NAMESPACE, board_name, make_board

    board_class, kwargs = make_board(settings, total)
    if board_class is None:
        return None, None
    import ray

    name = board_name(experiment)
    try:  # the board of an earlier run of this sweep in this process, not yet collected
        ray.kill(ray.get_actor(name, namespace=ASHA_NAMESPACE))
    except ValueError:
        pass
    handle = ray.remote(num_cpus=0)(board_class).options(name=name, namespace=ASHA_NAMESPACE).remote(**kwargs)
    if settings.resume:
        replay_rungs(handle, histories)
    return name, handle


def replay_rungs(board, histories) -> None:
    """Tell a new board the rung evaluations (and failures before a rung) the trials recorded."""
    import ray

    from sweep.plan.rung_boards import recorded_rungs

    points, gone = recorded_rungs(histories)
    for point in points:
        ray.get(board.at_eval.remote(point))
    for task, trial_id in gone:
        ray.get(board.gone.remote(task, trial_id))


def run_tune(settings: Settings, out_dir: Path, tracking=None) -> tuple[list[TrialRecord], list[Path]]:
    """Run every trial of the sweep in one Tune run (or resume it).

    Returns the records and the local folders holding the trials' checkpoints ([] on remote storage).
    """
    quiet_ray()
    from sweep.run.stop import stop_signals

    started_ray = connect(settings)
    # After ray.init (which installs its own exit-at-once SIGTERM handler): a signal stops the sweep
    # cleanly, its state saved for resume=true.
    with stop_signals() as stop:
        try:
            return _run_tune(settings, out_dir, tracking, stop)
        except KeyboardInterrupt:  # SweepStopped: the trials are stopped, the request withdrawn
            if started_ray:
                import ray

                ray.shutdown()  # the local Ray this sweep started: no raylet or worker left behind
            raise


def _run_tune(settings: Settings, out_dir: Path, tracking, stop) -> tuple[list[TrialRecord], list[Path]]:
    from ray import tune

    from sweep.plan.scale import NodeWait
    from sweep.run.autoscale import declared_view, read_autoscaler
    from sweep.run.cluster_request import request_trial_resources
    from sweep.run.disk_stop import StopOnDiskFull, fit_until_disk_full
    from sweep.run.gate import DdpFirst
    from sweep.run.mlflow_runs import TrialRuns
    from sweep.run.progress import SweepProgress, WaitForNodes
    from sweep.run.stage_nodes import ProgressRelay, StagingLines, ship_sources, stage_all_nodes
    from sweep.run.trial import Placement, train_driver_fn

    nodes = alive_nodes()
    total = trial_count(settings)
    # Only a cluster the sweep joined can have an autoscaler; the local Ray it starts itself has none.
    autoscaler = read_autoscaler() if settings.cluster.address else None
    if autoscaler is not None and not autoscaler.node_types and settings.cluster.node_types:
        autoscaler = declared_view(autoscaler, settings.cluster.node_types)
    # where trials write what this driver reads back: a place every node reaches, before any staging
    storage = sweep_storage(storage_path(settings, out_dir, len(nodes), autoscaler))
    several = many_nodes(len(nodes), autoscaler, settings.cluster.node_types)
    for spec in settings.tasks:  # a trial no node can hold is an error before any staging
        if settings.resources.gpus_for(spec.name) != AUTO:
            plan_trials(settings, nodes, autoscaler, wanted=total, task=spec.name)
    relay = ProgressRelay.remote()  # the nodes' staging lines, at the start and from nodes that join later
    # storage=local on nodes with their own disks: the driver's folders travel through Ray to those that lack them
    shipments = ship_sources(settings) if several else {}
    # every node stages (and checks the task files) before the plan reads them
    stage_all_nodes(settings, relay, shipments)
    sizes, params, cluster, chosen, plans = _plan(settings, nodes, autoscaler, total)
    plan = plans[chosen.order[0].task]  # the first trials' size drives the wait for launched nodes
    launch_id = uuid.uuid4().hex[:8]
    _refuse_halving_with_ddp(settings, plans)
    # the handle keeps the board alive
    rungs_board, _board_handle = start_rungs_board(settings, storage.experiment, total, storage.histories)
    placements = {task: Placement(p.workers, p.gpus_per_worker, p.cpus_per_worker, storage.train,
                                  storage.histories)
                  for task, p in plans.items()}
    trainable = tune.with_parameters(
        train_driver_fn, settings=settings, placements=placements, launch_id=launch_id, rungs_board=rungs_board,
        staging=(relay, shipments),
    )
    trainable = tune.with_resources(trainable, ResourcesByTask(placements))
    concurrency = min(max(p.max_concurrent for p in plans.values()), total)
    for line in chosen.describe(sizes, params):
        print(f"plan: {line}")
    grows = (f" (+ up to {plan.scale.fits_at_max - plan.scale.fits_now} trial(s) on launched nodes)"
             if plan.scale else "")
    print(f"sweep: {total} trials ({len(settings.tasks)} task(s) x {len(settings.sweep.seeds)} seed(s)"
          f"{' x grid' if settings.sweep.grid else ''}), up to {concurrency} at once on {len(nodes)} node(s){grows}; "
          + _describe_sizes(plans))
    progress = SweepProgress(settings, total, _forecast(settings, chosen, params, cluster, concurrency))
    # a full disk ends the sweep with its one line; late nodes' staging lines reach this terminal
    callbacks = [progress, StopOnDiskFull(), StagingLines(relay)]
    trial_runs = TrialRuns(settings, tracking, launch_id, _board_handle) if tracking is not None else None
    if trial_runs is not None:  # every trial's MLflow run, logged here from its reports (no node talks to MLflow)
        callbacks.append(trial_runs)
    if plan.waiting:
        print(plan.waiting)
        wait = NodeWait(plan.scale, autoscaler.alive_counts, settings.cluster.scale_timeout_s)
        callbacks.append(WaitForNodes(wait, progress))
    # Ask the autoscaler for every concurrent trial up front (added to other sweeps' requests);
    # withdrawn when the sweep ends, however it ends.
    asked = ([plans[t.task].needs.bundle for t in chosen.order[:concurrency]]
             if autoscaler is not None and autoscaler.can_launch else [])
    experiment = storage.experiment
    if settings.resume and tune.Tuner.can_restore(experiment):
        print(f"resume: continuing the sweep in {experiment}; finished trials are not run again")
        tuner = tune.Tuner.restore(experiment, trainable=trainable, resume_unfinished=True, resume_errored=False)
        # Restore brings back the first launch's run config, callbacks pickled then included: this
        # launch's own (its progress, its MLflow runs with its launch id) replace them.
        tuner._local_tuner.get_run_config().callbacks = callbacks
    else:
        if settings.resume:
            print(f"resume: nothing to resume in {experiment}; starting the sweep")
        tuner = tune.Tuner(
            trainable,
            param_space=param_space(settings, chosen.order),
            tune_config=tune.TuneConfig(
                num_samples=settings.sweep.num_samples,
                # the dispatch order as given; no trial after a DDP one until its workers are placed
                search_alg=DdpFirst({t for t, p in placements.items() if not p.in_trial_process},
                                    # a trial paused at the seed-halving rung still counts as live for the
                                    # generator's limit: it must hand out every seed (the resources limit)
                                    0 if settings.sweep.scheduler == "seed_halving" else concurrency),
                # A trial's driver process serves the next trial: no new process, no re-import.
                reuse_actors=True,
                **_tune_scheduler(settings, rungs_board),
            ),
            run_config=tune.RunConfig(
                name=EXPERIMENT, storage_path=storage.root, verbose=0,
                callbacks=callbacks, **retries_and_checkpoints(settings, placements),
            ),
        )
    try:
        with request_trial_resources(launch_id, asked), stop.tune_running():
            grid = fit_until_disk_full(tuner)  # tuner.fit(); a trial's full disk ends it as one DiskFullError
    finally:
        if trial_runs is not None:
            trial_runs.close()  # every call queued so far sent (or kept in the spool), however the sweep ends
    stop.check()  # SIGTERM/SIGINT: Tune stopped the trials and saved its state; end here
    progress.close()
    train_dir = storage.local_train_dir
    records = records_from_results(grid, settings, plans, storage.histories, train_dir,
                                   trial_runs.run_id_of if trial_runs is not None else None)
    return records, checkpoint_folders(grid, train_dir, storage.train if storage.remote else None)


def _tune_scheduler(settings: Settings, rungs_board: str | None) -> dict[str, Any]:
    """Seed halving pauses trials that reach the rung before their task is decided (Tune's side)."""
    if settings.sweep.scheduler != "seed_halving":
        return {}
    from sweep.run.halving_scheduler import SeedHalvingScheduler

    return {"scheduler": SeedHalvingScheduler(rungs_board, settings.sweep.halving.at)}


def _refuse_halving_with_ddp(settings: Settings, plans: dict[str, TrialPlan]) -> None:
    """A paused DDP trial would leave its Train worker group running: refused before any trial."""
    from sweep.errors import ConfigError

    ddp = sorted(task for task, p in plans.items() if p.workers > 1)
    if settings.sweep.scheduler == "seed_halving" and ddp:
        raise ConfigError(
            f"sweep.scheduler=seed_halving: the trials of {', '.join(ddp)} are multi-GPU (DDP), which seed halving "
            "cannot pause at its rung; give them 1 GPU (resources.gpus_per_trial=1) or use sweep.scheduler=asha")


def _plan(settings: Settings, nodes, autoscaler, total: int):
    """Cost every trial from the staged data, choose each task's GPUs and the dispatch order, and
    size each task's trials on this cluster (ResourceError before any trial when one cannot fit)."""
    from sweep.plan.costs import sweep_trials
    from sweep.plan.dispatch import cluster_gpus, dispatch

    sizes, params = _staged_sizes(settings)
    cluster = cluster_gpus(nodes, autoscaler, total)
    chosen = dispatch(settings, sweep_trials(settings, sizes, params), cluster)
    plans = {task: plan_trials(settings, nodes, autoscaler, wanted=total, task=task, gpus_per_trial=share)
             for task, share in chosen.gpus.items()}
    for warning in dict.fromkeys(p.warning for p in plans.values() if p.warning):
        print(f"warning: {warning}")
    return sizes, params, cluster, chosen, plans


def _staged_sizes(settings: Settings):
    """Each task's size and the model's parameters, read where the sources are staged: here for local
    storage; for S3 on a node (the driver downloads nothing; the nodes have staged already)."""
    from sweep.plan.costs import measure_sizes
    from sweep.storage.staging import ensure_local

    if settings.storage.kind != "s3":
        return measure_sizes(settings, ensure_local(settings))
    import ray

    def on_a_node(settings: Settings):
        return measure_sizes(settings, ensure_local(settings))

    return ray.get(ray.remote(num_cpus=0)(on_a_node).remote(settings))


def _forecast(settings: Settings, chosen, params: int, cluster, concurrency: int):
    """The progress line's ETA: every trial's predicted cost (Tune repeats the grid per search sample)."""
    from sweep.plan.costs import Forecast
    from sweep.run.trial import trial_key

    points = grid_points(settings)
    every = list(chosen.order) * settings.sweep.num_samples
    return Forecast(every, [trial_key({"trial": point_of(t, points)}) for t in every],
                    chosen.gpus if cluster.total else {}, params, cluster.total or concurrency,
                    on_gpus=cluster.total > 0)


def _describe_sizes(plans: dict[str, TrialPlan]) -> str:
    """'1 worker(s) x (1 CPU, 0 GPU) each', or per task when the tasks differ."""
    def size(p: TrialPlan) -> str:
        return f"{p.workers} worker(s) x ({p.cpus_per_worker:g} CPU, {p.gpus_per_worker:g} GPU)"

    sizes = {task: size(p) for task, p in plans.items()}
    if len(set(sizes.values())) == 1:
        return f"{next(iter(sizes.values()))} each"
    return "per trial: " + ", ".join(f"{task} {text}" for task, text in sizes.items())
