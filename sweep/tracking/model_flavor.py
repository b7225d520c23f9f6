"""The best model per task as an MLflow Model: MLflow's own ``transformers`` flavor, logged on the
best trial's run, so the registry's versions load with ``mlflow.pyfunc.load_model``, serve with
``mlflow models serve`` and KServe's ``mlflow`` format, and open in MLflow's evaluation.

Layout of a logged model (MLflow's): ``MLmodel``, ``model/`` (config and weights),
``components/tokenizer/``, the environment files, the input example. ``assemble_model_folder``
turns that back into one ``save_pretrained`` folder for ``python -m sweep serve``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sweep.config.tasks import TaskSpec
from sweep.results.export_layout import ADAPTER_FOLDER, MADE_BY, MODEL_DIR, TOKENIZER_DIR

# Greedy, the new tokens only: what `python -m sweep serve` answers at temperature 0 (a caller's
# `params` of the same names change them per request).
GENERATION = {"max_new_tokens": 32, "do_sample": False, "return_full_text": False}
METADATA_KEY = "sweep"  # MLmodel metadata: how the model was made (the export's sweep_made_by.json)


def pipeline_task(spec: TaskSpec) -> str:
    """The transformers pipeline that fits the task (regression is a one-logit text classification)."""
    return "text-generation" if spec.kind == "causal_lm" else "text-classification"


def input_example(spec: TaskSpec):
    """A small input in the shape the pyfunc takes: prompts, sentences, or (text, text_pair) rows."""
    import pandas as pd

    if spec.kind == "causal_lm":
        return ["The history of the city"]
    if spec.is_pair:
        return pd.DataFrame({"text": ["The cat sat on the mat.", "It rained all day."],
                             "text_pair": ["A cat was sitting.", "The weather was dry."]})
    return ["a gripping, well acted film", "the plot never comes together"]


def model_signature(pipe, example, generation: dict[str, Any] | None):
    """Inputs and outputs as the pipeline gives them on ``example``; for generation, its settings as
    params a request may change."""
    import pandas as pd
    from mlflow.models import infer_signature

    if generation is not None:
        outputs = [out[0]["generated_text"] for out in pipe(example, **generation)]
        return infer_signature(example, outputs, params=generation)
    rows = example.to_dict("records") if isinstance(example, pd.DataFrame) else example
    return infer_signature(example, pd.DataFrame(pipe(rows)))


def pip_requirements() -> list[str]:
    """Pinned from this environment: MLflow's own guess adds torchvision, which serving never imports."""
    import torch
    import transformers

    return [f"transformers=={transformers.__version__}", f"torch=={torch.__version__.split('+')[0]}"]


@contextmanager
def tracking_at(uri: str) -> Iterator[None]:
    """MLflow's fluent API (the flavor's ``log_model``) at ``uri``, the caller's setting restored after."""
    import mlflow

    before = mlflow.get_tracking_uri() if mlflow.is_tracking_uri_set() else None
    offline = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"  # the flavor looks for a model card on the hub: a local folder has none
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(before)
        if offline is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = offline


@contextmanager
def _quiet_flavor() -> Iterator[None]:
    """Without the flavor's warnings about a model card and a license on the hub: an exported folder has neither."""
    import logging

    flavor = logging.getLogger("mlflow.transformers")
    level = flavor.level
    flavor.setLevel(logging.ERROR)
    try:
        yield
    finally:
        flavor.setLevel(level)


def log_best_model(uri: str, run_id: str, model_dir: Path, spec: TaskSpec):
    """Log the exported ``model_dir`` with the transformers flavor on ``run_id``; MLflow's ``ModelInfo``."""
    import mlflow
    from transformers import pipeline

    model_dir = Path(model_dir)
    made_by = json.loads((model_dir / MADE_BY).read_text()) if (model_dir / MADE_BY).is_file() else {}
    task = pipeline_task(spec)
    pipe = pipeline(task, model=str(model_dir), tokenizer=str(model_dir), device="cpu")
    example = input_example(spec)
    generation = GENERATION if task == "text-generation" else None
    with tracking_at(uri), _quiet_flavor(), mlflow.start_run(run_id=run_id, log_system_metrics=False):
        info = mlflow.transformers.log_model(
            pipe, name="model", task=task, signature=model_signature(pipe, example, generation),
            input_example=example, pip_requirements=pip_requirements(), model_config=generation,
            metadata={METADATA_KEY: made_by})
    adapter = model_dir / ADAPTER_FOLDER
    if adapter.is_dir():  # LoRA: the adapter (MiBs, not the model's GiBs) beside the merged model it made
        mlflow.MlflowClient(uri).log_model_artifacts(info.model_id, str(adapter), ADAPTER_FOLDER)
    return info


def assemble_model_folder(logged: Path, target: Path) -> None:
    """One ``save_pretrained`` folder in ``target`` from a downloaded logged model: the weights, the
    tokenizer beside them, and ``sweep_made_by.json`` from the MLmodel's metadata (the server's names)."""
    import yaml

    logged, target = Path(logged), Path(target)
    for part in (MODEL_DIR, TOKENIZER_DIR):
        if (logged / part).is_dir():
            shutil.copytree(logged / part, target, dirs_exist_ok=True)
    meta: dict[str, Any] = (yaml.safe_load((logged / "MLmodel").read_text()) or {}).get("metadata") or {}
    if meta.get(METADATA_KEY):
        (target / MADE_BY).write_text(json.dumps(meta[METADATA_KEY], indent=2))
