"""The data layer: GLUE TSV / save_to_disk / parquet layouts, malformed input, tokenization cache, collation."""

from __future__ import annotations

import logging
import re
import shutil
import threading
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
import torch
from datasets import ClassLabel, Dataset, DatasetDict, Features, Value
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from sweep.config.tasks import GLUE_TASKS, load_task
from sweep.data import glue
from sweep.data.cache import cache_stats
from sweep.data.collate import count_tokens, make_collator
from sweep.data.glue import cache_key, load_task_data, tokenize_task
from sweep.data.synthetic import (
    CUE_GROUPS,
    LABEL_NOISE,
    corpus_sentences,
    write_synthetic_glue,
    write_synthetic_wikitext,
)
from sweep.data.task_files import check_task_data
from sweep.errors import DataFormatError

N_TRAIN, N_DEV = 200, 64  # what the synthetic_glue_dir fixture writes
REAL_SIZES = {"CoLA": (8551, 1043), "SST-2": (67349, 872), "MRPC": (3668, 408), "RTE": (2490, 277), "WNLI": (635, 71)}
MNLI_HUB = ("entailment", "neutral", "contradiction")  # nyu-mll/glue order; GLUE's TSV labels sort differently


def build_tokenizer(vocab_size: int = 600) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained offline on the synthetic corpus, with RoBERTa-style pair encoding."""
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    bpe.train_from_iterator(corpus_sentences(2000), trainer)
    bos, eos = bpe.token_to_id("<s>"), bpe.token_to_id("</s>")
    bpe.post_processor = processors.RobertaProcessing(("</s>", eos), ("<s>", bos))
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
        mask_token="<mask>", model_max_length=512,
    )  # fmt: skip
    assert len(tok) > 100
    return tok


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer()


def task_copy(src_root: Path, dst_root: Path, task: str) -> Path:
    """A private copy of one synthetic task folder, to damage without touching the shared fixture."""
    folder = dst_root / "glue_data" / task
    shutil.copytree(src_root / "glue_data" / task, folder)
    return folder


def bad_file(path: Path, pattern: str) -> AbstractContextManager[pytest.ExceptionInfo[DataFormatError]]:
    """Expect a DataFormatError whose message names ``path`` and continues with ``pattern``."""
    return pytest.raises(DataFormatError, match=re.escape(str(path)) + pattern)


def edit_line(path: Path, line: int, new: str) -> None:
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[line - 1] = new + "\n"
    path.write_text("".join(lines), encoding="utf-8")


# ---- synthetic GLUE files ------------------------------------------------------------------


@pytest.mark.parametrize("task", GLUE_TASKS)
def test_every_synthetic_task_loads(synthetic_glue_dir: Path, task: str) -> None:
    spec = load_task(task)
    dsd = load_task_data(spec, synthetic_glue_dir)
    assert list(dsd) == ["train", *spec.eval_files]
    assert dsd["train"].num_rows == N_TRAIN
    assert all(dsd[s].num_rows == N_DEV for s in spec.eval_files)
    expected_cols = ["text_a", "text_b", "label"] if spec.is_pair else ["text_a", "label"]
    assert dsd["train"].column_names == expected_cols
    labels = dsd["train"]["label"]
    if spec.kind == "regression":
        assert all(isinstance(x, float) and 0.0 <= x <= 5.0 for x in labels)
    else:
        assert dsd["train"].features["label"].names == list(spec.labels)
        assert sorted(set(labels)) == list(range(len(spec.labels)))  # balanced: every label present


def test_mnli_has_two_eval_splits(synthetic_glue_dir: Path) -> None:
    dsd = load_task_data(load_task("MNLI"), synthetic_glue_dir)
    assert set(dsd) == {"train", "matched", "mismatched"}


def test_data_dir_may_be_glue_data_itself(synthetic_glue_dir: Path) -> None:
    dsd = load_task_data(load_task("RTE"), synthetic_glue_dir / "glue_data")
    assert dsd["dev"].num_rows == N_DEV


def test_synthetic_headers_match_glue(synthetic_glue_dir: Path) -> None:
    glue = synthetic_glue_dir / "glue_data"
    first = {t: (glue / t / "train.tsv").read_text("utf-8").split("\n")[0] for t in GLUE_TASKS}
    assert first["MRPC"] == "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String"
    assert first["STS-B"].split("\t")[-3:] == ["sentence1", "sentence2", "score"]
    assert first["QQP"] == "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate"
    assert first["MNLI"].split("\t")[-3:] == ["sentence2", "label1", "gold_label"]
    assert first["QNLI"] == "index\tquestion\tsentence\tlabel"
    assert first["RTE"] == first["WNLI"] == "index\tsentence1\tsentence2\tlabel"
    assert first["SST-2"] == "sentence\tlabel"
    assert len(first["CoLA"].split("\t")) == 4 and first["CoLA"].split("\t")[1] in ("0", "1")  # no header
    dev = (glue / "MNLI" / "dev_mismatched.tsv").read_text("utf-8").split("\n")[0]
    assert dev.split("\t")[-6:] == ["label1", "label2", "label3", "label4", "label5", "gold_label"]


def test_synthetic_is_deterministic(tmp_path: Path) -> None:
    a = write_synthetic_glue(tmp_path / "a", ["MRPC"], n_train=20, n_dev=5, seed=3)
    b = write_synthetic_glue(tmp_path / "b", ["MRPC"], n_train=20, n_dev=5, seed=3)
    c = write_synthetic_glue(tmp_path / "c", ["MRPC"], n_train=20, n_dev=5, seed=4)
    read = lambda root: (root / "glue_data" / "MRPC" / "train.tsv").read_bytes()  # noqa: E731
    assert read(a) == read(b) != read(c)


@pytest.mark.parametrize("task", ["SST-2", "RTE", "MNLI", "STS-B"])
def test_synthetic_labels_follow_cue_words(synthetic_glue_dir: Path, task: str) -> None:
    """The learnable signal: the label (STS-B: the rounded score) is the cue group present in the text,
    except for the LABEL_NOISE share of classification rows whose cues were drawn at random."""
    spec = load_task(task)
    rows = load_task_data(spec, synthetic_glue_dir)["train"]
    agree = 0
    for row in rows:
        words = set(row.get("text_b", row["text_a"]).lower().split())
        groups = [g for g, cues in enumerate(CUE_GROUPS) if words & set(cues)]
        assert len(groups) == 1, "every row carries exactly one cue group"
        agree += groups[0] == (round(row["label"]) if spec.kind == "regression" else row["label"])
    floor = 1.0 if spec.kind == "regression" else 1 - 2 * LABEL_NOISE
    assert floor * len(rows) <= agree <= len(rows)
    if spec.kind != "regression":
        assert agree < len(rows), "label noise is present"


def test_synthetic_wikitext_style(tmp_path: Path) -> None:
    folder = write_synthetic_wikitext(tmp_path, n_lines=200) / "wikitext-2"
    lines = (folder / "wiki.train.tokens").read_text("utf-8").split("\n")[:-1]
    assert len(lines) == 200
    assert lines[1].startswith(" = ") and lines[1].endswith(" = ")
    assert " \n" in (folder / "wiki.valid.tokens").read_text("utf-8") and (folder / "wiki.test.tokens").is_file()
    assert any(" @-@ " in line for line in lines) and all(line.startswith(" ") for line in lines)


# ---- real GLUE files -------------------------------------------------------------------------


@pytest.mark.parametrize("task", sorted(REAL_SIZES))
def test_real_glue_sizes(shared_data_dir: Path, task: str) -> None:
    if not (shared_data_dir / "glue_data" / task).is_dir():
        pytest.skip(f"{task} is not in {shared_data_dir / 'glue_data'}")
    dsd = load_task_data(load_task(task), shared_data_dir)
    assert (dsd["train"].num_rows, dsd["dev"].num_rows) == REAL_SIZES[task]


def test_real_mrpc_bom_and_quotes(shared_data_dir: Path) -> None:
    if not (shared_data_dir / "glue_data" / "MRPC").is_dir():
        pytest.skip("MRPC is not in the shared data")
    first = load_task_data(load_task("MRPC"), shared_data_dir)["train"][0]
    assert first["label"] == 1 and first["text_a"].startswith('Amrozi accused his brother , whom he called " the')


# ---- Hugging Face layouts --------------------------------------------------------------------


def hub_split(n: int, label_offset: int = 0, names: tuple[str, ...] = MNLI_HUB) -> Dataset:
    """MNLI as nyu-mll/glue stores it: premise, hypothesis, label in the hub's label order."""
    features = Features({"premise": Value("string"), "hypothesis": Value("string"),
                         "label": ClassLabel(names=list(names)), "idx": Value("int32")})  # fmt: skip
    rows = {"premise": [f"premise {i}" for i in range(n)], "hypothesis": [f"hypothesis {i}" for i in range(n)],
            "label": [(i + label_offset) % len(names) for i in range(n)], "idx": list(range(n))}  # fmt: skip
    return Dataset.from_dict(rows, features=features)


def mnli_hub() -> DatasetDict:
    splits = {"train": hub_split(6), "validation_matched": hub_split(3, 1), "validation_mismatched": hub_split(3, 2)}
    return DatasetDict(splits)


def assert_mnli_remapped(dsd: DatasetDict) -> None:
    ours = load_task("MNLI").labels
    assert set(dsd) == {"train", "matched", "mismatched"}
    for split, offset in (("train", 0), ("matched", 1), ("mismatched", 2)):
        got = [ours[i] for i in dsd[split]["label"]]
        assert got == [MNLI_HUB[(i + offset) % 3] for i in range(dsd[split].num_rows)]
    assert dsd["train"][0] == {"text_a": "premise 0", "text_b": "hypothesis 0", "label": ours.index("entailment")}


def test_save_to_disk_layout_remaps_mnli_labels(tmp_path: Path) -> None:
    mnli_hub().save_to_disk(str(tmp_path / "mnli"))
    assert_mnli_remapped(load_task_data(load_task("MNLI"), tmp_path))


def test_save_to_disk_layout_under_glue_data_stsb(tmp_path: Path) -> None:
    feats = Features({"sentence1": Value("string"), "sentence2": Value("string"), "label": Value("float32")})
    split = Dataset.from_dict({"sentence1": ["a", "b"], "sentence2": ["c", "d"], "label": [0.5, 4.75]}, features=feats)
    DatasetDict({"train": split, "validation": split}).save_to_disk(str(tmp_path / "glue_data" / "stsb"))
    dsd = load_task_data(load_task("STS-B"), tmp_path)
    assert dsd["dev"]["label"] == [0.5, 4.75]


def write_parquet(dsd: DatasetDict, folder: Path) -> None:
    folder.mkdir(parents=True)
    for split, ds in dsd.items():
        ds.to_parquet(str(folder / f"{split}-00000-of-00001.parquet"))


def test_parquet_layout_remaps_mnli_labels(tmp_path: Path) -> None:
    write_parquet(mnli_hub(), tmp_path / "mnli")
    assert_mnli_remapped(load_task_data(load_task("MNLI"), tmp_path))


def test_parquet_layout_single_eval_split(tmp_path: Path) -> None:
    rte = {s: hub_split(n, names=("entailment", "not_entailment")) for s, n in (("train", 4), ("validation", 2))}
    rte = {s: ds.rename_columns({"premise": "sentence1", "hypothesis": "sentence2"}) for s, ds in rte.items()}
    write_parquet(DatasetDict(rte), tmp_path / "rte")
    dsd = load_task_data(load_task("RTE"), tmp_path)
    assert (dsd["train"].num_rows, dsd["dev"].num_rows) == (4, 2)


def test_tsv_layout_wins_over_hf(synthetic_glue_dir: Path, tmp_path: Path) -> None:
    task_copy(synthetic_glue_dir, tmp_path, "MNLI")
    mnli_hub().save_to_disk(str(tmp_path / "mnli"))
    assert load_task_data(load_task("MNLI"), tmp_path)["train"].num_rows == N_TRAIN


def test_hf_missing_split(tmp_path: Path) -> None:
    DatasetDict({"train": hub_split(3)}).save_to_disk(str(tmp_path / "mnli"))
    with pytest.raises(DataFormatError, match=r"mnli: no split 'validation_matched'.*splits found: \['train'\]"):
        load_task_data(load_task("MNLI"), tmp_path)


def test_hf_unlabeled_row(tmp_path: Path) -> None:
    dsd = mnli_hub()
    matched = dsd["validation_matched"].cast_column("label", Value("int64"))
    dsd["validation_matched"] = matched.map(lambda r, i: {"label": -1 if i == 2 else r["label"]}, with_indices=True)
    write_parquet(dsd, tmp_path / "mnli")
    path = tmp_path / "mnli" / "validation_matched-00000-of-00001.parquet"
    with bad_file(path, r": row 2: .*-1.*not in 0..2"):
        load_task_data(load_task("MNLI"), tmp_path)


def test_hf_missing_column(tmp_path: Path) -> None:
    write_parquet(DatasetDict({s: ds.remove_columns("hypothesis") for s, ds in mnli_hub().items()}), tmp_path / "mnli")
    with pytest.raises(DataFormatError, match=r"train-00000-of-00001.parquet: missing column\(s\) \['hypothesis'\]"):
        load_task_data(load_task("MNLI"), tmp_path)


# ---- malformed TSV input -----------------------------------------------------------------------


def test_no_layout_found(tmp_path: Path) -> None:
    with pytest.raises(DataFormatError) as err:
        load_task_data(load_task("RTE"), tmp_path)
    msg = str(err.value)
    assert str(tmp_path / "glue_data" / "RTE") in msg and str(tmp_path / "rte") in msg
    assert "train.tsv, dev.tsv" in msg and "save_to_disk" in msg and "parquet" in msg


def test_missing_data_dir(tmp_path: Path) -> None:
    with pytest.raises(DataFormatError, match="does not exist"):
        load_task_data(load_task("RTE"), tmp_path / "nope")


def test_missing_file(synthetic_glue_dir: Path, tmp_path: Path) -> None:
    folder = task_copy(synthetic_glue_dir, tmp_path, "MNLI")
    (folder / "dev_mismatched.tsv").unlink()
    with bad_file(folder / "dev_mismatched.tsv", r": file not found .*dev_matched.tsv"):
        load_task_data(load_task("MNLI"), tmp_path)


def test_missing_column(synthetic_glue_dir: Path, tmp_path: Path) -> None:
    path = task_copy(synthetic_glue_dir, tmp_path, "RTE") / "train.tsv"
    edit_line(path, 1, "index\tsentence1\tsentence2\tlbl")
    found = r"columns found: \['index', 'sentence1', 'sentence2', 'lbl'\]"
    with bad_file(path, rf":1: missing column\(s\) \['label'\].*{found}"):
        load_task_data(load_task("RTE"), tmp_path)


def test_short_row_raises_or_is_skipped(
    synthetic_glue_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = task_copy(synthetic_glue_dir, tmp_path, "QQP") / "train.tsv"
    edit_line(path, 5, "17\t35\t36\tA question broken by a newline")
    why = r"row has 4 field\(s\), needs at least 6.*skip_malformed=True"
    with bad_file(path, rf":5: {why}"):
        load_task_data(load_task("QQP"), tmp_path)
    with caplog.at_level(logging.WARNING, logger="sweep.data"):
        dsd = load_task_data(load_task("QQP"), tmp_path, skip_malformed=True)
    assert dsd["train"].num_rows == N_TRAIN - 1
    assert f"{path}: skipped 1 malformed row" in caplog.text


def test_unknown_label(synthetic_glue_dir: Path, tmp_path: Path) -> None:
    path = task_copy(synthetic_glue_dir, tmp_path, "RTE") / "dev.tsv"
    edit_line(path, 3, "2\tA man .\tA dog .\tmaybe")
    with bad_file(path, r":3: unknown label 'maybe' in column 'label'; allowed: entailment, not_entailment"):
        load_task_data(load_task("RTE"), tmp_path)


def test_unknown_label_headerless_cola(synthetic_glue_dir: Path, tmp_path: Path) -> None:
    path = task_copy(synthetic_glue_dir, tmp_path, "CoLA") / "train.tsv"
    edit_line(path, 1, "gj04\t2\t\tA sentence .")
    with bad_file(path, r":1: unknown label '2'"):
        load_task_data(load_task("CoLA"), tmp_path)


@pytest.mark.parametrize("score, why", [("high", "is not a number"), ("7.5", r"outside \[0, 5\]"), ("nan", "outside")])
def test_bad_stsb_score(synthetic_glue_dir: Path, tmp_path: Path, score: str, why: str) -> None:
    path = task_copy(synthetic_glue_dir, tmp_path, "STS-B") / "dev.tsv"
    edit_line(path, 4, f"2\tmain-news\theadlines\t2013\t0002\tnone\tnone\tA man .\tA dog .\t{score}")
    with bad_file(path, rf":4: score .*{why}"):
        load_task_data(load_task("STS-B"), tmp_path)


@pytest.mark.parametrize(
    "task, content, why",
    [("RTE", "index\tsentence1\tsentence2\tlabel\n", "no data rows"), ("RTE", "", "the file is empty"),
     ("CoLA", "", "no data rows")],
)  # fmt: skip
def test_empty_split(synthetic_glue_dir: Path, tmp_path: Path, task: str, content: str, why: str) -> None:
    path = task_copy(synthetic_glue_dir, tmp_path, task) / "dev.tsv"
    path.write_text(content, encoding="utf-8")
    with bad_file(path, f": empty split 'dev': {why}"):
        load_task_data(load_task(task), tmp_path)


def test_not_utf8(synthetic_glue_dir: Path, tmp_path: Path) -> None:
    path = task_copy(synthetic_glue_dir, tmp_path, "WNLI") / "dev.tsv"
    path.write_bytes(path.read_bytes() + b"9\t\xff\xfe\tB .\t1\n")
    with bad_file(path, r": not UTF-8"):
        load_task_data(load_task("WNLI"), tmp_path)


# ---- tokenization and its cache ----------------------------------------------------------------


def test_tokenize_columns_truncation_no_padding(synthetic_glue_dir: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    spec = load_task("RTE")
    tok = tokenize_task(load_task_data(spec, synthetic_glue_dir), spec, tokenizer, max_length=24, cache_dir=None)
    assert tok["train"].column_names == ["input_ids", "attention_mask", "labels"]
    lengths = [len(ids) for ids in tok["train"]["input_ids"]]
    assert max(lengths) == 24 and min(lengths) < 24  # truncated, not padded
    assert tok["train"].features["labels"].dtype == "int64"


def test_tokenize_stsb_labels_are_float(synthetic_glue_dir: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    spec = load_task("STS-B")
    dsd = load_task_data(spec, synthetic_glue_dir)
    tok = tokenize_task(dsd, spec, tokenizer, max_length=32, cache_dir=None)
    assert tok["dev"].features["labels"].dtype == "float32"
    assert tok["dev"]["labels"] == pytest.approx(dsd["dev"]["label"])


def test_second_call_loads_from_cache(
    synthetic_glue_dir: Path, tmp_path: Path, tokenizer: PreTrainedTokenizerFast, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = load_task("MRPC")
    before = (cache_stats.hits, cache_stats.misses)
    first = tokenize_task(load_task_data(spec, synthetic_glue_dir), spec, tokenizer, 32, tmp_path)
    assert (cache_stats.hits, cache_stats.misses) == (before[0], before[1] + 1)

    def no_tokenizing(*args: object) -> None:
        raise AssertionError("the second call tokenized again")

    monkeypatch.setattr(glue, "_tokenize", no_tokenizing)
    # a fresh read of the same files: the cache key comes from the content, not the object
    second = tokenize_task(load_task_data(spec, synthetic_glue_dir), spec, tokenizer, 32, tmp_path)
    assert (cache_stats.hits, cache_stats.misses) == (before[0] + 1, before[1] + 1)
    assert second["train"]["input_ids"] == first["train"]["input_ids"]
    entries = sorted(p.name for p in (tmp_path / "tokenized").iterdir())
    assert len(entries) == 2 and entries[1] == entries[0] + ".lock"  # no temp dir left behind


def test_cache_key_changes_with_inputs(
    synthetic_glue_dir: Path, tokenizer: PreTrainedTokenizerFast, tmp_path: Path
) -> None:
    spec = load_task("RTE")
    dsd = load_task_data(spec, synthetic_glue_dir)
    key = cache_key(dsd, spec, tokenizer, 32)
    assert key == cache_key(load_task_data(spec, synthetic_glue_dir), spec, tokenizer, 32)
    assert key != cache_key(dsd, spec, tokenizer, 64)
    other = task_copy(synthetic_glue_dir, tmp_path, "RTE") / "dev.tsv"
    edit_line(other, 2, "0\tChanged text .\tOther text .\tentailment")
    assert key != cache_key(load_task_data(spec, tmp_path), spec, tokenizer, 32)
    assert key != cache_key(dsd, spec, build_tokenizer(vocab_size=500), 32)
    fresh = build_tokenizer()
    fresh_key = cache_key(dsd, spec, fresh, 32)
    fresh("a used tokenizer keeps truncation state", truncation=True, max_length=3)
    assert cache_key(dsd, spec, fresh, 32) == fresh_key == key


def test_concurrent_callers_tokenize_once(
    synthetic_glue_dir: Path, tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    spec = load_task("WNLI")
    dsd = load_task_data(spec, synthetic_glue_dir)
    misses = cache_stats.misses
    results: list[DatasetDict] = []
    call = lambda: results.append(tokenize_task(dsd, spec, tokenizer, 16, tmp_path))  # noqa: E731
    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3 and cache_stats.misses == misses + 1
    assert results[0]["dev"]["input_ids"] == results[2]["dev"]["input_ids"]


# ---- collation ---------------------------------------------------------------------------------


def rows(synthetic_glue_dir: Path, tokenizer: PreTrainedTokenizerFast, task: str, max_length: int) -> list[dict]:
    spec = load_task(task)
    tok = tokenize_task(load_task_data(spec, synthetic_glue_dir), spec, tokenizer, max_length, cache_dir=None)
    return [tok["dev"][i] for i in range(8)]


def test_dynamic_padding_pads_to_longest(synthetic_glue_dir: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    batch_rows = rows(synthetic_glue_dir, tokenizer, "RTE", 64)
    batch = make_collator(tokenizer, "dynamic")(batch_rows)
    longest = max(len(r["input_ids"]) for r in batch_rows)
    assert batch["input_ids"].shape == batch["attention_mask"].shape == (8, longest)
    assert batch["labels"].dtype == torch.int64 and batch["labels"].shape == (8,)
    real, padded = count_tokens(batch)
    assert real == sum(len(r["input_ids"]) for r in batch_rows) and padded == 8 * longest


def test_max_length_padding_pads_to_max_length(synthetic_glue_dir: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    batch = make_collator(tokenizer, "max_length", max_length=64)(rows(synthetic_glue_dir, tokenizer, "STS-B", 64))
    assert batch["input_ids"].shape == (8, 64)
    assert batch["labels"].dtype == torch.float32
    assert count_tokens(batch).padded == 8 * 64


def test_max_length_collator_rejects_longer_rows(synthetic_glue_dir: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    with pytest.raises(ValueError, match="more than the collator's max_length=8"):
        make_collator(tokenizer, "max_length", max_length=8)(rows(synthetic_glue_dir, tokenizer, "RTE", 64))


def test_collator_validates_padding(tokenizer: PreTrainedTokenizerFast) -> None:
    with pytest.raises(ValueError, match="padding='longest' is not supported; allowed: dynamic, max_length"):
        make_collator(tokenizer, "longest")


def test_check_task_data_finds_a_missing_split_file_before_reading(tmp_path: Path) -> None:
    root = write_synthetic_glue(tmp_path, ["MNLI"], n_train=4, n_dev=3)
    assert check_task_data(load_task("MNLI"), root) == root / "glue_data" / "MNLI"
    (root / "glue_data" / "MNLI" / "dev_mismatched.tsv").unlink()
    with pytest.raises(DataFormatError, match=r"dev_mismatched.tsv: missing file of task MNLI"):
        check_task_data(load_task("MNLI"), root)
    with pytest.raises(DataFormatError, match="no data for task RTE: looked in"):
        check_task_data(load_task("RTE"), root)
