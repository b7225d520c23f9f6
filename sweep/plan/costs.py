"""Each trial's predicted cost, from the staged data and model, before any trial runs.

``sweep.plan.makespan``'s cost model wants ``rows x mean tokens x epochs x model parameters``: rows come
from the task's training file (capped by ``train.max_train_samples``), mean tokens from the
model's own tokenizer on a sample of rows (truncated at ``train.max_seq_length`` as training does),
parameters from the model's config (built on torch's meta device: no weights are read). A causal-LM
corpus is blocks of ``train.block_size`` tokens: rows = its estimated tokens / block size.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweep.config.settings import Settings, TrainConfig, with_hparams
from sweep.config.tasks import TaskSpec
from sweep.errors import DataFormatError
from sweep.failures import first_line
from sweep.plan.makespan import DEFAULT_SPEEDUP, CostModel, Speedup, TrialWork

SAMPLE_ROWS = 512  # enough for a mean within a few percent; tokenizing all of MNLI would take a minute


@dataclass(frozen=True)
class TaskSize:
    task: str
    rows: int  # training rows one epoch reads, before train.max_train_samples
    mean_tokens: float  # tokens per row, after truncation to max_seq_length (LM: block_size)
    blocks: bool = False  # causal LM: every row is a full block, padding changes nothing
    error: str = ""  # the data did not read: sized as the mean of the others (its trials report the error)


def grid_points(settings: Settings) -> list[dict[str, Any]]:
    """The sweep's grid as a list of points (one empty point without a grid), in a fixed order."""
    grid = settings.sweep.grid
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


def task_size(spec: TaskSpec, data_dir: Path, tokenizer, train: TrainConfig) -> TaskSize:
    """Rows and mean tokens of the task's training split, measured on a sample of its rows."""
    rng = random.Random(0)
    if spec.kind == "causal_lm":
        from sweep.data.lm import read_split, split_files

        documents = read_split(spec, "train", split_files(spec, data_dir)["train"]).documents
        lines = [line for doc in documents for line in doc.splitlines() if line.strip()]
        sample = rng.sample(lines, min(SAMPLE_ROWS, len(lines)))
        tokens_per_char = sum(len(tokenizer(line)["input_ids"]) for line in sample) / max(1, sum(map(len, sample)))
        total_tokens = tokens_per_char * sum(len(doc) for doc in documents)
        if any(f is None for f in spec.eval_files.values()):  # the corpus' tail is held out for evaluation
            total_tokens *= 1 - spec.holdout_fraction
        return TaskSize(spec.name, max(1, math.ceil(total_tokens / train.block_size)), float(train.block_size), True)
    from sweep.data.glue import load_task_data

    rows = load_task_data(spec, data_dir)["train"]
    picked = rows.select(sorted(rng.sample(range(len(rows)), min(SAMPLE_ROWS, len(rows)))))
    columns = ["text_a", "text_b"] if "text_b" in picked.column_names else ["text_a"]
    encoded = tokenizer(*(list(picked[c]) for c in columns), truncation=True, max_length=train.max_seq_length)
    lengths = [len(ids) for ids in encoded["input_ids"]]
    return TaskSize(spec.name, len(rows), sum(lengths) / max(1, len(lengths)))


# A training step's time with the method over full fine-tuning's, on the same model and batch: LoRA skips
# the frozen weights' gradients and their optimizer update but still runs the whole forward and most of
# the backward (activations' gradients). Measured by scripts/bench_peft.py: MiniLM, real SST-2 (4,000 rows,
# 2 epochs, 3 seeds, a quiet 2-core CPU) 469 / 582 ms per step = 0.81; RTE (1,000 rows, longer rows) gave
# 0.64-0.96 per seed on a busy machine. A running sweep's own throughput refines the constant (Forecast).
# QLoRA's 4-bit base is unmeasured (no GPU here) and takes LoRA's.
METHOD_STEP_RATIO = {"full": 1.0, "lora": 0.81, "qlora": 0.81}


def trial_seconds(size: TaskSize, train: TrainConfig, params: int, cost: CostModel) -> float:
    """One trial's predicted seconds on one whole GPU."""
    rows = min(size.rows, train.max_train_samples) if train.max_train_samples else size.rows
    # padding=max_length computes every row at full length, padding included
    tokens = train.max_seq_length if train.padding == "max_length" and not size.blocks else size.mean_tokens
    return cost.seconds(rows, tokens, train.epochs, params) * METHOD_STEP_RATIO[train.method]


def sweep_trials(settings: Settings, sizes: Mapping[str, TaskSize], params: int,
                 cost: CostModel | None = None) -> list[TrialWork]:
    """Every trial of the sweep (task x seed x grid point) with its predicted one-GPU seconds.

    A grid point that sets ``epochs`` or ``max_train_samples`` changes its trials' cost.
    """
    cost = cost or CostModel()
    trials = []
    for index, point in enumerate(grid_points(settings)):
        train = with_hparams(settings.train, point)
        for spec in settings.tasks:
            seconds = trial_seconds(sizes[spec.name], train, params, cost)
            trials += [TrialWork(spec.name, seed, seconds, index) for seed in settings.sweep.seeds]
    return trials


def measure_sizes(settings: Settings, sources) -> tuple[dict[str, TaskSize], int]:
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
    for name, error in failed.items():
        sizes[name] = TaskSize(name, rows, tokens, error=error)
    return {spec.name: sizes[spec.name] for spec in settings.tasks}, model_params(model_dir)



class Forecast:
    """The sweep's remaining time from each trial's predicted cost, rescaled as trials report.

    Before any report the prediction is the cost model's prior (published GPU times: meaningless
    on a CPU, so ``remaining`` is None there until the first epoch is measured). Each epoch's real
    tokens/s refines the constant (``CostModel.refine``), converted to one whole GPU by the trial's
    share (a trial on share s runs ``Speedup.seconds(1, s)`` times as long as on one GPU).
    """

    def __init__(self, trials: list[TrialWork], keys: list[Any], shares: Mapping[str, float], params: int,
                 capacity: int, on_gpus: bool, speedup: Speedup = DEFAULT_SPEEDUP, method: str = "full"):
        """``capacity``: the cluster's GPUs (``on_gpus``), else how many CPU trials run at once; ``method``:
        the sweep's train.method (its trials' throughput is converted to full fine-tuning's, which the
        cost constant counts in)."""
        self.cost, self.params, self.capacity, self.speedup = CostModel(), params, max(1, capacity), speedup
        self.step_ratio = METHOD_STEP_RATIO[method]
        self.prior = self.cost.seconds_per_token_param
        self.shares = {task: (s if s > 0 else 1.0) for task, s in shares.items()}  # a CPU trial: one slot
        self.predicted: dict[Any, tuple[str, float, int]] = {}  # key -> task, seconds, trials (search samples)
        for key, t in zip(keys, trials):
            copies = self.predicted.get(key, (t.task, t.gpu_seconds, 0))[2]
            self.predicted[key] = (t.task, t.gpu_seconds, copies + 1)
        self.done: dict[Any, int] = {}
        self.running: dict[str, tuple[Any, float]] = {}  # trial id -> key, share of its epochs done
        self.started: dict[Any, float] = {}  # key -> the epochs its running trials have done, in trials
        self.measured = on_gpus  # the prior is only worth showing where trials run on GPUs
        # The work left, kept per key and in total as trials advance (the progress line asks for it
        # after every report: a sum over every trial there would cost O(trials) each time). A key's
        # duration at its share, x the share, at the prior's scale (Speedup.seconds is linear in time).
        self.weight = {key: self.speedup.seconds(seconds, self.shares.get(task, 1.0)) * self.shares.get(task, 1.0)
                       for key, (task, seconds, _) in self.predicted.items()}
        self.left = {key: self.weight[key] * copies for key, (_, _, copies) in self.predicted.items()}
        self.total_left = sum(self.left.values())

    def observe(self, task: str, tokens: float, seconds: float) -> None:
        if tokens > 0 and seconds > 0 and self.params > 0:
            share_factor = self.speedup.seconds(1.0, self.shares.get(task, 1.0))
            self.cost.refine(tokens / seconds * share_factor * self.step_ratio, self.params)
            self.measured = True

    def advance(self, trial_id: str, key: Any, fraction: float) -> None:
        """A running trial has done ``fraction`` of its epochs: only the rest of it is left."""
        self._stop_running(trial_id)
        fraction = min(max(fraction, 0.0), 1.0)
        self.running[trial_id] = (key, fraction)
        self.started[key] = self.started.get(key, 0.0) + fraction
        self._recount(key)

    def finish(self, key: Any, trial_id: str | None = None) -> None:
        self.done[key] = self.done.get(key, 0) + 1
        self._stop_running(trial_id)
        self._recount(key)

    def _stop_running(self, trial_id: str | None) -> None:
        if trial_id in self.running:
            key, fraction = self.running.pop(trial_id)
            self.started[key] = self.started.get(key, 0.0) - fraction
            self._recount(key)

    def _recount(self, key: Any) -> None:
        if key not in self.predicted:  # a trial the plan did not predict: no share of the forecast
            return
        copies = self.predicted[key][2]
        left = self.weight[key] * max(0.0, copies - self.done.get(key, 0) - self.started.get(key, 0.0))
        self.total_left += left - self.left[key]
        self.left[key] = left

    def remaining(self) -> float | None:
        """The work left (GPU- or slot-seconds: a trial's duration at its share x the share) over the
        capacity; None: nothing measured yet on a CPU cluster."""
        if not self.measured:
            return None
        scale = self.cost.seconds_per_token_param / self.prior
        return max(self.total_left, 0.0) * scale / self.capacity
