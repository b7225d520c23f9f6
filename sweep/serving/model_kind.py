"""What a model folder holds, from its ``config.json`` alone (no torch): a sequence classifier or a causal LM.

The folder's ``config.json`` says what it is: a ``*ForSequenceClassification`` (a GLUE task; ``num_labels == 1``
is a regression head) or a causal LM (``*ForCausalLM`` / ``*LMHeadModel``). Light on purpose: the server
knows before its heavy imports whether to start a decoding process.
"""

from __future__ import annotations

import json
from pathlib import Path

CLASSIFIER = "classification"
CAUSAL_LM = "causal_lm"


class ModelKindError(ValueError):
    """The folder holds neither a sequence classifier nor a causal LM."""


def model_kind(model_dir: Path) -> str:
    config_file = Path(model_dir) / "config.json"
    try:
        architectures = json.loads(config_file.read_text()).get("architectures") or []
    except (OSError, json.JSONDecodeError) as e:
        raise ModelKindError(f"{config_file}: cannot read the model config ({e})") from None
    for arch in architectures:
        if arch.endswith("ForSequenceClassification"):
            return CLASSIFIER
        if arch.endswith(("ForCausalLM", "LMHeadModel")):
            return CAUSAL_LM
    raise ModelKindError(
        f"{config_file}: architectures {architectures} is neither a sequence classifier nor a causal LM; "
        "serve a folder exported by a sweep (best/<TASK>/)"
    )
