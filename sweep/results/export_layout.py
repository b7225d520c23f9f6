"""The layout of an exported model folder (``out_dir/best/<TASK>/``), shared by the export, the server and
the registry: what the sweep writes beside the weights and the name it publishes the model under."""

from __future__ import annotations

import re
from pathlib import Path

MADE_BY = "sweep_made_by.json"  # written beside an exported model: how it was made
ADAPTER_FOLDER = "adapter"  # best/<TASK>/adapter/: a LoRA export's adapter and head beside the merged model
MODEL_DIR, TOKENIZER_DIR = "model", "components/tokenizer"  # MLflow's names inside a logged transformers model


def is_logged_model(folder: Path) -> bool:
    """An MLflow Model's files (the transformers flavor) rather than a ``save_pretrained`` folder. Here, not in
    sweep.tracking, so that a server given a plain folder never imports MLflow (a slow import, paid at each
    start (docs/benchmarks.md: Behind the code's choices))."""
    return (Path(folder) / "MLmodel").is_file() and (Path(folder) / MODEL_DIR).is_dir()


def registry_name(*parts: str) -> str:
    """The registered model's name, ``<model>-<task>``: a hub id's "/" (or any other character the
    registry refuses) becomes "-". The server publishes a model under the same name."""
    return re.sub(r"[^\w\-.]", "-", "-".join(parts))
