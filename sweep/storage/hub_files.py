"""Which files of a Hugging Face Hub repo a sweep needs (plain functions of the repo's file list).

A model needs its config, its tokenizer and one copy of its weights: safetensors where the repo has
them (``.bin``, ``.h5``, ``.msgpack``, ``.onnx`` and sub-folders such as ``onnx/`` are left on the Hub),
else PyTorch's ``.bin``. A dataset needs the parquet files of the splits its tasks read
(``rte/train-00000-of-00001.parquet``): nyu-mll/glue holds every GLUE task, and a sweep fetches only its own.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable

# Top-level files a model folder reads besides its weights (config, tokenizer, generation defaults).
MODEL_SIDE_FILES = (
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json", "vocab.json", "merges.txt", "vocab.txt", "chat_template.jinja", "chat_template.json",
    "preprocessor_config.json",
)
TOKENIZER_MODELS = ("*.model", "*.tiktoken")  # sentencepiece (spiece.model), tiktoken vocabularies
SAFETENSORS = ("model.safetensors", "model-*-of-*.safetensors", "model.safetensors.index.json")
PYTORCH_BIN = ("pytorch_model.bin", "pytorch_model-*-of-*.bin", "pytorch_model.bin.index.json")


def _matching(files: Iterable[str], patterns: Iterable[str]) -> list[str]:
    patterns = tuple(patterns)
    return sorted(f for f in files if "/" not in f and any(fnmatch.fnmatchcase(f, p) for p in patterns))


def model_files(repo_files: Iterable[str]) -> list[str]:
    """The files of a model repo to fetch: config, tokenizer, and the safetensors weights (else the .bin)."""
    files = list(repo_files)
    weights = _matching(files, SAFETENSORS) or _matching(files, PYTORCH_BIN)
    return sorted({*_matching(files, MODEL_SIDE_FILES + TOKENIZER_MODELS), *weights})


def model_lacks(selected: Iterable[str]) -> list[str]:
    """What a selection misses to be loadable: its config, or any weights."""
    selected = set(selected)
    missing = [] if "config.json" in selected else ["config.json"]
    if not _matching(selected, SAFETENSORS + PYTORCH_BIN):
        missing.append("weights (model.safetensors or pytorch_model.bin)")
    return missing


def dataset_files(repo_files: Iterable[str], wanted: Iterable[tuple[str, str]]) -> list[str]:
    """The parquet files of each (config folder, split) a sweep reads: ``rte``'s train and validation, not
    its test split (nor the other tasks' folders)."""
    files = list(repo_files)
    return sorted({f for folder, split in wanted for f in split_files(files, folder, split)})


def split_files(selected: Iterable[str], folder: str, split: str) -> list[str]:
    """A split's parquet files in a config's folder, as ``datasets``' push_to_hub names them (and
    ``sweep.data.glue`` reads them): ``rte/validation-00000-of-00001.parquet`` for ``validation``."""
    return sorted(f for f in selected if fnmatch.fnmatchcase(f, f"{folder.strip('/')}/{split}-*.parquet"))
