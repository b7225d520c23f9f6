"""Batches for the training loop: a list of tokenized rows -> padded tensors.

Classes rather than closures, so that DataLoader worker processes can pickle them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase

PADDING_MODES = ("dynamic", "max_length")
IGNORE_INDEX = -100  # labels the loss skips (padding of a short last LM block)


@dataclass
class PaddingCollator:
    """Pads a list of tokenized rows into tensors; a class (not a closure) so DataLoader workers can pickle it."""

    tokenizer: PreTrainedTokenizerBase
    padding: str = "dynamic"
    max_length: int = 128

    def __post_init__(self) -> None:
        if self.padding not in PADDING_MODES:
            raise ValueError(f"padding={self.padding!r} is not supported; allowed: {', '.join(PADDING_MODES)}")
        if self.tokenizer.pad_token is None:
            raise ValueError(
                f"tokenizer {self.tokenizer.name_or_path!r} has no pad token; set one (e.g. the eos token) first"
            )
        strategy = "longest" if self.padding == "dynamic" else "max_length"
        self._pad = DataCollatorWithPadding(self.tokenizer, padding=strategy, max_length=self.max_length)

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        inputs = [{k: v for k, v in row.items() if k != "labels"} for row in rows]
        if self.padding == "max_length":
            longest = max(len(row["input_ids"]) for row in inputs)
            if longest > self.max_length:
                raise ValueError(
                    f"a row has {longest} tokens, more than the collator's max_length={self.max_length}; "
                    "tokenize with the same or a smaller max_length"
                )
        batch = dict(self._pad(inputs))
        if "labels" in rows[0]:
            batch["labels"] = _label_tensor([row["labels"] for row in rows])
        return batch


def _label_tensor(labels: list[Any]) -> torch.Tensor:
    """Regression scores as float32 (MSE loss), class indices as int64 (cross-entropy)."""
    values = [x.item() if hasattr(x, "item") else x for x in labels]
    dtype = torch.float32 if isinstance(values[0], float) else torch.int64
    return torch.tensor(values, dtype=dtype)


def make_collator(
    tokenizer: PreTrainedTokenizerBase, padding: str = "dynamic", max_length: int = 128
) -> PaddingCollator:
    """A collator: padding="dynamic" pads each batch to its longest row; "max_length" pads every
    batch to max_length (the original workflow's behaviour, kept for the benchmark)."""
    return PaddingCollator(tokenizer, padding, max_length)


class TokenCount(NamedTuple):
    real: int  # non-pad tokens (attention_mask sum)
    padded: int  # tokens the model computes on, padding included


def count_tokens(batch: dict[str, torch.Tensor]) -> TokenCount:
    mask = batch["attention_mask"]
    return TokenCount(real=int(mask.sum()), padded=int(mask.numel()))


@dataclass
class LMCollator:
    """Blocks -> input_ids, attention_mask and labels (= input_ids; padding of a short block is
    masked out of attention and loss). A class so DataLoader workers can pickle it."""

    pad_token_id: int

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        longest = max(len(row["input_ids"]) for row in rows)
        input_ids = torch.full((len(rows), longest), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), longest), dtype=torch.long)
        for i, row in enumerate(rows):
            n = len(row["input_ids"])
            input_ids[i, :n] = torch.as_tensor(row["input_ids"], dtype=torch.long)
            attention_mask[i, :n] = 1
        labels = input_ids.masked_fill(attention_mask == 0, IGNORE_INDEX)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def make_lm_collator(tokenizer: PreTrainedTokenizerBase) -> LMCollator:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return LMCollator(pad if pad is not None else 0)
