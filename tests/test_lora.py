"""LoRA (train.method=lora) without Ray: what trains, what a checkpoint holds, resume, the merged
export, and the config's one-line errors. Tiny models built offline for RoBERTa, BERT and GPT-2."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from sweep.config.tasks import load_task
from sweep.config.validate import compose_settings
from sweep.data.synthetic import write_synthetic_wikitext
from sweep.errors import ConfigError
from sweep.models.tiny import build_tiny_model
from sweep.plan.costs import METHOD_STEP_RATIO, DataVolume, trial_seconds
from sweep.plan.makespan import CostModel
from sweep.results.records import TrialRecord, copy_model, export_best
from sweep.results.trial_reports import TRAINING_STATE
from sweep.train.loading import load_for_task
from sweep.train.loop import finetune, setup
from sweep.train.lora import (
    ADAPTER_FOLDER,
    adaptable_names,
    check_method_runs_here,
    check_targets,
    export_merged,
    trainable_parameters,
)
from tests.helpers.configs import train_config
from tests.helpers.files import modes, umask, unshared

HIDDEN, LAYERS, R = 32, 2, 4
QUICK = train_config(lr=5e-3, batch_size=16, epochs=2, max_seq_length=64, max_train_samples=64, max_eval_samples=64)
LORA = replace(QUICK, method="lora", lora=replace(QUICK.lora, r=R))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {arch: build_tiny_model(root / arch, arch, 1000, HIDDEN, LAYERS, 2, 130 if arch == "roberta" else 128)
            for arch in ("roberta", "bert", "gpt2")}


def _head_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if n.startswith(("classifier.", "score.")))


@pytest.mark.parametrize("arch, per_layer", [
    ("roberta", 2 * R * (HIDDEN + HIDDEN)),  # query and value: A (r x in) + B (out x r) each
    ("bert", 2 * R * (HIDDEN + HIDDEN)),
    ("gpt2", R * (HIDDEN + 3 * HIDDEN)),  # c_attn: one projection to q, k and v (out = 3 x hidden)
])
def test_lora_trains_the_adapters_and_the_head_alone(tiny, synthetic_glue_dir, cache_dir, arch, per_layer):
    spec = load_task("RTE")
    _, plain = load_for_task(tiny[arch], spec)
    run = setup(spec, tiny[arch], synthetic_glue_dir, LORA, seed=1, cache_dir=cache_dir)
    trainable, total = trainable_parameters(run.model)
    assert (trainable, total) == run.model.get_nb_trainable_parameters()  # as PEFT counts them
    assert trainable == LAYERS * per_layer + _head_params(plain)
    # PEFT keeps the head it trains beside the original (modules_to_save): counted once more in the total
    assert total == sum(p.numel() for p in plain.parameters()) + LAYERS * per_layer + _head_params(plain)
    optimized = sum(p.numel() for g in run.optimizer.param_groups for p in g["params"])
    assert optimized == trainable  # Adam's moments only for what trains


def test_a_lora_checkpoint_holds_the_adapter_not_the_base(tiny_roberta_dir, synthetic_glue_dir, cache_dir, tmp_path):
    spec = load_task("RTE")
    finetune(spec, tiny_roberta_dir, synthetic_glue_dir, QUICK, seed=1, out_dir=tmp_path / "full", cache_dir=cache_dir)
    finetune(spec, tiny_roberta_dir, synthetic_glue_dir, LORA, seed=1, out_dir=tmp_path / "lora", cache_dir=cache_dir)
    lora_files = {p.name for p in (tmp_path / "lora").iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", TRAINING_STATE} <= lora_files
    assert "model.safetensors" not in lora_files
    full_weights = (tmp_path / "full" / "model.safetensors").stat().st_size
    lora_weights = (tmp_path / "lora" / "adapter_model.safetensors").stat().st_size
    # The tiny model's embeddings dominate its 0.3 MB: the adapter and head are a small share of it
    assert lora_weights * 10 < full_weights, (lora_weights, full_weights)
    full_state = (tmp_path / "full" / TRAINING_STATE).stat().st_size
    assert (tmp_path / "lora" / TRAINING_STATE).stat().st_size * 5 < full_state


def test_lora_learns(tiny_roberta_dir, synthetic_glue_dir, cache_dir):
    result = finetune(load_task("SST-2"), tiny_roberta_dir, synthetic_glue_dir,
                      replace(LORA, epochs=4, max_train_samples=200), seed=1, cache_dir=cache_dir)
    losses = [e.train_loss for e in result.epochs]
    assert losses[-1] < losses[0], losses


def test_the_merged_export_predicts_as_base_plus_adapter(tiny_roberta_dir, synthetic_glue_dir, cache_dir, tmp_path):
    from peft import PeftModel

    spec = load_task("RTE")
    finetune(spec, tiny_roberta_dir, synthetic_glue_dir, LORA, seed=3, out_dir=tmp_path / "ckpt", cache_dir=cache_dir)
    export_merged(tmp_path / "ckpt", tiny_roberta_dir, spec, tmp_path / "best")
    assert (tmp_path / "best" / "config.json").is_file() and (tmp_path / "best" / "model.safetensors").is_file()
    assert (tmp_path / "best" / ADAPTER_FOLDER / "adapter_model.safetensors").is_file()
    assert not list((tmp_path / "best").rglob(TRAINING_STATE))
    merged = AutoModelForSequenceClassification.from_pretrained(tmp_path / "best", local_files_only=True).eval()
    tok, base = load_for_task(tiny_roberta_dir, spec)
    adapted = PeftModel.from_pretrained(base, tmp_path / "best" / ADAPTER_FOLDER).eval()
    batch = tok(["The cat sees a dog.", "A river runs."], ["A dog.", "Water."], padding=True, return_tensors="pt")
    with torch.no_grad():
        want, got = adapted(**batch).logits, merged(**batch).logits
    _, untrained = load_for_task(tiny_roberta_dir, spec)
    with torch.no_grad():
        before = untrained.eval()(**batch).logits
    assert torch.allclose(got, want, atol=1e-5), (got, want)
    assert not torch.allclose(got, before, atol=1e-4)  # the adapter changed the model


def test_a_causal_lm_adapter_merges_too(tiny, cache_dir, tmp_path):
    spec = load_task("wikitext-2")
    data = write_synthetic_wikitext(tmp_path / "data")
    lm = replace(LORA, block_size=32, epochs=1, max_train_samples=16, max_eval_samples=8, batch_size=4)
    finetune(spec, tiny["gpt2"], data, lm, seed=1, out_dir=tmp_path / "ckpt", cache_dir=cache_dir)
    export_merged(tmp_path / "ckpt", tiny["gpt2"], spec, tmp_path / "best")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "best", local_files_only=True)
    assert merged.config.model_type == "gpt2" and not hasattr(merged, "peft_config")


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # PEFT 0.21
def test_a_merged_lora_export_is_readable_by_all(tiny_roberta_dir, tmp_path):
    """The merged model.safetensors (safetensors writes 0600) and the adapter: files 0644, folders 0755."""
    from peft import LoraConfig, TaskType, get_peft_model

    spec = load_task("RTE")
    tok, model = load_for_task(tiny_roberta_dir, spec)
    config = LoraConfig(task_type=TaskType.SEQ_CLS, r=R, target_modules=["query", "value"])
    get_peft_model(model, config).save_pretrained(tmp_path / "ckpt")  # an untrained adapter: its files suffice
    tok.save_pretrained(tmp_path / "ckpt")
    record = TrialRecord(task="RTE", seed=1, score=0.5, checkpoint=str(tmp_path / "ckpt"))
    with umask(0o022):
        out = export_best(record, tmp_path / "best" / "RTE", "tiny-roberta",
                          lambda ckpt, target: export_merged(ckpt, tiny_roberta_dir, spec, target))
    assert {"model.safetensors", f"{ADAPTER_FOLDER}/adapter_model.safetensors"} <= set(modes(out))
    assert unshared(out) == {}


def test_copy_export_leaves_the_training_state_behind(tmp_path):
    (tmp_path / "ckpt").mkdir()
    for name in ("config.json", "model.safetensors", TRAINING_STATE):
        (tmp_path / "ckpt" / name).write_text("x")
    copy_model(tmp_path / "ckpt", tmp_path / "best")
    assert sorted(p.name for p in (tmp_path / "best").iterdir()) == ["config.json", "model.safetensors"]


# ---- the config's one-line errors -----------------------------------------------------------

def test_target_modules_that_match_nothing_name_the_choices(tiny):
    bad = replace(LORA, lora=replace(LORA.lora, target_modules=["nosuch", "query"]))
    with pytest.raises(ConfigError) as e:
        check_targets(tiny["roberta"], bad)
    line = str(e.value)
    assert "\n" not in line and line.startswith("train.lora.target_modules: nosuch matches no layer of roberta")
    assert "query" in line and "value" in line and "dense" in line  # the names to choose from
    check_targets(tiny["roberta"], LORA)  # PEFT's defaults are there
    check_targets(tiny["gpt2"], LORA)
    check_targets(tiny["roberta"], replace(LORA, lora=replace(LORA.lora, target_modules=["query", "key", "dense"])))


def test_adaptable_names_are_the_linear_layers(tiny):
    _, model = load_for_task(tiny["gpt2"], load_task("RTE"))
    assert {"c_attn", "c_proj", "c_fc"} <= set(adaptable_names(model))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the error is for machines without a CUDA GPU")
def test_qlora_without_a_gpu_is_one_line():
    with pytest.raises(ConfigError, match=r"^train.method=qlora: a 4-bit base \(bitsandbytes\) needs a CUDA GPU"):
        check_method_runs_here(replace(LORA, method="qlora"))
    check_method_runs_here(replace(LORA, method="qlora"), "ray://head:10001")  # a cluster's workers have the GPUs


@pytest.mark.parametrize("override, line", [
    ("train.lora.r=0", "train.lora.r: must be a positive integer (the adapters' rank, e.g. 8), got 0"),
    ("train.lora.alpha=0", "train.lora.alpha: must be > 0 (scaling alpha / r; e.g. 8 or 16), got 0.0"),
    ("train.lora.alpha=-2", "train.lora.alpha: must be > 0 (scaling alpha / r; e.g. 8 or 16), got -2.0"),
    ("train.lora.dropout=1", "train.lora.dropout: must be in [0, 1), got 1.0"),
    ("train.lora.dropout=-0.1", "train.lora.dropout: must be in [0, 1), got -0.1"),
    ("train.method=dora", "train.method: got 'dora', allowed: full, lora, qlora"),
    ("+sweep.grid.lora.r=[4,0]", "sweep.grid.lora.r: value 0: train.lora.r: must be a positive integer"),
    ("+sweep.grid.method=[full,lora]", "sweep.grid.method: train.method is one per sweep; compare methods with a "
                                       "multirun: python -m sweep -m train.method=full,lora"),
])
def test_bad_lora_settings_are_one_line(override, line):
    with pytest.raises(ConfigError) as e:
        compose_settings("train.method=lora", override)
    assert str(e.value).startswith(line) and "\n" not in str(e.value)


def test_each_method_has_its_own_default_learning_rate_and_a_set_one_wins():
    assert compose_settings().train.lr == 2e-5
    assert compose_settings("train.method=lora").train.lr == 5e-4
    assert compose_settings("train.method=lora", "train.lr=1e-3").train.lr == 1e-3


def test_a_grid_over_lora_rank_is_one_point_per_value():
    from sweep.plan.costs import grid_points

    s = compose_settings("train.method=lora", "+sweep.grid.lora.r=[4,16]", "+sweep.grid.lr=[1e-4,1e-3]")
    assert grid_points(s.sweep) == [{"lora.r": 4, "lr": 1e-4}, {"lora.r": 4, "lr": 1e-3},
                              {"lora.r": 16, "lr": 1e-4}, {"lora.r": 16, "lr": 1e-3}]


def test_the_plan_costs_a_lora_trial_at_the_measured_step_ratio():
    size, cost = DataVolume("RTE", 1000, 50.0), CostModel()
    full = trial_seconds(size, train_config(), 10**6, cost)
    lora = trial_seconds(size, train_config(method="lora"), 10**6, cost)
    assert lora == pytest.approx(full * METHOD_STEP_RATIO["lora"]) and lora < full


@pytest.mark.parametrize("method", ["full", "lora"])
def test_gradient_checkpointing_trains_the_same_model(tiny_roberta_dir, synthetic_glue_dir, cache_dir, method):
    """transformers' own gradient checkpointing recomputes activations (with the same dropout draws):
    the run's losses match one without it."""
    spec, cfg = load_task("RTE"), replace(LORA if method == "lora" else QUICK, epochs=1)
    run = setup(spec, tiny_roberta_dir, synthetic_glue_dir, replace(cfg, gradient_checkpointing=True), seed=2,
                cache_dir=cache_dir)
    base = run.model.get_base_model() if method == "lora" else run.model
    assert base.is_gradient_checkpointing
    plain = finetune(spec, tiny_roberta_dir, synthetic_glue_dir, cfg, seed=2, cache_dir=cache_dir)
    checkpointed = finetune(spec, tiny_roberta_dir, synthetic_glue_dir, replace(cfg, gradient_checkpointing=True),
                            seed=2, cache_dir=cache_dir)
    assert [e.train_loss for e in checkpointed.epochs] == pytest.approx([e.train_loss for e in plain.epochs], rel=1e-5)
