"""One fine-tuning run: one model, one task, one seed. Plain Python and PyTorch, no Ray.

The sweep runs this loop inside Ray Train workers (``sweep.trial.train_fn``); tests and benchmarks call it
directly. The seed fixes the new head's initialisation and the data order, so the same seed on
the same machine gives the same metrics.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler
from transformers import get_linear_schedule_with_warmup, set_seed
from transformers.trainer_pt_utils import LengthGroupedSampler

from sweep.config.metric_names import MetricFn
from sweep.config.model_limits import usable_positions
from sweep.config.settings import TrainConfig
from sweep.config.tasks import TaskSpec
from sweep.data.collate import count_tokens, make_collator, make_lm_collator
from sweep.data.glue import load_task_data, tokenize_task
from sweep.data.lm import check_block_fits, lm_blocks
from sweep.data.selection import NO_SELECTION, SELECTION, Selection, carve_selection, report_splits
from sweep.results.trial_reports import TRAINING_STATE
from sweep.train.evaluate import autocast, autocast_dtype, evaluate, to_device
from sweep.train.loading import load_for_task, pick_device
from sweep.train.metrics import merge_splits, selection_score, trivial_score

log = logging.getLogger(__name__)


@dataclass
class Evaluation:
    """One evaluation: at an epoch's end, or within it (train.eval_every / train.evals_per_epoch).

    The training fields cover the segment since the previous evaluation, so their sums over a
    run's evaluations are the run's totals.
    """

    epoch: int  # 1-based: the epoch this evaluation falls in
    train_loss: float  # mean loss of the segment's batches
    metrics: dict[str, float]  # eval metrics, primary split unprefixed
    score: float  # the task's selection score (higher is better)
    train_seconds: float
    eval_seconds: float
    train_tokens: int  # real (non-pad) tokens seen in training
    padded_tokens: int  # tokens including padding: what the model actually computed on
    step: int = 0  # optimizer steps done in the run so far (this worker's, under DDP)
    steps_total: int = 0  # len(train_loader) * train.epochs
    end_of_epoch: bool = True
    trivial_score: float | None = None  # the score of predicting the majority class (None: causal LM)
    # the report split's metrics (primary unprefixed), at an evaluation that became the best on the selection
    # split (sweep.selection): taken then, on those weights, and read by no decision; None elsewhere
    report_metrics: dict[str, float] | None = None

    @property
    def progress(self) -> float:
        return self.step / self.steps_total if self.steps_total else 0.0


@dataclass
class FinetuneResult:
    task: str
    seed: int
    epochs: list[Evaluation] = field(default_factory=list)  # every evaluation, in order (mid-epoch too)
    best_index: int = 0  # 1-based index into epochs; 0 before the first evaluation
    checkpoint_dir: Path | None = None

    @property
    def best(self) -> Evaluation:
        return self.epochs[self.best_index - 1]

    @property
    def best_epoch(self) -> int:
        return self.best.epoch


# Called after each evaluation with the result and a function that saves model + tokenizer to a folder.
EvaluationCallback = Callable[[Evaluation, Callable[[Path], None]], None]



@dataclass(frozen=True)
class Distributed:
    """This worker's place in a data-parallel (DDP) run; the default is a single process."""

    rank: int = 0
    world_size: int = 1
    wrap_model: Callable[[torch.nn.Module], torch.nn.Module] | None = None  # e.g. ray.train.torch.prepare_model


def quiet_progress_bars() -> None:
    """Per-shard and per-map progress bars are noise in a sweep's log: epochs are the progress."""
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()


def subsample_rows(ds, limit: int | None):
    # A fixed shuffle (seed 0), independent of the trial seed: every seed sees the same subset.
    if limit is None or len(ds) <= limit:
        return ds
    return ds.shuffle(seed=0).select(range(limit))


def _optimizer(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    # No weight decay on biases and normalisation weights, as BERT/RoBERTa fine-tuning does.
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or "norm" in name.lower() else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # The fused kernel (what transformers.Trainer uses by default with torch >= 2.8): the same AdamW
    # update in one kernel over all tensors. torch's default on CPU is the per-tensor Python loop,
    # which profiled at ~22% of a MiniLM training epoch on CPU (fused: ~10%).
    return torch.optim.AdamW(groups, lr=lr, fused=_fused_ok(decay + no_decay))


def _fused_ok(params: list[torch.Tensor]) -> bool:
    """Fused AdamW needs floating-point tensors on a device with the kernel; else torch's default."""
    return bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)


def prepare_data(spec: TaskSpec, tokenizer, data_dir: Path, train: TrainConfig, cache_dir: Path | None,
                 selection: Selection = NO_SELECTION):
    """Read, subsample and tokenize a task's splits (the tokenized form is cached per machine), with the
    selection split carved out first (``selection``: none by default) from every row, so that each trial
    selects on the same rows whatever it trains on.

    A causal-LM corpus becomes blocks of ``train.block_size`` tokens; max_train_samples and
    max_eval_samples then count blocks.
    """
    if spec.kind == "causal_lm":
        data = lm_blocks(spec, tokenizer, data_dir, train.block_size, cache_dir)
        return _subsample_splits(carve_selection(data, spec, selection)[0], spec, train)
    raw = carve_selection(load_task_data(spec, data_dir), spec, selection)[0]
    return tokenize_task(_subsample_splits(raw, spec, train), spec, tokenizer, train.max_seq_length, cache_dir)


def _subsample_splits(data, spec: TaskSpec, train: TrainConfig):
    data["train"] = subsample_rows(data["train"], train.max_train_samples)
    for split in [*spec.eval_files, SELECTION]:
        if split in data:
            data[split] = subsample_rows(data[split], train.max_eval_samples)
    return data


def _collator(spec: TaskSpec, tokenizer, train: TrainConfig):
    if spec.kind == "causal_lm":
        return make_lm_collator(tokenizer)
    return make_collator(tokenizer, train.padding, train.max_seq_length)


def eval_points(n_batches: int, train: TrainConfig, epoch: int = 1) -> set[int]:
    """The 1-based batches of ``epoch`` after which to evaluate; the last batch always is one.

    ``train.eval_every`` counts optimizer steps over the whole run (so the points move from epoch
    to epoch); ``train.evals_per_epoch`` = K puts them after batch ceil(n*i/K), i = 1..K.
    """
    if train.eval_every is not None:
        before = (epoch - 1) * n_batches  # steps of the earlier epochs
        points = {b for b in range(1, n_batches + 1) if (before + b) % train.eval_every == 0}
    else:
        k = train.evals_per_epoch
        points = {math.ceil(n_batches * i / k) for i in range(1, k + 1)}
    return points | {n_batches}


def _train_sampler(ds, train: TrainConfig, seed: int, generator: torch.Generator, dist: Distributed):
    if dist.world_size > 1:
        return DistributedSampler(ds, num_replicas=dist.world_size, rank=dist.rank, shuffle=True, seed=seed)
    if train.group_by_length:
        # Batches of similar lengths: dynamic padding then pads little (random order between groups).
        lengths = [len(ids) for ids in ds["input_ids"]]
        return LengthGroupedSampler(train.batch_size, lengths=lengths, generator=generator)
    return RandomSampler(ds, generator=generator)


@dataclass
class Run:
    """Everything one fine-tuning run holds between evaluations (what torchtune's recipes keep on ``self``)."""

    spec: TaskSpec
    train: TrainConfig
    seed: int
    device: torch.device
    tokenizer: Any
    model: torch.nn.Module  # wrapped for DDP when distributed
    sampler: Any
    train_loader: DataLoader
    eval_loaders: dict[str, DataLoader]
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: torch.amp.GradScaler
    amp_dtype: torch.dtype | None
    result: FinetuneResult
    trivial_score: float | None = None  # of the split decisions are made on (None: causal LM)
    own_metrics: Mapping[str, MetricFn] = field(default_factory=dict)  # the user's, beside the built-in ones
    # sweep.selection: the report splits, evaluated only at a new best (eval_loaders then hold the selection split)
    report_loaders: dict[str, DataLoader] = field(default_factory=dict)

    @property
    def bare_model(self) -> torch.nn.Module:
        return getattr(self.model, "module", self.model)  # unwrapped from DDP, for saving


def setup(spec: TaskSpec, model_dir: Path, data_dir: Path, train: TrainConfig, seed: int,
          cache_dir: Path | None = None, device: torch.device | None = None, resume_from: Path | None = None,
          dist: Distributed = Distributed(), metrics: Mapping[str, MetricFn] | None = None,
          selection: Selection = NO_SELECTION) -> Run:
    """Model, data, loaders, optimizer and schedule for one run, seeded (the order below fixes the RNG draws)."""
    quiet_progress_bars()
    device = device or pick_device()
    # before the model is built: the seed (or train.init_seed, one start for every seed) fixes the new head's
    # and the adapters' weights; the trial's own seed then draws everything after (dropout)
    set_seed(seed if train.init_seed is None else train.init_seed)
    tokenizer, model = _load_model(spec, Path(model_dir), train, device, resume_from)
    if train.init_seed is not None:
        set_seed(seed)
    if spec.kind == "causal_lm":  # before any data work: a block the model cannot hold
        check_block_fits(train.block_size, usable_positions(model.config), Path(model_dir).name)
    if dist.wrap_model is not None:
        model = dist.wrap_model(model)
    data = prepare_data(spec, tokenizer, Path(data_dir), train, cache_dir, selection)
    collate = _collator(spec, tokenizer, train)

    generator = torch.Generator().manual_seed(seed)  # the seed fixes the data order too
    sampler = _train_sampler(data["train"], train, seed, generator, dist)
    train_loader = DataLoader(
        data["train"], batch_size=train.batch_size, sampler=sampler,
        collate_fn=collate, num_workers=train.num_workers,
    )
    loader = partial(DataLoader, batch_size=train.eval_batch_size, collate_fn=collate)
    report = report_splits(spec, selection)
    decides = [SELECTION] if selection.on else report  # the splits every decision reads
    eval_loaders = {split: loader(data[split]) for split in decides}
    steps = len(train_loader) * train.epochs
    optimizer = _optimizer(model, train.lr, train.weight_decay)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(train.warmup_ratio * steps), steps)
    amp_dtype = autocast_dtype(train.precision, device)
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
    # Causal-LM blocks hold token labels and have no majority baseline: trivial_score gives None.
    labels = [] if spec.kind == "causal_lm" else data[decides[0]]["labels"]
    return Run(spec, train, seed, device, tokenizer, model, sampler, train_loader, eval_loaders,
               optimizer, scheduler, scaler, amp_dtype, FinetuneResult(task=spec.name, seed=seed),
               trivial_score(spec, np.asarray(labels), metrics), dict(metrics or {}),
               {split: loader(data[split]) for split in report} if selection.on else {})


def _load_model(spec: TaskSpec, model_dir: Path, train: TrainConfig, device: torch.device,
                resume_from: Path | None):
    """Tokenizer and model on ``device``: the whole model (full fine-tuning, from the checkpoint when
    resuming), or the frozen base with LoRA adapters (new, or the checkpoint's)."""
    if train.method == "full":
        tokenizer, model = load_for_task(Path(resume_from or model_dir), spec)
        if train.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return tokenizer, model.to(device)
    from sweep.train.lora import check_method_runs_here, quantization, with_adapters

    check_method_runs_here(train)  # QLoRA on a worker without a CUDA GPU or bitsandbytes: the driver's line
    extra = quantization(train)
    if extra:  # a 4-bit base is placed by bitsandbytes when it loads, never moved after
        extra["device_map"] = {"": device.index or 0}
    tokenizer, model = load_for_task(model_dir, spec, **extra)
    if train.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = with_adapters(model, spec, train, resume_from)
    return tokenizer, model if extra else model.to(device)


def _rng_state(run: Run) -> dict[str, torch.Tensor]:
    # Dropout draws from it: saved and restored for an identical resume.
    state = {"torch_rng": torch.get_rng_state()}
    if run.device.type == "cuda":
        state["cuda_rng"] = torch.cuda.get_rng_state(run.device)
    return state


def _set_rng_state(run: Run, state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["torch_rng"])
    if run.device.type == "cuda" and "cuda_rng" in state:
        torch.cuda.set_rng_state(state["cuda_rng"], run.device)


def save(run: Run, folder: Path) -> None:
    """The model and tokenizer (save_pretrained) plus what a resume needs to go on identically.

    With LoRA the model's save_pretrained is PEFT's: the adapters and the head alone, and the
    optimizer holds only their state."""
    run.bare_model.save_pretrained(folder)
    run.tokenizer.save_pretrained(folder)
    torch.save({
        "optimizer": run.optimizer.state_dict(), "scheduler": run.scheduler.state_dict(),
        "scaler": run.scaler.state_dict(),
        "epochs": [asdict(e) for e in run.result.epochs], "best_index": run.result.best_index,
        **_rng_state(run),
    }, Path(folder) / TRAINING_STATE)


def _apply_recipe(run: Run) -> None:
    """The run's own lr and weight decay over what the checkpoint's optimizer held: the same values
    when a trial resumes its own checkpoint, mutated ones when PBT restarts it from a donor's. The
    schedule's shape (warmup, linear decay) is the run's too: its step goes on from the checkpoint's."""
    lr, scheduler = run.train.lr, run.scheduler
    scheduler.base_lrs = [lr for _ in run.optimizer.param_groups]
    for i, group in enumerate(run.optimizer.param_groups):
        group["initial_lr"] = lr
        group["lr"] = lr * scheduler.lr_lambdas[i](scheduler.last_epoch)
        if i == 0:  # the decayed group (_optimizer); biases and norms stay at 0
            group["weight_decay"] = run.train.weight_decay
    scheduler._last_lr = [group["lr"] for group in run.optimizer.param_groups]


@dataclass(frozen=True)
class Resume:
    """Where a resumed run goes on: its epoch, the batches of that epoch already done, the RNG state."""

    epoch: int
    batches_done: int
    rng: dict[str, torch.Tensor]


def restore(run: Run, folder: Path) -> Resume:
    """Go on after the last evaluation that ``save`` wrote into ``folder``, with the same data order."""
    state = torch.load(Path(folder) / TRAINING_STATE, weights_only=False)
    run.optimizer.load_state_dict(state["optimizer"])
    run.scheduler.load_state_dict(state["scheduler"])
    run.scaler.load_state_dict(state["scaler"])
    _apply_recipe(run)
    run.result.epochs = [Evaluation(**e) for e in state["epochs"]]
    run.result.best_index = state["best_index"]
    last = run.result.epochs[-1]
    completed = last.epoch if last.end_of_epoch else last.epoch - 1
    for _ in range(completed):  # replay the shuffles of the epochs done: same order as without a stop
        list(iter(run.sampler))
    log.info("%s seed %d: resumed after step %d/%d (epoch %d)", run.spec.name, run.seed, last.step,
             last.steps_total, last.epoch)
    rng = {k: v for k, v in state.items() if k.endswith("_rng")}
    done = 0 if last.end_of_epoch else last.step - (last.epoch - 1) * len(run.train_loader)
    return Resume(epoch=completed + 1, batches_done=done, rng=rng)


def _epoch_batches(run: Run, resume: Resume | None) -> Iterator[dict[str, torch.Tensor]]:
    """The epoch's batches; when resuming, positioned (data and RNG) where the stopped run was."""
    # iter(DataLoader) draws a seed from torch's global RNG: at an epoch start the saved state comes
    # first, mid-epoch it comes after the iterator and the skipped batches, as in the stopped run.
    if resume is not None and resume.batches_done == 0:
        _set_rng_state(run, resume.rng)
    batches = iter(run.train_loader)
    if resume is not None and resume.batches_done > 0:
        for _ in range(resume.batches_done):
            next(batches)
        _set_rng_state(run, resume.rng)
    return batches


@dataclass
class Segment:
    """The training since the previous evaluation: what the next Evaluation reports."""

    loss_sum: float = 0.0
    batches: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    started: float = field(default_factory=time.perf_counter)


def train_step(run: Run, batch: dict[str, torch.Tensor], segment: Segment) -> None:
    tokens = count_tokens(batch)
    segment.real_tokens += tokens.real
    segment.padded_tokens += tokens.padded
    batch = to_device(batch, run.device)
    with autocast(run.device, run.amp_dtype):
        loss = run.model(**batch).loss
    run.optimizer.zero_grad(set_to_none=True)
    run.scaler.scale(loss).backward()
    run.scaler.unscale_(run.optimizer)
    torch.nn.utils.clip_grad_norm_(run.model.parameters(), run.train.max_grad_norm)
    run.scaler.step(run.optimizer)
    run.scaler.update()
    run.scheduler.step()
    segment.loss_sum += float(loss.detach())
    segment.batches += 1


def _evaluation(run: Run, epoch: int, batch_index: int, segment: Segment) -> Evaluation:
    """Every eval split after ``batch_index`` (1-based) of ``epoch``, with the segment's training figures."""
    train_seconds = time.perf_counter() - segment.started
    t1 = time.perf_counter()
    # iter(DataLoader) draws from torch's RNG: evaluating must not move the dropout draws of the
    # training that follows, or how often a run evaluates would change the model it trains.
    per_split = _evaluate_splits(run, run.eval_loaders)
    # the selection split's metrics unprefixed (sweep.selection), else the eval splits' (primary unprefixed)
    metrics = per_split[SELECTION] if SELECTION in per_split else merge_splits(run.spec, per_split)
    n = len(run.train_loader)
    return Evaluation(
        epoch=epoch,
        train_loss=segment.loss_sum / max(segment.batches, 1),
        metrics=metrics,
        score=selection_score(run.spec, metrics),
        train_seconds=train_seconds,
        eval_seconds=time.perf_counter() - t1,
        train_tokens=segment.real_tokens,
        padded_tokens=segment.padded_tokens,
        step=(epoch - 1) * n + batch_index,
        steps_total=n * run.train.epochs,
        end_of_epoch=batch_index == n,
        trivial_score=run.trivial_score,
    )


def _evaluate_splits(run: Run, loaders: Mapping[str, DataLoader]) -> dict[str, dict[str, float]]:
    # iter(DataLoader) draws from torch's RNG: evaluating must not move the dropout draws of the
    # training that follows, or how often a run evaluates would change the model it trains.
    with torch.random.fork_rng(devices=[run.device] if run.device.type == "cuda" else []):
        return {s: evaluate(run.model, loader, run.spec, run.device, run.amp_dtype, run.own_metrics)
                for s, loader in loaders.items()}


def train_one_epoch(run: Run, epoch: int, resume: Resume | None = None) -> Iterator[Evaluation]:
    """One pass over the training data, yielding an evaluation at each of the epoch's eval points."""
    if isinstance(run.sampler, DistributedSampler):
        run.sampler.set_epoch(epoch)
    points = eval_points(len(run.train_loader), run.train, epoch)
    batches = _epoch_batches(run, resume)
    run.model.train()
    segment = Segment()
    for index, batch in enumerate(batches, start=(resume.batches_done if resume else 0) + 1):
        train_step(run, batch, segment)
        if index in points:
            yield _evaluation(run, epoch, index, segment)
            run.model.train()  # evaluate() switched dropout off
            segment = Segment()  # started after the caller's callback: its time is not training


def _record(run: Run, evaluation: Evaluation, out_dir: Path | None, on_evaluation: EvaluationCallback | None) -> None:
    """Keep an evaluation, save the model when it is the best so far, and hand it to the caller."""
    result = run.result
    result.epochs.append(evaluation)
    log.info("%s seed %d epoch %d step %d/%d: loss %.4f %s", run.spec.name, run.seed, evaluation.epoch,
             evaluation.step, evaluation.steps_total, evaluation.train_loss, evaluation.metrics)
    # Strictly better only: on a tie the earlier evaluation stays best.
    if result.best_index == 0 or evaluation.score > result.best.score:
        result.best_index = len(result.epochs)
        if run.report_loaders:  # the report split, on the weights the selection split chose (no decision reads it)
            evaluation.report_metrics = merge_splits(run.spec, _evaluate_splits(run, run.report_loaders))
        if out_dir is not None:
            save(run, Path(out_dir))
            result.checkpoint_dir = Path(out_dir)
    if on_evaluation is not None:
        on_evaluation(evaluation, lambda folder: save(run, folder))


def finetune(
    spec: TaskSpec,
    model_dir: Path,
    data_dir: Path,
    train: TrainConfig,
    seed: int,
    out_dir: Path | None = None,
    cache_dir: Path | None = None,
    on_evaluation: EvaluationCallback | None = None,
    device: torch.device | None = None,
    resume_from: Path | None = None,
    dist: Distributed = Distributed(),
    metrics: Mapping[str, MetricFn] | None = None,
    selection: Selection = NO_SELECTION,
) -> FinetuneResult:
    """Fine-tune ``model_dir`` on ``spec`` with ``seed``; evaluate at every epoch's end, and within
    epochs with ``train.eval_every`` (steps) or ``train.evals_per_epoch``.

    With ``out_dir`` the best evaluation's model (mid-epoch ones included) is saved there
    (``save_pretrained``) and returned as ``checkpoint_dir``; ``on_evaluation`` is called after every
    evaluation and lets a caller (the Ray trial) report and checkpoint instead. ``resume_from`` is
    a folder that ``save`` wrote: training goes on after its last evaluation, even a mid-epoch one,
    with the same data order and dropout draws as an uninterrupted run. ``metrics``: the user's own
    (``{name: fn(predictions, labels) -> float}``), computed beside the built-in ones at every evaluation.
    """
    run = setup(spec, model_dir, data_dir, train, seed, cache_dir, device, resume_from, dist, metrics, selection)
    resume = restore(run, resume_from) if resume_from is not None else None
    start = resume.epoch if resume is not None else 1
    for epoch in range(start, train.epochs + 1):
        for evaluation in train_one_epoch(run, epoch, resume if epoch == start else None):
            _record(run, evaluation, out_dir, on_evaluation)
    return run.result


def evaluate_model(model_dir: Path, spec: TaskSpec, data_dir: Path, train: TrainConfig,
                   selection: Selection = NO_SELECTION, device: torch.device | None = None,
                   ) -> tuple[dict[str, float], dict[str, float]]:
    """A saved model (a ``save_pretrained`` folder: an export) scored as a trial's best evaluation is: its
    metrics on the split decisions are made on, and (``selection`` on) on the report splits; the same rows as
    the trials' (``prepare_data`` with the same ``train`` and ``selection``)."""
    device = device or pick_device()
    tokenizer, model = load_for_task(Path(model_dir), spec)
    model.to(device)
    data = prepare_data(spec, tokenizer, Path(data_dir), train, None, selection)
    loader = partial(DataLoader, batch_size=train.eval_batch_size, collate_fn=_collator(spec, tokenizer, train))
    report = report_splits(spec, selection)
    amp_dtype = autocast_dtype(train.precision, device)
    scored = {split: evaluate(model, loader(data[split]), spec, device, amp_dtype) for split in report}
    reported = merge_splits(spec, scored)
    if not selection.on:
        return reported, {}
    return evaluate(model, loader(data[SELECTION]), spec, device, amp_dtype), reported
