"""Parameter-efficient fine-tuning (train.method=lora|qlora) through Hugging Face PEFT.

The base model is frozen and LoRA adapters train on its attention projections; the task head
(``classifier`` / ``score``) trains in full, as PEFT's sequence-classification task does. A
checkpoint holds only what trains (``adapter_model.safetensors``, ``adapter_config.json``, a few MB);
the export merges it into the base (``merge_and_unload``) so the server, KServe and ``sweep infer``
load a plain ``save_pretrained`` folder, with the adapter beside it for one-base-many-adapters users.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from sweep.config.settings import TrainConfig
from sweep.config.tasks import TaskSpec
from sweep.errors import ConfigError
from sweep.results.export_layout import ADAPTER_FOLDER

ADAPTER_CONFIG = "adapter_config.json"  # PEFT's: a checkpoint folder holding an adapter, not a whole model

# PEFT 0.21 reads transformers' deprecated is_gradient_checkpointing on every wrap and save: noise in a sweep's log.
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)


def is_adapter_folder(folder: Path) -> bool:
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def default_targets(model_type: str) -> list[str] | None:
    """PEFT's own LoRA targets for an architecture (RoBERTa/BERT ``query,value``; GPT-2 ``c_attn``)."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    targets = DEFAULTS.get(model_type)
    return list(targets) if targets else None


def lora_config(spec: TaskSpec, train: TrainConfig, model_type: str):
    """PEFT's LoraConfig for the task: causal LM, or sequence classification (which trains the head)."""
    from peft import LoraConfig, TaskType

    targets = train.lora.target_modules or default_targets(model_type)
    if targets is None:
        raise ConfigError(f"train.lora.target_modules: PEFT has no default for a {model_type!r} model; name the "
                          "attention projections to adapt, e.g. train.lora.target_modules=[query,value]")
    return LoraConfig(
        task_type=TaskType.CAUSAL_LM if spec.kind == "causal_lm" else TaskType.SEQ_CLS,
        r=train.lora.r, lora_alpha=train.lora.alpha, lora_dropout=train.lora.dropout,
        target_modules=list(targets),
        fan_in_fan_out=model_type == "gpt2",  # GPT-2's Conv1D stores its weight transposed
    )


def adaptable_names(model: torch.nn.Module) -> list[str]:
    """The last names of the model's linear layers: what ``train.lora.target_modules`` may name."""
    from transformers.pytorch_utils import Conv1D

    return sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                   if isinstance(module, (torch.nn.Linear, Conv1D)) and name})


def check_targets(model_dir: Path, train: TrainConfig, model_name: str | None = None) -> None:
    """Every target module names a layer of the model (built on the meta device: no weights read).

    Raises one ConfigError line listing the names to choose from; a no-op for full fine-tuning."""
    if train.method == "full":
        return
    from transformers import AutoConfig, AutoModel

    from sweep.models.quiet import quiet_transformers

    with quiet_transformers():
        config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
        with torch.device("meta"):
            model = AutoModel.from_config(config)
    names = adaptable_names(model)
    targets = train.lora.target_modules or default_targets(config.model_type) or []
    unknown = [t for t in targets if t not in names]
    if unknown or not targets:
        model = model_name or Path(model_dir).name
        raise ConfigError(f"train.lora.target_modules: {', '.join(unknown) or '(none)'} matches no layer of "
                          f"{model} ({config.model_type}); choose from: {', '.join(names)}")


def check_method_runs_here(train: TrainConfig, cluster_address: str | None = None) -> None:
    """QLoRA's 4-bit base needs bitsandbytes on a CUDA GPU: one line before any trial where there is none.

    On a cluster the GPUs and packages are the workers' (the driver may have neither): checked here only
    for a local Ray; a worker without them fails its trial with the same line."""
    if train.method != "qlora" or cluster_address is not None:
        return
    if not torch.cuda.is_available():
        raise ConfigError("train.method=qlora: a 4-bit base (bitsandbytes) needs a CUDA GPU and this machine has "
                          "none; use train.method=lora (the same adapters on a full-precision base)")
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise ConfigError("train.method=qlora: bitsandbytes is not installed; pip install bitsandbytes") from None


def quantization(train: TrainConfig) -> dict[str, Any]:
    """``from_pretrained`` keywords for the method: a 4-bit NF4 base for QLoRA (bf16 compute), else none."""
    if train.method != "qlora":
        return {}
    from transformers import BitsAndBytesConfig

    return {"quantization_config": BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16)}


def with_adapters(model, spec: TaskSpec, train: TrainConfig, resume_from: Path | None = None):
    """The base wrapped for training: new LoRA adapters, or the ones a checkpoint saved (resume)."""
    from peft import PeftModel, get_peft_model, prepare_model_for_kbit_training

    if train.method == "qlora":
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=train.gradient_checkpointing)
    if resume_from is not None and is_adapter_folder(resume_from):
        return PeftModel.from_pretrained(model, resume_from, is_trainable=True)
    return get_peft_model(model, lora_config(spec, train, model.config.model_type))


def trainable_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, all) parameters, as PEFT's ``print_trainable_parameters`` counts them."""
    if hasattr(model, "get_nb_trainable_parameters"):
        return model.get_nb_trainable_parameters()
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def export_merged(checkpoint: Path, base_dir: Path, spec: TaskSpec, target: Path) -> None:
    """Into ``target``: the base with the checkpoint's adapter merged in (a plain ``save_pretrained``
    folder with the tokenizer), and the adapter itself under ``target/adapter/``."""
    from peft import PeftModel

    from sweep.train.loading import load_for_task, load_tokenizer

    _, base = load_for_task(Path(base_dir), spec)
    merged = PeftModel.from_pretrained(base, checkpoint).merge_and_unload()
    merged.save_pretrained(target)
    load_tokenizer(Path(checkpoint)).save_pretrained(target)
    adapter = Path(target) / ADAPTER_FOLDER
    adapter.mkdir(parents=True, exist_ok=True)
    for path in Path(checkpoint).iterdir():
        if path.name.startswith("adapter_"):
            shutil.copy2(path, adapter / path.name)
