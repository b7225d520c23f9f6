"""Evaluating a model on one split, and the precision (autocast) and device moves training shares.

Plain PyTorch: the loop (``sweep.train.loop``) calls ``evaluate`` at each evaluation point; the
benchmarks call it on models trained elsewhere, so both are scored by the same code.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import numpy as np
import torch

from sweep.config.metric_names import MetricFn
from sweep.config.tasks import TaskSpec
from sweep.train.metrics import perplexity, task_metrics


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for a precision setting; None means plain fp32."""
    if device.type != "cuda" or precision == "fp32":
        return None
    if precision == "fp16":
        return torch.float16
    if precision == "bf16" or torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float16  # auto on an older GPU without bf16


def autocast(device: torch.device, dtype: torch.dtype | None):
    """torch.autocast for ``dtype`` (from autocast_dtype); nothing for plain fp32."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


@torch.no_grad()
def evaluate(model, loader, spec: TaskSpec, device, amp_dtype,
             own: Mapping[str, MetricFn] | None = None) -> dict[str, float]:
    """Metrics of one split: GLUE metrics (and the user's ``own``) from logits, or perplexity from the mean
    token loss (causal LM: no predictions kept, so no ``own`` metrics)."""
    model.eval()
    logits, labels = [], []
    loss_sum, loss_count = 0.0, 0
    for batch in loader:
        batch = to_device(batch, device)
        with autocast(device, amp_dtype):
            out = model(**batch)
        if spec.kind == "causal_lm":
            # out.loss is the mean over predicted tokens (each but a block's first, padding excluded):
            # weight it by their count for the mean over the whole split
            n = int((batch["labels"][:, 1:] != -100).sum())
        else:
            n = len(batch["labels"])  # out.loss is the mean over the batch's rows
            logits.append(out.logits.float().cpu().numpy())
            labels.append(batch["labels"].cpu().numpy())
        loss_sum += float(out.loss) * n
        loss_count += n
    mean_loss = loss_sum / max(loss_count, 1)
    if spec.kind == "causal_lm":
        return {"eval_loss": mean_loss, "perplexity": perplexity(mean_loss)}
    preds = np.concatenate(logits)
    if spec.kind == "regression":
        preds = preds.reshape(-1)
    return {**task_metrics(spec, preds, np.concatenate(labels), own), "eval_loss": mean_loss}
