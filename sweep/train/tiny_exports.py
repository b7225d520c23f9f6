"""Tiny servable models, built offline, in the layout a sweep exports (for tests, the benchmark, a demo).

``best/<TASK>/`` of a sweep holds a ``save_pretrained`` model with its tokenizer and
``sweep_made_by.json``; these are the same, untrained: a RoBERTa classifier with RTE's head and a
GPT-2 language model.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from omegaconf import OmegaConf

from sweep.config.tasks import CONF_DIR, load_task
from sweep.models.local_folder import resolve_model_dir
from sweep.models.quiet import quiet_transformers
from sweep.results.export_layout import MADE_BY
from sweep.train.loading import load_for_task


def model_spec(name: str) -> dict:
    """A model config as conf/model/<name>.yaml defines it (the one home of the tiny models' shapes)."""
    return OmegaConf.to_container(OmegaConf.load(CONF_DIR / "model" / f"{name}.yaml"), resolve=True)


TINY_ROBERTA = model_spec("tiny-roberta")
TINY_GPT2 = model_spec("tiny-gpt2")
CLASSIFIER_TASK = "RTE"
LM_TASK = "wikitext-2"


def _made_by(model: str, task: str) -> str:
    return json.dumps({"task": task, "seed": 0, "model": model, "hparams": {}, "score": None,
                       "note": "untrained tiny model"})


def export_tiny_classifier(dest: Path, cache_dir: Path) -> Path:
    """``dest`` = an RTE classifier on the tiny RoBERTa, published as ``tiny-roberta-RTE``."""
    tokenizer, model = load_for_task(resolve_model_dir(TINY_ROBERTA, cache_dir), load_task(CLASSIFIER_TASK))
    dest.mkdir(parents=True, exist_ok=True)
    with quiet_transformers():
        model.save_pretrained(dest)
        tokenizer.save_pretrained(dest)
    (dest / MADE_BY).write_text(_made_by(TINY_ROBERTA["name"], CLASSIFIER_TASK))
    return dest


def export_tiny_lm(dest: Path, cache_dir: Path) -> Path:
    """``dest`` = the tiny GPT-2 language model, published as ``tiny-gpt2-wikitext-2``."""
    shutil.copytree(resolve_model_dir(TINY_GPT2, cache_dir), dest, dirs_exist_ok=True)
    (dest / MADE_BY).write_text(_made_by(TINY_GPT2["name"], LM_TASK))
    return dest
