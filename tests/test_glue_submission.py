"""GLUE test-set submission (``sweep.predict_test``): the synthetic test splits, their reader, and the
zip of predictions the best models write. Ray-free: tiny untrained models, saved as a sweep exports them."""

from __future__ import annotations

import csv
import io
import shutil
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from sweep.config.tasks import GLUE_TASKS, load_task
from sweep.config.validate import compose_settings
from sweep.data.glue import find_test_files, read_unlabeled
from sweep.data.synthetic import write_synthetic_glue
from sweep.errors import ConfigError, DataFormatError, ModelSourceError
from sweep.models.quiet import quiet_transformers
from sweep.outputs.glue_submission import SUBMISSION_ZIP, write_submission
from sweep.train.loading import load_for_task

N_TEST = 37  # not a multiple of the batch size: the last, short batch is predicted too
# What gluebenchmark.com reads in each file (its sample submission; run_glue.py --do_predict writes the same)
BENCHMARK_LABELS = {
    "CoLA.tsv": {"0", "1"}, "SST-2.tsv": {"0", "1"}, "MRPC.tsv": {"0", "1"}, "QQP.tsv": {"0", "1"},
    "WNLI.tsv": {"0", "1"}, "QNLI.tsv": {"entailment", "not_entailment"}, "RTE.tsv": {"entailment", "not_entailment"},
    "MNLI-m.tsv": {"entailment", "neutral", "contradiction"}, "MNLI-mm.tsv": {"entailment", "neutral", "contradiction"},
    "AX.tsv": {"entailment", "neutral", "contradiction"},
}  # fmt: skip
ALL_FILES = {*BENCHMARK_LABELS, "STS-B.tsv"}
# GLUE's real test layouts (download_glue_data.py)
TEST_HEADERS = {
    "CoLA/test.tsv": "index\tsentence",
    "SST-2/test.tsv": "index\tsentence",
    "MRPC/test.tsv": "index\t#1 ID\t#2 ID\t#1 String\t#2 String",
    "STS-B/test.tsv": "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2",
    "QQP/test.tsv": "id\tquestion1\tquestion2",
    "MNLI/test_matched.tsv": "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
                             "sentence1_parse\tsentence2_parse\tsentence1\tsentence2",
    "QNLI/test.tsv": "index\tquestion\tsentence",
    "RTE/test.tsv": "index\tsentence1\tsentence2",
    "WNLI/test.tsv": "index\tsentence1\tsentence2",
    "diagnostic/diagnostic.tsv": "index\tsentence1\tsentence2",
}


def read_tsv(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text), delimiter="\t", quoting=csv.QUOTE_NONE))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_glue(tmp_path_factory.mktemp("glue"), GLUE_TASKS, n_train=8, n_dev=4, n_test=N_TEST)


@pytest.fixture(scope="module")
def best_dirs(tiny_roberta_dir: Path, data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each task's head on the tiny RoBERTa, untrained, saved as the sweep exports out_dir/best/<TASK>/."""
    root = tmp_path_factory.mktemp("best")
    out = {}
    for i, task in enumerate(GLUE_TASKS):
        torch.manual_seed(i)
        spec = load_task(task)
        tok, model = load_for_task(tiny_roberta_dir, spec)
        # an untrained head gives every row nearly the same logits: centre them on the test rows, so
        # that the argmax differs between rows and a constant prediction would show
        _, files = find_test_files(spec, data_dir)
        split = read_unlabeled(spec, next(iter(files.values())), "test")
        with torch.no_grad():
            logits = model(**tok(split.text_a, split.text_b, padding=True, return_tensors="pt")).logits
            model.classifier.out_proj.bias.sub_(logits.mean(0))
        with quiet_transformers():
            model.save_pretrained(root / task)
            tok.save_pretrained(root / task)
        out[task] = root / task
    return out


@pytest.fixture(scope="module")
def settings():
    return compose_settings("task=glue", "model=tiny-roberta", "tracking=none")


@pytest.fixture(scope="module")
def submission(settings, best_dirs, data_dir, tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("out")
    return write_submission(settings, best_dirs, out_dir, data_dir, device="cpu"), out_dir


# ---- The synthetic test splits --------------------------------------------------------------


def test_synthetic_test_files_have_glue_layout_and_no_label(data_dir: Path) -> None:
    glue = data_dir / "glue_data"
    for name, header in TEST_HEADERS.items():
        rows = read_tsv((glue / name).read_text("utf-8"))
        assert "\t".join(rows[0]) == header, name
        assert len(rows) == N_TEST + 1 and all(len(r) == len(rows[0]) for r in rows), name
    assert (glue / "MNLI" / "test_mismatched.tsv").read_text().split("\n")[0] == TEST_HEADERS["MNLI/test_matched.tsv"]


def test_test_files_leave_train_and_dev_as_they_were(tmp_path: Path) -> None:
    """Each test split has its own generator: train and dev are byte for byte those of a write without them."""
    without = write_synthetic_glue(tmp_path / "a", GLUE_TASKS, n_train=10, n_dev=5, n_test=0)
    with_test = write_synthetic_glue(tmp_path / "b", GLUE_TASKS, n_train=10, n_dev=5, n_test=9)
    a = {p.relative_to(without): p.read_bytes() for p in without.rglob("*.tsv")}
    b = {p.relative_to(with_test): p.read_bytes() for p in with_test.rglob("*.tsv")}
    assert a == {k: v for k, v in b.items() if k in a}
    assert sorted(str(k) for k in set(b) - set(a)) == sorted(f"glue_data/{n}" for n in
                                                              [*TEST_HEADERS, "MNLI/test_mismatched.tsv"])


def test_reads_the_real_glue_test_files(shared_data_dir: Path) -> None:
    counts = {"CoLA": 1063, "MRPC": 1725, "RTE": 3000, "SST-2": 1821, "WNLI": 146}
    for task, n in counts.items():
        spec = load_task(task)
        folder, files = find_test_files(spec, shared_data_dir)
        split = read_unlabeled(spec, files["test"], "test")
        assert len(split) == n and split.index[:2] == ["0", "1"], task
        assert (split.text_b is not None) == spec.is_pair


@pytest.mark.parametrize(("content", "message"), [
    ("index\tsentence1\n0\ta\n", r"RTE/test.tsv:1: test file of RTE lacks column\(s\) \['sentence2'\]; "
                                 r"columns found: \['index', 'sentence1'\]"),
    ("idx\tsentence1\tsentence2\n0\ta\tb\n", r"lacks column\(s\) \['index'\]"),
    ("index\tsentence1\tsentence2\n0\ta\tb\n1\ta\n", r"RTE/test.tsv:3: row has 2 field\(s\), needs at least 3"),
    ("index\tsentence1\tsentence2\n0\ta\tb\n0\tc\td\n", r"RTE/test.tsv:3: index '0' again \(first on line 2\)"),
    ("index\tsentence1\tsentence2\n", "has a header but no rows"),
    ("", "empty test file of RTE"),
])  # fmt: skip
def test_a_malformed_test_file_is_one_line_naming_it(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "RTE" / "test.tsv"
    path.parent.mkdir()
    path.write_text(content)
    with pytest.raises(DataFormatError, match=message):
        read_unlabeled(load_task("RTE"), path, "test")


# ---- The submission -------------------------------------------------------------------------


def test_the_zip_holds_every_glue_file_in_the_benchmark_layout(submission, data_dir: Path) -> None:
    result, out_dir = submission
    assert result.zip_path == out_dir / SUBMISSION_ZIP and result.skipped == []
    with zipfile.ZipFile(result.zip_path) as z:
        assert set(z.namelist()) == ALL_FILES  # nothing else
        files = {name: read_tsv(z.read(name).decode("utf-8")) for name in z.namelist()}
    sources = {f.name: f.source for f in result.files}
    for name, rows in files.items():
        assert rows[0] == ["index", "prediction"], name
        test_rows = read_tsv(sources[name].read_text("utf-8"))
        assert [r[0] for r in rows[1:]] == [r[0] for r in test_rows[1:]], name  # every row, in the file's order
        assert len(rows) - 1 == N_TEST, name
        predictions = [r[1] for r in rows[1:]]
        if name == "STS-B.tsv":
            assert all(len(p.split(".")[1]) == 3 and float(p) == float(p) for p in predictions)
        else:
            assert set(predictions) <= BENCHMARK_LABELS[name], name
    glue = data_dir / "glue_data"
    assert sources["MNLI-m.tsv"] == glue / "MNLI" / "test_matched.tsv"
    assert sources["MNLI-mm.tsv"] == glue / "MNLI" / "test_mismatched.tsv"
    assert sources["AX.tsv"] == glue / "diagnostic" / "diagnostic.tsv"
    assert result.lines() == [f"glue submission: {', '.join(f'{f.name} {N_TEST} rows' for f in result.files)} "
                              f"-> {out_dir / SUBMISSION_ZIP}"]
    assert not [p.name for p in out_dir.iterdir() if p.name != SUBMISSION_ZIP]  # no temporary left


@pytest.mark.parametrize("task", ["RTE", "MNLI-mm", "AX", "STS-B"])
def test_predictions_are_the_models_own(submission, best_dirs, settings, task: str) -> None:
    """The model's argmax (STS-B: its score) on the test texts, truncated as in training: not a constant."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    result, _ = submission
    written = next(f for f in result.files if f.name == f"{task}.tsv")
    source, spec = written.source, load_task(written.task)
    split = read_unlabeled(spec, source, "test")
    model_dir = best_dirs[spec.name]
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    enc = tok(split.text_a, split.text_b, padding=True, truncation=True,
              max_length=settings.train.max_seq_length, return_tensors="pt")
    with torch.no_grad():
        logits = model(**enc).logits
    if spec.kind == "regression":
        expected = [f"{v:.3f}" for v in logits[:, 0].tolist()]
    else:
        expected = [model.config.id2label[i] for i in logits.argmax(-1).tolist()]
    with zipfile.ZipFile(result.zip_path) as z:
        got = [r[1] for r in read_tsv(z.read(f"{task}.tsv").decode())[1:]]
    assert len(set(expected)) > 1  # so a constant prediction could not pass
    if spec.kind == "regression":  # padding in another batch shifts the last digit at most
        assert max(abs(float(a) - float(b)) for a, b in zip(got, expected)) <= 0.002
    else:
        assert got == expected


def test_a_task_without_a_test_split_is_one_line(settings, best_dirs, data_dir: Path, tmp_path: Path) -> None:
    data = Path(shutil.copytree(data_dir, tmp_path / "data"))
    (data / "glue_data" / "STS-B" / "test.tsv").unlink()
    (data / "glue_data" / "diagnostic" / "diagnostic.tsv").unlink()
    tasks = [load_task(t) for t in ("STS-B", "MNLI", "WNLI")] + [load_task("wikitext-2")]
    result = write_submission(replace(settings, tasks=tasks), best_dirs, tmp_path / "out", data, device="cpu")
    with zipfile.ZipFile(result.zip_path) as z:
        assert sorted(z.namelist()) == ["MNLI-m.tsv", "MNLI-mm.tsv", "WNLI.tsv"]  # no AX without its file
    lines = result.lines()
    assert lines[:3] == [
        f"glue submission: STS-B has no test split in {data / 'glue_data' / 'STS-B'} (no test.tsv); not predicted",
        f"glue submission: no AX diagnostic at {data / 'glue_data' / 'diagnostic' / 'diagnostic.tsv'}; "
        "AX.tsv not written",
        "glue submission: wikitext-2 is not a GLUE task; not predicted",
    ]
    assert lines[3].startswith("glue submission: MNLI-m.tsv 37 rows, MNLI-mm.tsv 37 rows, WNLI.tsv 37 rows -> ")


def test_nothing_to_predict_writes_no_zip(settings, best_dirs, tmp_path: Path) -> None:
    two = replace(settings, tasks=[load_task("RTE"), load_task("WNLI")])
    result = write_submission(two, {"WNLI": best_dirs["WNLI"]}, tmp_path, tmp_path)
    assert result.zip_path is None and not (tmp_path / SUBMISSION_ZIP).exists()
    assert result.lines() == ["glue submission: RTE has no best model; not predicted",
                              f"glue submission: WNLI has no folder in {tmp_path}; not predicted",
                              f"glue submission: no task predicted; {SUBMISSION_ZIP} not written"]


def test_bad_input_fails_before_any_prediction(settings, best_dirs, data_dir: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import sweep.serving.engines as engines

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(engines, "Classifier", no_model)
    two = replace(settings, tasks=[load_task("WNLI"), load_task("RTE")])
    data = Path(shutil.copytree(data_dir, tmp_path / "data"))
    (data / "glue_data" / "RTE" / "test.tsv").write_text("index\tsentence1\n0\tA cat .\n")
    with pytest.raises(DataFormatError, match=r"RTE/test.tsv:1: test file of RTE lacks column\(s\) \['sentence2'\]"):
        write_submission(two, best_dirs, tmp_path / "out", data)
    with pytest.raises(ModelSourceError, match=r"the model's labels \['contradiction', 'entailment', 'neutral'\] "
                                               r"are not RTE's \['entailment', 'not_entailment'\]"):
        write_submission(two, {**best_dirs, "RTE": best_dirs["MNLI"]}, tmp_path / "out", data_dir)
    with pytest.raises(ModelSourceError, match=r"best model of RTE .*/nowhere does not exist"):
        write_submission(two, {**best_dirs, "RTE": tmp_path / "nowhere"}, tmp_path / "out", data_dir)
    assert not (tmp_path / "out").exists()


def test_predict_test_is_a_checked_bool() -> None:
    assert compose_settings("task=RTE").sweep.predict_test is False
    assert compose_settings("task=RTE", "sweep.predict_test=true").sweep.predict_test is True
    with pytest.raises(ConfigError, match="sweep.predict_test: Value 'maybe' is not a valid bool"):
        compose_settings("task=RTE", "sweep.predict_test=maybe")


def test_the_sweep_checks_every_test_file_before_any_trial(data_dir: Path, tmp_path: Path) -> None:
    """What app.run calls with sweep.predict_test=true, before tracking or Ray start: every task's test file read."""
    from sweep.outputs.glue_submission import check_test_files

    tasks = [load_task("WNLI"), load_task("RTE"), load_task("MNLI")]
    check_test_files(tasks, data_dir)  # the synthetic files, MNLI's two and AX, are fine
    data = Path(shutil.copytree(data_dir, tmp_path / "data"))
    (data / "glue_data" / "diagnostic" / "diagnostic.tsv").write_text("index\tsentence1\n0\tA cat .\n")
    with pytest.raises(DataFormatError, match=r"diagnostic.tsv:1: .*lacks column\(s\) \['sentence2'\]"):
        check_test_files(tasks, data)
