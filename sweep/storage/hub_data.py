"""The data folder a sweep reads, made from the Hub's snapshots: one folder whatever the tasks' repos.

A classification task's config folder (``rte/`` of nyu-mll/glue, ``data/`` of a user's dataset) is linked
in as it is: ``sweep.data.glue`` reads the Hub's parquet layout. A causal-LM corpus (WikiText's parquet
rows, each a line of the original file) is written out as the text files ``sweep.data.lm`` reads
(``wikitext-2-raw/wiki.train.raw``). Built once per node and set of pins, under a lock, in the sweep's cache.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from filelock import FileLock

from sweep.config.tasks import TaskSpec
from sweep.data.task_files import hub_split
from sweep.files import atomic_folder
from sweep.storage import hub_files
from sweep.storage.hub import HubPin

LAYOUT_VERSION = 1  # bump when the folder's layout changes, so that old ones are not reused
DONE = ".hub-data.json"  # written last: which pins the folder was made from


def hub_data_dir(tasks: list[tuple[TaskSpec, HubPin, Path]], cache: Path) -> Path:
    """The data folder for ``tasks`` (each with its dataset's pin and snapshot folder on this node)."""
    made_from = {"version": LAYOUT_VERSION,
                 "tasks": sorted([spec.name, spec.hf.config, pin.repo_id, pin.sha] for spec, pin, _ in tasks)}
    digest = hashlib.sha256(json.dumps(made_from).encode()).hexdigest()[:16]
    target = Path(cache) / "hub-data" / digest
    if (target / DONE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / DONE).is_file():
            return target
        with atomic_folder(target) as tmp:  # a half-made folder is never taken for one
            for spec, pin, snapshot in tasks:
                if spec.kind == "causal_lm":
                    _write_corpus(spec, pin, snapshot, tmp / spec.folder)
                elif not (tmp / spec.hf.config).exists():
                    os.symlink(snapshot / spec.hf.config, tmp / spec.hf.config, target_is_directory=True)
            (tmp / DONE).write_text(json.dumps(made_from, indent=1))
    return target


def _write_corpus(spec: TaskSpec, pin: HubPin, snapshot: Path, folder: Path) -> None:
    """Each split's parquet rows, joined, as the split's text file (WikiText's rows keep their newlines)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    column = spec.hf.text_columns[0] if spec.hf.text_columns else "text"
    if spec.split_file and spec.hf.splits:  # every split, named as the task's pattern names it: wiki.valid.raw
        files = {spec.split_file.replace("{split}", ours): theirs for ours, theirs in spec.hf.splits.items()}
    else:
        files = {name: hub_split(spec, split) for split, name in {"train": spec.train_file, **spec.eval_files}.items()
                 if name is not None}  # a split of file None is held out of the train text
    for name, split in files.items():
        parts = hub_files.split_files(pin.files, spec.hf.config, split)
        table = pa.concat_tables(pq.read_table(snapshot / part, columns=[column]) for part in parts)
        rows = table.column(column).fill_null("").to_pylist()
        with open(folder / name, "w", encoding="utf-8", newline="") as f:
            f.write("".join(row if row.endswith("\n") else row + "\n" for row in rows))
