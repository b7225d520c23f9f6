"""Task specifications: where a task's files are, which columns hold text and label, how it is scored.

The specs live in the Hydra tree (``sweep/conf/task/<NAME>.yaml``) so that a sweep's config
carries them; this module turns one such mapping into a validated, typed ``TaskSpec``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

CONF_DIR = Path(__file__).resolve().parent / "conf"
GLUE_TASKS = ("CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE", "WNLI")
KINDS = ("classification", "regression", "causal_lm")
MODES = ("max", "min")


class TaskConfigError(ValueError):
    """A task's config is malformed (a shipped or user-written task YAML)."""


@dataclass(frozen=True)
class HFLayout:
    """The same task as the Hugging Face hub's ``nyu-mll/glue`` stores it."""

    config: str  # sub-folder name on the hub: cola, sst2, mnli, ...
    text_columns: tuple[str, ...]
    label_names: tuple[str, ...] | None  # hub label index -> our label string (None: regression)


@dataclass(frozen=True)
class TaskSpec:
    name: str
    kind: str  # classification | regression | causal_lm
    folder: str  # folder under glue_data/ (or under the data dir for LM corpora)
    train_file: str
    eval_files: Mapping[str, str]  # split name -> file; the first is the primary split
    header: bool = True
    columns: tuple[str, ...] | None = None  # names for a header-less file (CoLA)
    text_columns: tuple[str, ...] = ()
    label_column: str | None = None
    labels: tuple[str, ...] | None = None
    metric: str = "acc"
    mode: str = "max"
    hf: HFLayout | None = None

    @property
    def num_labels(self) -> int:
        """Outputs of the model head: 1 for regression, the label count for classification."""
        if self.kind == "regression":
            return 1
        return len(self.labels or ())

    @property
    def primary_eval(self) -> str:
        return next(iter(self.eval_files))

    @property
    def is_pair(self) -> bool:
        return len(self.text_columns) == 2


def task_from_config(cfg: Mapping[str, Any] | Any) -> TaskSpec:
    """Build a TaskSpec from one task's config node, with errors that name the bad key."""
    d = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else dict(cfg)
    name = d.get("name")
    if not name or not isinstance(name, str):
        raise TaskConfigError("task: every task config needs a string 'name'")

    def bad(key: str, why: str) -> TaskConfigError:
        return TaskConfigError(f"task.{name}.{key}: {why}")

    kind = d.get("kind", "classification")
    if kind not in KINDS:
        raise bad("kind", f"got {kind!r}, allowed: {', '.join(KINDS)}")
    mode = d.get("mode", "max")
    if mode not in MODES:
        raise bad("mode", f"got {mode!r}, allowed: max, min")
    eval_files = d.get("eval_files") or {}
    if not isinstance(eval_files, Mapping) or not eval_files:
        raise bad("eval_files", "needs at least one split name -> file, e.g. {dev: dev.tsv}")
    text_columns = tuple(d.get("text_columns") or ())
    labels = d.get("labels")
    if kind == "classification":
        if not labels or len(labels) < 2:
            raise bad("labels", "a classification task needs a list of at least two labels")
        labels = tuple(str(x) for x in labels)
    elif labels is not None:
        raise bad("labels", f"a {kind} task has no label list; set it to null")
    if kind != "causal_lm":
        if len(text_columns) not in (1, 2):
            raise bad("text_columns", f"needs one or two column names, got {list(text_columns)}")
        if not d.get("label_column"):
            raise bad("label_column", "needs the name of the label column")
    header = bool(d.get("header", True))
    columns = tuple(d["columns"]) if d.get("columns") else None
    if kind != "causal_lm" and not header:
        if not columns:
            raise bad("columns", "a file without a header row needs 'columns' naming each column")
        missing = [c for c in (*text_columns, d["label_column"]) if c not in columns]
        if missing:
            raise bad("columns", f"does not name {missing}")
    hf = d.get("hf")
    hf_layout = None
    if hf:
        names = hf.get("label_names")
        hf_layout = HFLayout(
            config=str(hf["config"]),
            text_columns=tuple(hf.get("text_columns") or ()),
            label_names=tuple(str(x) for x in names) if names else None,
        )
    return TaskSpec(
        name=name,
        kind=kind,
        folder=d.get("folder", name),
        train_file=d.get("train_file", "train.tsv"),
        eval_files=dict(eval_files),
        header=header,
        columns=columns,
        text_columns=text_columns,
        label_column=d.get("label_column"),
        labels=labels,
        metric=d.get("metric", "acc"),
        mode=mode,
        hf=hf_layout,
    )


def load_task(name: str) -> TaskSpec:
    """The shipped spec of one task by name (reads the YAML without composing Hydra)."""
    path = CONF_DIR / "task" / f"{name}.yaml"
    if not path.is_file() or name == "glue":
        known = sorted(p.stem for p in (CONF_DIR / "task").glob("*.yaml") if p.stem != "glue")
        raise TaskConfigError(f"unknown task {name!r}; known tasks: {', '.join(known)}")
    return task_from_config(OmegaConf.load(path))


def tasks_from_config(task_node: Mapping[str, Any] | Any) -> list[TaskSpec]:
    """All tasks selected in a composed config (``cfg.task`` maps task name -> spec)."""
    specs = [task_from_config(node) for node in task_node.values()]
    if not specs:
        raise TaskConfigError("task: no task selected; e.g. task=WNLI, task=[WNLI,RTE] or task=glue")
    return specs
