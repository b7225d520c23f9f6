"""Evaluations inside an epoch (train.eval_every / train.evals_per_epoch): where they fall, what
each reports, a mid-epoch best, and a resume from a mid-epoch checkpoint."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from sweep.config.tasks import load_task
from sweep.config.validate import compose_settings
from sweep.errors import ConfigError
from sweep.train.evaluate import evaluate
from sweep.train.loop import TRAINING_STATE, eval_points, finetune, setup
from tests.helpers.configs import train_config

# 64 rows in batches of 16: 4 batches an epoch
QUICK = train_config(lr=5e-3, batch_size=16, epochs=2, max_seq_length=64, max_train_samples=64, max_eval_samples=64)


# ---- where the evaluations fall --------------------------------------------------------------


def test_evals_per_epoch_spreads_evenly_and_ends_the_epoch():
    assert eval_points(10, train_config(evals_per_epoch=3)) == {4, 7, 10}
    assert eval_points(10, train_config()) == {10}  # the default: the epoch's end only
    assert eval_points(4, train_config(evals_per_epoch=2), epoch=2) == {2, 4}  # the same in every epoch
    assert eval_points(3, train_config(evals_per_epoch=7)) == {1, 2, 3}  # more than batches: every batch


def test_eval_every_counts_steps_across_epochs():
    cfg = train_config(eval_every=4)
    # 10 batches an epoch: global steps 4, 8 | 12, 16, 20 | 24, 28 (+ each epoch's end)
    assert eval_points(10, cfg, epoch=1) == {4, 8, 10}
    assert eval_points(10, cfg, epoch=2) == {2, 6, 10}
    assert eval_points(10, cfg, epoch=3) == {4, 8, 10}
    assert eval_points(3, train_config(eval_every=100), epoch=1) == {3}


# ---- what each evaluation reports ------------------------------------------------------------


def test_three_evaluations_an_epoch(synthetic_glue_dir, tiny_roberta_dir, cache_dir):
    spec = load_task("RTE")
    cfg = replace(QUICK, max_train_samples=96)  # 6 batches: evaluations after 2, 4, 6
    calls = []
    split = finetune(spec, tiny_roberta_dir, synthetic_glue_dir, replace(cfg, evals_per_epoch=3), seed=38,
                     cache_dir=cache_dir, on_evaluation=lambda e, save: calls.append(e))
    plain = finetune(spec, tiny_roberta_dir, synthetic_glue_dir, cfg, seed=38, cache_dir=cache_dir)

    evals = split.epochs
    assert len(evals) == 6 and calls == evals
    assert [e.step for e in evals] == [2, 4, 6, 8, 10, 12]
    assert all(e.steps_total == 12 for e in evals) and evals[-1].progress == 1.0
    assert [e.epoch for e in evals] == [1, 1, 1, 2, 2, 2]
    assert [e.end_of_epoch for e in evals] == [False, False, True] * 2
    assert all("eval_loss" in e.metrics for e in evals)
    # Segments add up to the run: the same tokens, and each epoch's loss is its segments' mean.
    assert sum(e.train_tokens for e in evals) == sum(e.train_tokens for e in plain.epochs)
    assert sum(e.padded_tokens for e in evals) == sum(e.padded_tokens for e in plain.epochs)
    for epoch, whole in enumerate(plain.epochs):
        parts = evals[3 * epoch: 3 * epoch + 3]
        assert np.mean([p.train_loss for p in parts]) == pytest.approx(whole.train_loss, rel=1e-6)
    # Evaluating mid-epoch draws no random numbers: training, and so the epoch ends, are unchanged.
    assert [e.metrics for e in evals if e.end_of_epoch] == [e.metrics for e in plain.epochs]


def test_the_best_can_be_a_mid_epoch_evaluation_and_is_the_one_saved(synthetic_glue_dir, tiny_roberta_dir,
                                                                     cache_dir, tmp_path):
    spec = load_task("RTE")
    # A high learning rate on few rows: a seed can beat the majority class early, then fall back
    # to it. The first seed (in a fixed order) whose best is mid-epoch and strictly above every
    # epoch end's score (not a tie); were the best picked at epoch ends only, none would be.
    cfg = replace(QUICK, lr=1e-2, evals_per_epoch=4)  # an evaluation after every batch

    def mid_epoch_best(result) -> bool:
        best = result.best
        return not best.end_of_epoch and best.score > max(e.score for e in result.epochs if e.end_of_epoch)

    for seed in range(38, 46):
        out = tmp_path / f"seed_{seed}"
        result = finetune(spec, tiny_roberta_dir, synthetic_glue_dir, cfg, seed=seed, out_dir=out, cache_dir=cache_dir)
        if mid_epoch_best(result):
            break
    assert mid_epoch_best(result), [(e.step, e.score) for e in result.epochs]
    assert result.best.score > result.best.trivial_score
    assert result.best_epoch == result.best.epoch and result.checkpoint_dir == out

    state = torch.load(out / TRAINING_STATE, weights_only=False)
    assert len(state["epochs"]) == state["best_index"] == result.best_index
    reloaded = setup(spec, out, synthetic_glue_dir, cfg, seed, cache_dir=cache_dir)
    metrics = evaluate(reloaded.model, reloaded.eval_loaders[spec.primary_eval], spec, reloaded.device, None)
    assert metrics == pytest.approx(result.best.metrics)


class _Stop(Exception):
    pass


@pytest.mark.parametrize("method", ["full", "lora"])  # LoRA: the checkpoint holds the adapters, head, their Adam
@pytest.mark.parametrize("stop_at", [1, 3])  # mid-epoch 1; mid-epoch 2, after a whole epoch
def test_resume_from_a_mid_epoch_checkpoint_equals_an_uninterrupted_run(synthetic_glue_dir, tiny_roberta_dir,
                                                                        cache_dir, tmp_path, stop_at, method):
    spec = load_task("RTE")
    cfg = replace(QUICK, evals_per_epoch=2, method=method)  # evaluations after steps 2, 4 | 6, 8
    whole = finetune(spec, tiny_roberta_dir, synthetic_glue_dir, cfg, seed=42, cache_dir=cache_dir)
    seen = []

    def stop(evaluation, save):
        seen.append(evaluation)
        if len(seen) == stop_at:
            save(tmp_path / "ckpt")
            raise _Stop

    with pytest.raises(_Stop):
        finetune(spec, tiny_roberta_dir, synthetic_glue_dir, cfg, seed=42, cache_dir=cache_dir, on_evaluation=stop)
    assert not seen[-1].end_of_epoch
    resumed = finetune(spec, tiny_roberta_dir, synthetic_glue_dir, cfg, seed=42, cache_dir=cache_dir,
                       resume_from=tmp_path / "ckpt")
    assert [e.step for e in resumed.epochs] == [e.step for e in whole.epochs] == [2, 4, 6, 8]
    assert [e.train_loss for e in resumed.epochs] == [e.train_loss for e in whole.epochs]
    assert [e.metrics for e in resumed.epochs] == [e.metrics for e in whole.epochs]
    assert [e.train_tokens for e in resumed.epochs] == [e.train_tokens for e in whole.epochs]
    assert resumed.best_index == whole.best_index


# ---- the trivial score -----------------------------------------------------------------------


def test_trivial_score_is_the_majority_share_and_none_for_causal_lm(synthetic_glue_dir, tiny_roberta_dir,
                                                                      cache_dir, tmp_path):
    spec = load_task("RTE")  # metric: accuracy
    cfg = replace(QUICK, epochs=1, max_train_samples=16)
    result = finetune(spec, tiny_roberta_dir, synthetic_glue_dir, cfg, seed=38, cache_dir=cache_dir)
    run = setup(spec, tiny_roberta_dir, synthetic_glue_dir, cfg, seed=38, cache_dir=cache_dir)
    labels = np.asarray(run.eval_loaders[spec.primary_eval].dataset["labels"])
    majority_share = np.bincount(labels).max() / len(labels)
    assert run.trivial_score == pytest.approx(majority_share)
    assert result.epochs[0].trivial_score == pytest.approx(majority_share)

    from sweep.data.synthetic import write_synthetic_wikitext
    from sweep.models.local_folder import resolve_model_dir
    from sweep.train.tiny_exports import TINY_GPT2

    wiki = write_synthetic_wikitext(tmp_path / "wiki")
    lm = setup(load_task("wikitext-2"), resolve_model_dir(TINY_GPT2, cache_dir), wiki,
               replace(cfg, block_size=64, max_eval_samples=8), seed=38, cache_dir=cache_dir)
    assert lm.trivial_score is None


# ---- config ----------------------------------------------------------------------------------


@pytest.mark.parametrize("overrides, key", [
    (["train.eval_every=0"], "train.eval_every"),
    (["train.evals_per_epoch=0"], "train.evals_per_epoch"),
    (["train.eval_every=50", "train.evals_per_epoch=2"], "train.eval_every"),
])
def test_bad_eval_settings_are_one_line_errors(overrides, key):
    with pytest.raises(ConfigError) as e:
        compose_settings(*overrides)
    assert str(e.value).startswith(key) and "\n" not in str(e.value)
    if len(overrides) == 2:
        assert "choose one" in str(e.value) and "evals_per_epoch" in str(e.value)


def test_good_eval_settings_pass():
    assert compose_settings("train.eval_every=50").train.eval_every == 50
    assert compose_settings("train.evals_per_epoch=4").train.evals_per_epoch == 4
