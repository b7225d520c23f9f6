"""The trial contract, without Ray: what a trial reports and keeps, and how a trial is named.

Every evaluation a trial reports to Tune is one ``Report``; the same row goes into the trial's own
history file, and an ended trial's last row says so (``trial_done``, ``trial_error``, ``stopped``).
The driver (records, the rungs a resumed sweep replays, the MLflow runs, the progress line) reads
reports and history rows only as ``Report``. ``trial_of`` / ``trial_key`` / ``point_of`` name a
trial from its Tune config.

The history: a trial writes ``<storage>/history/<Tune trial id>.json`` after every evaluation, from
whatever node runs it; the driver reads it for the records (Tune's own table of a killed driver
misses the last rows), a resumed sweep for the trials already done and for the rungs its new board
must learn. The storage is a folder every node sees, or ``s3://…`` (any URI pyarrow opens, as Ray's
own storage does): both are written and read through ``TrialHistories``, so nothing depends on the
driver and the trial sharing a disk. A file is replaced whole (an atomic rename on a folder, one
PUT on S3), never seen half-written.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

from sweep.remote_files import JsonFolder

FOLDER = "history"
EVAL_PREFIX = "eval/"  # a report's key for each eval metric: eval/accuracy, eval/eval_loss, ...
PBT_PREFIX = "pbt/"  # a report's key for each value PBT mutates: pbt/lr, ...
# Tune keeps each trial's best checkpoint by this report key (plus the latest, for a restart).
CHECKPOINT_RANK = "checkpoint_rank"
CHECKPOINT_MARKER = "sweep_epoch.json"  # in each checkpoint folder: which evaluation (epoch, step) it holds
# In each checkpoint folder: optimizer, scheduler and evaluations done, what a resume needs. Never exported:
# twice the model's size, and of no use to a server or the registry.
TRAINING_STATE = "training_state.pt"


def checkpoint_rank(score: float, progress: float) -> float:
    """The score, the earlier evaluation first among equal ones (progress: step / planned steps, <= 1),
    as finetune's own choice of the best evaluation."""
    return score - 1e-9 * progress


@dataclass(frozen=True)
class Report:
    """One report of a trial (an evaluation, a DDP trial's workers-ready, or an ended trial's last
    row), as Tune gets it and the history keeps it: ``to_row`` is the flat dict both hold (a key
    per field that is set, ``eval/<name>`` per eval metric); ``from_row`` reads one back, from a
    history file, a Tune result or Tune's table (NaN is unset, unknown keys are ignored)."""

    trial_id: str
    task: str | None = None
    seed: int | None = None
    launch_id: str | None = None  # the driver launch that ran it (a resumed sweep has a new one)
    # the evaluation
    epoch: int | None = None
    step: int | None = None
    steps_total: int | None = None
    progress: float | None = None  # step / steps_total
    end_of_epoch: bool | None = None
    score: float | None = None  # the task's selection score (higher is better)
    trivial_score: float | None = None  # what a model ignoring its input scores (None: causal LM)
    train_loss: float | None = None
    rung: bool | None = None  # seed halving's decision point
    checkpoint_rank: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # the eval metrics, without the prefix
    # sweep.selection: the report split's metrics, at an evaluation that became the trial's best (metrics and
    # score are then the selection split's); no decision reads them
    report: dict[str, float] = field(default_factory=dict)
    train_seconds: float | None = None
    eval_seconds: float | None = None
    train_tokens: int | None = None
    # where and when it ran
    node: str | None = None
    node_ip: str | None = None
    host: str | None = None
    device: str | None = None
    resumed: bool | None = None
    pid: int | None = None
    rss_at_start_mb: float | None = None
    driver_started: float | None = None
    process_started: float | None = None
    imported: float | None = None
    loop_started: float | None = None
    reported_at: float | None = None
    workers_ready: int | None = None
    checkpoint_path: str | None = None  # rows of Tune's own table may carry it
    checkpoint_id: str | None = None  # the checkpoint this evaluation wrote (its marker says the same)
    # sweep.scheduler=pbt: the mutated values this evaluation trained with, and on the first evaluation
    # after an exploit, whose checkpoint (trial, step) the trial went on from
    pbt: dict[str, float] = field(default_factory=dict)
    donor: str | None = None
    donor_step: int | None = None
    # the end of the trial (its last history row)
    trial_done: bool | None = None
    trial_error: str | None = None  # the one-line error of a trial that failed on its own data/config/model
    stopped: str | None = None  # why the rungs stopped it (degenerate / below median …)
    stopped_at_step: int | None = None
    stopped_at_progress: float | None = None

    @property
    def is_evaluation(self) -> bool:
        return self.score is not None and self.step is not None

    def to_row(self) -> dict[str, Any]:
        row = {f.name: getattr(self, f.name) for f in _FIELDS if f.name not in _PREFIXED}
        row = {k: v for k, v in row.items() if v is not None}
        prefixed = {f"{prefix}{k}": v for name, prefix in _PREFIXED.items() for k, v in getattr(self, name).items()}
        return {**row, **prefixed}

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Report:
        values = {f.name: _cast(f.type, row.get(f.name)) for f in _FIELDS if f.name not in _PREFIXED}
        values["trial_id"] = str(values["trial_id"] or "")
        prefixed = {name: {k[len(prefix):]: float(v) for k, v in row.items() if k.startswith(prefix) and _set(v)}
                    for name, prefix in _PREFIXED.items()}
        return cls(**values, **prefixed)

    def ended(self, **end: Any) -> Report:
        """This row as a trial's last: ``trial_done`` and whatever ``end`` says (why the rungs stopped it)."""
        return dataclasses.replace(self, trial_done=True, **end)


_FIELDS = dataclasses.fields(Report)
REPORT_PREFIX = "report/"  # a report's key for each report-split metric (sweep.selection): report/acc, ...
_PREFIXED = {"metrics": EVAL_PREFIX, "pbt": PBT_PREFIX, "report": REPORT_PREFIX}  # dict fields, a flat key each


def _set(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _cast(kind: str, value: Any) -> Any:
    """A row's value as the field's type (ints from Tune's float columns, numpy scalars as Python's)."""
    if not _set(value):
        return None
    if kind.startswith("int"):
        return int(value)
    if kind.startswith("float"):
        return float(value)
    if kind.startswith("bool"):
        return bool(value)
    return str(value) if kind.startswith("str") else value


def history_to_go_on_from(rows: list[Report], marker: dict[str, Any], trial_id: str) -> list[Report]:
    """The history rows a trial keeps when it goes on from a checkpoint whose marker is ``marker``.

    Its own checkpoint (a retry, a pause, a resumed sweep): the rows up to the evaluation that wrote it,
    found by its ``checkpoint_id`` (by step for markers older than ids). Steps alone cannot say it: after
    a PBT exploit a trial's steps may go back. Another trial's (an exploit): every row stays, but an
    earlier start from that same checkpoint (a crash before its first own checkpoint) is dropped."""
    writer, step = marker.get("trial_id"), int(marker.get("step") or 0)
    if writer is not None and writer != trial_id:
        again = [i for i, row in enumerate(rows) if row.donor == writer and row.donor_step == step]
        return rows[:again[-1]] if again else list(rows)
    ids = [row.checkpoint_id for row in rows]
    wrote = marker.get("checkpoint_id")
    if wrote and wrote in ids:
        return rows[:len(ids) - ids[::-1].index(wrote)]
    kept = [row for row in rows if (row.step or 0) <= step]
    if marker.get("report"):  # reported, then killed before its history row: the checkpoint holds the row
        kept.append(Report.from_row(marker["report"]))
    return kept


def steps_trained(rows: list[Report]) -> int:
    """The optimizer steps a trial trained: its last step, or after PBT exploits (which go on from a
    donor's step, maybe behind its own) the sum of what each stretch trained."""
    steps = [row for row in rows if row.step is not None]
    if not any(row.donor for row in steps):
        return max((row.step for row in steps), default=0)
    trained, last = 0, 0
    for row in steps:
        start = (row.donor_step or 0) if row.donor else last
        trained += max(row.step - start, 0)
        last = row.step
    return trained


def pbt_schedule(rows: list[Report]) -> list[dict[str, Any]]:
    """A PBT trial's values over its training, from its history: one entry per stretch trained with one
    set of values, ``{"from_step", "values", "donor"}``. After an exploit the stretch begins at the
    donor's step (the trial went on from its checkpoint) and names the donor; [] without PBT."""
    schedule: list[dict[str, Any]] = []
    last_step = 0
    for row in rows:
        if not row.pbt:
            continue
        if row.donor is not None:
            schedule.append({"from_step": row.donor_step or 0, "values": dict(row.pbt), "donor": row.donor})
        elif not schedule or schedule[-1]["values"] != row.pbt:
            schedule.append({"from_step": last_step, "values": dict(row.pbt), "donor": None})
        last_step = row.step or last_step
    return schedule


def trial_of(config: dict[str, Any]) -> tuple[str, int, dict[str, Any]]:
    """A Tune trial's (task, seed, hparams) from its config: ``trial`` is the point of the dispatch
    order (task, seed, grid values), ``hparams`` the search samples (``schedulers/gate.py``)."""
    point = config["trial"]
    return point["task"], int(point["seed"]), {**(point.get("grid") or {}), **(config.get("hparams") or {})}


# A trial's own keys in its Tune config beside its search values: its point, and from the ledger its identity,
# sample round and the earlier launch's trial it goes on as. A PBT exploit copies the donor's config but these.
OWN_KEYS = ("trial", "identity", "sample_round", "continues")


def sweep_trial_id(tune_trial_id: str, config: dict[str, Any] | None) -> str:
    """The id a trial reports with (names its history, Train run and MLflow run): Tune's, or on a resumed
    launch the id of the earlier launch's trial it goes on as (``continues``, from the ledger)."""
    return ((config or {}).get("continues") or {}).get("trial_id") or tune_trial_id


def trial_key(config: dict[str, Any]) -> str:
    """The dispatch point a trial runs (task, seed, grid values), as one hashable key."""
    return json.dumps(config["trial"], sort_keys=True)


def point_of(task: str, seed: int, grid: dict[str, Any]) -> dict[str, Any]:
    """A trial's entry in the param space: what ``trial_of`` reads back."""
    return {"task": task, "seed": seed, "grid": grid}


class TrialHistories:
    """The history files of one sweep, under ``root`` (``<storage path>/history``, a folder or URI)."""

    def __init__(self, root: str) -> None:
        self.root = str(root).rstrip("/")
        self.files = JsonFolder(self.root)

    def __reduce__(self):  # travels to the trials as its root alone (a pyarrow filesystem is per process)
        return (TrialHistories, (self.root,))

    @property
    def remote(self) -> bool:
        return self.files.remote

    def location(self, trial_id: str) -> str:
        return f"{self.root}/{trial_id}.json"

    def read(self, trial_id: str) -> list[Report]:
        """The trial's rows, oldest first ([] when it has written none)."""
        return [Report.from_row(row) for row in self.files.read(trial_id) or []]

    def write(self, trial_id: str, rows: list[Report]) -> None:
        self.files.write(trial_id, [row.to_row() for row in rows])

    def all(self) -> dict[str, list[Report]]:
        """Every trial's rows by Tune trial id, in the ids' order."""
        return {trial_id: self.read(trial_id) for trial_id in self.files.names()}
