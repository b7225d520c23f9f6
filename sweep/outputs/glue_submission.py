"""GLUE test-set predictions in the benchmark's submission layout: ``out_dir/glue_submission.zip``.

With ``sweep.predict_test=true`` the best model of each GLUE task (``out_dir/best/<TASK>/``) predicts
the task's unlabeled test split(s). Each becomes ``<TASK>.tsv`` with the columns ``index`` and
``prediction`` (MNLI: ``MNLI-m.tsv`` and ``MNLI-mm.tsv``; GLUE's AX diagnostic, by MNLI's model:
``AX.tsv``), the files of Hugging Face's ``run_glue.py --do_predict`` under the names
gluebenchmark.com reads: a label as the task's own files write it (0/1, entailment, ...), STS-B's
score with three decimals. Plain Python, no Ray: the driver calls ``write_submission`` once the best
models are exported; everything is read and checked before the first model loads.
"""

from __future__ import annotations

import csv
import io
import time
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sweep.config.settings import Settings
from sweep.config.tasks import GLUE_TASKS, TaskSpec
from sweep.data.glue import UnlabeledSplit, diagnostic_file, find_test_files, read_unlabeled
from sweep.disk import writing
from sweep.errors import DataFormatError, ModelSourceError
from sweep.files import atomic_file, require_model_folder

SUBMISSION_ZIP = "glue_submission.zip"
PREFIX = "glue submission:"
# A task with one test split is <TASK>.tsv; GLUE names MNLI's two itself.
SPLIT_NAMES = {("MNLI", "matched"): "MNLI-m", ("MNLI", "mismatched"): "MNLI-mm"}
DIAGNOSTIC_NAME, DIAGNOSTIC_TASK = "AX", "MNLI"
PROGRESS_EVERY_S = 30.0


@dataclass(frozen=True)
class SubmissionFile:
    name: str  # the file in the zip: RTE.tsv
    task: str  # whose best model predicted it
    source: Path  # the test file it predicts
    rows: int


@dataclass
class SubmissionResult:
    zip_path: Path | None  # None: no task had a test split and a model, nothing was written
    files: list[SubmissionFile] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # one sentence per task (or split) not predicted, and why

    def lines(self) -> list[str]:
        """What the driver prints: a line per skipped task, then what the zip holds."""
        out = [f"{PREFIX} {why}" for why in self.skipped]
        if self.zip_path is None:
            return [*out, f"{PREFIX} no task predicted; {SUBMISSION_ZIP} not written"]
        written = ", ".join(f"{f.name} {f.rows:,} rows" for f in self.files)
        return [*out, f"{PREFIX} {written} -> {self.zip_path}"]


@dataclass(frozen=True)
class _Job:
    name: str  # file stem in the zip
    spec: TaskSpec
    model_dir: Path
    split: UnlabeledSplit


def write_submission(settings: Settings, best_dirs: Mapping[str, Path], out_dir: Path, data_dir: Path,
                     device: str = "auto", progress: Callable[[str], None] = print) -> SubmissionResult:
    """Predict every GLUE task's test split(s) with ``best_dirs[task]`` (a save_pretrained folder) and
    write ``out_dir/glue_submission.zip``.

    ``data_dir``: the folder the sweep read its data from (holding ``glue_data/<TASK>/``). A task
    without a test file, or without a best model, is one sentence in ``skipped``; a malformed test file
    or a model whose labels are not the task's is an error, raised before any prediction.
    ``progress`` gets a line now and then while a long split is predicted.
    """
    jobs, skipped = _plan(settings.tasks, best_dirs, Path(data_dir))
    if not jobs:
        return SubmissionResult(None, [], skipped)
    texts: dict[str, str] = {}
    files = []
    for task in dict.fromkeys(job.spec.name for job in jobs):  # each model loads once (MNLI's: 3 files)
        own = [job for job in jobs if job.spec.name == task]
        predict = _predictor(own[0].model_dir, own[0].spec, settings.train.max_seq_length,
                             settings.train.eval_batch_size, device, progress)
        for job in own:
            texts[f"{job.name}.tsv"] = _tsv(job.split.index, predict(job.split))
            files.append(SubmissionFile(f"{job.name}.tsv", job.spec.name, job.split.path, len(job.split)))
    return SubmissionResult(_write_zip(Path(out_dir) / SUBMISSION_ZIP, texts), files, skipped)


def check_test_files(tasks: list[TaskSpec], data_dir: Path) -> None:
    """Read every GLUE task's test file(s) now, before any trial: a malformed one is its file:line error
    at the start of the sweep, not after hours of training."""
    for spec in tasks:
        if spec.name not in GLUE_TASKS:
            continue
        try:
            folder, files = find_test_files(spec, data_dir)
        except DataFormatError:
            continue
        for split, path in files.items():
            read_unlabeled(spec, path, split)
        if spec.name == DIAGNOSTIC_TASK and diagnostic_file(folder).is_file():
            read_unlabeled(spec, diagnostic_file(folder), "diagnostic")


def _plan(tasks: list[TaskSpec], best_dirs: Mapping[str, Path], data_dir: Path) -> tuple[list[_Job], list[str]]:
    """Every file to predict, read and checked (test files, model folders, their labels), and the skips."""
    jobs: list[_Job] = []
    skipped: list[str] = []
    for spec in tasks:
        if spec.name not in GLUE_TASKS:
            skipped.append(f"{spec.name} is not a GLUE task; not predicted")
            continue
        if spec.name not in best_dirs:
            skipped.append(f"{spec.name} has no best model; not predicted")
            continue
        try:
            folder, files = find_test_files(spec, data_dir)
        except DataFormatError:  # the sweep read the task elsewhere (another data_dir): nothing here to predict
            skipped.append(f"{spec.name} has no folder in {data_dir}; not predicted")
            continue
        if not files:
            wanted = ", ".join(spec.test_files.values()) or "a test file"
            skipped.append(f"{spec.name} has no test split in {folder} (no {wanted}); not predicted")
            continue
        model_dir = _check_model(Path(best_dirs[spec.name]), spec)
        missing = [name for split, name in spec.test_files.items() if split not in files]
        if missing:
            skipped.append(f"{spec.name}: no {', '.join(missing)} in {folder}; that split not predicted")
        for split, path in files.items():
            jobs.append(_Job(_file_stem(spec, split), spec, model_dir, read_unlabeled(spec, path, split)))
        if spec.name == DIAGNOSTIC_TASK:
            diagnostic = diagnostic_file(folder)
            if diagnostic.is_file():
                jobs.append(_Job(DIAGNOSTIC_NAME, spec, model_dir, read_unlabeled(spec, diagnostic, "diagnostic")))
            else:
                skipped.append(f"no {DIAGNOSTIC_NAME} diagnostic at {diagnostic}; {DIAGNOSTIC_NAME}.tsv not written")
    return jobs, skipped


def _file_stem(spec: TaskSpec, split: str) -> str:
    if len(spec.test_files) == 1:
        return spec.name
    return SPLIT_NAMES.get((spec.name, split), f"{spec.name}-{split}")


def _check_model(model_dir: Path, spec: TaskSpec) -> Path:
    """The folder is a save_pretrained model with the task's head (labels in the task's own names)."""
    from transformers import AutoConfig

    hint = f"point best_dirs[{spec.name!r}] at the sweep's export out_dir/best/{spec.name}/"
    require_model_folder(model_dir, f"best model of {spec.name}", hint)
    config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    if spec.kind == "regression":
        if config.num_labels != 1:
            raise ModelSourceError(f"{model_dir}: {config.num_labels} outputs, but {spec.name} is a regression task "
                                   f"(1 output); {hint}")
        return model_dir
    labels = [config.id2label[i] for i in range(config.num_labels)]
    if sorted(labels) != sorted(spec.labels or ()):
        raise ModelSourceError(f"{model_dir}: the model's labels {labels} are not {spec.name}'s "
                               f"{list(spec.labels or ())}; {hint}")
    return model_dir


def _predictor(model_dir: Path, spec: TaskSpec, max_length: int, batch_size: int, device: str,
               progress: Callable[[str], None]) -> Callable[[UnlabeledSplit], list[str]]:
    """A function split -> one prediction per row (in the file's order), by the serving engine's forward pass."""
    from sweep.serving.engines import Classifier

    classifier = Classifier(model_dir, device)
    # the training's truncation: test rows are read as the dev rows that chose this model were
    classifier.max_length = min(classifier.max_length, max_length)

    def predict(split: UnlabeledSplit) -> list[str]:
        pairs = split.text_b or [None] * len(split)
        # rows of similar length batched together: less padding to compute on
        order = sorted(range(len(split)), key=lambda i: len(split.text_a[i]) + len(pairs[i] or ""))
        out: list[str] = [""] * len(split)
        last = time.monotonic()
        for start in range(0, len(order), batch_size):
            rows = order[start:start + batch_size]
            for i, c in zip(rows, classifier.classify(None, [(split.text_a[i], pairs[i]) for i in rows])):
                out[i] = f"{c.score:.3f}" if classifier.regression else str(c.label)
            if time.monotonic() - last >= PROGRESS_EVERY_S:
                last = time.monotonic()
                progress(f"{PREFIX} {spec.name} {split.path.name}: {start + len(rows):,}/{len(split):,} rows")
        return out

    return predict


def _tsv(index: list[str], predictions: list[str]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, delimiter="\t", lineterminator="\n")
    writer.writerow(["index", "prediction"])
    writer.writerows(zip(index, predictions))
    return buffer.getvalue()


def _write_zip(target: Path, texts: Mapping[str, str]) -> Path:
    """The zip whole or not at all (a temporary beside it, then renamed); a full disk is one line."""
    size = sum(len(text.encode()) for text in texts.values())
    with writing(target.name, target.parent, size, key="out_dir"), atomic_file(target, "wb") as f:
        with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            for name, text in texts.items():
                archive.writestr(name, text)
    return target
