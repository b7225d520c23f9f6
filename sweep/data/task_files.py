"""Where a task's files are, and whether they are all there: the cheap checks, without datasets or torch.

The command runs them before Hydra makes its run folder and before any trial (``sweep/cli/run.py``,
``storage/staging.check_tasks_here``); ``glue.py`` and ``lm.py`` read the files they find.
"""

from __future__ import annotations

from pathlib import Path

from sweep.config.tasks import TaskSpec
from sweep.errors import DataFormatError

GLOB_CHARS = "*?["
TSV_LAYOUT = "GLUE TSV files <data_dir>/glue_data/<TASK>/{files}"
HF_LAYOUT = (
    "a datasets.save_to_disk folder <data_dir>/{config}/dataset_dict.json, or the hub's parquet "
    "files <data_dir>/{config}/train-00000-of-00001.parquet and validation-*.parquet"
)


# GLUE tasks: TSV files, a save_to_disk folder, or the hub's parquet files


def check_task_data(spec: TaskSpec, data_dir: str | Path) -> Path:
    """Cheap preflight before any trial starts: the task's folder and every split file exist."""
    layout, folder = task_folder(spec, data_dir, "checked by sweep.data.lm.check_corpus")
    if layout == "tsv":
        for name in split_file_names(spec).values():
            if not (folder / name).is_file():
                raise DataFormatError(f"{folder / name}: missing file of task {spec.name}")
    return folder


def task_folder(spec: TaskSpec, data_dir: str | Path, lm_route: str) -> tuple[str, Path]:
    if spec.kind == "causal_lm":
        raise ValueError(f"task {spec.name}: a causal_lm corpus is {lm_route}")
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise DataFormatError(f"{data_dir}: data directory does not exist")
    return find_layout(spec, data_dir)


def split_file_names(spec: TaskSpec) -> dict[str, str]:
    return {"train": spec.train_file, **spec.eval_files}


def find_layout(spec: TaskSpec, data_dir: Path) -> tuple[str, Path]:
    tsv_dirs = [data_dir / "glue_data" / spec.folder, data_dir / spec.folder]
    hf_dirs = [data_dir / spec.hf.config, data_dir / "glue_data" / spec.hf.config] if spec.hf else []
    for d in tsv_dirs:
        # a case-insensitive file system may find the hub folder (rte) under the TSV name (RTE)
        if d.is_dir() and not is_hf_dir(d):
            return "tsv", d
    for d in hf_dirs:
        if (d / "dataset_dict.json").is_file():
            return "disk", d
    for d in hf_dirs:
        if any(d.glob("train-*.parquet")):
            return "parquet", d
    looked = ", ".join(str(d) for d in (*tsv_dirs, *hf_dirs))
    expected = TSV_LAYOUT.format(files=", ".join(split_file_names(spec).values()))
    if spec.hf:
        expected += "; or " + HF_LAYOUT.format(config=spec.hf.config)
    raise DataFormatError(f"no data for task {spec.name}: looked in {looked}; expected {expected}")


def hub_split(spec: TaskSpec, split: str) -> str:
    """Our split name -> the hub's: dev -> validation, MNLI's matched -> validation_matched (or as the
    task's ``hf.splits`` maps it)."""
    if split in spec.hf.splits:
        return spec.hf.splits[split]
    if split == "train":
        return "train"
    return "validation" if len(spec.eval_files) == 1 else f"validation_{split}"


def is_hf_dir(d: Path) -> bool:
    return (d / "dataset_dict.json").is_file() or any(d.glob("*.parquet"))


# Causal LM corpora: a folder of text files


def corpus_folder(spec: TaskSpec, data_dir: str | Path) -> Path:
    """The folder holding the task's text files."""
    if spec.path is not None:
        folder = Path(spec.path)
        if not folder.is_dir():
            what = "a file, not a folder" if folder.is_file() else "does not exist"
            raise DataFormatError(f"task.{spec.name}.path: {folder} {what}; give a folder of text files")
        return folder
    if spec.folder is None:
        raise DataFormatError(
            f"task.{spec.name}.path: not set; give the folder of .txt files, e.g. task={spec.name} task.path=DIR"
        )
    data_dir = Path(data_dir)
    candidates = [data_dir / spec.folder] + ([data_dir] if data_dir.name == spec.folder else [])
    for folder in candidates:
        if folder.is_dir():
            return folder
    files = ", ".join(f for f in (spec.train_file, *spec.eval_files.values()) if f)
    raise DataFormatError(f"no data for task {spec.name}: {candidates[0]} does not exist; expected {files} there")


def split_files(spec: TaskSpec, data_dir: str | Path) -> dict[str, list[Path]]:
    """Split name -> its files, in name order; a held-out split (file null) has none."""
    folder = corpus_folder(spec, data_dir)
    patterns = {"train": spec.train_file, **spec.eval_files}
    return {split: _matching(spec, folder, pattern) if pattern else [] for split, pattern in patterns.items()}


def _matching(spec: TaskSpec, folder: Path, pattern: str) -> list[Path]:
    present = sorted(p.name for p in folder.iterdir())
    shown = ", ".join(present[:10]) + (" ..." if len(present) > 10 else "") if present else "none"
    if any(c in pattern for c in GLOB_CHARS):
        files = sorted(p for p in folder.glob(pattern) if p.is_file())
        if not files:
            raise DataFormatError(f"{folder}: no {pattern} files for task {spec.name} (files there: {shown})")
        return files
    path = folder / pattern
    if not path.is_file():
        hint = (f"; choose the splits with task.{spec.name}.train_split=NAME task.{spec.name}.eval_splits=[NAME,...]"
                if spec.split_file else "")
        raise DataFormatError(f"{path}: missing file of task {spec.name} (files in {folder}: {shown}){hint}")
    return [path]


def check_corpus(spec: TaskSpec, data_dir: str | Path) -> Path:
    """Cheap preflight: the folder and every split's files exist, and no split is all empty files."""
    for split, files in split_files(spec, data_dir).items():
        if files and all(p.stat().st_size == 0 for p in files):
            raise empty_corpus(spec, split, files)
    return corpus_folder(spec, data_dir)


def empty_corpus(spec: TaskSpec, split: str, files: list[Path]) -> DataFormatError:
    where = str(files[0]) if len(files) == 1 else f"{files[0].parent} ({len(files)} files)"
    return DataFormatError(f"{where}: empty corpus: split {split!r} of task {spec.name} holds no text")
