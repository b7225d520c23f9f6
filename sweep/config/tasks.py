"""Task specifications: where a task's files are, which columns hold text and label, how it is scored.

The specs live in the Hydra tree (``sweep/conf/task/<NAME>.yaml``) so that a sweep's config
carries them; this module turns one such mapping into a validated, typed ``TaskSpec``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf


def _conf_dir() -> Path:
    """conf/ at the repository's top; an install maps it to the package ``sweep.conf``."""
    spec = importlib.util.find_spec("sweep.conf")
    if spec is not None and spec.origin:
        return Path(spec.origin).parent
    return Path(__file__).resolve().parents[2] / "conf"  # a checkout used without installing: <repo>/conf


CONF_DIR = _conf_dir()
GLUE_TASKS = ("CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE", "WNLI")
# GLUE's diagnostic set (AX): glue_data/diagnostic/diagnostic.tsv, MNLI's text columns, scored with MNLI's model
GLUE_DIAGNOSTIC = ("diagnostic", "diagnostic.tsv")
KINDS = ("classification", "regression", "causal_lm")
MODES = ("max", "min")
# Keys of the task group itself (not of one task): ``task.path`` is the text task's corpus folder; the rest
# describe ``task=hub``'s dataset (conf/task/hub.yaml).
GROUP_SETTINGS = ("path", "dataset", "dataset_config", "dataset_revision", "text_columns", "label_column", "labels",
                  "train_split", "eval_split")
SPLIT_PLACEHOLDER = "{split}"


class TaskConfigError(ValueError):
    """A task's config is malformed (a shipped or user-written task YAML)."""


GLUE_REPO = "nyu-mll/glue"


@dataclass(frozen=True)
class HFLayout:
    """The same task as a Hugging Face Hub dataset stores it (GLUE: ``nyu-mll/glue``): with no
    ``storage.data_dir`` the sweep reads it from there, at ``revision`` resolved once to a commit."""

    config: str  # the config's folder in the repo: cola, sst2, mnli, wikitext-2-raw-v1, data, ...
    text_columns: tuple[str, ...]
    label_names: tuple[str, ...] | None  # hub label index -> our label string (None: regression, causal LM)
    repo: str = GLUE_REPO
    revision: str = "main"
    label_column: str = "label"
    # our split -> the repo's (train -> train, dev -> validation); empty: train, and validation[_<split>]
    splits: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskSpec:
    name: str
    kind: str  # classification | regression | causal_lm
    folder: str | None  # folder under glue_data/ (or under the data dir for LM corpora); None: ``path`` only
    train_file: str  # a file name, or a glob (causal LM: "*.txt" reads every match, in name order)
    eval_files: Mapping[str, str | None]  # split name -> file; the first is the primary split
    header: bool = True
    columns: tuple[str, ...] | None = None  # names for a header-less file (CoLA)
    text_columns: tuple[str, ...] = ()
    label_column: str | None = None
    labels: tuple[str, ...] | None = None
    metric: str = "acc"
    mode: str = "max"
    hf: HFLayout | None = None
    path: str | None = None  # causal LM: the corpus folder itself (absolute), instead of data_dir/folder
    holdout_fraction: float = 0.0  # causal LM: the share of the train text an eval split of file None gets
    split_file: str | None = None  # causal LM: the files' pattern (wiki.{split}.tokens) when splits are chosen by name
    # unlabeled test split(s): split -> file with a header row: the index column (index, or QQP's id) and
    # text_columns, no label (what GLUE scores a submission on; sweep.predict_test)
    test_files: Mapping[str, str] = field(default_factory=dict)

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


Bad = Callable[[str, str], TaskConfigError]  # (key, why) -> the error naming task.<name>.<key>


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
    lm = kind == "causal_lm"
    mode = d.get("mode", "min" if lm else "max")
    if mode not in MODES:
        raise bad("mode", f"got {mode!r}, allowed: max, min")
    if d.get("split_file") is not None:
        d = {**d, **_files_of_splits(d, bad)}
    eval_files = d.get("eval_files") or {}
    if not isinstance(eval_files, Mapping) or not eval_files:
        raise bad("eval_files", "needs at least one split name -> file, e.g. {dev: dev.tsv}")
    holdout = _holdout_fraction(d, lm, eval_files, bad)  # the checks in this order: the first error is the one said
    labels = _labels(d, kind, bad)
    text_columns = tuple(d.get("text_columns") or ())
    header, columns = _columns(d, kind, text_columns, bad)
    hf = _hf_layout(d.get("hf"), bad)
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
        metric=d.get("metric", "perplexity" if lm else "acc"),
        mode=mode,
        hf=hf,
        path=_absolute(d.get("path")),
        holdout_fraction=holdout,
        split_file=d.get("split_file"),
        test_files=_test_files(d.get("test_files"), bad),
    )


def _labels(d: dict[str, Any], kind: str, bad: Bad) -> tuple[str, ...] | None:
    """A classification task's label strings (at least two); other kinds have none."""
    labels = d.get("labels")
    if kind == "classification":
        if not labels or len(labels) < 2:
            raise bad("labels", "a classification task needs a list of at least two labels")
        return tuple(str(x) for x in labels)
    if labels is not None:
        raise bad("labels", f"a {kind} task has no label list; set it to null")
    return None


def _columns(d: dict[str, Any], kind: str, text_columns: tuple[str, ...],
             bad: Bad) -> tuple[bool, tuple[str, ...] | None]:
    """(header, columns): a GLUE-style file's text and label columns, named by its header row or by
    ``columns`` (a file without one); a causal LM corpus has no columns to check."""
    header = bool(d.get("header", True))
    columns = tuple(d["columns"]) if d.get("columns") else None
    if kind == "causal_lm":
        return header, columns
    if len(text_columns) not in (1, 2):
        raise bad("text_columns", f"needs one or two column names, got {list(text_columns)}")
    if not d.get("label_column"):
        raise bad("label_column", "needs the name of the label column")
    if not header:
        if not columns:
            raise bad("columns", "a file without a header row needs 'columns' naming each column")
        missing = [c for c in (*text_columns, d["label_column"]) if c not in columns]
        if missing:
            raise bad("columns", f"does not name {missing}")
    return header, columns


def _test_files(files: Any, bad: Bad) -> dict[str, str]:
    """split -> file of the unlabeled test split(s); none: the task has no test split."""
    if not files:
        return {}
    if not isinstance(files, Mapping) or not all(isinstance(f, str) and f for f in files.values()):
        raise bad("test_files", f"needs split name -> file, e.g. {{test: test.tsv}}; got {files!r}")
    return {str(split): f for split, f in files.items()}


def _hf_layout(hf: Mapping[str, Any] | None, bad: Bad) -> HFLayout | None:
    if not hf:
        return None
    names = hf.get("label_names")
    for key in ("repo", "config", "revision"):
        value = hf.get(key, "x")
        if not isinstance(value, str) or not value.strip("/"):
            raise bad(f"hf.{key}", f"needs a non-empty string, got {value!r}")
    return HFLayout(
        config=str(hf["config"]).strip("/"),
        text_columns=tuple(hf.get("text_columns") or ()),
        label_names=tuple(str(x) for x in names) if names else None,
        repo=str(hf.get("repo") or GLUE_REPO),
        revision=str(hf.get("revision") or "main"),
        label_column=str(hf.get("label_column") or "label"),
        splits={str(k): str(v) for k, v in (hf.get("splits") or {}).items()},
    )


def _files_of_splits(d: dict[str, Any], bad: Bad) -> dict[str, Any]:
    """``split_file`` + ``train_split`` + ``eval_splits`` -> ``train_file`` and ``eval_files``.

    Lists replace each other whole in Hydra overrides (dicts merge), so choosing splits reads
    naturally on the command line: ``task.wikitext-2.train_split=valid task.wikitext-2.eval_splits=[test]``.
    """
    pattern = d["split_file"]
    if not isinstance(pattern, str) or SPLIT_PLACEHOLDER not in pattern:
        raise bad("split_file",
                  f"needs a file name holding {SPLIT_PLACEHOLDER}, e.g. wiki.{{split}}.tokens; got {pattern!r}")
    if "train_file" in d or "eval_files" in d:
        raise bad("split_file", "names the files of train_split and eval_splits; drop train_file and eval_files")
    train = d.get("train_split")
    evals = d.get("eval_splits")
    if not train or not isinstance(train, str):
        raise bad("train_split", f"needs a split name, e.g. train; got {train!r}")
    if not isinstance(evals, list) or not evals or not all(isinstance(s, str) and s for s in evals):
        raise bad("eval_splits", f"needs a non-empty list of split names, e.g. [valid, test]; got {evals!r}")
    if len(set(evals)) != len(evals):
        raise bad("eval_splits", f"has duplicates: {evals}")
    if train in evals:
        others = [s for s in evals if s != train] or ["<another split>"]
        raise bad("eval_splits", f"{train!r} is also the train split: scoring on the training text says nothing; "
                                 f"e.g. task.{d['name']}.eval_splits=[{','.join(others)}]")
    return {
        "train_file": pattern.replace(SPLIT_PLACEHOLDER, train),
        "eval_files": {s: pattern.replace(SPLIT_PLACEHOLDER, s) for s in evals},
    }


def _holdout_fraction(d: dict[str, Any], lm: bool, eval_files: Mapping[str, Any], bad: Bad) -> float:
    """An eval split with file null is cut from the end of the train text (causal LM only)."""
    held_out = [split for split, file in eval_files.items() if file is None]
    if not held_out:
        return 0.0
    if not lm:
        raise bad(f"eval_files.{held_out[0]}", "needs a file name; only a causal_lm task can hold out a split")
    if len(held_out) > 1:
        raise bad("eval_files", f"at most one split can be held out (file null), got {held_out}")
    fraction = d.get("holdout_fraction", 0.1)
    if not isinstance(fraction, (int, float)) or not 0 < fraction <= 0.5:
        raise bad("holdout_fraction", f"must be in (0, 0.5], got {fraction!r}")
    return float(fraction)


def _absolute(path: str | None) -> str | None:
    # Trials run in Ray workers' own folders: a relative path must mean the user's folder.
    return str(Path(path).expanduser().resolve()) if path else None


def load_task(name: str, **group_settings: Any) -> TaskSpec:
    """The shipped spec of one task by name (reads the YAML without composing Hydra).

    ``group_settings`` are keys of the task group, as on the command line: ``load_task("text", path=DIR)``.
    """
    path = CONF_DIR / "task" / f"{name}.yaml"
    if not path.is_file() or name == "glue":
        known = sorted(p.stem for p in (CONF_DIR / "task").glob("*.yaml") if p.stem != "glue")
        raise TaskConfigError(f"unknown task {name!r}; known tasks: {', '.join(known)}")
    node = OmegaConf.load(path)
    if "name" in node:  # packaged as task.<NAME>
        return task_from_config(node)
    # packaged as the whole task group (text.yaml: task.path and task.text): resolve as composed
    root = OmegaConf.create({"task": node})
    root.task.merge_with(group_settings)
    return task_from_config(root.task[name])


def tasks_from_config(task_node: Mapping[str, Any] | Any) -> list[TaskSpec]:
    """All tasks selected in a composed config (``cfg.task`` maps task name -> spec)."""
    if OmegaConf.is_config(task_node):
        unset = [k for k in GROUP_SETTINGS if k in task_node.keys() and OmegaConf.is_missing(task_node, k)]
        if unset:  # task=hub without its dataset or labels
            raise TaskConfigError(f"task.{unset[0]}: required with this task ({_example(unset[0])})")
    unknown = [k for k, v in task_node.items() if not _is_mapping(v) and k not in GROUP_SETTINGS]
    if unknown:
        raise TaskConfigError(f"task.{unknown[0]}: not a task; tasks are configured as task.<NAME>.<key>")
    specs = [task_from_config(node) for node in task_node.values() if _is_mapping(node)]
    if not specs:
        raise TaskConfigError("task: no task selected; e.g. task=WNLI, task=[WNLI,RTE] or task=glue")
    return specs


def _example(key: str) -> str:
    examples = {"dataset": "task.dataset=ORG/NAME, a dataset repo on the Hugging Face Hub",
                "labels": "the label names in index order, e.g. 'task.labels=[negative,positive]'"}
    return examples.get(key, f"task.{key}=...")


def _is_mapping(node: Any) -> bool:
    return isinstance(node, Mapping) or OmegaConf.is_dict(node)
