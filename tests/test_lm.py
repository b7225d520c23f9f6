"""Causal language modelling: WikiText and folders of .txt files -> blocks -> perplexity, through the sweep."""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from mlflow import MlflowClient
from torch.utils.data import DataLoader

from sweep.config.tasks import load_task
from sweep.config.validate import validate
from sweep.data.cache import cache_stats
from sweep.data.collate import make_lm_collator
from sweep.data.lm import BlockSizeError, check_block_fits, lm_blocks, token_ids
from sweep.data.synthetic import write_synthetic_wikitext
from sweep.data.task_files import check_corpus
from sweep.errors import ConfigError, DataFormatError
from sweep.models.local_folder import resolve_model_dir
from sweep.results.export_layout import MADE_BY
from sweep.results.records import load_records, rank_key
from sweep.train.evaluate import evaluate
from sweep.train.loading import load_for_task
from sweep.train.loop import finetune
from sweep.train.tiny_exports import TINY_GPT2
from tests.helpers.configs import compose_config, train_config
from tests.helpers.sweeps import sweep_cmd

QUICK_LM = train_config(lr=5e-3, batch_size=16, epochs=3, block_size=64)


@pytest.fixture(scope="session")
def tiny_gpt2_dir(cache_dir: Path) -> Path:
    return resolve_model_dir(TINY_GPT2, cache_dir)


@pytest.fixture(scope="session")
def tokenizer(tiny_gpt2_dir: Path):
    return load_for_task(tiny_gpt2_dir, load_task("wikitext-2"))[0]


@pytest.fixture(scope="session")
def wikitext_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir holding generated wikitext-2/ (.tokens) and wikitext-2-raw/ (.raw) splits."""
    return write_synthetic_wikitext(tmp_path_factory.mktemp("wiki"))


def text_folder(root: Path, wikitext_dir: Path) -> Path:
    """A folder of three .txt documents (the generated WikiText splits) and a file that is not .txt."""
    root.mkdir(parents=True, exist_ok=True)
    for split, name in (("train", "a.txt"), ("valid", "b.txt"), ("test", "c.txt")):
        shutil.copy(wikitext_dir / "wikitext-2" / f"wiki.{split}.tokens", root / name)
    (root / "notes.md").write_text("not part of the corpus\n")
    return root


compose_cfg = compose_config


# ---- task configs ----------------------------------------------------------------------------


def test_wikitext_specs_read_their_files_and_splits_are_chosen_by_name():
    spec = load_task("wikitext-2")
    assert (spec.kind, spec.metric, spec.mode, spec.folder) == ("causal_lm", "perplexity", "min", "wikitext-2")
    assert spec.train_file == "wiki.train.tokens"
    assert dict(spec.eval_files) == {"valid": "wiki.valid.tokens", "test": "wiki.test.tokens"}
    raw = load_task("wikitext-2-raw")
    assert raw.train_file == "wiki.train.raw" and raw.folder == "wikitext-2-raw"

    shared = validate(compose_cfg("task=wikitext-2", "task.wikitext-2.train_split=valid",
                                  "task.wikitext-2.eval_splits=[test]")).tasks[0]
    assert shared.train_file == "wiki.valid.tokens" and dict(shared.eval_files) == {"test": "wiki.test.tokens"}


def test_training_on_an_eval_split_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match=r"task.wikitext-2.eval_splits: 'valid' is also the train split.*"
                                          r"task.wikitext-2.eval_splits=\[test\]"):
        validate(compose_cfg("task=wikitext-2", "task.wikitext-2.train_split=valid"))


def test_text_task_takes_its_folder_from_task_path_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (spec,) = validate(compose_cfg("task=text", "task.path=corpus")).tasks
    assert spec.path == str(tmp_path / "corpus")
    assert dict(spec.eval_files) == {"valid": None} and spec.holdout_fraction == 0.1
    both = validate(compose_cfg("task=[text,WNLI]", f"task.path={tmp_path}")).tasks
    assert [t.name for t in both] == ["text", "WNLI"]


def test_text_task_without_a_path_says_how_to_give_one(tmp_path):
    (spec,) = validate(compose_cfg("task=text")).tasks
    with pytest.raises(DataFormatError, match=r"^task.text.path: not set; .* task=text task.path=DIR$"):
        check_corpus(spec, tmp_path)


# ---- reading and blocks ----------------------------------------------------------------------


def test_blocks_are_the_token_stream_cut_at_block_size(wikitext_dir, tokenizer):
    spec = load_task("wikitext-2")
    data = lm_blocks(spec, tokenizer, wikitext_dir, 64, cache_dir=None)
    for split, keep_tail in (("train", False), ("valid", True), ("test", True)):
        text = (wikitext_dir / "wikitext-2" / f"wiki.{split}.tokens").read_text()
        ids = token_ids([text], tokenizer)
        rows = data[split]["input_ids"]
        assert all(len(r) == 64 for r in rows[:-1])
        flat = np.concatenate([np.asarray(r) for r in rows])
        if keep_tail:  # eval: every token, the last block shorter
            assert np.array_equal(flat, ids) and 1 < len(rows[-1]) <= 64
        else:  # train: whole blocks only
            assert len(rows[-1]) == 64 and np.array_equal(flat, ids[: len(rows) * 64]) and len(ids) - len(flat) < 64
    # tokenized line by line, as WikiText's rows: the same ids as the text decoded again
    assert (tokenizer.decode(data["valid"]["input_ids"][0])[:40]
            == (wikitext_dir / "wikitext-2/wiki.valid.tokens").read_text()[:40])


def test_raw_wikitext_is_read_too(wikitext_dir, tokenizer):
    data = lm_blocks(load_task("wikitext-2-raw"), tokenizer, wikitext_dir, 64, cache_dir=None)
    assert set(data) == {"train", "valid", "test"} and len(data["train"]) > 10
    assert "@-@" not in tokenizer.decode(data["train"]["input_ids"][0] + data["train"]["input_ids"][1])


def test_text_folder_holds_out_the_end_of_the_corpus(tmp_path, wikitext_dir, tokenizer):
    folder = text_folder(tmp_path / "corpus", wikitext_dir)
    spec = load_task("text", path=str(folder))
    data = lm_blocks(spec, tokenizer, tmp_path, 64, cache_dir=None)
    docs = [(folder / n).read_text() for n in ("a.txt", "b.txt", "c.txt")]  # name order; notes.md not read
    ids = token_ids(docs, tokenizer)
    assert (ids == tokenizer.eos_token_id).sum() == 2  # one eos between documents
    train = np.concatenate([np.asarray(r) for r in data["train"]["input_ids"]])
    held = np.concatenate([np.asarray(r) for r in data["valid"]["input_ids"]])
    assert np.array_equal(np.concatenate([train, held]), ids)  # contiguous: held out = the tail
    n_blocks = len(ids) // 64
    assert len(data["valid"]) - 1 == round(0.1 * n_blocks)  # its blocks, plus the shorter tail


def test_collator_labels_are_the_inputs_and_padding_is_ignored(tokenizer):
    batch = make_lm_collator(tokenizer)([{"input_ids": [5, 6, 7, 8]}, {"input_ids": [9, 10]}])
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8], [9, 10, tokenizer.pad_token_id, tokenizer.pad_token_id]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert batch["labels"].tolist() == [[5, 6, 7, 8], [9, 10, -100, -100]]


def test_blocks_are_cached_by_content_tokenizer_and_block_size(tmp_path, wikitext_dir, tokenizer):
    data_dir = tmp_path / "data"
    shutil.copytree(wikitext_dir / "wikitext-2", data_dir / "wikitext-2")
    spec, cache = load_task("wikitext-2"), tmp_path / "cache"

    def misses(block_size: int) -> int:
        before = cache_stats.misses
        lm_blocks(spec, tokenizer, data_dir, block_size, cache)
        return cache_stats.misses - before

    assert misses(64) == 1
    hits = cache_stats.hits
    first = lm_blocks(spec, tokenizer, data_dir, 64, cache)
    assert cache_stats.hits == hits + 1
    assert misses(32) == 1  # another block size
    with (data_dir / "wikitext-2" / "wiki.valid.tokens").open("a") as f:
        f.write(" A new line of text .\n")
    assert misses(64) == 1  # another content
    assert lm_blocks(spec, tokenizer, data_dir, 64, cache)["valid"].num_rows >= first["valid"].num_rows


# ---- bad input: one line that says what is wrong -----------------------------------------------


def test_missing_folder_and_missing_file(tmp_path, tokenizer):
    spec = load_task("wikitext-2")
    with pytest.raises(DataFormatError, match=r"no data for task wikitext-2: .*/wikitext-2 does not exist; "
                                              r"expected wiki.train.tokens, wiki.valid.tokens, wiki.test.tokens"):
        check_corpus(spec, tmp_path)
    (tmp_path / "wikitext-2").mkdir()
    (tmp_path / "wikitext-2" / "wiki.valid.tokens").write_text(" text \n")
    with pytest.raises(DataFormatError, match=r"wiki.train.tokens: missing file of task wikitext-2 "
                                              r"\(files in .*: wiki.valid.tokens\); choose the splits with "
                                              r"task.wikitext-2.train_split=NAME"):
        check_corpus(spec, tmp_path)
    with pytest.raises(DataFormatError, match=r"task.text.path: .*/nowhere does not exist; give a folder"):
        check_corpus(load_task("text", path=str(tmp_path / "nowhere")), tmp_path)


def test_folder_without_txt_files(tmp_path):
    (tmp_path / "readme.md").write_text("hello")
    with pytest.raises(DataFormatError, match=r": no \*.txt files for task text \(files there: readme.md\)"):
        check_corpus(load_task("text", path=str(tmp_path)), tmp_path)


def test_empty_corpus(tmp_path, tokenizer):
    (tmp_path / "a.txt").write_text("")
    spec = load_task("text", path=str(tmp_path))
    with pytest.raises(DataFormatError, match=r"a.txt: empty corpus: split 'train' of task text holds no text"):
        check_corpus(spec, tmp_path)
    (tmp_path / "a.txt").write_text("  \n\n \n")  # passes the cheap size check, fails on reading
    with pytest.raises(DataFormatError, match=r"empty corpus"):
        lm_blocks(spec, tokenizer, tmp_path, 64, cache_dir=None)


def test_corpus_shorter_than_two_blocks(tmp_path, tokenizer):
    (tmp_path / "a.txt").write_text("A few words only .\n")
    spec = load_task("text", path=str(tmp_path))
    with pytest.raises(DataFormatError,
                       match=r"fewer than two blocks of train.block_size=64 .* lower train.block_size"):
        lm_blocks(spec, tokenizer, tmp_path, 64, cache_dir=None)


def test_block_size_beyond_the_model_says_what_to_set(tiny_gpt2_dir, wikitext_dir):
    spec = load_task("wikitext-2")
    check_block_fits(256, 256, "tiny-gpt2")
    message = r"train.block_size: 512 is more than tiny-gpt2 holds \(256 positions\); use at most 256"
    with pytest.raises(BlockSizeError, match=message):
        check_block_fits(512, 256, "tiny-gpt2")
    with pytest.raises(ConfigError, match=message.replace("tiny-gpt2", tiny_gpt2_dir.name)):
        finetune(spec, tiny_gpt2_dir, wikitext_dir, replace(QUICK_LM, block_size=512), seed=38)


# ---- perplexity ------------------------------------------------------------------------------


def test_perplexity_is_exp_of_the_mean_loss_over_every_predicted_token(wikitext_dir, tiny_gpt2_dir, tokenizer):
    spec = load_task("wikitext-2")
    blocks = lm_blocks(spec, tokenizer, wikitext_dir, 64, cache_dir=None)["valid"]
    _, model = load_for_task(tiny_gpt2_dir, spec)
    model.eval()
    # the short tail in a padded batch
    loader = DataLoader(blocks, batch_size=3, collate_fn=make_lm_collator(tokenizer))
    got = evaluate(model, loader, spec, torch.device("cpu"), None)

    total, count = 0.0, 0
    with torch.no_grad():
        for row in blocks["input_ids"]:
            ids = torch.tensor([row])
            logits = model(ids).logits[0, :-1]
            total += float(torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum"))
            count += len(row) - 1
    assert got["eval_loss"] == pytest.approx(total / count, rel=1e-5)
    assert got["perplexity"] == pytest.approx(math.exp(total / count), rel=1e-5)


def test_finetune_lowers_perplexity_every_epoch(wikitext_dir, tiny_gpt2_dir, cache_dir, tmp_path):
    result = finetune(load_task("wikitext-2"), tiny_gpt2_dir, wikitext_dir, QUICK_LM, seed=38,
                      out_dir=tmp_path / "ckpt", cache_dir=cache_dir)
    ppl = [e.metrics["perplexity"] for e in result.epochs]
    assert ppl == sorted(ppl, reverse=True) and ppl[-1] < 0.7 * ppl[0], ppl
    assert "perplexity_test" in result.best.metrics
    assert result.best_epoch == 3 and result.best.score == -ppl[-1]  # lower perplexity, higher score
    assert (result.checkpoint_dir / "model.safetensors").exists()


# ---- the sweep, from the command line --------------------------------------------------------


def assert_tracked_and_registered(db: Path, experiment: str, task: str, seeds: list[int], out: Path) -> None:
    """Each trial's perplexity falls epoch by epoch in MLflow; the best trial's model is exported
    to best/<task>/ and registered as tiny-gpt2-<task> with the alias champion."""
    client = MlflowClient(f"sqlite:///{db}")
    exp = client.get_experiment_by_name(experiment)
    trials = [r for r in client.search_runs([exp.experiment_id]) if "mlflow.parentRunId" in r.data.tags]
    assert sorted(int(r.data.params["seed"]) for r in trials) == seeds
    for trial in trials:
        history = sorted(client.get_metric_history(trial.info.run_id, "perplexity"), key=lambda m: m.step)
        ppl = [m.value for m in history]
        assert [m.step for m in history] == [1, 2, 3]
        assert ppl == sorted(ppl, reverse=True) and ppl[-1] < ppl[0], ppl

    rows = load_records(out / "results.json")
    assert all(r.ok and r.metrics["perplexity"] == r.score for r in rows)
    best = max(rows, key=lambda r: rank_key("min", r.score, r.seed))  # perplexity: mode min
    made_by = json.loads((out / "best" / task / MADE_BY).read_text())
    assert int(made_by["seed"]) == best.seed
    assert (out / "best" / task / "config.json").exists() and (out / "best" / task / "tokenizer.json").exists()
    champion = client.get_model_version_by_alias(f"tiny-gpt2-{task}", "champion")
    assert champion.run_id in {t.info.run_id for t in trials}


@pytest.mark.ray
@pytest.mark.slow
def test_sweep_of_a_text_folder(tmp_path, wikitext_dir):
    corpus = text_folder(tmp_path / "corpus", wikitext_dir)
    out, db = tmp_path / "out", tmp_path / "mlflow.db"
    r = sweep_cmd("task=text", "task.path=corpus", "model=tiny-gpt2", "train=quick", "train.block_size=64",
                  "train.max_train_samples=null", "train.epochs=3", "sweep.seeds=[38,39]",
                  f"tracking.uri=sqlite:///{db}", "tracking.experiment=lm-text", f"out_dir={out}",
                  cwd=tmp_path, cache=tmp_path / "cache", timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    assert str(corpus) not in r.stderr
    assert "best text: seed" in r.stdout and "now champion" in r.stdout
    assert_tracked_and_registered(db, "lm-text", "text", [38, 39], out)


@pytest.mark.ray
@pytest.mark.slow
def test_sweep_on_real_wikitext_valid_for_training_test_for_evaluation(tmp_path, shared_data_dir):
    """docs/lm.md's WikiText line, every path relative to the folder it runs in (the data, out_dir, the
    sqlite store: each resolved there, once); that folder is left as it was (no outputs/, no mlartifacts/)."""
    work = tmp_path / "work"
    work.mkdir()
    out, db = tmp_path / "out", tmp_path / "mlflow.db"
    r = sweep_cmd("task=wikitext-2", "task.wikitext-2.train_split=valid", "task.wikitext-2.eval_splits=[test]",
                  f"storage.data_dir={os.path.relpath(shared_data_dir, work)}", "model=tiny-gpt2", "train=quick",
                  "train.max_train_samples=256", "train.max_eval_samples=64", "train.epochs=3", "sweep.seeds=[38]",
                  "tracking.uri=sqlite:///../mlflow.db", "tracking.experiment=lm-wikitext", "out_dir=../out",
                  cwd=work, cache=tmp_path / "cache", timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    assert_tracked_and_registered(db, "lm-wikitext", "wikitext-2", [38], out)
    assert list(work.iterdir()) == []


def test_cli_block_size_too_large_is_one_line_before_any_trial(tmp_path, wikitext_dir, tiny_gpt2_dir, cache_dir):
    r = sweep_cmd("task=wikitext-2", "model=tiny-gpt2", f"storage.data_dir={wikitext_dir}", "train.block_size=1024",
                  "tracking=none", f"out_dir={tmp_path / 'out'}", cwd=tmp_path, cache=cache_dir, timeout=120)
    assert r.returncode == 2
    assert "error: train.block_size: 1024 is more than tiny-gpt2 holds (256 positions); use at most 256" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "out" / "results.csv").exists()
