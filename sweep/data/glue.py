"""GLUE tasks: read a task's files into a DatasetDict and tokenize it (cached per node).

Three on-disk layouts are understood, tried in this order:

1. GLUE TSV files as written by ``download_glue_data.py``: ``<data_dir>/glue_data/<TASK>/train.tsv``
   (or ``<data_dir>/<TASK>/train.tsv`` when ``data_dir`` is ``glue_data`` itself);
2. a ``datasets`` ``save_to_disk`` folder: ``<data_dir>/<hf config>/dataset_dict.json``;
3. the hub's ``nyu-mll/glue`` parquet files: ``<data_dir>/<hf config>/train-00000-of-00001.parquet``.

Every layout is normalized to the columns ``text_a``, ``text_b`` (pair tasks only) and ``label``
(an index into ``spec.labels``, or a float score in [0, 5] for STS-B). Causal-LM corpora (WikiText,
folders of .txt files) are read by ``sweep.data.lm``; batches are made in ``sweep.data.collate``.

A task's unlabeled test split(s) (GLUE TSV layout only) are read by ``read_unlabeled``, for a
GLUE submission (``sweep.outputs.glue_submission``).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from datasets import ClassLabel, Dataset, DatasetDict, DatasetInfo, Features, Value, load_from_disk
from datasets.table import InMemoryTable
from transformers import PreTrainedTokenizerBase

from sweep.config.tasks import GLUE_DIAGNOSTIC, TaskSpec
from sweep.data.cache import cache_stats, cached_dataset, content_key, tokenizer_identity
from sweep.data.task_files import hub_split, split_file_names, task_folder
from sweep.errors import DataFormatError

log = logging.getLogger(__name__)

# Bump when the normalized or tokenized format changes, so that old caches are not reused.
FORMAT_VERSION = 1
STS_RANGE = (0.0, 5.0)


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def load_task_data(spec: TaskSpec, data_dir: str | Path, skip_malformed: bool = False) -> DatasetDict:
    """Read one task's train split and every split of ``spec.eval_files`` into a DatasetDict.

    ``skip_malformed`` skips (and counts, in a warning) TSV rows with too few fields, as the GLUE
    readers do for QQP's broken train rows; by default such a row is an error.
    """
    layout, folder = task_folder(spec, data_dir, "read by sweep.data.lm.lm_blocks")
    if layout == "tsv":
        return _load_tsv_task(spec, folder, skip_malformed)
    if layout == "disk":
        return _load_saved_task(spec, folder)
    return _load_parquet_task(spec, folder)


def _features(spec: TaskSpec) -> Features:
    cols: dict[str, Any] = {"text_a": Value("string")}
    if spec.is_pair:
        cols["text_b"] = Value("string")
    cols["label"] = Value("float32") if spec.kind == "regression" else ClassLabel(names=list(spec.labels))
    return Features(cols)


def _to_dataset(columns: dict[str, Any], spec: TaskSpec, fingerprint: str) -> Dataset:
    """Build an in-memory Dataset whose fingerprint is derived from the source bytes, so the
    tokenization cache recognises the same data across processes."""
    features = _features(spec)
    table = pa.Table.from_pydict(columns, schema=features.arrow_schema)
    return Dataset(InMemoryTable(table), info=DatasetInfo(features=features), fingerprint=fingerprint)


def _fingerprint(spec: TaskSpec, split: str, digest: str, *extra: object) -> str:
    return content_key(FORMAT_VERSION, repr(spec), split, digest, *extra)


def _hash_files(paths: Iterable[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


# ---- GLUE TSV ------------------------------------------------------------------------------


def _load_tsv_task(spec: TaskSpec, folder: Path, skip_malformed: bool) -> DatasetDict:
    return DatasetDict(
        {split: _read_tsv(spec, folder / name, split, skip_malformed) for split, name in split_file_names(spec).items()}
    )


def _read_text(path: Path) -> tuple[str, str]:
    """The file's text (BOM removed) and the sha256 of its bytes."""
    if not path.is_file():
        present = sorted(p.name for p in path.parent.iterdir()) if path.parent.is_dir() else []
        raise DataFormatError(f"{path}: file not found (files in {path.parent}: {present or 'none'})")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataFormatError(f"{path}: not UTF-8 text ({e}); GLUE files are UTF-8") from e
    return text.removeprefix("\ufeff"), hashlib.sha256(raw).hexdigest()


def _column_index(spec: TaskSpec, path: Path, columns: Sequence[str]) -> dict[str, int]:
    """Our column name -> its field number in the file's rows."""
    names = {"text_a": spec.text_columns[0], "label": spec.label_column}
    if spec.is_pair:
        names["text_b"] = spec.text_columns[1]
    missing = [c for c in names.values() if c not in columns]
    if missing:
        raise DataFormatError(f"{path}:1: missing column(s) {missing} in the header; columns found: {list(columns)}")
    return {ours: list(columns).index(theirs) for ours, theirs in names.items()}


def _read_tsv(spec: TaskSpec, path: Path, split: str, skip_malformed: bool) -> Dataset:
    text, digest = _read_text(path)
    # QUOTE_NONE: GLUE text holds unbalanced quotes (MRPC); newline=None: universal newlines as open()
    reader = csv.reader(io.StringIO(text, newline=None), delimiter="\t", quoting=csv.QUOTE_NONE)
    parse_label = _label_parser(spec, path)
    skipped = 0
    try:
        header = next(reader, None) if spec.header else spec.columns
        if header is None:
            raise DataFormatError(f"{path}: empty split {split!r}: the file is empty, expected a header and rows")
        index = _column_index(spec, path, [c.strip() for c in header])
        min_fields = max(index.values()) + 1
        rows: dict[str, list[Any]] = {name: [] for name in index}
        for row in reader:
            if len(row) < min_fields:
                if skip_malformed:
                    skipped += 1
                    continue
                raise DataFormatError(
                    f"{path}:{reader.line_num}: row has {len(row)} field(s), needs at least {min_fields} "
                    f"(columns {list(header)}); pass skip_malformed=True to skip such rows"
                )
            for name, i in index.items():
                rows[name].append(parse_label(row[i], reader.line_num) if name == "label" else row[i])
    except csv.Error as e:
        raise DataFormatError(f"{path}:{reader.line_num}: unreadable TSV row: {e}") from e
    if skipped:
        log.warning("%s: skipped %d malformed row(s) with too few fields", path, skipped)
    if not rows["label"]:
        why = f"all {skipped} row(s) malformed" if skipped else "no data rows"
        raise DataFormatError(f"{path}: empty split {split!r}: {why}")
    return _to_dataset(rows, spec, _fingerprint(spec, split, digest, skip_malformed))


def _label_parser(spec: TaskSpec, path: Path) -> Callable[[str, int], int | float]:
    """A function (value, line) -> label index or score, raising DataFormatError with file:line."""
    if spec.kind == "regression":
        lo, hi = STS_RANGE

        def score(value: str, line: int) -> float:
            try:
                x = float(value)
            except ValueError:
                raise DataFormatError(
                    f"{path}:{line}: score {value!r} in column {spec.label_column!r} is not a number"
                ) from None
            if not lo <= x <= hi:  # also rejects nan
                raise DataFormatError(f"{path}:{line}: score {x} is outside [{lo:g}, {hi:g}]")
            return x

        return score
    index = {name: i for i, name in enumerate(spec.labels)}

    def label(value: str, line: int) -> int:
        try:
            return index[value.strip()]
        except KeyError:
            raise DataFormatError(
                f"{path}:{line}: unknown label {value!r} in column {spec.label_column!r}; "
                f"allowed: {', '.join(spec.labels)}"
            ) from None

    return label


# ---- Unlabeled test splits (what a GLUE submission predicts) -----------------------------------

TEST_INDEX_COLUMNS = ("index", "id")  # the first present names the rows (QQP's test file calls it id)


@dataclass(frozen=True)
class UnlabeledSplit:
    """One test file's rows: each row's index as the file writes it, and its text(s)."""

    task: str
    split: str
    path: Path
    index: list[str]
    text_a: list[str]
    text_b: list[str] | None  # pair tasks only

    def __len__(self) -> int:
        return len(self.index)


def find_test_files(spec: TaskSpec, data_dir: str | Path) -> tuple[Path, dict[str, Path]]:
    """The task's folder and the test splits of ``spec.test_files`` whose files it holds (GLUE TSV
    layout; a Hugging Face layout's folder holds none of them)."""
    layout, folder = task_folder(spec, data_dir, "not a GLUE task: it has no test split")
    if layout != "tsv":
        return folder, {}
    files = {split: folder / name for split, name in spec.test_files.items()}
    return folder, {split: path for split, path in files.items() if path.is_file()}


def diagnostic_file(task_folder: Path) -> Path:
    """Where GLUE keeps the AX diagnostic: ``glue_data/diagnostic/diagnostic.tsv`` beside the task folders."""
    return Path(task_folder).parent.joinpath(*GLUE_DIAGNOSTIC)


def read_unlabeled(spec: TaskSpec, path: Path, split: str) -> UnlabeledSplit:
    """Read a test file: a header row naming the index column and ``spec.text_columns``, then rows.

    Every row is predicted and named by its index in a submission, so a short row or an index seen
    before is an error (file:line), never skipped.
    """
    text, _ = _read_text(path)
    expected = f"a header row with {TEST_INDEX_COLUMNS[0]} (or {TEST_INDEX_COLUMNS[1]}) and {list(spec.text_columns)}"
    reader = csv.reader(io.StringIO(text, newline=None), delimiter="\t", quoting=csv.QUOTE_NONE)
    index: list[str] = []
    texts: list[list[str]] = [[] for _ in spec.text_columns]
    seen: dict[str, int] = {}
    try:
        header = [c.strip() for c in next(reader, None) or []]
        if not header:
            raise DataFormatError(f"{path}: empty test file of {spec.name}; expected {expected}, then rows")
        index_column = next((c for c in TEST_INDEX_COLUMNS if c in header), None)
        missing = ([] if index_column else [TEST_INDEX_COLUMNS[0]]) + [c for c in spec.text_columns if c not in header]
        if missing:
            raise DataFormatError(f"{path}:1: test file of {spec.name} lacks column(s) {missing}; "
                                  f"columns found: {header}; expected {expected}")
        fields = [header.index(index_column), *(header.index(c) for c in spec.text_columns)]
        need = max(fields) + 1
        for row in reader:
            if len(row) < need:
                raise DataFormatError(f"{path}:{reader.line_num}: row has {len(row)} field(s), needs at least "
                                      f"{need} (columns {header})")
            key = row[fields[0]].strip()
            if key in seen:
                raise DataFormatError(f"{path}:{reader.line_num}: index {key!r} again (first on line {seen[key]}); "
                                      "a submission names each row by its index")
            seen[key] = reader.line_num
            index.append(key)
            for column, i in zip(texts, fields[1:]):
                column.append(row[i])
    except csv.Error as e:
        raise DataFormatError(f"{path}:{reader.line_num}: unreadable TSV row: {e}") from e
    if not index:
        raise DataFormatError(f"{path}: test file of {spec.name} has a header but no rows")
    return UnlabeledSplit(spec.name, split, Path(path), index, texts[0], texts[1] if spec.is_pair else None)


# ---- Hugging Face layouts --------------------------------------------------------------------


def _load_saved_task(spec: TaskSpec, folder: Path) -> DatasetDict:
    saved = load_from_disk(str(folder))
    out = {}
    for split in split_file_names(spec):
        name = hub_split(spec, split)
        if name not in saved:
            raise DataFormatError(
                f"{folder}: no split {name!r} in this save_to_disk folder (splits found: {list(saved)}); "
                f"expected {[hub_split(spec, s) for s in split_file_names(spec)]}"
            )
        ds = saved[name]
        digest = _hash_files(Path(f["filename"]) for f in ds.cache_files)
        table = ds.with_format("arrow")[:]
        out[split] = _from_hub_table(spec, table, f"{folder}/{name}", _fingerprint(spec, split, digest))
    return DatasetDict(out)


def _load_parquet_task(spec: TaskSpec, folder: Path) -> DatasetDict:
    out = {}
    for split in split_file_names(spec):
        name = hub_split(spec, split)
        files = sorted(folder.glob(f"{name}-*.parquet"))
        if not files:
            found = sorted(p.name for p in folder.glob("*.parquet"))
            raise DataFormatError(f"{folder}/{name}-*.parquet: file not found (parquet files there: {found})")
        table = pa.concat_tables(pq.read_table(p) for p in files)
        source = str(files[0]) if len(files) == 1 else f"{folder}/{name}-*.parquet"
        out[split] = _from_hub_table(spec, table, source, _fingerprint(spec, split, _hash_files(files)))
    return DatasetDict(out)


def _from_hub_table(spec: TaskSpec, table: pa.Table, source: str, fingerprint: str) -> Dataset:
    """Rename the hub's text columns and map its label indices onto ours."""
    wanted = [*spec.hf.text_columns, spec.hf.label_column]
    missing = [c for c in wanted if c not in table.column_names]
    if missing:
        raise DataFormatError(f"{source}: missing column(s) {missing}; columns found: {table.column_names}")
    if table.num_rows == 0:
        raise DataFormatError(f"{source}: empty split, no data rows")
    texts = [pc.fill_null(table.column(c).cast(pa.string()), "") for c in spec.hf.text_columns]
    columns = dict(zip(("text_a", "text_b") if spec.is_pair else ("text_a",), texts))
    columns["label"] = _hub_labels(spec, table.column(spec.hf.label_column), source)
    return _to_dataset(columns, spec, fingerprint)


def _hub_labels(spec: TaskSpec, column: pa.ChunkedArray, source: str) -> pa.Array:
    if column.null_count:
        row = pc.index(pc.is_null(column), True).as_py()
        raise DataFormatError(f"{source}: row {row}: label is missing")
    values = column.to_numpy()
    if spec.kind == "regression":
        lo, hi = STS_RANGE
        bad = ~((values >= lo) & (values <= hi))
        _raise_first(bad, values, source, f"score outside [{lo:g}, {hi:g}]")
        return pa.array(values, type=pa.float32())
    names = spec.hf.label_names
    unknown = [n for n in names if n not in spec.labels]
    if unknown:
        raise DataFormatError(f"{source}: hub label names {unknown} are not task labels {list(spec.labels)}")
    lookup = np.array([spec.labels.index(n) for n in names], dtype=np.int64)
    bad = (values < 0) | (values >= len(names))
    why = f"label not in 0..{len(names) - 1} ({', '.join(names)}); -1 marks unlabeled test rows"
    _raise_first(bad, values, source, why)
    return pa.array(lookup[values.astype(np.int64)])


def _raise_first(bad: np.ndarray, values: np.ndarray, source: str, why: str) -> None:
    if bad.any():
        row = int(np.argmax(bad))
        raise DataFormatError(f"{source}: row {row}: {values[row]!r}: {why}")


# --------------------------------------------------------------------------------------------
# Tokenization (cached per node)
# --------------------------------------------------------------------------------------------


def tokenize_task(
    dsdict: DatasetDict,
    spec: TaskSpec,
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    cache_dir: str | Path | None,
) -> DatasetDict:
    """Tokenize every split to ``input_ids``, ``attention_mask`` (and ``token_type_ids`` when the
    tokenizer makes them) and ``labels``, truncated to ``max_length`` and not padded.

    With a ``cache_dir`` the result is stored under ``cache_dir/tokenized/<key>`` and a later call
    with the same data, tokenizer, max_length and task loads it instead of tokenizing again.
    """
    if max_length < 1:
        raise ValueError(f"max_length must be a positive number of tokens, got {max_length}")
    if cache_dir is None:
        cache_stats.misses += 1
        return _tokenize(dsdict, spec, tokenizer, max_length)
    key = cache_key(dsdict, spec, tokenizer, max_length)
    return cached_dataset(cache_dir, key, lambda: _tokenize(dsdict, spec, tokenizer, max_length),
                          f"tokenized {spec.name}")


def cache_key(dsdict: DatasetDict, spec: TaskSpec, tokenizer: PreTrainedTokenizerBase, max_length: int) -> str:
    """sha256 over the data's fingerprints, the tokenizer's identity, max_length, format, task."""
    data = {split: ds._fingerprint for split, ds in sorted(dsdict.items())}
    return content_key(json.dumps(data), tokenizer_identity(tokenizer), max_length, FORMAT_VERSION, spec.name)


def _tokenize(dsdict: DatasetDict, spec: TaskSpec, tokenizer: PreTrainedTokenizerBase, max_length: int) -> DatasetDict:
    label_dtype = np.float32 if spec.kind == "regression" else np.int64

    def encode(batch: dict[str, list]) -> dict[str, Any]:
        enc = tokenizer(batch["text_a"], batch.get("text_b"), truncation=True, max_length=max_length)
        return {**enc, "labels": np.asarray(batch["label"], dtype=label_dtype)}

    out = {}
    for split, ds in dsdict.items():
        missing = [c for c in ("text_a", "label", *(["text_b"] if spec.is_pair else [])) if c not in ds.column_names]
        if missing:
            raise ValueError(f"split {split!r} lacks column(s) {missing}; load it with load_task_data")
        # keep_in_memory: never write datasets' own cache files next to the source data
        out[split] = ds.map(
            encode,
            batched=True,
            remove_columns=ds.column_names,
            keep_in_memory=True,
            new_fingerprint=content_key(ds._fingerprint, tokenizer_identity(tokenizer), max_length),
            desc=f"tokenize {spec.name}/{split}",
        )
    return DatasetDict(out)
