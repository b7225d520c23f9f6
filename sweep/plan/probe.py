"""Time a few real training steps on this machine before any trial: the plan's seconds per token where
the trials run on CPU beside the driver (the GPU prior of ``sweep.plan.makespan`` means nothing on a CPU).

The probe builds a trial as the loop does (``sweep.train.loop.setup``: the task's model, the method,
adapters, optimizer, collator, the real rows' token lengths), on as many torch threads as one trial's
CPUs, times a training step or three on real batches and one evaluation batch, and puts the driver's
random state back. A few seconds: MiniLM on 1 thread, ~1.1 s per batch of 16 RTE rows.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from sweep.config.settings import TrainConfig
from sweep.config.tasks import TaskSpec
from sweep.plan.costs import DataVolume, StepCost, trained_rows
from sweep.plan.eta import COLD_START_S

BUDGET_S = 2.0  # timed training steps stop once past this (at least one, at most STEPS)
STEPS = 3
WARMUP_ROWS = 2  # a first step on a tiny batch: the optimizer's state and kernels made, not timed


@dataclass(frozen=True)
class Probe:
    step: StepCost  # measured seconds per real token
    setup_seconds: float  # model and data loaded into a warm process: a reused trial process's start
    seconds: float  # the probe's own wall time
    steps: int  # training steps timed


def probe_step_cost(spec: TaskSpec, model_dir: Path, data_dir: Path, train: TrainConfig, threads: int,
                    cache_dir: Path | None = None) -> Probe:
    """Seconds per real token of a training step and of an evaluation batch, on ``threads`` CPU threads.

    Only the rows the probe uses are tokenized (max_train/eval_samples cut to them); a causal-LM corpus
    is cut into blocks whole, into ``cache_dir`` (the trials' cache: the work is not lost)."""
    started = time.perf_counter()
    rows = train.batch_size * STEPS
    small = replace(train, max_train_samples=min(rows, train.max_train_samples or rows),
                    max_eval_samples=min(train.eval_batch_size, train.max_eval_samples or train.eval_batch_size),
                    group_by_length=False, num_workers=0)
    with _driver_state_kept(threads):
        import torch

        from sweep.train.loop import setup

        run = setup(spec, model_dir, data_dir, small, seed=0, device=torch.device("cpu"),
                    cache_dir=cache_dir if spec.kind == "causal_lm" else None)
        setup_seconds = time.perf_counter() - started
        train_seconds, train_tokens, steps = _time_training(run)
        eval_seconds, eval_tokens = _time_evaluation(run)
    step = StepCost(train_seconds / train_tokens, eval_seconds / max(eval_tokens, 1), train.method, measured=True)
    return Probe(step, setup_seconds, time.perf_counter() - started, steps)


def _time_training(run) -> tuple[float, int, int]:
    """Seconds and real tokens of up to STEPS training steps, after an untimed tiny one."""
    from sweep.data.collate import count_tokens
    from sweep.train.loop import Segment, train_step  # the loop's own step: forward, backward, clip, update

    batches = list(run.train_loader)
    run.model.train()
    warmup = {k: v[:WARMUP_ROWS] for k, v in batches[0].items()}
    train_step(run, warmup, Segment())
    seconds, tokens, steps = 0.0, 0, 0
    for batch in batches[:STEPS]:
        t = time.perf_counter()
        train_step(run, batch, Segment())
        seconds += time.perf_counter() - t
        tokens += count_tokens(batch).real
        steps += 1
        if seconds >= BUDGET_S:
            break
    return seconds, tokens, steps


def _time_evaluation(run) -> tuple[float, int]:
    """Seconds and real tokens of one evaluation batch of the primary split (the loop's evaluate)."""
    from sweep.data.collate import count_tokens
    from sweep.train.evaluate import evaluate

    loader = run.eval_loaders[run.spec.primary_eval]
    tokens = sum(count_tokens(batch).real for batch in loader)
    t = time.perf_counter()
    evaluate(run.model, loader, run.spec, run.device, run.amp_dtype)
    return time.perf_counter() - t, tokens


@contextmanager
def _driver_state_kept(threads: int):
    """The probe on a trial's threads; the driver's torch threads and random states as they were
    (setup seeds every generator: an unseeded search must stay unseeded)."""
    import numpy as np
    import torch

    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        yield
    finally:
        torch.set_num_threads(before)
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])


def why_no_probe(on_cpu: bool, joined: bool, nodes: int, local_sources: bool) -> str:
    """Why this driver cannot time the trials' CPU ("" : it can: every trial runs on CPU on this machine)."""
    if not on_cpu:
        return "the trials run on GPUs"
    if joined or nodes > 1:
        return "the trials run on the cluster's nodes, not beside this driver; the ETA follows the first trials"
    if not local_sources:
        return "the model and data are staged on the nodes, not here; the ETA follows the first trials"
    return ""


def probe_task(sizes: Mapping[str, DataVolume], train: TrainConfig) -> str:
    """The task to time: the one with the most tokens to train (its data read)."""
    readable = [s for s in sizes.values() if not s.error] or list(sizes.values())
    return max(readable, key=lambda s: trained_rows(s, train) * s.mean_tokens).task


def cpu_note(probe: Probe | None, why_not: str) -> str:
    """What the CPU estimate rests on, for the plan line (or why there is none)."""
    if probe is None:
        return why_not
    return (f"training measured here: {probe.steps} step(s) at {probe.step.train * 1e3:.2f} ms/token, "
            f"eval {probe.step.eval * 1e3:.2f} ms/token, probe {probe.seconds:.1f} s; "
            f"+ ~{COLD_START_S:.0f}s to start each new trial process, a prior")
