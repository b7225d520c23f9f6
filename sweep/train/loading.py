"""Loading a model folder for one task (tokenizer with a pad token, the task's head) and picking
its device."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from sweep.config.tasks import TaskSpec
from sweep.models.quiet import quiet_transformers

log = logging.getLogger(__name__)


# Parameters a task head adds on top of a pretrained body (plus BERT's pooler, absent from MLM
# checkpoints): missing ones are expected at load.
HEAD_PREFIXES = ("classifier.", "score.")


def pick_device(preferred: str = "auto") -> torch.device:
    """The device a model runs on: "auto" is the GPU when torch can use one, else the CPU."""
    if preferred == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(preferred)




# Loading for a task.

def load_tokenizer(model_dir: Path) -> PreTrainedTokenizerBase:
    """The folder's tokenizer, with a pad token (GPT-2-like models pad with eos)."""
    with quiet_transformers():
        tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise ValueError(f"tokenizer in {model_dir} has neither a pad nor an eos token to pad with")
        tok.pad_token = tok.eos_token
    return tok


def _warn_missing_body(model_dir: Path, info: Mapping[str, Any]) -> None:
    """A new head is expected to be missing; missing body weights mean the wrong checkpoint."""
    missing = info.get("missing_keys", ())
    body = sorted(k for k in missing if not (k.startswith(HEAD_PREFIXES) or ".pooler." in k))
    if body:
        log.warning("%s: %d weights not in the checkpoint, randomly initialised: %s",
                    model_dir, len(body), ", ".join(body[:5]) + (" ..." if len(body) > 5 else ""))


def load_for_task(model_dir: Path, spec: TaskSpec,
                  **extra: Any) -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
    """Tokenizer and model with the head ``spec`` needs, from a local folder only (``extra``: more
    ``from_pretrained`` keywords, e.g. QLoRA's quantization config)."""
    tok = load_tokenizer(model_dir)
    kwargs: dict[str, Any] = {"local_files_only": True, "output_loading_info": True, **extra}
    if spec.kind == "causal_lm":
        auto = AutoModelForCausalLM
    elif spec.kind == "regression":
        auto = AutoModelForSequenceClassification
        kwargs.update(num_labels=1, problem_type="regression")
    else:
        auto = AutoModelForSequenceClassification
        labels = spec.labels or ()
        kwargs.update(
            num_labels=spec.num_labels,
            id2label=dict(enumerate(labels)),
            label2id={label: i for i, label in enumerate(labels)},
            problem_type="single_label_classification",
        )
    with quiet_transformers():
        model, info = auto.from_pretrained(model_dir, **kwargs)
    _warn_missing_body(model_dir, info)
    model.config.pad_token_id = tok.pad_token_id  # GPT-2 classification finds the last non-pad token
    return tok, model


