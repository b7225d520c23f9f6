"""Time a few real training steps on this machine before any trial: the plan's seconds per token where
the trials run on CPU beside the driver (the GPU prior of ``sweep.plan.makespan`` means nothing on a CPU).

The probe builds a trial as the loop does (``sweep.train.loop.setup``: the task's model, the method,
adapters, optimizer, collator, the real rows' token lengths), on as many torch threads as one trial's
CPUs, times a training step or three on real batches and one evaluation batch, and puts the driver's
random state back. A few seconds (docs/benchmarks.md: Behind the code's choices).

It also saves the trial's checkpoint once (the model, the tokenizer, the optimizer's state: what a trial
writes at each evaluation) and times it: a trial's end after its loop is mostly those saves.

A step's time is a fixed part (the optimizer's update of every weight, clipping) plus a part per token
computed; two steps of a few rows beside the full ones tell them apart. Per token alone, the plan of
the README's tour put SST-2's short rows far too low from MRPC's longer ones
(docs/benchmarks.md: Behind the code's choices).
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from sweep.config.metric_names import BUILT_IN
from sweep.config.settings import TrainConfig
from sweep.config.tasks import TaskSpec
from sweep.plan.costs import DataVolume, StepCost, trained_rows
from sweep.plan.cpu_load import CpuLoad, CpuLoadMeter, trial_niceness
from sweep.plan.eta import COLD_START_S, END_S

BUDGET_S = 2.0  # timed training steps stop once past this (at least one, at most STEPS)
STEPS = 3
SMALL_STEPS, SMALL_ROWS = 2, 2  # timed steps of a few rows: the fixed part of a step


@dataclass(frozen=True)
class Probe:
    step: StepCost  # measured seconds per computed token, and per step
    setup_seconds: float  # model and data loaded into a warm process: a reused trial process's start
    seconds: float  # the probe's own wall time
    steps: int  # training steps timed
    threads: int  # a trial's torch threads, as timed
    load: CpuLoad  # the other processes' CPU while timed
    save_seconds: float  # one checkpoint saved (a trial saves one at each evaluation)

    def slowdown(self, at_once: int) -> float:
        """How much slower a trial process works with ``at_once`` trials (Ray workers: niced) sharing this
        CPU with the other work measured beside the probe, than the probe did alone."""
        return self.load.slowdown(at_once, self.threads, trial_niceness())

    def step_at(self, at_once: int) -> StepCost:
        return self.step.scaled(self.slowdown(at_once))


def probe_step_cost(spec: TaskSpec, model_dir: Path, data_dir: Path, train: TrainConfig, threads: int,
                    cache_dir: Path | None = None) -> Probe:
    """Seconds per computed token (padding included) of a training step and of an evaluation batch, and
    a training step's fixed seconds, on ``threads`` CPU threads.

    Only the rows the probe uses are tokenized (max_train/eval_samples cut to them); a causal-LM corpus
    is cut into blocks whole, into ``cache_dir`` (the trials' cache: the work is not lost)."""
    started = time.perf_counter()
    rows = train.batch_size * (STEPS + 1)  # the first batch warms up
    small = replace(train, max_train_samples=min(rows, train.max_train_samples or rows),
                    max_eval_samples=min(train.eval_batch_size, train.max_eval_samples or train.eval_batch_size),
                    group_by_length=False, num_workers=0)
    with _driver_state_kept(threads):
        import torch

        from sweep.train.loop import setup

        # it times, it picks nothing: a built-in metric stands in for the user's own (sweep.run(metrics=...)),
        # which only the trials compute
        timed = replace(spec, metric=BUILT_IN[spec.kind][0])
        run = setup(timed, model_dir, data_dir, small, seed=0, device=torch.device("cpu"),
                    cache_dir=cache_dir if spec.kind == "causal_lm" else None)
        setup_seconds = time.perf_counter() - started
        with CpuLoadMeter() as meter:
            few, full = _time_training(run)
            eval_seconds, eval_tokens = _time_evaluation(run)
            save_seconds = _time_save(run, cache_dir)
    per_token, per_step = split_step_time(few, full)
    step = StepCost(per_token, eval_seconds / max(eval_tokens, 1), train.method, measured=True, per_step=per_step)
    return Probe(step, setup_seconds, time.perf_counter() - started, len(full), max(1, threads), meter.load,
                 save_seconds)


def _time_save(run, near: Path | None) -> float:
    """Seconds to save the trial's checkpoint as the loop does (``sweep.train.loop.save``), into a
    folder that is removed after (beside the trials' cache where there is one: the same disk)."""
    from sweep.train.loop import save

    if near is not None:
        near.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="probe-checkpoint-", dir=near) as folder:
        t = time.perf_counter()
        save(run, Path(folder))
        return time.perf_counter() - t


Timed = list[tuple[float, int]]  # (seconds, computed tokens) of each timed step


def _time_training(run) -> tuple[Timed, Timed]:
    """Steps of SMALL_ROWS rows, then up to STEPS full training steps, after an untimed full one (the
    optimizer's state, the kernels and the allocator's buffers made: warmed up on two rows, the first
    probe in a process put a step's fixed part above the next ones' (docs/benchmarks.md: Behind the code's choices))."""
    from sweep.data.collate import count_tokens
    from sweep.train.loop import Segment, train_step  # the loop's own step: forward, backward, clip, update

    def timed(batch) -> tuple[float, int]:
        t = time.perf_counter()
        train_step(run, batch, Segment())
        return time.perf_counter() - t, count_tokens(batch).padded

    batches = list(run.train_loader)
    run.model.train()
    first = batches[0]
    train_step(run, first, Segment())
    starts = range(0, SMALL_ROWS * SMALL_STEPS, SMALL_ROWS)
    few = [timed(_rows(first, start, SMALL_ROWS)) for start in starts if start < len(first["attention_mask"])]
    full: Timed = []
    for batch in batches[1:STEPS + 1] or batches[:1]:  # one batch in all: time it again
        full.append(timed(batch))
        if sum(seconds for seconds, _ in full) >= BUDGET_S:
            break
    return few, full


def _rows(batch: dict, start: int, n: int) -> dict:
    """Rows start..start+n of a collated batch (its padded width kept: counted as computed)."""
    return {k: v[start:start + n] for k, v in batch.items()}


def split_step_time(few: Timed, full: Timed) -> tuple[float, float]:
    """Seconds per computed token and a step's fixed seconds: the line through the mean step of a few
    rows and the mean full one. All per token where the few-row steps tell nothing (not fewer tokens
    than half a full step's, or noise tipped the line below zero)."""
    full_s, full_t = (sum(x) / len(full) for x in zip(*full))
    per_token_only = full_s / max(full_t, 1)
    if not few:
        return per_token_only, 0.0
    small_s, small_t = (sum(x) / len(few) for x in zip(*few))
    if full_t < 2 * small_t:
        return per_token_only, 0.0
    per_token = (full_s - small_s) / (full_t - small_t)
    per_step = small_s - per_token * small_t
    if per_token <= 0 or per_step <= 0:
        return per_token_only, 0.0
    return per_token, per_step


def _time_evaluation(run) -> tuple[float, int]:
    """Seconds and computed tokens of one evaluation batch of the primary split (the loop's evaluate)."""
    from sweep.data.collate import count_tokens
    from sweep.train.evaluate import evaluate

    loader = run.eval_loaders[run.spec.primary_eval]
    tokens = sum(count_tokens(batch).padded for batch in loader)
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


def end_seconds(probe: Probe, saves: float, at_once: int) -> float:
    """A trial's time after its loop starts outside its training and evaluation: ``saves`` checkpoints
    (one per evaluation) and its end (END_S), as slow as the steps with ``at_once`` trials (the same
    niced process)."""
    return (END_S + saves * probe.save_seconds) * probe.slowdown(at_once)


def cpu_note(probe: Probe | None, why_not: str, at_once: int = 1, saves: float = 0.0) -> str:
    """What the CPU estimate rests on, for the plan line (or why there is none); ``saves``: checkpoints
    a trial saves (its evaluations)."""
    if probe is None:
        return why_not
    return (f"training measured here: {probe.steps} step(s) at {probe.step.per_step:.2f} s + "
            f"{probe.step.train * 1e3:.2f} ms/token computed, eval {probe.step.eval * 1e3:.2f} ms/token, "
            f"a checkpoint saved in {probe.save_seconds:.2f} s, probe {probe.seconds:.1f} s; "
            f"{probe.load.describe(at_once, probe.threads, trial_niceness())}; "
            f"+ ~{COLD_START_S * probe.slowdown(at_once):.0f}s to start each new trial process, a prior, and "
            f"~{end_seconds(probe, saves, at_once):.0f}s to end each trial with its {saves:.3g} checkpoint(s)")
