"""One sweep trial on Ray: a Tune function trainable that runs a Ray Train ``TorchTrainer``.

Train V2 (Ray >= 2.43) cannot be wrapped by ``Tuner(TorchTrainer(...))``; the supported pattern
is a function trainable that builds and fits a TorchTrainer, with ``TuneReportCallback`` passing
the workers' reports on to Tune (DESIGN §5). Everything below the worker loop is plain Python
(``sweep.finetune``).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
import time
import traceback
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import psutil
import ray
import ray.train
from ray import tune
from ray.train import Checkpoint, CheckpointConfig, FailureConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer
from ray.tune.integration.ray_train import TuneReportCallback

from sweep.config import Settings
from sweep.schedulers import EarlyStop

# Reported every epoch; the checkpoint manager keeps the best by it (plus the latest, for a
# restart). Among equal scores the EARLIER epoch ranks higher, as in finetune's own choice.
CHECKPOINT_RANK = "checkpoint_rank"
CHECKPOINT_EPOCH = "sweep_epoch.json"  # in each checkpoint folder: which epoch it holds
PROCESS_STARTED = psutil.Process().create_time()  # this worker process's start (before its imports)


def checkpoint_rank(score: float, epoch: int) -> float:
    return score - 1e-9 * epoch


def trial_train_config(settings: Settings, hparams: dict[str, Any]):
    """The trial's recipe: the sweep's ``train`` with this trial's grid/search values on top."""
    return replace(settings.train, **hparams)


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Runs in each Ray Train worker: stage (no-op when staged), fine-tune, report every epoch."""
    # Imported here, not at the top: the trial's driver process never needs torch/transformers.
    from sweep.finetune import Distributed, finetune
    from sweep.staging import cache_root, ensure_local

    imported = time.time()
    settings: Settings = config["settings"]
    spec = next(t for t in settings.tasks if t.name == config["task"])
    train = trial_train_config(settings, config["hparams"])
    sources = ensure_local(settings)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    node = ray.get_runtime_context().get_node_id()

    resume_dir = None
    started = time.time()
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:  # a restart after a crash: go on from the latest epoch
        resume_dir = Path(checkpoint.to_directory(tempfile.mkdtemp(prefix="sweep-resume-")))

    mlflow_run = _start_trial_run(config, spec.name, train) if rank == 0 else None
    history_file = Path(config["history_dir"]) / f"{config['trial_id']}.json" if config.get("history_dir") else None
    history = json.loads(history_file.read_text()) if resume_dir is not None and history_file and history_file.exists() else []

    def on_epoch(epoch, save) -> None:
        if mlflow_run is not None:
            mlflow_run.log_epoch(epoch.epoch, {"train_loss": epoch.train_loss, "score": epoch.score, **epoch.metrics})
        metrics = {
            "mlflow_run_id": mlflow_run.run_id if mlflow_run is not None else "",
            "epoch": epoch.epoch, "train_loss": epoch.train_loss, "score": epoch.score,
            CHECKPOINT_RANK: checkpoint_rank(epoch.score, epoch.epoch),
            "train_seconds": epoch.train_seconds, "eval_seconds": epoch.eval_seconds,
            "train_tokens": epoch.train_tokens, "node": node, "host": platform.node(),
            "resumed": resume_dir is not None, "launch_id": config["launch_id"],
            # where a trial's time goes (bench_overhead.py): driver start -> worker process -> loop -> epochs
            "driver_started": config["driver_started"], "process_started": PROCESS_STARTED,
            "loop_started": started, "imported": imported, "reported_at": time.time(),
            **{f"eval/{k}": v for k, v in epoch.metrics.items()},
        }
        if rank != 0:  # every worker reports; only rank 0 writes the model
            ray.train.report(metrics)
        else:
            folder = Path(tempfile.mkdtemp(prefix="sweep-ckpt-"))
            try:
                save(folder)
                _write_json(folder / CHECKPOINT_EPOCH, {"epoch": epoch.epoch})  # found again without Tune's log
                ray.train.report(metrics, checkpoint=Checkpoint.from_directory(folder))
            finally:
                shutil.rmtree(folder, ignore_errors=True)
        if rank == 0 and history_file is not None:
            # The trial's own durable record of its epochs: Tune's progress.csv of a driver that
            # was killed may miss the last rows, and resume reads this instead.
            history.append({k: v for k, v in metrics.items() if isinstance(v, (int, float, str, bool))})
            _write_json(history_file, history)
        if board is not None and not ray.get(
            board.should_continue.remote(spec.name, config["trial_id"], epoch.epoch, epoch.score)
        ):
            raise EarlyStop  # cut by ASHA: every rank gets the same answer and stops here

    board = ray.get_actor(config["asha_board"], namespace="sweep") if config.get("asha_board") else None
    wrap = ray.train.torch.prepare_model if world > 1 else None
    try:
        finetune(
            spec, sources.model_dir, sources.data_dir, train, int(config["seed"]),
            cache_dir=cache_root(settings.storage), on_epoch=on_epoch, resume_from=resume_dir,
            dist=Distributed(rank=rank, world_size=world, wrap_model=wrap),
            device=_device(),
        )
    except EarlyStop:
        pass  # a finished trial with fewer epochs; its best checkpoint is already reported
    except BaseException:
        if mlflow_run is not None:
            mlflow_run.end("FAILED", traceback.format_exc())
        raise
    else:
        if mlflow_run is not None:
            mlflow_run.end("FINISHED")
    finally:
        if resume_dir is not None:
            shutil.rmtree(resume_dir, ignore_errors=True)


def _write_json(path: Path, payload: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, path)


def _start_trial_run(config: dict[str, Any], task: str, train):
    """The trial's nested MLflow run, logged straight to the store from this worker (None: no tracking).

    A restarted trial finds its run again by name and goes on logging into it.
    """
    tracking = config.get("tracking")
    if tracking is None:
        return None
    from sweep.tracking import TrialLogger

    params = {"task": task, "seed": config["seed"], **asdict(train)}
    logger = TrialLogger(
        tracking.uri, tracking.experiment_id, tracking.parent_run_id,
        run_name=f"{task}-seed{config['seed']}-{config['trial_id']}", params=params,
        tags={"sweep.trial_id": config["trial_id"], "sweep.hparams": str(config.get("hparams") or {})},
    )
    logger.start()
    return logger


def _device():
    import torch

    # Ray assigns GPUs by its own accounting (fake GPUs in tests, a CPU-only torch build):
    # use the assigned GPU only when torch can.
    return ray.train.torch.get_device() if torch.cuda.is_available() else torch.device("cpu")


def run_trial(config: dict[str, Any], settings: Settings, storage_path: str, workers: int,
              gpus_per_worker: float, launch_id: str, asha_board: str | None = None, tracking=None) -> None:
    """The Tune trainable: one TorchTrainer run for this (task, seed, hparams).

    ``launch_id`` names the driver invocation that ran the trial (a resumed sweep has a new one).
    """
    started = time.time()
    trial_id = tune.get_context().get_trial_id()
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={**config, "settings": settings, "launch_id": launch_id, "driver_started": started,
                           "trial_id": trial_id, "asha_board": asha_board, "tracking": tracking,
                           "history_dir": None if "://" in storage_path else str(Path(storage_path).parent / "history")},
        # One worker needs no collectives: gloo works on any node; NCCL only for multi-GPU DDP.
        torch_config=TorchConfig(backend="nccl" if workers > 1 and gpus_per_worker > 0 else "gloo"),
        scaling_config=ScalingConfig(
            num_workers=workers,
            use_gpu=gpus_per_worker > 0,
            resources_per_worker={"CPU": settings.resources.cpus_per_trial, "GPU": gpus_per_worker},
            placement_strategy="STRICT_PACK",  # a trial's DDP workers share one node
        ),
        run_config=ray.train.RunConfig(
            name=f"trial-{trial_id}",  # unique per trial: Train V2 resumes a run whose name it has seen
            storage_path=storage_path,
            callbacks=[TuneReportCallback()],
            checkpoint_config=CheckpointConfig(
                num_to_keep=1, checkpoint_score_attribute=CHECKPOINT_RANK, checkpoint_score_order="max",
            ),
            failure_config=FailureConfig(max_failures=settings.sweep.max_failures),
        ),
    )
    trainer.fit()
