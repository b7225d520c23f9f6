"""Seed soups: one model from the checkpoints of several seeds, averaged in weight space (Wortsman et al.
2022's uniform soup).

LoRA: the mean of the seeds' updates ΔW = s·B·A, never of A and B apart (their product is what the model
adds; PEFT's maintainers on linear adapter mixing, peft#643). That mean is exactly one adapter of rank Σr:
each seed's A scaled by s/k and stacked, the B's side by side (PEFT's own ``cat`` combination, done here on
the saved files because ``add_weighted_adapter`` refuses adapters that each train the head); the head, trained
in full, is the seeds' mean. Full fine-tuning: the mean of the weights. Either only means something when the
seeds share a start (train.init_seed: the same new head and adapters), which the config checks.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from sweep.results.trial_reports import CHECKPOINT_MARKER, TRAINING_STATE
from sweep.train.lora import ADAPTER_CONFIG, is_adapter_folder

ADAPTER_WEIGHTS = "adapter_model.safetensors"  # PEFT's save_pretrained
# LoRA options a stacked adapter cannot carry over exactly (a per-module rank or alpha, DoRA's magnitudes)
UNSUPPORTED = {"rank_pattern": {}, "alpha_pattern": {}, "use_dora": False}


class SoupError(ValueError):
    """The checkpoints cannot be averaged (what differs between them, or what they lack)."""


def write_soup(members: Sequence[Path], target: Path) -> None:
    """Into ``target`` (created): a checkpoint folder that is the mean of ``members`` (2 or more checkpoint
    folders of one task and one base), the same kind as theirs (an adapter, or a whole model) with the
    first one's tokenizer and config; loadable as any trial's checkpoint is."""
    members = [Path(m) for m in members]
    if len(members) < 2:
        raise SoupError(f"a soup needs 2 checkpoints or more, got {len(members)}")
    adapters = [is_adapter_folder(m) for m in members]
    if any(adapters) and not all(adapters):
        raise SoupError("some checkpoints are LoRA adapters and some whole models: they do not average")
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    _copy_beside_weights(members[0], target)
    if all(adapters):
        _adapter_soup(members, target)
    else:
        _weights_soup(members, target)


def _copy_beside_weights(checkpoint: Path, target: Path) -> None:
    """The tokenizer and the model's config (not its weights, not the optimizer's state nor the trial's marker of
    which evaluation it holds: a soup is no one trial's evaluation)."""
    for path in checkpoint.iterdir():
        if path.is_file() and path.suffix not in (".safetensors", ".bin") and path.name not in (
                TRAINING_STATE, CHECKPOINT_MARKER, ADAPTER_CONFIG, "README.md"):
            shutil.copy2(path, target / path.name)


def _mean(states: Sequence[dict[str, torch.Tensor]], what: str) -> dict[str, torch.Tensor]:
    """The tensors' mean, key by key, summed in float32 and kept in each tensor's dtype; integer buffers
    (position ids) are the first's."""
    keys = set(states[0])
    for state in states[1:]:
        if set(state) != keys:
            raise SoupError(f"the seeds' {what} hold different tensors ({sorted(keys ^ set(state))[:3]} …): "
                            "not the same model")
    out = {}
    for key, first in states[0].items():
        if not first.is_floating_point():
            out[key] = first
            continue
        if any(state[key].shape != first.shape for state in states):
            raise SoupError(f"{key} differs in shape between the seeds' {what}")
        total = sum(state[key].float() for state in states)
        out[key] = (total / len(states)).to(first.dtype).contiguous()
    return out


def _weights_soup(members: Sequence[Path], target: Path) -> None:
    """Full fine-tuning: every weights file (a sharded model's each shard) as the mean of the seeds'."""
    names = sorted(p.name for p in members[0].glob("*.safetensors"))
    if not names:
        raise SoupError(f"{members[0]} holds no .safetensors weights to average")
    for name in names:
        missing = [str(m) for m in members if not (m / name).is_file()]
        if missing:
            raise SoupError(f"{name} is missing from {', '.join(missing)}")
        save_file(_mean([load_file(m / name) for m in members], name), target / name, metadata={"format": "pt"})


def _scaling(config: dict) -> float:
    """What PEFT multiplies B·A by: alpha / r (alpha / sqrt(r) with rsLoRA)."""
    r = config["r"]
    return config["lora_alpha"] / (math.sqrt(r) if config.get("use_rslora") else r)


def _setting(config: dict, key: str):
    """A config value as compared: PEFT saves target_modules from a set, in no fixed order."""
    value = config.get(key)
    return sorted(value) if isinstance(value, list) else value


def _adapter_soup(members: Sequence[Path], target: Path) -> None:
    """One adapter whose ΔW is the mean of the seeds' ΔW = s·B·A (rank Σr, scaling 1), the head the seeds' mean."""
    configs = [json.loads((m / ADAPTER_CONFIG).read_text()) for m in members]
    for member, config in zip(members, configs):
        for key, plain in UNSUPPORTED.items():
            if config.get(key, plain) not in (plain, None):
                raise SoupError(f"{member}: {key}={config[key]!r} is not supported in a soup")
        for key in ("target_modules", "task_type", "fan_in_fan_out", "modules_to_save"):
            if _setting(config, key) != _setting(configs[0], key):
                raise SoupError(f"the seeds' adapters differ in {key} ({configs[0].get(key)} vs {config.get(key)})")
    states = [load_file(m / ADAPTER_WEIGHTS) for m in members]
    k = len(members)
    low_rank = {key for key in states[0] if ".lora_A." in key or ".lora_B." in key}
    soup = _mean([{key: v for key, v in s.items() if key not in low_rank} for s in states], "adapters' heads")
    for key in low_rank:
        if any(key not in state for state in states):
            raise SoupError(f"{key} is missing from a seed's adapter: not the same targets")
        if ".lora_A." in key:  # (r, in): each seed's rows scaled by its s / k, stacked
            soup[key] = torch.cat([s[key].float() * (_scaling(c) / k) for s, c in zip(states, configs)], dim=0)
        else:  # (out, r): side by side, so that B_cat · A_cat = Σ s_i/k · B_i · A_i
            soup[key] = torch.cat([s[key].float() for s in states], dim=1)
        soup[key] = soup[key].to(states[0][key].dtype).contiguous()
    rank = sum(c["r"] for c in configs)
    config = {**configs[0], "r": rank, "lora_alpha": rank, "use_rslora": False, "rank_pattern": {},
              "alpha_pattern": {}}  # scaling 1: the seeds' own scalings are in the stacked A's
    save_file(soup, target / ADAPTER_WEIGHTS, metadata={"format": "pt"})
    (target / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2))
