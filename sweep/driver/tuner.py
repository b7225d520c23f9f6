"""The Ray Tune run of a sweep: connect, plan (``sweep_plan.py``), run every trial in one Tuner (or
resume it), and turn Tune's results into records (``records.py``).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sweep.cluster.connect import beside_the_driver, connect, quiet_ray
from sweep.config.metric_names import MetricFn
from sweep.config.settings import Settings
from sweep.driver.extensions import Extensions
from sweep.driver.sweep_plan import SweepPlan, plan_sweep
from sweep.hooks.ledger_entries import KeepTheLedger
from sweep.plan.costs import grid_points
from sweep.plan.makespan import TrialWork
from sweep.plan.scale import TrialResources
from sweep.plan.sizes import EXPERIMENT
from sweep.results.ledger import Ledger, TrialEntry, identity_of, left_to_run, resuming_line
from sweep.results.outcome import SavedTrial
from sweep.results.records import TrialRecord
from sweep.results.trial_reports import CHECKPOINT_RANK, TrialHistories, point_of, trial_of
from sweep.schedulers.policies import SCHEDULERS, SchedulerPolicy, SweepPolicies, policies_for
from sweep.storage.staging import DriverSources, check_sources
from sweep.tracking.session import NoTracking


def run_tune(settings: Settings, out_dir: Path, session=None,
             sources: DriverSources | None = None,
             extensions: Extensions | None = None) -> tuple[list[TrialRecord], list[Path | str]]:
    """Run every trial of the sweep in one Tune run (or resume it).

    ``session``: the sweep's tracking session, open (sweep/tracking/session.py; None: no tracking).
    ``sources``: what the driver's check of the sources found (``staging.check_sources``, which the
    sweep ran before tracking started; checked here when not given), passed down to the staging on
    every node and to the plan. ``extensions``: the user's scheduler policy, Tune callbacks and metrics
    (``sweep.run``'s, checked there). Returns the records and the folders holding the trials' checkpoints
    (their URIs on remote storage).
    """
    if sources is None:
        sources = check_sources(settings)
    quiet_ray()
    from sweep.driver.stop import stop_signals

    started_ray = connect(settings.cluster)
    # After ray.init (which installs its own exit-at-once SIGTERM handler): a signal stops the sweep
    # cleanly, its state saved for resume=true.
    with stop_signals() as stop:
        try:
            return _run_tune(settings, sources, out_dir, session or NoTracking(), stop,
                             extensions or Extensions())
        except KeyboardInterrupt:  # SweepStopped: the trials are stopped, the request withdrawn
            if started_ray:
                import ray

                ray.shutdown()  # the local Ray this sweep started: no raylet or worker left behind
            raise


def _run_tune(settings: Settings, sources: DriverSources, out_dir: Path, session: NoTracking,
              stop, extensions: Extensions) -> tuple[list[TrialRecord], list[Path | str]]:
    from sweep.cluster.request import request_trial_resources
    from sweep.driver.tune_results import (
        TrialConfigs,
        checkpoint_folders,
        records_from_ledger,
        records_from_results,
        reported_ids,
    )

    plan = plan_sweep(settings, sources, out_dir)
    policies = policies_for(settings.sweep, extensions.scheduler)  # the scheduler and searcher, asked from here on
    launch_id = uuid.uuid4().hex[:8]
    # the handle keeps the board alive for the sweep's duration
    rungs_board, board_handle = start_rungs_board(settings, policies.scheduler, plan.storage.experiment, plan.total,
                                                  plan.storage.histories)
    callbacks, progress, trial_runs = sweep_callbacks(settings, plan, session.trials, launch_id, board_handle,
                                                      policies.scheduler)
    configs = TrialConfigs()  # a trial killed before its first report still has a task and seed
    callbacks.append(configs)
    copies = session.record_copies()  # with storage.output_prefix: records that outlive the head's disk
    if copies is not None:
        from sweep.hooks.record_copies import CopyTheRecords

        callbacks.append(CopyTheRecords(copies))
    ledger = Ledger(plan.storage.root)
    callbacks.append(KeepTheLedger(ledger))  # each trial's state, for a resume that Tune's snapshot cannot give
    callbacks.extend(extensions.callbacks)  # the user's own, after the sweep's
    tuner, left = make_tuner(settings, policies, plan, callbacks, launch_id, rungs_board, ledger, extensions.metrics)
    kept = list(left.kept.values()) if left is not None else []
    progress.count_ended(kept)
    try:
        # the autoscaler is asked for every concurrent trial up front (added to other sweeps' requests),
        # and the request withdrawn when the sweep ends, however it ends
        with request_trial_resources(launch_id, plan.asked), stop.tune_running():
            grid = fit_sweep(tuner) if left is None or left.running else []  # every trial ended before: no Tune run
    finally:
        if trial_runs is not None:
            trial_runs.close()  # every call queued so far sent (or kept in the spool), however the sweep ends
    stop.check()  # SIGTERM/SIGINT: Tune stopped the trials and saved its state; end here
    progress.close()
    storage = plan.storage
    run_id_of = trial_runs.run_id_of if trial_runs is not None else None
    earlier = {e.trial_id: e for e in ledger.entries().values() if e.trial_id} if left is not None else {}
    records = records_from_results(grid, settings, plan.tasks, storage.histories, storage.local_train_dir,
                                   run_id_of, configs.by_folder, earlier)
    ended_before = records_from_ledger(kept, settings, plan.tasks, storage.histories, run_id_of)
    records += ended_before
    if trial_runs is not None and settings.resume and storage.histories is not None:  # the last copy's gaps
        ids = {**reported_ids(grid), **{r.trial_id: e.trial_id for r, e in zip(ended_before, kept) if e.trial_id}}
        added = trial_runs.reconcile(records, storage.histories, ids, {r.trial_id for r in ended_before})
        if added:
            print(f"tracking: {added} evaluations logged from the trials' histories (after the records' last copy)")
    folders = [f for entry in earlier.values() for f in entry.folders]
    return records, checkpoint_folders(grid, storage.local_train_dir, storage.train if storage.remote else None,
                                       folders)


def fit_sweep(tuner):
    """``tuner.fit()``: a trial's process that Ray ended (its memory monitor) is a failed trial; our own
    verdicts (a full disk's DiskFullError, ScaleTimeoutError) end the sweep as they are; anything else Tune
    raises is one SweepFailed line."""
    from sweep.errors import USER_ERRORS, SweepFailed
    from sweep.failures import error_line
    from sweep.hooks.disk_stop import fit_until_disk_full
    from sweep.hooks.lost_trials import one_line_trial_failures, treat_lost_processes_as_trial_failures

    treat_lost_processes_as_trial_failures()
    one_line_trial_failures()
    try:
        return fit_until_disk_full(tuner)
    except USER_ERRORS:  # our own one-line verdicts (a full disk, nodes that never came): as they are
        raise
    except Exception as e:  # Tune's own failure, after trials ran: their work is in Tune's saved state
        raise SweepFailed(f"Tune's run ended on {error_line(e)}") from e


def sweep_callbacks(settings: Settings, plan: SweepPlan, tracking, launch_id: str, board_handle,
                    scheduler: SchedulerPolicy | None = None):
    """Tune's callbacks on the driver; also the progress line and the MLflow runs' callback (None
    without tracking), which the caller closes."""
    from sweep.hooks.disk_stop import StopOnDiskFull
    from sweep.hooks.ended_trials import ForgetEndedTrialMetrics
    from sweep.hooks.mlflow_runs import TrialRuns
    from sweep.hooks.progress import SweepProgress, WaitForNodes
    from sweep.hooks.staging_lines import StagingLines
    from sweep.plan.scale import NodeWait

    progress = SweepProgress(settings, plan.total, plan.forecast, scheduler)
    # a full disk ends the sweep with its one line; late nodes' staging lines reach this terminal
    # ... and an ended trial's per-metric analysis, which nothing reads, leaves the driver's memory
    callbacks = [progress, StopOnDiskFull(), StagingLines(plan.staging.relay), ForgetEndedTrialMetrics()]
    trial_runs = TrialRuns(settings, tracking, launch_id, board_handle, scheduler) if tracking is not None else None
    if trial_runs is not None:  # every trial's MLflow run, logged here from its reports (no node talks to MLflow)
        callbacks.append(trial_runs)
    if plan.first.waiting:
        print(plan.first.waiting)
        wait = NodeWait(plan.first.scale, plan.autoscaler.alive_counts, settings.cluster.scale_timeout_s,
                        asked=plan.asked)
        callbacks.append(WaitForNodes(wait, progress))
    return callbacks, progress, trial_runs


def make_tuner(settings: Settings, policies: SweepPolicies, plan: SweepPlan, callbacks: list, launch_id: str,
               rungs_board: str | None, ledger: Ledger, metrics: Mapping[str, MetricFn] | None = None):
    """One Tuner over every trial, or (resume) over those the sweep's ledger says are left; a sweep begun
    before the ledger is restored from Tune's own state. Returns it and what is left (None: Tune's restore)."""
    from ray import tune

    from sweep.trial.kept_checkpoints import restoring_kept_checkpoints
    from sweep.trial.train_fn import train_driver_fn

    trainable = tune.with_parameters(
        train_driver_fn, settings=settings, sizes=plan.sizes, storage=plan.storage, launch_id=launch_id,
        rungs_board=rungs_board, staging=plan.staging,
        # the user's scheduler policy for the trials to ask (None: they build the config's) and metrics
        scheduler=None if _built_in(policies.scheduler) else policies.scheduler, metrics=dict(metrics or {}),
    )
    trainable = tune.with_resources(trainable, ResourcesByTask(plan.sizes))
    # a trial whose saved checkpoint a kill left deleted goes on from its newest whole one (not only on resume)
    trainable = restoring_kept_checkpoints(trainable, plan.storage.histories)
    experiment = plan.storage.experiment
    resume_ledger = settings.resume and ledger.begun()
    if settings.resume and not resume_ledger and tune.Tuner.can_restore(experiment):
        return restored_tuner(experiment, trainable, callbacks), None
    if settings.resume and not resume_ledger:
        print(f"resume: nothing to resume in {plan.storage.root}; starting the sweep")
    ddp_tasks = {t for t, s in plan.sizes.items() if not s.in_trial_process}
    # a trial paused (at the seed-halving rung, or by PBT to share slots) still counts as live for the
    # generator's limit: it must hand out every trial (the resources limit)
    concurrency = 0 if policies.scheduler.pauses_trials else plan.concurrency
    search, left = make_search(settings, policies, plan.dispatch.order, ddp_tasks, concurrency, ledger,
                               plan.storage.histories, resume_ledger)
    if resume_ledger:
        print(resuming_line(plan.storage.root, left))
    tuner = tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            # exactly the trials: once the last is out the search is over, and Tune caches no actor for
            # reuse (num_samples=-1, the searcher saying FINISHED, kept them: a sweep hung in CI's run)
            num_samples=max(left.running, 1),
            search_alg=search,
            # A trial's driver process serves the next trial: no new process, no re-import.
            reuse_actors=True,
            trial_dirname_creator=trial_folder_name,
            **_tune_scheduler(policies.scheduler, rungs_board),
        ),
        run_config=tune.RunConfig(
            name=EXPERIMENT, storage_path=plan.storage.root, verbose=0,
            callbacks=callbacks, **retries_and_checkpoints(settings, policies.scheduler, plan.sizes),
        ),
    )
    return tuner, left


def trial_folder_name(trial) -> str:
    """A trial's folder as Tune names it (``train_driver_fn_<id>_<n>_seed=1,task=RTE,lr=0.0001_<date>``), from
    its point and search values only: Tune's own name would also spell out the ledger's keys (its identity,
    the checkpoint URI it goes on from), and results.csv shows the name."""
    import re

    from ray.tune.search.variant_generator import format_vars
    from ray.tune.utils.util import date_str

    task, seed, hparams = trial_of(trial.config)
    values = format_vars({("seed",): seed, ("task",): task, **{(key,): value for key, value in hparams.items()}})
    number = str(trial.experiment_tag or "").split("_", 1)[0]
    return re.sub(r'[/()<>:"\\|?*]', "_", f"{trial}_{number}_{values}"[:130] + f"_{date_str()}")


def restored_tuner(experiment: str, trainable, callbacks: list):
    """A sweep begun before the ledger (an older version of sweep), resumed from Tune's own saved state."""
    from ray import tune

    from sweep.hooks.resumed_search import ResumeTheSearch
    from sweep.results.outcome import resuming_line as saved_state_line

    tuner = tune.Tuner.restore(experiment, trainable=trainable, resume_unfinished=True, resume_errored=False)
    print(saved_state_line(experiment, [saved_trial_state(result) for result in tuner.get_results()]))
    # Restore brings back the first launch's run config, callbacks pickled then included: this
    # launch's own (its progress, its MLflow runs with its launch id) replace them.
    # ... and its searcher goes on from the trials restored, not from its own (maybe torn) snapshot
    callbacks.append(ResumeTheSearch(tuner._local_tuner._tune_config.search_alg))
    tuner._local_tuner.get_run_config().callbacks = callbacks
    return tuner


def saved_trial_state(result) -> SavedTrial:
    """What a restored Tune ``Result`` says of its trial (its last report's ``done``, its error, its checkpoint)."""
    return SavedTrial(finished=bool((result.metrics or {}).get("done")), failed=result.error is not None,
                      checkpointed=result.checkpoint is not None)


def make_search(settings: Settings, policies: SweepPolicies, order: Sequence[TrialWork], ddp_tasks: set[str],
                concurrency: int, ledger: Ledger, histories: TrialHistories, resume: bool):
    """Tune's searcher over the sweep's trials, and what is left to run (``LeftToRun``): one trial per
    (task, seed, grid point) in the dispatch order, ``num_samples`` rounds of them, each with its ``hparams``
    as the searcher policy gives them (drawn at random: schedulers/gate.RandomSearch, or asked of its task's
    TPE study: schedulers/optuna_search.py). Tune starts trials in the order it gets them: the dispatch
    order holds. A new sweep begins its ledger; a resumed one (``resume``) runs what its ledger says is
    left, each started trial as it was, and its searcher learns the ended ones' scores."""
    from ray.tune.search import ConcurrencyLimiter

    points = grid_points(settings.sweep)
    planned = [point_of(t.task, t.seed, points[t.point]) for t in order] * settings.sweep.num_samples
    rounds = [i // max(len(order), 1) for i in range(len(planned))]
    identities = [identity_of(p["task"], p["seed"], p["grid"], r) for p, r in zip(planned, rounds)]
    if resume:
        left = left_to_run(planned, identities, rounds, ledger.entries())
        ledger.extend(identities)
    else:
        left = left_to_run(planned, identities, rounds, {})
        ledger.begin(identities)
    searcher = policies.searcher.tune_searcher(left.points, ddp_tasks, policies.scheduler)
    searcher.carry(left.extras)
    if left.kept:
        searcher.learn_from([(point_of(e.task, e.seed, e.grid), e.hparams, best_score(histories, e))
                             for e in left.kept.values()])
    limited = ConcurrencyLimiter(searcher, max_concurrent=concurrency) if concurrency > 0 else searcher
    return limited, left


def best_score(histories: TrialHistories, entry: TrialEntry) -> float | None:
    """An ended trial's best score, from its history (None: it failed, or reported none)."""
    if entry.state != "finished" or not entry.trial_id:
        return None
    scores = [row.score for row in histories.read(entry.trial_id) if row.score is not None]
    return max(scores) if scores else None


class ResourcesByTask:
    """``tune.with_resources``' per-trial request: the trial's task decides (each task has its size)."""

    def __init__(self, sizes: dict[str, TrialResources]):
        self.requests = {task: size.process_resources for task, size in sizes.items()}

    def __call__(self, config: dict[str, Any]):
        from ray.tune.execution.placement_groups import resource_dict_to_pg_factory

        return resource_dict_to_pg_factory(self.requests[trial_of(config)[0]])


def retries_and_checkpoints(settings: Settings, scheduler: SchedulerPolicy,
                            sizes: dict[str, TrialResources]) -> dict[str, Any]:
    """Tune retries every failed trial from its latest checkpoint (the trainable has already ended
    the trials that failed on their own data, config or model without raising: those are not
    retried). Tune keeps the checkpoints of a trial running in its own process; Train (per trial,
    in trial.py) those of a DDP worker group, whose retry by Tune resumes its Train run."""
    from ray import tune

    retries = {"failure_config": tune.FailureConfig(max_failures=settings.sweep.max_failures)}
    if not any(s.in_trial_process for s in sizes.values()):
        return retries
    if scheduler.keeps_every_checkpoint:
        # PBT: an exploit clones a top trial's checkpoint of its last perturbation, which may no longer be
        # its best or latest: every checkpoint is kept until the sweep ends (keep_checkpoints prunes then).
        return {**retries, "checkpoint_config": tune.CheckpointConfig(num_to_keep=None)}
    return {
        **retries,
        # the best by score, plus always the latest (Tune keeps it for a retry)
        "checkpoint_config": tune.CheckpointConfig(num_to_keep=1, checkpoint_score_attribute=CHECKPOINT_RANK,
                                                   checkpoint_score_order="max"),
    }


def start_rungs_board(settings: Settings, scheduler: SchedulerPolicy, experiment: str, total: int, histories):
    """The named actor that holds the rungs of the scheduler (its policy's ``rung_board``: asha,
    seed_halving); trials ask it after each evaluation. A resumed sweep's board learns again what the
    trials' histories say.

    Returns (name, handle), (None, None) without a board; the caller keeps the handle for the sweep's
    duration (it owns the actor).
    """
    from sweep.plan.rung_boards import ASHA_NAMESPACE, board_name

    board = scheduler.rung_board(settings, total)
    if board is None:
        return None, None
    board_class, kwargs = board
    import ray

    name = board_name(experiment)
    try:  # the board of an earlier run of this sweep in this process, not yet collected
        ray.kill(ray.get_actor(name, namespace=ASHA_NAMESPACE))
    except ValueError:
        pass
    handle = ray.remote(num_cpus=0)(board_class).options(  # beside the driver: a lost worker node keeps no board
        name=name, namespace=ASHA_NAMESPACE, scheduling_strategy=beside_the_driver()).remote(**kwargs)
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


def _tune_scheduler(scheduler: SchedulerPolicy, rungs_board: str | None) -> dict[str, Any]:
    """TuneConfig's scheduler where the policy has one of Tune's (seed halving pauses trials that reach
    the rung before their task is decided; PBT pauses a trial to clone another's checkpoint); else
    Tune's default."""
    tune_scheduler = scheduler.tune_scheduler(rungs_board)
    return {} if tune_scheduler is None else {"scheduler": tune_scheduler}


def _built_in(scheduler: SchedulerPolicy) -> bool:
    """One of the policies sweep.scheduler names: the trials build it again from the config (nothing to pickle)."""
    return type(scheduler) in SCHEDULERS.values()
