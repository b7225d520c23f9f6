"""The plain fine-tuning loop: loss drops, seeds are reproducible, checkpoints reload."""

from __future__ import annotations

from dataclasses import replace

import pytest
from transformers import AutoModelForSequenceClassification

from sweep.config.tasks import load_task
from sweep.data.collate import count_tokens
from sweep.train.loop import finetune, restore, setup
from tests.helpers.configs import train_config

QUICK = train_config(lr=5e-3, batch_size=16, epochs=3, max_seq_length=64, max_train_samples=160, max_eval_samples=64)


def test_loss_drops_and_checkpoint_reloads(synthetic_glue_dir, tiny_roberta_dir, cache_dir, tmp_path):
    cfg = replace(QUICK, epochs=6, max_train_samples=None)
    result = finetune(load_task("RTE"), tiny_roberta_dir, synthetic_glue_dir, cfg, seed=38,
                      out_dir=tmp_path / "ckpt", cache_dir=cache_dir)
    losses = [e.train_loss for e in result.epochs]
    assert len(losses) == 6
    assert losses[-1] < losses[0] * 0.8, losses
    assert result.best.metrics["acc"] > 0.6
    assert result.best.score == max(e.score for e in result.epochs)
    reloaded = AutoModelForSequenceClassification.from_pretrained(result.checkpoint_dir)
    assert reloaded.config.num_labels == 2
    assert (result.checkpoint_dir / "tokenizer.json").exists()


def test_same_seed_same_metrics_other_seed_differs(synthetic_glue_dir, tiny_roberta_dir, cache_dir):
    cfg = replace(QUICK, epochs=1)
    spec = load_task("WNLI")
    a = finetune(spec, tiny_roberta_dir, synthetic_glue_dir, cfg, seed=40, cache_dir=cache_dir)
    b = finetune(spec, tiny_roberta_dir, synthetic_glue_dir, cfg, seed=40, cache_dir=cache_dir)
    c = finetune(spec, tiny_roberta_dir, synthetic_glue_dir, cfg, seed=41, cache_dir=cache_dir)
    assert a.epochs[0].train_loss == b.epochs[0].train_loss
    assert a.epochs[0].metrics == b.epochs[0].metrics
    assert a.epochs[0].train_loss != c.epochs[0].train_loss


def test_regression_and_two_eval_splits(synthetic_glue_dir, tiny_roberta_dir, cache_dir):
    cfg = replace(QUICK, epochs=1, max_train_samples=48, max_eval_samples=32)
    stsb = finetune(load_task("STS-B"), tiny_roberta_dir, synthetic_glue_dir, cfg, seed=38, cache_dir=cache_dir)
    assert {"pearson", "spearmanr", "corr"} <= stsb.best.metrics.keys()
    mnli = finetune(load_task("MNLI"), tiny_roberta_dir, synthetic_glue_dir, cfg, seed=38, cache_dir=cache_dir)
    assert {"acc", "acc_mismatched"} <= mnli.best.metrics.keys()


@pytest.mark.parametrize("padding", ["dynamic", "max_length"])
def test_padding_modes_count_tokens(synthetic_glue_dir, tiny_roberta_dir, cache_dir, padding):
    cfg = replace(QUICK, epochs=1, padding=padding, max_train_samples=32)
    spec = load_task("SST-2")
    epoch = finetune(spec, tiny_roberta_dir, synthetic_glue_dir, cfg, seed=38, cache_dir=cache_dir).epochs[0]
    assert 0 < epoch.train_tokens <= epoch.padded_tokens
    if padding == "max_length":
        assert epoch.padded_tokens == 32 * 64
    else:
        assert epoch.padded_tokens < 32 * 64
    # the loop counts with the collator's count_tokens: the same batches (same seed) give the same sums
    counts = [count_tokens(batch) for batch in setup(spec, tiny_roberta_dir, synthetic_glue_dir, cfg, seed=38,
                                                       cache_dir=cache_dir).train_loader]
    assert (epoch.train_tokens, epoch.padded_tokens) == (sum(c.real for c in counts), sum(c.padded for c in counts))


class _Stop(Exception):
    pass


def _checkpoint_after_first_evaluation(spec, model_dir, data_dir, cfg, cache_dir, folder) -> None:
    """A run (seed 42) stopped right after its first evaluation, which ``save`` wrote into ``folder``."""
    def stop_after_first(epoch, save):
        save(folder)
        raise _Stop

    with pytest.raises(_Stop):
        finetune(spec, model_dir, data_dir, cfg, seed=42, cache_dir=cache_dir, on_evaluation=stop_after_first)


def test_resume_after_a_stop_equals_an_uninterrupted_run(synthetic_glue_dir, tiny_roberta_dir, cache_dir, tmp_path):
    cfg = replace(QUICK, epochs=3, max_train_samples=64)
    spec = load_task("RTE")
    whole = finetune(spec, tiny_roberta_dir, synthetic_glue_dir, cfg, seed=42, cache_dir=cache_dir)
    _checkpoint_after_first_evaluation(spec, tiny_roberta_dir, synthetic_glue_dir, cfg, cache_dir, tmp_path / "ckpt")
    resumed = finetune(spec, tiny_roberta_dir, synthetic_glue_dir, cfg, seed=42, cache_dir=cache_dir,
                       resume_from=tmp_path / "ckpt")
    assert [e.epoch for e in resumed.epochs] == [1, 2, 3]
    assert [e.train_loss for e in resumed.epochs] == [e.train_loss for e in whole.epochs]
    assert resumed.epochs[-1].metrics == whole.epochs[-1].metrics


def test_group_by_length_pads_less_and_stays_seeded(synthetic_glue_dir, tiny_roberta_dir, cache_dir):
    cfg = replace(QUICK, epochs=1, batch_size=8, max_train_samples=None)
    spec = load_task("SST-2")
    plain = finetune(spec, tiny_roberta_dir, synthetic_glue_dir, cfg, seed=38, cache_dir=cache_dir).epochs[0]
    grouped_cfg = replace(cfg, group_by_length=True)
    a = finetune(spec, tiny_roberta_dir, synthetic_glue_dir, grouped_cfg, seed=38, cache_dir=cache_dir).epochs[0]
    b = finetune(spec, tiny_roberta_dir, synthetic_glue_dir, grouped_cfg, seed=38, cache_dir=cache_dir).epochs[0]
    assert a.train_tokens == plain.train_tokens
    assert a.padded_tokens < plain.padded_tokens
    assert a.train_loss == b.train_loss


def test_optimizer_is_fused_adamw_with_the_same_update_as_the_default():
    # Fused AdamW (the Trainer's default) is the speed fix for CPU; the update must stay AdamW's.
    import torch

    from sweep.train.loop import _optimizer

    def trained(fused: bool):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
        opt = _optimizer(model, lr=1e-2, weight_decay=0.01)
        if not fused:  # the loop as it was: torch's default implementation
            opt = torch.optim.AdamW([{**g, "fused": None} for g in opt.param_groups], lr=1e-2)
        for _ in range(5):
            opt.zero_grad()
            model(torch.randn(4, 8)).pow(2).mean().backward()
            opt.step()
        return opt, [p.detach().clone() for p in model.parameters()]

    fused_opt, fused_params = trained(fused=True)
    _, plain_params = trained(fused=False)
    assert all(g["fused"] for g in fused_opt.param_groups)
    assert [g["weight_decay"] for g in fused_opt.param_groups] == [0.01, 0.0]
    for a, b in zip(fused_params, plain_params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_resume_with_other_values_trains_with_them_from_the_checkpoints_step(
        synthetic_glue_dir, tiny_roberta_dir, cache_dir, tmp_path):
    # what a PBT exploit does: go on from a (donor's) checkpoint with a mutated lr and weight decay
    cfg = replace(QUICK, epochs=2, max_train_samples=64, warmup_ratio=0.0)
    spec = load_task("RTE")
    _checkpoint_after_first_evaluation(spec, tiny_roberta_dir, synthetic_glue_dir, cfg, cache_dir, tmp_path / "ckpt")
    mutated = replace(cfg, lr=cfg.lr * 0.1, weight_decay=0.3)
    run = setup(spec, tiny_roberta_dir, synthetic_glue_dir, mutated, seed=42, cache_dir=cache_dir,
                resume_from=tmp_path / "ckpt")
    restore(run, tmp_path / "ckpt")
    steps_total, done = 2 * len(run.train_loader), run.scheduler.last_epoch
    assert done == len(run.train_loader)  # the schedule goes on from the checkpoint's step ...
    decayed, plain = run.optimizer.param_groups
    linear = (steps_total - done) / steps_total  # ... with the new lr on the same linear decay
    assert decayed["lr"] == pytest.approx(mutated.lr * linear) and plain["lr"] == pytest.approx(mutated.lr * linear)
    assert run.scheduler.get_last_lr() == [decayed["lr"], plain["lr"]]
    assert (decayed["weight_decay"], plain["weight_decay"]) == (0.3, 0.0)
    run.scheduler.step()  # the next step decays from the new base, not the checkpoint's
    assert decayed["lr"] == pytest.approx(mutated.lr * (steps_total - done - 1) / steps_total)
    # and the values are used: the second epoch differs from the unmutated resume's
    same = finetune(spec, tiny_roberta_dir, synthetic_glue_dir, cfg, seed=42, cache_dir=cache_dir,
                    resume_from=tmp_path / "ckpt")
    other = finetune(spec, tiny_roberta_dir, synthetic_glue_dir, mutated, seed=42, cache_dir=cache_dir,
                     resume_from=tmp_path / "ckpt")
    assert same.epochs[0].train_loss == other.epochs[0].train_loss  # the checkpoint's own epoch, carried
    assert same.epochs[1].train_loss != other.epochs[1].train_loss
