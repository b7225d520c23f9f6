"""Each trial's predicted cost, from the staged data and model, before any trial runs.

A trial's cost is what it will actually compute: the training rows it reads (``trained_rows``: the
split capped by ``train.max_train_samples``, the loop's own rule) x mean tokens x epochs, plus every
evaluation (``evaluations`` per trial, over ``eval_rows``: each split capped by ``max_eval_samples``).
Rows come from the task's files, mean tokens from the model's own tokenizer on a sample of rows
(truncated at ``train.max_seq_length`` as training does). A causal-LM corpus is blocks of
``train.block_size`` tokens: rows = its estimated tokens / block size.

Seconds per token (``StepCost``) are either measured on this machine (``sweep.plan.probe``: the real
model, method and batches, on CPU) or, for GPUs, the published prior of ``sweep.plan.makespan``
(``CostModel``: seconds per token·parameter, parameters from the model's config). A measured figure is
per token the model computes on (``computed_tokens``: each batch padded to its longest row), plus a
training step's fixed cost (the optimizer's update of every weight, gradient clipping): on CPU both
matter: for a model like MiniLM on 1 thread, short rows (SST-2) padded to their batch's longest take about
twice what a per-real-token rate from longer rows (MRPC) says (docs/benchmarks.md: Behind the code's choices).
"""

from __future__ import annotations

import functools
import itertools
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweep.config.settings import Settings, SweepConfig, TrainConfig, with_hparams
from sweep.config.tasks import TaskSpec
from sweep.errors import DataFormatError
from sweep.failures import first_line
from sweep.plan.makespan import CostModel, TrialWork

SAMPLE_ROWS = 512  # enough for a mean within a few percent; tokenizing all of MNLI would take a minute
BATCHINGS = 8  # random batchings of the sampled lengths whose padding is averaged (computed_tokens)


@dataclass(frozen=True)
class DataVolume:
    """How much one task trains and evaluates on: its rows and tokens per row (the plan's costs read it)."""

    task: str
    rows: int  # training rows of the split, before train.max_train_samples (trained_rows applies it)
    mean_tokens: float  # tokens per row, after truncation to max_seq_length (LM: block_size)
    blocks: bool = False  # causal LM: every row is a full block, padding changes nothing
    error: str = ""  # the data did not read: sized as the mean of the others (its trials report the error)
    eval_rows: tuple[int, ...] = ()  # rows of each eval split, before train.max_eval_samples
    lengths: tuple[int, ...] = ()  # tokens of each sampled training row: how much its batches pad


def capped(rows: int, limit: int | None) -> int:
    """The rows a split keeps under a max_*_samples limit: sweep.train.loop.subsample_rows's rule (None: all)."""
    return rows if limit is None or rows <= limit else limit


def trained_rows(size: DataVolume, train: TrainConfig) -> int:
    return capped(size.rows, train.max_train_samples)


def computed_tokens(size: DataVolume, train: TrainConfig, batch_size: int, grouped: bool = False) -> float:
    """Tokens per row the model computes on, padding included, in batches of ``batch_size``: a block
    for a corpus, max_seq_length under ``padding=max_length``, else (dynamic padding: each batch padded
    to its longest row) from batches of the sampled lengths: random ones, or sorted by length when
    ``grouped`` (group_by_length's sampler). Without sampled lengths: the mean."""
    if size.blocks:
        return size.mean_tokens
    if train.padding == "max_length":
        return float(train.max_seq_length)
    if not size.lengths:
        return size.mean_tokens
    return _padded_mean(size.lengths, max(1, batch_size), grouped)


@functools.lru_cache(maxsize=256)
def _padded_mean(lengths: tuple[int, ...], batch_size: int, grouped: bool) -> float:
    rng = random.Random(0)
    order = list(lengths)
    computed = 0
    for _ in range(1 if grouped else BATCHINGS):
        if grouped:
            order.sort(reverse=True)
        else:
            rng.shuffle(order)
        computed += sum(max(order[i:i + batch_size]) * len(order[i:i + batch_size])
                        for i in range(0, len(order), batch_size))
    return computed / (len(order) * (1 if grouped else BATCHINGS))


def evaluated_rows(size: DataVolume, train: TrainConfig) -> int:
    """Rows one evaluation reads: every eval split, each capped by max_eval_samples."""
    return sum(capped(rows, train.max_eval_samples) for rows in size.eval_rows)


def evaluations(rows: int, train: TrainConfig) -> int:
    """Evaluations in one trial: the points of sweep.train.loop.eval_points over every epoch (one
    worker: ceil(rows / batch_size) batches an epoch; the epoch's last batch is always one)."""
    batches = math.ceil(rows / train.batch_size)
    if batches == 0:
        return 0
    if train.eval_every is None:  # ceil(n*i/K) for i = 1..K: K distinct points when K <= n
        return train.epochs * min(train.evals_per_epoch, batches)
    steps = batches * train.epochs  # every eval_every steps over the run, plus each epoch's end
    return steps // train.eval_every + sum(1 for e in range(1, train.epochs + 1) if (e * batches) % train.eval_every)


def grid_points(sweep: SweepConfig) -> list[dict[str, Any]]:
    """The sweep's grid as a list of points (one empty point without a grid), in a fixed order."""
    grid = sweep.grid
    keys = list(grid)
    return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))] or [{}]


def model_params(model_dir: Path) -> int:
    """The model's parameter count, from its config alone (meta tensors: no memory, no weights read)."""
    import torch
    from transformers import AutoConfig, AutoModel

    from sweep.models.quiet import quiet_transformers

    with quiet_transformers():
        config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
        with torch.device("meta"):
            model = AutoModel.from_config(config)
    return sum(p.numel() for p in model.parameters())


def task_size(spec: TaskSpec, data_dir: Path, tokenizer, train: TrainConfig) -> DataVolume:
    """Rows and mean tokens of the task's training split, measured on a sample of its rows; the rows
    of each eval split."""
    rng = random.Random(0)
    if spec.kind == "causal_lm":
        return _corpus_size(spec, data_dir, tokenizer, train, rng)
    from sweep.data.glue import load_task_data

    data = load_task_data(spec, data_dir)
    rows = data["train"]
    picked = rows.select(sorted(rng.sample(range(len(rows)), min(SAMPLE_ROWS, len(rows)))))
    columns = ["text_a", "text_b"] if "text_b" in picked.column_names else ["text_a"]
    encoded = tokenizer(*(list(picked[c]) for c in columns), truncation=True, max_length=train.max_seq_length)
    lengths = [len(ids) for ids in encoded["input_ids"]]
    return DataVolume(spec.name, len(rows), sum(lengths) / max(1, len(lengths)),
                    eval_rows=tuple(len(data[split]) for split in spec.eval_files), lengths=tuple(lengths))


def _corpus_size(spec: TaskSpec, data_dir: Path, tokenizer, train: TrainConfig, rng: random.Random) -> DataVolume:
    """A causal-LM corpus in blocks: tokens per character from a sample of lines x the characters."""
    from sweep.data.lm import read_split, split_files

    files = split_files(spec, data_dir)
    documents = read_split(spec, "train", files["train"]).documents
    lines = [line for doc in documents for line in doc.splitlines() if line.strip()]
    sample = rng.sample(lines, min(SAMPLE_ROWS, len(lines)))
    tokens_per_char = sum(len(tokenizer(line)["input_ids"]) for line in sample) / max(1, sum(map(len, sample)))
    corpus = tokens_per_char * sum(len(doc) for doc in documents) / train.block_size  # in blocks
    held_out = spec.holdout_fraction * corpus if any(f is None for f in spec.eval_files.values()) else 0.0
    eval_rows = []
    for split, paths in ((split, files[split]) for split in spec.eval_files):
        if paths:  # an eval file's blocks keep their tail: one more, shorter block
            chars = sum(len(doc) for doc in read_split(spec, split, paths).documents)
            eval_rows.append(math.ceil(tokens_per_char * chars / train.block_size))
        else:  # the corpus' tail, held out
            eval_rows.append(max(1, math.ceil(held_out)))
    return DataVolume(spec.name, max(1, math.ceil(corpus - held_out)), float(train.block_size), True,
                    eval_rows=tuple(eval_rows))


# A training step's time with the method over full fine-tuning's, on the same model and batch: LoRA skips
# the frozen weights' gradients and their optimizer update but still runs the whole forward and most of
# the backward (activations' gradients). LoRA's ratio is scripts/bench_peft.py's on MiniLM and real SST-2
# (docs/benchmarks.md: Behind the code's choices). Used with the GPU prior only: on CPU the probe times the method
# itself. QLoRA's 4-bit base is unmeasured (no GPU here) and takes LoRA's.
METHOD_STEP_RATIO = {"full": 1.0, "lora": 0.81, "qlora": 0.81}
# An evaluation's forward over a training step, per token, for the GPU prior: ~2 of the ~6 FLOP per
# token·parameter a training step costs (forward 2, backward 4). Unmeasured on a GPU here; on CPU the
# probe times one evaluation batch instead (a MiniLM RTE trial's ratio per row on CPU is a little over this,
# its eval batches padding more: docs/benchmarks.md: Behind the code's choices).
FORWARD_SHARE = 1 / 3


@dataclass(frozen=True)
class StepCost:
    """Seconds per token of a training step and of an evaluation's forward, on one trial's device, for
    the sweep's method. ``measured``: timed on this machine (sweep.plan.probe), per token the model
    computes on (``computed_tokens``), plus ``per_step``, a training step's cost whatever its tokens;
    else the GPU prior, per real token (as it was calibrated), with no fixed cost."""

    train: float
    eval: float
    method: str = "full"  # the method the figures are for
    measured: bool = False
    per_step: float = 0.0  # seconds

    def for_method(self, method: str) -> StepCost:
        """The same figures for another method (a grid over train.method), by the documented ratio."""
        ratio = METHOD_STEP_RATIO[method] / METHOD_STEP_RATIO[self.method]
        return StepCost(self.train * ratio, self.eval, method, self.measured, self.per_step * ratio)

    def scaled(self, factor: float) -> StepCost:
        """Every figure ``factor`` times as long (a CPU shared with more work than when measured)."""
        return StepCost(self.train * factor, self.eval * factor, self.method, self.measured, self.per_step * factor)


def prior_step_cost(train: TrainConfig, params: int, cost: CostModel | None = None) -> StepCost:
    """The GPU prior: seconds per token·parameter x parameters, LoRA's step ratio, the forward's share."""
    per_token = (cost or CostModel()).seconds_per_token_param * params
    return StepCost(per_token * METHOD_STEP_RATIO[train.method], per_token * FORWARD_SHARE, train.method)


def trial_seconds(size: DataVolume, train: TrainConfig, params: int, cost: CostModel | None = None,
                  step: StepCost | None = None) -> float:
    """One trial's predicted seconds in its training loop: on one whole GPU (the prior ``cost``), or on
    one CPU trial slot when ``step`` was measured there. Start-up is not in it (sweep.plan.eta)."""
    step = step.for_method(train.method) if step is not None else prior_step_cost(train, params, cost)
    rows = trained_rows(size, train)
    evaluated = evaluations(rows, train) * evaluated_rows(size, train)
    if not step.measured:  # real tokens; every row at full length under max_length padding
        tokens = train.max_seq_length if train.padding == "max_length" and not size.blocks else size.mean_tokens
        return tokens * (rows * train.epochs * step.train + evaluated * step.eval)
    steps = math.ceil(rows / train.batch_size) * train.epochs
    trained = rows * train.epochs * computed_tokens(size, train, train.batch_size, train.group_by_length)
    return (trained * step.train + steps * step.per_step
            + evaluated * computed_tokens(size, train, train.eval_batch_size) * step.eval)


def sweep_trials(settings: Settings, sizes: Mapping[str, DataVolume], params: int,
                 cost: CostModel | None = None, step: StepCost | None = None) -> list[TrialWork]:
    """Every trial of the sweep (task x seed x grid point) with its predicted seconds (``trial_seconds``).

    A grid point that sets ``epochs``, ``max_train_samples``, ``method``… changes its trials' cost.
    """
    trials = []
    for index, point in enumerate(grid_points(settings.sweep)):
        train = with_hparams(settings.train, point)
        for spec in settings.tasks:
            seconds = trial_seconds(sizes[spec.name], train, params, cost, step)
            trials += [TrialWork(spec.name, seed, seconds, index) for seed in settings.sweep.seeds]
    return trials


def measure_sizes(settings: Settings, sources) -> tuple[dict[str, DataVolume], int]:
    """Each task's size and the model's parameter count, read from the staged sources (``LocalSources``)."""
    from sweep.train.loading import load_tokenizer

    model_dir, data_dir = Path(sources.model_dir), Path(sources.data_dir)
    tokenizer = load_tokenizer(model_dir)
    sizes, failed = {}, {}
    for spec in settings.tasks:
        try:
            sizes[spec.name] = task_size(spec, data_dir, tokenizer, settings.train)
        except (DataFormatError, OSError, ValueError) as e:  # a plan is no reason to stop the other tasks
            failed[spec.name] = first_line(e)
    known = list(sizes.values())
    rows = round(sum(s.rows for s in known) / len(known)) if known else 1
    tokens = sum(s.mean_tokens for s in known) / len(known) if known else 1.0
    evals = (round(sum(sum(s.eval_rows) for s in known) / len(known)),) if known else ()
    for name, error in failed.items():
        sizes[name] = DataVolume(name, rows, tokens, error=error, eval_rows=evals)
    return {spec.name: sizes[spec.name] for spec in settings.tasks}, model_params(model_dir)


