"""The selection split: the rows every decision of a sweep is made on, apart from the rows it reports on.

Picking the best of many seeds on the rows its score is reported on biases that score upward (the winner's
curse: the maximum of N noisy scores). So the sweep decides on a selection split (early stops, schedulers,
the search's objective, the best checkpoint, the best trial, the champion) and reports the chosen trial's
score on the report split (the task's eval splits, GLUE dev), which no decision reads.

``sweep.selection``:
- ``train`` (the default): a fraction of the training rows (stratified by label for classification),
  at most as many rows as the primary eval split has, drawn with ``sweep.selection_seed`` (the same rows
  for every trial);
- ``dev_half``: the primary eval split in two halves (stratified, the same seed): one selects, one reports;
- a split name: one of the task's eval splits selects (MNLI: ``validation_mismatched``), the others report;
- ``none``: today's single split, decisions and report on the same rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SELECTION = "selection"  # the split's name in a task's data


@dataclass(frozen=True)
class Selection:
    """Where a trial's decisions are made: ``kind`` (sweep.selection), the fraction of training rows it
    takes (``train``) and the seed that draws them."""

    kind: str = "none"
    fraction: float = 0.1
    seed: int = 0

    @property
    def on(self) -> bool:
        return self.kind != "none"


NO_SELECTION = Selection()  # decisions and report on the task's eval splits (sweep.selection=none)


def carve_selection(data, spec, selection: Selection):
    """``data`` (a DatasetDict of the task's train and eval splits) with a ``selection`` split carved out
    as ``selection`` says, and the names of the report splits; unchanged (and the eval splits) with none."""
    report = report_splits(spec, selection)
    if not selection.on:
        return data, report
    if selection.kind == "train":
        rows = min(math.ceil(selection.fraction * len(data["train"])), len(data[spec.primary_eval]))
        data["train"], data[SELECTION] = _split(data["train"], rows, selection.seed)
    elif selection.kind == "dev_half":
        primary = spec.primary_eval
        data[primary], data[SELECTION] = _split(data[primary], len(data[primary]) // 2, selection.seed)
    else:  # a named eval split selects; the others report
        data[SELECTION] = data.pop(selection.kind)
    return data, report


def _split(ds, rows: int, seed: int):
    """(the rest, ``rows`` rows drawn with ``seed``), stratified by a class label where every class can be."""
    stratify = "label" if _can_stratify(ds, rows) else None
    parts = ds.train_test_split(test_size=rows, seed=seed, shuffle=True, stratify_by_column=stratify)
    return parts["train"], parts["test"]


def _can_stratify(ds, rows: int) -> bool:
    """A ClassLabel column whose every class has 2 rows or more, and room for each class in both parts."""
    feature = ds.features.get("label")
    if feature is None or type(feature).__name__ != "ClassLabel":
        return False
    counts: dict[int, int] = {}
    for label in ds["label"]:
        counts[label] = counts.get(label, 0) + 1
    classes = len(counts)
    return min(counts.values(), default=0) >= 2 and classes <= rows <= len(ds) - classes


def report_splits(spec, selection: Selection) -> list[str]:
    """The splits a task reports on: its eval splits, but the one a named selection takes."""
    return [split for split in spec.eval_files if split != selection.kind]


def selection_of(sweep) -> Selection:
    """The sweep's ``Selection`` from its ``SweepConfig``."""
    return Selection(sweep.selection, sweep.selection_fraction, sweep.selection_seed)
