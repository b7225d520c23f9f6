"""Tune's results -> one ``TrialRecord`` per trial (the best evaluation's metrics and checkpoint),
and the folders holding the sweep's checkpoints. Every row is read as a ``trials.Report``: from
the trial's own history first, else from Tune's table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ray.tune import Callback

from sweep.config.settings import Settings
from sweep.failures import trial_failure_line
from sweep.plan.sizes import TaskPlacement
from sweep.results.ledger import TrialEntry
from sweep.results.records import TrialRecord
from sweep.results.trial_reports import (
    CHECKPOINT_MARKER,
    Report,
    TrialHistories,
    pbt_schedule,
    steps_trained,
    sweep_trial_id,
    trial_of,
)


def records_from_results(grid, settings: Settings, plans: dict[str, TaskPlacement],
                         histories: TrialHistories | None = None, train_dir: Path | None = None, run_id_of=None,
                         configs: dict[str, dict] | None = None,
                         earlier: dict[str, TrialEntry] | None = None) -> list[TrialRecord]:
    """One TrialRecord per Tune trial (``plans``: each task's), with the best evaluation's metrics and checkpoint.

    ``run_id_of(tune trial id, task, seed, hparams)``: the id of the trial's MLflow run (the driver logged it).
    ``configs``: each trial's config by its folder's name (``TrialConfigs``), for a trial that never reported.
    ``earlier``: the ledger's entries by the id their trials report with: where a trial an earlier launch
    started kept its checkpoints (its best may be one of them)."""
    records = []
    tables = [(result, _history(result, histories)) for result in grid]
    first_in_process = _first_trial_per_process([rows for _, rows in tables])
    for result, rows in tables:
        config = _config(result, configs or {})
        task, seed, hparams = trial_of(config) if config else ("?", -1, {})
        trial_id = _trial_id(result)
        record = _record(task, seed, hparams, plans.get(task), result.path.rsplit("/", 1)[-1] if result.path else "")
        ranked = [row for row in rows if row.checkpoint_rank is not None]
        if ranked:
            best = _fill(record, settings, rows, first_in_process, run_id_of, trial_id)
            record.checkpoint = (_best_checkpoint(best, _checkpoint_dirs(result, train_dir, trial_id))
                                 if train_dir is not None else _remote_best_checkpoint(result, best))
            folders = list(earlier[trial_id].folders if earlier and trial_id in earlier else [])  # oldest first
            here = _folder_of(result)
            _checkpoint_still_there(record, best, rows, folders + ([here] if here and here not in folders else []))
        own_error = _own_error(result, rows)
        if own_error is not None:  # failed on its own data/config/model: ended at once, not retried
            record.status, record.error = "ERROR", own_error
        elif result.error is not None or record.score is None:
            record.status = "ERROR"
            record.error = trial_failure_line(result.error) if result.error is not None else "trial reported no result"
        records.append(record)
    return records


def records_from_ledger(entries: list[TrialEntry], settings: Settings, plans: dict[str, TaskPlacement],
                        histories: TrialHistories, run_id_of=None) -> list[TrialRecord]:
    """The records of the trials an earlier launch ended (the ledger's finished and failed entries): from
    their histories, their checkpoints found in the folders they ran in."""
    records = []
    tables = [(entry, histories.read(entry.trial_id) if entry.trial_id else []) for entry in entries]
    first_in_process = _first_trial_per_process([rows for _, rows in tables])
    for entry, rows in tables:
        hparams = {**(entry.grid or {}), **(entry.hparams or {})}
        last = entry.folders[-1].rstrip("/").rsplit("/", 1)[-1] if entry.folders else ""
        record = _record(entry.task, entry.seed, hparams, plans.get(entry.task), last)
        if any(row.checkpoint_rank is not None for row in rows):
            best = _fill(record, settings, rows, first_in_process, run_id_of, entry.trial_id)
            _checkpoint_still_there(record, best, rows, entry.folders)
        own_error = rows[-1].trial_error if rows else None
        if entry.state == "failed" or own_error or record.score is None:
            record.status = "ERROR"
            record.error = own_error or entry.error or "trial reported no result"
        records.append(record)
    return records


def _record(task: str, seed: int, hparams: dict[str, Any], plan: TaskPlacement | None, folder_name: str) -> TrialRecord:
    return TrialRecord(task=task, seed=seed, hparams=hparams,
                       gpus=plan.size.gpus_per_worker * plan.size.workers if plan else 0.0, trial_id=folder_name)


def _fill(record: TrialRecord, settings: Settings, rows: list[Report], first_in_process: dict[int, float], run_id_of,
          trial_id: str | None) -> Report:
    """The record's best evaluation, schedule and MLflow run from the trial's rows; returns the best row."""
    ranked = [row for row in rows if row.checkpoint_rank is not None]
    best = max(ranked, key=lambda row: row.checkpoint_rank)  # the first of equal ranks, as idxmax
    _best_evaluation(record, settings, rows, best, first_in_process)
    record.schedule = pbt_schedule(rows)
    record.run_id = (run_id_of(trial_id, record.task, record.seed, record.hparams)
                     if run_id_of is not None and trial_id else "")
    return best


def _folder_of(result) -> str | None:
    """A Tune result's trial folder as a URI (s3://…) or a local path."""
    if not result.path:
        return None
    from sweep.remote_files import uri_of

    return uri_of(result.filesystem, result.path) if result.filesystem is not None else _local_path(result.path)


def _checkpoint_still_there(record: TrialRecord, best: Report, rows: list[Report], folders: list[str]) -> None:
    """The best evaluation's checkpoint as it is in storage now: where Tune said it is, else found by its
    marker in any folder the trial ran in; gone (a kill between Tune's deletion of an older checkpoint and
    its snapshot, a torn upload, a resumed launch's retention), the trial's newest whole checkpoint, which
    ``checkpoint_note`` says. The end of the sweep exports what is there, never a path that is not."""
    from sweep.trial.kept_checkpoints import folder_exists, newest_whole, with_marker

    if record.checkpoint and folder_exists(record.checkpoint):
        return
    record.checkpoint = with_marker(folders, best.checkpoint_id, best.step)
    if record.checkpoint is not None:
        return
    recorded = {row.checkpoint_id: row for row in rows if row.checkpoint_id}
    found = newest_whole(folders, set(recorded))
    if found is None:
        return
    record.checkpoint, checkpoint_id = found
    kept = recorded[checkpoint_id]
    record.checkpoint_note = (f"its best checkpoint (step {best.step}) is gone from storage; its newest whole one "
                              f"(step {kept.step}, score {kept.score:.4f}) is exported instead")


def _best_evaluation(record: TrialRecord, settings: Settings, rows: list[Report], best: Report,
                     first_in_process: dict[int, float]) -> None:
    """The best evaluation's metrics and where the trial's time went."""
    record.metrics = dict(best.metrics)
    spec = next(t for t in settings.tasks if t.name == record.task)
    record.score = record.metrics.get(spec.metric)
    record.report_metrics = dict(best.report)  # sweep.selection: the report split's, at this same evaluation
    record.report_score = best.report.get(spec.metric)
    record.best_epoch = int(best.epoch or 0)
    _steps_and_stop(record, rows, best)
    first = rows[0]
    started = _trial_started(first, first_in_process)
    record.wall_seconds = float(max(row.reported_at or 0.0 for row in rows) - started)
    record.loop_seconds = float(sum((row.train_seconds or 0.0) + (row.eval_seconds or 0.0) for row in rows))
    first_batch = (first.reported_at or 0.0) - (first.train_seconds or 0.0) - (first.eval_seconds or 0.0)
    record.startup_seconds = float(first_batch - started)
    record.started_at = started
    record.pid = first.pid
    record.node = best.node or ""


def _steps_and_stop(record: TrialRecord, rows: list[Report], best: Report) -> None:
    """The compute a trial spent (steps trained, whole epochs) and, if the rungs stopped it, why and when."""
    steps = [row.step for row in rows if row.step is not None]
    if not steps:  # rows of an older sweep: one per epoch
        record.epochs_done = max(row.epoch or 0 for row in rows)
        return
    record.best_step = int(best.step)
    record.steps_done = steps_trained(rows)
    record.steps_total = max(row.steps_total or 0 for row in rows)
    ends = [row.epoch or 0 for row in rows if row.end_of_epoch]
    record.epochs_done = max(ends) if ends else 0
    last = rows[-1]
    if last.stopped:
        record.stopped = last.stopped
        record.stopped_at_step = last.step


def _own_error(result, rows: list[Report]) -> str | None:
    """The error line of a trial that ended on its own data, config or model (``Report.trial_error``):
    in its last report, or (Tune's state lost with a killed driver) its history's last row."""
    text = Report.from_row({"trial_id": "", **(result.metrics or {})}).trial_error
    if not text and rows:
        text = rows[-1].trial_error
    return text or None


def _first_trial_per_process(histories: list[list[Report]]) -> dict[int, float]:
    """pid -> the driver start of the first trial that process ran (a reused process runs several)."""
    first: dict[int, float] = {}
    for rows in histories:
        if rows and rows[0].pid is not None and rows[0].driver_started is not None:
            pid, started = rows[0].pid, rows[0].driver_started
            first[pid] = min(first.get(pid, started), started)
    return first


def _trial_started(first_row: Report, first_in_process: dict[int, float]) -> float:
    """When the trial began costing time: the process start for the first trial a process ran (it
    paid for starting the process and importing torch), the trial's own start for a reused one."""
    started = float(first_row.driver_started or 0.0)
    pid = first_row.pid
    if pid is not None and first_in_process.get(pid) == started and first_row.process_started is not None:
        started = min(started, first_row.process_started)
    return started


class TrialConfigs(Callback):
    """Each trial's config by its folder's name, as Tune ran it. A trial killed before its first report
    has none in its Result (Tune's ``Result.config`` is its last report's), and its record must still
    say which task and seed failed: the exit code and the failure lines go by task."""

    def __init__(self) -> None:
        self.by_folder: dict[str, dict] = {}

    def __getstate__(self) -> dict:
        return {"by_folder": {}}  # Tune pickles its callbacks into the experiment

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        self._keep(trial)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self._keep(trial)

    def _keep(self, trial) -> None:
        if trial.path and trial.config and "trial" in trial.config:
            self.by_folder[trial.path.rstrip("/").rsplit("/", 1)[-1]] = trial.config


def _config(result, configs: dict[str, dict]) -> dict | None:
    if result.config and "trial" in result.config:
        return result.config
    return configs.get(result.path.rstrip("/").rsplit("/", 1)[-1]) if result.path else None


def reported_ids(grid) -> dict[str, str]:
    """Each trial's folder name (``TrialRecord.trial_id``) -> the id it reported with (its history's name)."""
    ids = {}
    for result in grid:
        trial_id = _trial_id(result)
        if result.path and trial_id:
            ids[result.path.rsplit("/", 1)[-1]] = trial_id
    return ids


def _trial_id(result) -> str | None:
    """The id the trial reported with every evaluation (None: it never reported): Tune writes its own id into
    every result, over the trial's; a resumed launch's trial goes on under an earlier launch's (its config says)."""
    tune_id = (result.metrics or {}).get("trial_id")
    return sweep_trial_id(tune_id, result.config) if tune_id else None


def _checkpoint_dirs(result, train_dir: Path | None, trial_id: str | None) -> list[Path]:
    """Where a trial's checkpoints are: its Tune trial folder (a trial run in its own process) and
    its Train run folder (a DDP trial); only on local storage."""
    local = _local_path(result.path)
    if train_dir is None or not local:  # remote storage: nothing on this machine's disk
        return []
    return [Path(local)] + ([train_dir / f"trial-{trial_id}"] if trial_id else [])


def checkpoint_folders(grid, train_dir: Path | None, remote_train: str | None = None,
                       earlier: list[str] = ()) -> list[Path | str]:
    """Every folder holding the sweep's checkpoints (pruned once the best models are exported):
    Train's runs (DDP trials) and the ``checkpoint_*`` folders in Tune's trial folders, this launch's and
    ``earlier`` launches' (the ledger's); on remote storage (``train_dir`` None) their URIs."""
    from sweep.trial.kept_checkpoints import checkpoint_locations

    if train_dir is None:
        folders = _remote_checkpoint_folders(grid, remote_train)
    else:
        folders = [train_dir] if train_dir.exists() else []
        for result in grid:
            local = _local_path(result.path)
            if local:
                folders += sorted(Path(local).glob("checkpoint_*"))
    known = {str(f) for f in folders}
    return folders + [f for f in checkpoint_locations(list(earlier)) if f not in known]


def _remote_checkpoint_folders(grid, remote_train: str | None) -> list[str]:
    import pyarrow.fs

    from sweep.remote_files import uri_of

    folders = [remote_train] if remote_train else []
    for result in grid:
        fs = result.filesystem
        if fs is None or not result.path:
            continue
        found = fs.get_file_info(pyarrow.fs.FileSelector(result.path, allow_not_found=True))
        folders += sorted(uri_of(fs, i.path) for i in found
                          if i.type == pyarrow.fs.FileType.Directory and i.base_name.startswith("checkpoint_"))
    return folders


def _best_checkpoint(best: Report, run_dirs: list[Path]) -> str | None:
    """The best evaluation's checkpoint folder: from Tune's report, else found by the checkpoint marker."""
    path = _local_path(best.checkpoint_path)
    if path and Path(path).is_dir():
        return path
    for run_dir in run_dirs:
        for marker in run_dir.glob(f"checkpoint_*/{CHECKPOINT_MARKER}"):
            held = json.loads(marker.read_text())
            if held.get("checkpoint_id") and best.checkpoint_id:  # a PBT trial may pass a step twice
                if held["checkpoint_id"] == best.checkpoint_id:
                    return str(marker.parent)
            elif "step" in held and best.step is not None:
                if held["step"] == best.step:
                    return str(marker.parent)
            elif held["epoch"] == best.epoch:  # a checkpoint of an older sweep: one per epoch
                return str(marker.parent)
    return None


def _remote_best_checkpoint(result, best: Report) -> str | None:
    """The URI of the best evaluation's checkpoint on remote storage (s3://…): Tune keeps it among
    the trial's best checkpoints, each with the report it came with."""
    from sweep.remote_files import uri_of

    for checkpoint, metrics in result.best_checkpoints or []:
        if best.checkpoint_id and metrics.get("checkpoint_id"):
            if metrics["checkpoint_id"] == best.checkpoint_id:
                return uri_of(checkpoint.filesystem, checkpoint.path)
        elif best.step is not None and metrics.get("step") == best.step:
            return uri_of(checkpoint.filesystem, checkpoint.path)
    return None


def _history(result, histories: TrialHistories | None) -> list[Report]:
    """Every evaluation a trial reported. The trial's own history file comes first: a driver killed
    mid-sweep loses Tune's last unflushed rows, and after ``Tuner.restore`` a finished trial's
    history is not in memory."""
    trial_id = _trial_id(result)
    rows = histories.read(trial_id) if histories is not None and trial_id else []
    if rows:
        return rows
    df = result.metrics_dataframe
    if df is None or "epoch" not in df:  # only evaluations: a DDP trial's first report only says its workers are up
        return []
    return [Report.from_row({"trial_id": trial_id or "", **row}) for row in df[df["epoch"].notna()].to_dict("records")]


def _local_path(path: Any) -> str | None:
    if not isinstance(path, str) or not path:
        return None
    return path[len("file://"):] if path.startswith("file://") else path

