"""One sweep trial on Ray: a Tune function trainable (``train_driver_fn``) that runs a Ray Train
``TorchTrainer`` whose workers run ``train_fn_per_worker``.

Train V2 (Ray >= 2.43) cannot be wrapped by ``Tuner(TorchTrainer(...))``; the supported pattern
is a function trainable that builds and fits a TorchTrainer (docs/architecture.md §6). Two ways
to run it:

* One worker (every single-GPU or CPU trial): Train's local mode (``num_workers=0``) runs the loop
  in the Tune trial's own process, which holds the trial's resources and reports with
  ``ray.tune.report``; Tune reuses that process for the next trial (``reuse_actors``), so torch
  and transformers are imported once per process, not once per trial, and no worker group, Train
  controller or placement group is started. A killed trial is retried by Tune from its last
  checkpoint (``tune.FailureConfig``).
* Several workers (multi-GPU DDP): real Train workers, whose reports the trainable's own thread
  passes on to Tune (``tune_reports.py``: Ray's ``TuneReportCallback`` can hang the trial). Train
  itself does not retry: a failed worker group ends ``fit`` here, and Tune retries the trial,
  whose TorchTrainer (named by the trial) resumes its Train run from the last checkpoint.

Either way the trainable sees the trial's failure first and sorts it (``failures.trial_error``): an
error of the trial's own data, config or model limits ends the trial at once, failed, unretried
(``trial_error`` in its last report and history row); anything else is raised and retried.

What a trial reports and keeps is the Ray-free contract of ``sweep/results/trial_reports.py`` (``Report``); the
worker loop below it is plain Python (``sweep.train.loop``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import json
import os
import platform
import shutil
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import ray
import ray.train
from ray import tune
from ray.train import Checkpoint, CheckpointConfig, FailureConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

from sweep.config.metric_names import MetricFn
from sweep.config.settings import Settings, TrainConfig, with_hparams
from sweep.config.tasks import TaskSpec
from sweep.data.selection import selection_of
from sweep.disk import folder_size, writing
from sweep.errors import DiskFullError
from sweep.failures import error_line, trial_error
from sweep.plan.rung_boards import ASHA_NAMESPACE, EarlyStop, EvalPoint
from sweep.plan.rungs import past_rung
from sweep.plan.scale import TrialResources
from sweep.plan.sizes import SweepStorage
from sweep.results.trial_reports import (
    CHECKPOINT_MARKER,
    CHECKPOINT_RANK,
    Report,
    TrialHistories,
    checkpoint_rank,
    history_to_go_on_from,
    sweep_trial_id,
    trial_of,
)
from sweep.schedulers.policies import SchedulerPolicy, policies_for
from sweep.trial.tune_reports import fit_reporting_to_tune

PROCESS_STARTED = psutil.Process().create_time()  # this worker process's start (before its imports)
# How long Tune waits, when it hands this (reused) process the next trial, for the last trial's thread to end:
# its default, 2 s, is short of a paused trial's last save on a busy CPU, and a reset that times out ends the
# next trial in ERROR before it starts (seen under load with seed halving: a seed lost, its task stalled).
REUSE_WAIT_ENV, REUSE_WAIT_S = "TUNE_FUNCTION_THREAD_TIMEOUT_S", "60"


@dataclass(frozen=True)
class TrialContext:
    """What one trial's workers need to know, typed (the TorchTrainer's ``train_loop_config``)."""

    settings: Settings
    task: str
    seed: int
    hparams: dict[str, Any]
    trial_id: str  # Tune's id of this trial: names its Train run, history file and MLflow run
    launch_id: str  # the driver invocation that ran it (a resumed sweep has a new one)
    driver_started: float
    histories: TrialHistories
    size: TrialResources
    rungs_board: str | None = None
    staging: Any = None  # stage_nodes.Staging: the driver's pins, shipped folders and lines relay
    # the checkpoint (URI) an earlier launch's trial reached, as the ledger has it: where a resumed
    # launch's first start of this trial goes on from (Tune's own retries go on from Tune's)
    continues_from: str | None = None
    # sweep.run(scheduler=, metrics=): the user's scheduler policy (None: the one sweep.scheduler names) and
    # metric functions, pickled with the context (Ray sends it to the trial's process)
    scheduler: SchedulerPolicy | None = None
    metrics: Mapping[str, MetricFn] = field(default_factory=dict)

    @property
    def in_trial_process(self) -> bool:  # Train's local mode: report to Tune directly
        return self.size.in_trial_process

    @property
    def spec(self) -> TaskSpec:
        return next(t for t in self.settings.tasks if t.name == self.task)

    @property
    def train(self) -> TrainConfig:
        """The trial's recipe: the sweep's ``train`` with this trial's grid/search values on top."""
        return with_hparams(self.settings.train, self.hparams)

    def read_history(self) -> list[Report]:
        return self.histories.read(self.trial_id)

    def write_history(self, rows: list[Report]) -> None:
        self.histories.write(self.trial_id, rows)


class EvaluationReporter:
    """What a worker does after each evaluation, in order: report (rank 0 with the checkpoint),
    record it in the trial's own history, and ask the rungs (ASHA, seed halving) whether to go on.

    The trial never talks to MLflow: the driver logs its run from these reports (hooks/mlflow_runs.py),
    so a node needs no route to the tracking store and writes nothing the driver must read but
    through Tune and the sweep's storage."""

    def __init__(self, ctx: TrialContext, rank: int, resumed_from: dict[str, Any] | None,
                 timing: dict[str, float]) -> None:
        """``resumed_from``: the marker of the checkpoint the trial goes on from (None: from the start):
        its own (a retry, a resumed sweep, a pause) or, after a PBT exploit, the donor's."""
        self.ctx, self.rank, self.resumed, self.timing = ctx, rank, resumed_from is not None, timing
        self.node = ray.get_runtime_context().get_node_id()
        self.node_ip = ray.util.get_node_ip_address()
        self.device = _device_name()
        history = ctx.read_history() if self.resumed and rank == 0 else []
        writer = (resumed_from or {}).get("trial_id")
        # (donor trial, its step) until the first evaluation after an exploit has said so
        self.donor = (writer, int(resumed_from.get("step") or 0)) if writer not in (None, ctx.trial_id) else None
        # the rows after its own checkpoint are redone; after an exploit its own past stays
        self.history = history_to_go_on_from(history, resumed_from, ctx.trial_id) if resumed_from else history
        self.board = ray.get_actor(ctx.rungs_board, namespace=ASHA_NAMESPACE) if ctx.rungs_board else None
        scheduler = policies_for(ctx.settings.sweep, ctx.scheduler).scheduler
        # PBT's mutated keys ({} otherwise): reported each evaluation; a row written before its report
        self.mutated: dict[str, Any] = scheduler.mutations
        halving = scheduler.halving  # seed halving's rung, None when the sweep does not halve seeds
        self.rung_at = halving.at if halving is not None else None
        self.rung_seen = any(row.rung for row in self.history)
        self.stopped: dict[str, Any] = {}  # the rungs' reason, once they stop the trial

    def __call__(self, evaluation, save) -> None:
        report = self.report_of(evaluation)
        # A history row says its checkpoint is registered (a killer, a resumed sweep rely on it), so
        # it comes after the report; but a pause ends the trial inside the report (seed halving's at
        # its rung evaluation, PBT's at any), whose row therefore comes first (a retry drops rows
        # past its checkpoint).
        first = bool(report.rung or self.mutated)
        if first:
            self.record(report)
        self.report(report, evaluation, save)
        if not first:
            self.record(report)
        self.ask_rungs(report)

    def report_of(self, evaluation) -> Report:
        donor, self.donor = self.donor, None
        return Report(
            trial_id=self.ctx.trial_id, task=self.ctx.task, seed=self.ctx.seed, launch_id=self.ctx.launch_id,
            epoch=evaluation.epoch, train_loss=evaluation.train_loss, score=evaluation.score,
            step=evaluation.step, steps_total=evaluation.steps_total, progress=evaluation.progress,
            end_of_epoch=evaluation.end_of_epoch, trivial_score=evaluation.trivial_score,
            rung=self.is_rung(evaluation), checkpoint_rank=checkpoint_rank(evaluation.score, evaluation.progress),
            metrics=dict(evaluation.metrics), report=dict(evaluation.report_metrics or {}),
            train_seconds=evaluation.train_seconds,
            eval_seconds=evaluation.eval_seconds, train_tokens=evaluation.train_tokens,
            node=self.node, node_ip=self.node_ip, host=platform.node(), device=self.device, resumed=self.resumed,
            # where a trial's time goes: driver start -> worker process -> imports -> loop -> evaluations
            driver_started=self.ctx.driver_started, process_started=PROCESS_STARTED, **self.timing,
            reported_at=time.time(),
            checkpoint_id=uuid.uuid4().hex[:16] if self.rank == 0 else None,
            pbt={k: float(v) for k, v in self.ctx.hparams.items() if k in self.mutated},
            donor=donor[0] if donor else None, donor_step=donor[1] if donor else None,
        )

    def is_rung(self, epoch) -> bool:
        """Seed halving's decision point: the trial's first evaluation at or past fraction ``at``."""
        if self.rung_at is None or self.rung_seen or not past_rung(epoch.progress, self.rung_at):
            return False
        self.rung_seen = True
        return True

    checkpoint_bytes = 0  # the last checkpoint's size: what the next one needs

    def report(self, row: Report, evaluation, save) -> None:
        # In the trial's own process Tune takes the report (ray.train.report refuses there).
        report = tune.report if self.ctx.in_trial_process else ray.train.report
        metrics = row.to_row()
        if self.rank != 0:  # every worker reports; only rank 0 writes the model
            report(metrics)
            return
        folder = Path(tempfile.mkdtemp(prefix="sweep-ckpt-"))
        try:
            # A full disk, here (the system temp dir) or in the storage below, is one DiskFullError
            # line: a retry on the same disk cannot fix it (StopOnDiskFull ends the sweep on it).
            staged = lambda: self.checkpoint_bytes or folder_size(folder)  # noqa: E731 (measured once it failed)
            with writing("a checkpoint", folder.parent, staged, key="TMPDIR"):
                save(folder)
                # found again without Tune's log (a plain write: the whole folder is private until reported)
                # ... and whose it is: a PBT exploit restarts another trial from it
                # ... and its evaluation's row: a driver killed between this report and the history
                # row loses the row, and a trial resumed from this (its last) checkpoint has no
                # evaluation left to write it again
                (folder / CHECKPOINT_MARKER).write_text(json.dumps({
                    "epoch": row.epoch, "step": row.step, "trial_id": row.trial_id,
                    "checkpoint_id": row.checkpoint_id, "report": metrics}, default=float))
            self.checkpoint_bytes = folder_size(folder)
            storage = _checkpoint_storage(self.ctx)
            before = _checkpoints_in(storage)
            try:
                key = "cluster.storage_path" if self.ctx.settings.cluster.storage_path else "out_dir"
                with writing(f"the checkpoint of epoch {row.epoch}", storage, self.checkpoint_bytes, key=key):
                    report(metrics, checkpoint=Checkpoint.from_directory(folder))  # persisted before it returns
            except DiskFullError:
                for half in _checkpoints_in(storage) - before:  # Ray's half-copied folder
                    shutil.rmtree(half, ignore_errors=True)
                raise
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def record(self, report: Report) -> None:
        """The trial's own durable record of its evaluations: Tune's progress.csv of a driver that was
        killed may miss the last rows, and resume reads this instead."""
        if self.rank == 0:
            self.history.append(report)
            self.ctx.write_history(self.history)

    def ask_rungs(self, report: Report) -> None:
        """Raise EarlyStop when the rungs stop the trial: every rank gets the same answer."""
        if self.board is None:
            return
        point = EvalPoint.from_report(report)
        verdict = ray.get(self.board.at_eval.remote(point))
        while verdict is None:  # seed halving: Tune pauses a trial that must wait; a DDP rank may still ask
            time.sleep(1.0)
            verdict = ray.get(self.board.at_eval.remote(point))
        if not verdict.go_on:
            raise EarlyStop(verdict)

    def stopped_before(self) -> EarlyStop | None:
        """A trial resumed after its task's decision (seed halving pauses it at the rung): stopped?"""
        if self.board is None or not self.history:
            return None
        verdict = ray.get(self.board.verdict_of.remote(self.ctx.trial_id))
        return EarlyStop(verdict) if verdict is not None and not verdict.go_on else None

    def end(self, status: str, stop: EarlyStop | None = None) -> None:
        if stop is not None:
            last = self.history[-1] if self.history else None
            self.stopped = {"stopped": stop.verdict.stop_text, "stopped_at_step": last.step if last else None,
                            "stopped_at_progress": last.progress if last else None}
        if status == "FINISHED":
            self.mark_done()

    def mark_done(self) -> None:
        """The history says the trial is over (all epochs, or stopped by the rungs, with why): a
        resumed sweep whose Tune state missed the end (Tune saves it every 10 s at most) does not
        run it again."""
        if self.rank == 0 and self.history:
            self.history[-1] = self.history[-1].ended(**self.stopped)
            self.ctx.write_history(self.history)


def _checkpoint_storage(ctx: TrialContext) -> Path:
    """The folder Ray copies this trial's checkpoints into (the trial's folder in the sweep's storage)."""
    if ctx.in_trial_process:
        from sweep.cluster.ray_internals import trial_storage_path

        return trial_storage_path()
    return Path(ray.train.get_context().get_storage().experiment_fs_path)


def _checkpoints_in(storage: Path) -> set[Path]:
    return set(storage.glob("checkpoint_*")) if storage.is_dir() else set()


def train_fn_per_worker(config: dict[str, Any]) -> None:
    """Runs in each Ray Train worker: stage (no-op when staged), fine-tune, report every epoch."""
    # Imported here, not at the top: the trial's driver process never needs torch/transformers.
    from sweep.cluster.stage_nodes import stage_for_trial
    from sweep.storage.staging import cache_root
    from sweep.train.loop import Distributed, finetune

    # rss_at_start_mb: what the previous trial left in a reused process (tests check it does not grow)
    timing = {"imported": time.time(), "pid": os.getpid(),
              "rss_at_start_mb": psutil.Process().memory_info().rss / 2**20}
    ctx: TrialContext = config["context"]
    sources = stage_for_trial(ctx.settings, ctx.staging)  # a no-op on a node staged at the start
    if ctx.in_trial_process:  # ray.train's API refuses to run inside a Tune function: one worker, rank 0
        rank, world = 0, 1
    else:
        train_ctx = ray.train.get_context()
        rank, world = train_ctx.get_world_rank(), train_ctx.get_world_size()
    if not ctx.in_trial_process:  # every worker reports (Train V2); the sweep's dispatch waits for this one
        ray.train.report(Report(trial_id=ctx.trial_id, workers_ready=1).to_row())
    timing["loop_started"] = time.time()
    device = _device(ctx.in_trial_process)
    resume_dir = _restore_latest(ctx)
    reporter = EvaluationReporter(ctx, rank, resumed_from=_checkpoint_marker(resume_dir), timing=timing)
    try:
        stopped = reporter.stopped_before() if resume_dir is not None else None
        if stopped is not None:
            raise stopped  # decided while paused at the rung: end now, without loading the model
        finetune(
            ctx.spec, sources.model_dir, sources.data_dir, ctx.train, ctx.seed,
            cache_dir=cache_root(ctx.settings.storage), on_evaluation=reporter, resume_from=resume_dir,
            # DDP on the device chosen here: Train's own choice is cuda for a (fake) GPU torch cannot use
            dist=Distributed(
                rank=rank, world_size=world,
                wrap_model=partial(ray.train.torch.prepare_model, move_to_device=device) if world > 1 else None,
            ),
            device=device, metrics=ctx.metrics, selection=selection_of(ctx.settings.sweep),
        )
    except EarlyStop as stop:
        # a finished trial with fewer steps; its best checkpoint is already reported
        reporter.end("FINISHED", stop=stop)
    except SystemExit:
        raise  # Tune paused (seed halving) or stopped the trial: its MLflow run goes on when it resumes
    except BaseException:
        reporter.end("FAILED")
        raise
    else:
        reporter.end("FINISHED")
    finally:
        if resume_dir is not None:
            shutil.rmtree(resume_dir, ignore_errors=True)
        if ctx.in_trial_process:
            _free_for_the_next_trial()


def _checkpoint_marker(folder: Path | None) -> dict[str, Any] | None:
    """What a checkpoint folder holds: the evaluation's epoch and step, the trial that wrote it (None:
    no checkpoint)."""
    if folder is None:
        return None
    return json.loads((folder / CHECKPOINT_MARKER).read_text())


def _free_for_the_next_trial() -> None:
    """The process serves the next trial: drop this one's model, optimizer and batches now (they
    are garbage once finetune returned, but cycles wait for a collection) and the CUDA cache."""
    gc.collect()
    _return_freed_heap()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _return_freed_heap() -> None:
    """glibc keeps a freed model's pages in its arenas, scattered so the next trial's allocations do not fill
    them: a reused process grew with every trial until they are handed back here
    (docs/benchmarks.md: Behind the code's choices)."""
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to hand back this way
        pass


def _finished_before(ctx: TrialContext) -> Report | None:
    """The last evaluation's record of a trial that already ended (in an earlier launch), else None."""
    rows = ctx.read_history()
    return rows[-1] if rows and rows[-1].trial_done else None


def _restore_latest(ctx: TrialContext) -> Path | None:
    """After a crash the retried trial (Tune) or restarted worker (Train) gets the latest checkpoint:
    go on from its epoch. A resumed launch's first start of an earlier launch's trial goes on from the
    checkpoint the ledger holds (or, gone, the newest whole one beside it)."""
    checkpoint = tune.get_checkpoint() if ctx.in_trial_process else ray.train.get_checkpoint()
    if checkpoint is None and ctx.continues_from and ctx.in_trial_process:
        from sweep.trial.kept_checkpoints import kept_instead

        checkpoint = kept_instead(Checkpoint(ctx.continues_from), ctx.trial_id, ctx.histories)
    if checkpoint is None:
        return None
    return Path(checkpoint.to_directory(tempfile.mkdtemp(prefix="sweep-resume-")))


def _device_name() -> str:
    """The device the loop trains on, for the trial's MLflow run (torch is imported by then)."""
    import torch

    if torch.cuda.is_available():
        return f"cuda:{torch.cuda.current_device()} ({torch.cuda.get_device_name()})"
    return "cpu"


def _device(in_trial_process: bool):
    import torch

    from sweep.train.loading import pick_device

    # Ray assigns GPUs by its own accounting (fake GPUs in tests, a CPU-only torch build):
    # use the assigned GPU only when torch can. In the trial's own process Ray has set
    # CUDA_VISIBLE_DEVICES to the trial's GPU (cuda:0 here, also for a fractional share).
    if not torch.cuda.is_available():
        return pick_device("cpu")
    return pick_device("cuda") if in_trial_process else ray.train.torch.get_device()


def _has_nccl() -> bool:
    import torch.distributed  # the one torch import in a DDP trial's driver (its workers import the rest)

    return torch.distributed.is_nccl_available()


def train_driver_fn(config: dict[str, Any], settings: Settings, sizes: dict[str, TrialResources], storage: SweepStorage,
                    launch_id: str, rungs_board: str | None = None, staging=None,
                    scheduler: SchedulerPolicy | None = None, metrics: Mapping[str, MetricFn] | None = None) -> None:
    """The Tune trainable: one TorchTrainer run for this (task, seed, hparams)."""
    os.environ.setdefault(REUSE_WAIT_ENV, REUSE_WAIT_S)  # read in this process by the next trial's reset
    # an earlier launch's trial goes on under its id (the ledger's): its history, Train run and MLflow run
    trial_id = sweep_trial_id(tune.get_context().get_trial_id(), config)
    task, seed, hparams = trial_of(config)
    ctx = TrialContext(
        settings=settings, task=task, seed=seed, hparams=hparams,
        trial_id=trial_id, launch_id=launch_id, driver_started=time.time(), histories=storage.histories,
        size=sizes[task], rungs_board=rungs_board, staging=staging,
        continues_from=(config.get("continues") or {}).get("checkpoint"),
        scheduler=scheduler, metrics=dict(metrics or {}),
    )
    done = _finished_before(ctx)
    if done is not None:  # finished before a killed driver's Tune state recorded it: report, don't rerun
        tune.report(done.to_row())
        return
    try:
        _fit(ctx, storage.train)
    except Exception as error:
        own = trial_error(error)
        if own is None:
            raise  # infrastructure (or unknown): Tune retries it from the latest checkpoint
        _end_failed(ctx, own)


def _end_failed(ctx: TrialContext, error: BaseException) -> None:
    """The trial failed on its own data, config or the model's limits: a retry would fail the same
    way. Its history and its last report say so (records_from_results marks it ERROR), and the
    trainable returns instead of raising, so neither Tune nor Train runs it again (nor a resume)."""
    row = Report(trial_id=ctx.trial_id, task=ctx.task, seed=ctx.seed, launch_id=ctx.launch_id,
                 trial_error=error_line(error), trial_done=True, reported_at=time.time())
    ctx.write_history([*ctx.read_history(), row])
    tune.report(row.to_row())


def _fit(ctx: TrialContext, train_storage: str) -> None:
    """One TorchTrainer run of the trial; raises what the trial's loop raised (Train wraps it for DDP).
    ``train_storage``: Train's storage for the sweep's trials (a folder or s3://…)."""
    if ctx.in_trial_process:
        # Local mode: the loop runs right here; this process holds the trial's CPU/GPU (tune.with_resources).
        TorchTrainer(train_fn_per_worker, train_loop_config={"context": ctx},
                     scaling_config=ScalingConfig(num_workers=0)).fit()
        return
    workers, gpus = ctx.size.workers, ctx.size.gpus_per_worker
    fit_reporting_to_tune(lambda reports: TorchTrainer(
        train_fn_per_worker,
        train_loop_config={"context": ctx},
        # NCCL between GPUs; gloo where the workers are CPU processes (a GPU-less cluster, or fake
        # GPUs in tests with a CPU build of torch, which has no NCCL).
        torch_config=TorchConfig(backend="nccl" if gpus > 0 and _has_nccl() else "gloo"),
        scaling_config=ScalingConfig(
            num_workers=workers,
            use_gpu=gpus > 0,
            resources_per_worker={"CPU": ctx.size.cpus_per_worker, "GPU": gpus},
            placement_strategy="STRICT_PACK",  # a trial's DDP workers share one node
        ),
        run_config=ray.train.RunConfig(
            name=f"trial-{ctx.trial_id}",  # unique per trial: Train V2 resumes a run whose name it has seen
            storage_path=train_storage,
            callbacks=[reports],  # Train's reports, passed to Tune by this thread (not Ray's TuneReportCallback)
            checkpoint_config=CheckpointConfig(
                num_to_keep=1, checkpoint_score_attribute=CHECKPOINT_RANK, checkpoint_score_order="max",
            ),
            # No retry by Train: the trainable sorts the failure first (a trial error ends the
            # trial; anything else Tune retries, resuming this Train run by its name).
            failure_config=FailureConfig(max_failures=0),
        ),
    ))
