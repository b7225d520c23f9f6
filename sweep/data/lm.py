"""Causal language modelling data: text files -> token ids -> fixed-size blocks (cached per node).

A corpus is a folder: ``<data_dir>/<spec.folder>`` (WikiText-2: ``wiki.{train,valid,test}.tokens``)
or ``spec.path`` (the ``text`` task: any folder of ``.txt`` files). Each split's files are read
in name order, each file one document; lines are tokenized one by one (as HF's ``run_clm`` does
with WikiText's rows) and concatenated, with the eos token between documents. The train split
is cut into blocks of ``train.block_size`` tokens (the remainder dropped); an eval split keeps
its tail as a last, shorter block, so perplexity covers every token. An eval split whose file is
null is held out: the last ``spec.holdout_fraction`` of the train blocks, tail included.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
from datasets import Dataset, DatasetDict, DatasetInfo, Features, Sequence, Value
from datasets.table import InMemoryTable
from transformers import PreTrainedTokenizerBase

from sweep.config.model_limits import too_long
from sweep.config.tasks import TaskSpec
from sweep.data.cache import cache_stats, cached_dataset, content_key, tokenizer_identity
from sweep.data.task_files import empty_corpus, split_files
from sweep.errors import ConfigError, DataFormatError

# Bump when the block format changes, so that old caches are not reused.
LM_FORMAT_VERSION = 1
LINES_PER_CALL = 2048  # lines handed to the fast tokenizer at once


class BlockSizeError(ConfigError):
    """train.block_size does not fit the model; the message says what to set."""


# --------------------------------------------------------------------------------------------
# Finding the files
# --------------------------------------------------------------------------------------------



def check_block_fits(block_size: int, positions: int | None, model: str) -> None:
    """In the trial, against the loaded model's positions (``usable_positions``): what
    sweep.config.model_limits checks before any trial, with the same message."""
    if positions is not None and block_size > positions:
        raise BlockSizeError(too_long("train.block_size", block_size, model, positions))


# --------------------------------------------------------------------------------------------
# Reading, tokenizing, cutting into blocks
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SplitText:
    documents: list[str]  # one per file
    digest: str  # sha256 over the files' names and bytes


def read_split(spec: TaskSpec, split: str, files: list[Path]) -> SplitText:
    h = hashlib.sha256()
    documents = []
    for path in files:
        raw = path.read_bytes()
        h.update(path.name.encode() + b"\0" + hashlib.sha256(raw).digest())
        try:
            text = raw.decode("utf-8").removeprefix("\ufeff")
        except UnicodeDecodeError as e:
            raise DataFormatError(f"{path}: not UTF-8 text ({e}); save it as UTF-8") from e
        if text.strip():
            documents.append(text)
    if not documents:
        raise empty_corpus(spec, split, files)
    return SplitText(documents, h.hexdigest())


def token_ids(documents: list[str], tokenizer: PreTrainedTokenizerBase) -> np.ndarray:
    """All documents as one id sequence: lines tokenized one by one, eos between documents."""
    chunks: list[np.ndarray] = []
    eos = tokenizer.eos_token_id
    for i, doc in enumerate(documents):
        if i and eos is not None:
            chunks.append(np.asarray([eos], dtype=np.int32))
        lines = doc.splitlines(keepends=True)
        for start in range(0, len(lines), LINES_PER_CALL):
            # no special tokens per line; verbose=False: a line longer than the model is fine here
            enc = tokenizer(lines[start:start + LINES_PER_CALL], add_special_tokens=False, verbose=False)
            chunks.append(np.fromiter(itertools.chain.from_iterable(enc["input_ids"]), dtype=np.int32))
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int32)


def cut_blocks(ids: np.ndarray, block_size: int, keep_tail: bool) -> list[np.ndarray]:
    """Consecutive blocks of block_size ids; the shorter tail is kept only when asked (eval)."""
    n_full = len(ids) // block_size
    blocks = list(ids[: n_full * block_size].reshape(n_full, block_size))
    tail = ids[n_full * block_size:]
    if keep_tail and len(tail) >= 2:  # a block of one token predicts nothing
        blocks.append(tail)
    return blocks


def lm_blocks(
    spec: TaskSpec,
    tokenizer: PreTrainedTokenizerBase,
    data_dir: str | Path,
    block_size: int,
    cache_dir: str | Path | None,
) -> DatasetDict:
    """Every split as a Dataset of ``input_ids`` blocks; cached under ``cache_dir/tokenized/<key>``,
    the key made of the files' contents, the tokenizer, block_size and the hold-out."""
    if block_size < 2:
        raise ValueError(f"block_size must be at least 2 tokens, got {block_size}")
    files = split_files(spec, data_dir)
    texts = {split: read_split(spec, split, paths) for split, paths in files.items() if paths}
    if cache_dir is None:
        cache_stats.misses += 1
        return _blocks(spec, texts, tokenizer, block_size)
    key = content_key(
        LM_FORMAT_VERSION, spec.name, json.dumps({s: t.digest for s, t in sorted(texts.items())}),
        json.dumps({s: f for s, f in spec.eval_files.items()}), spec.holdout_fraction,
        tokenizer_identity(tokenizer), block_size,
    )
    return cached_dataset(cache_dir, key, lambda: _blocks(spec, texts, tokenizer, block_size),
                          f"blocks of {block_size} for {spec.name}")


def _blocks(
    spec: TaskSpec, texts: dict[str, SplitText], tokenizer: PreTrainedTokenizerBase, block_size: int
) -> DatasetDict:
    ids = {split: token_ids(text.documents, tokenizer) for split, text in texts.items()}
    blocks = {split: cut_blocks(seq, block_size, keep_tail=split != "train") for split, seq in ids.items()}
    held_out = [split for split, file in spec.eval_files.items() if file is None]
    if held_out:
        blocks["train"], blocks[held_out[0]] = _hold_out(spec, ids["train"], block_size)
    for split, rows in blocks.items():
        if not rows:
            raise DataFormatError(
                f"task {spec.name}: split {split!r} has {len(ids.get(split, ids['train']))} tokens, fewer than one "
                f"block of train.block_size={block_size}; add text or lower train.block_size"
            )
    return DatasetDict({split: _to_dataset(rows) for split, rows in blocks.items()})


def _to_dataset(blocks: list[np.ndarray]) -> Dataset:
    """One arrow list column, built from the flat ids and block offsets (no Python int per token)."""
    offsets = np.zeros(len(blocks) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in blocks], out=offsets[1:])
    column = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(np.concatenate(blocks), type=pa.int32()))
    features = Features({"input_ids": Sequence(Value("int32"))})
    table = pa.table({"input_ids": column.cast(features.arrow_schema.field("input_ids").type)})
    return Dataset(InMemoryTable(table), info=DatasetInfo(features=features))


def _hold_out(spec: TaskSpec, ids: np.ndarray, block_size: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Train blocks and the held-out blocks: the corpus's last holdout_fraction, tail included."""
    full = cut_blocks(ids, block_size, keep_tail=False)
    if len(full) < 2:
        raise DataFormatError(
            f"task {spec.name}: the corpus has {len(ids)} tokens, fewer than two blocks of "
            f"train.block_size={block_size} (one to train on, one held out); add text or lower train.block_size"
        )
    n_held = min(len(full) - 1, max(1, round(spec.holdout_fraction * len(full))))
    cut = (len(full) - n_held) * block_size
    return full[: len(full) - n_held], cut_blocks(ids[cut:], block_size, keep_tail=True)
