"""The Tune callback that keeps the sweep's ledger (sweep/results/ledger.py): each trial's entry written at every
change of its state, on Tune's event loop, before Tune goes on (one small file; one PUT on S3).

Started: its id, hparams and Tune folder. A checkpoint Tune registered: its URI and step. Ended: finished,
or failed with its one-line reason. A kill between two of these leaves the entry at the earlier one: a
trial checkpointed but not yet marked finished goes on from its checkpoint on resume, where its history
(which the trial marks done itself) ends it at once without training (trial/train_fn.py).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from ray.tune import Callback

from sweep.failures import first_line, trial_failure_line
from sweep.remote_files import uri_of
from sweep.results.ledger import Ledger, TrialEntry
from sweep.results.trial_reports import Report, sweep_trial_id, trial_of

log = logging.getLogger(__name__)


class KeepTheLedger(Callback):
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.entries: dict[str, TrialEntry] = {}  # identity -> its entry as last written

    def __getstate__(self) -> dict[str, Any]:
        return {"ledger": self.ledger, "entries": {}}  # Tune pickles its callbacks into the experiment

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        entry = self._entry(trial)
        if entry is None:
            return
        folder = _folder_uri(trial)
        self._put(replace(entry, state="running", trial_id=sweep_trial_id(trial.trial_id, trial.config),
                          hparams=dict(trial.config.get("hparams") or {}), attempts=entry.attempts + 1,
                          folders=entry.folders + ([folder] if folder and folder not in entry.folders else [])))

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info) -> None:
        entry = self._entry(trial)
        if entry is None or entry.ended:
            return
        step = Report.from_row({"trial_id": "", **(trial.last_result or {})}).step
        self._put(replace(entry, state="checkpointed", checkpoint=uri_of(checkpoint.filesystem, checkpoint.path),
                          step=step))

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        entry = self._entry(trial)
        if entry is None:
            return
        error = Report.from_row({"trial_id": "", **(trial.last_result or {})}).trial_error
        self._put(replace(entry, state="failed" if error else "finished", error=error))

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        entry = self._entry(trial)
        if entry is None:
            return
        try:
            error = trial.get_error()  # Tune's TuneError around the trial's own
        except Exception:  # noqa: BLE001 - no error kept: the state still says failed
            error = None
        self._put(replace(entry, state="failed", error=trial_failure_line(error) if error else "the trial failed"))

    def _entry(self, trial) -> TrialEntry | None:
        identity = (trial.config or {}).get("identity")
        if identity is None:  # a trial of a sweep restored from Tune's own state (begun before the ledger)
            return None
        if identity not in self.entries:
            task, seed, _ = trial_of(trial.config)
            found = self.ledger.entry(identity)
            grid = trial.config["trial"].get("grid") or {}
            self.entries[identity] = found or TrialEntry(identity, task, seed, grid,
                                                         int(trial.config.get("sample_round", 0)))
        return self.entries[identity]

    def _put(self, entry: TrialEntry) -> None:
        try:
            self.entries[entry.identity] = self.ledger.put(entry)
        except Exception as e:  # storage away for a moment: the next change writes the entry whole again
            self.entries[entry.identity] = entry
            log.warning("ledger: the entry of %s was not written (%s)", entry.identity,
                        first_line(e, 300, scrubbed=True))


def _folder_uri(trial) -> str | None:
    storage = getattr(trial, "storage", None)
    if storage is None:
        return None
    try:
        return uri_of(storage.storage_filesystem, storage.trial_fs_path)
    except Exception:  # noqa: BLE001 - no folder name yet: the checkpoint's URI still says where
        return None
