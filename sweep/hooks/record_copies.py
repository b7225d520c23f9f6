"""The Tune callback that keeps a copy of the sweep's MLflow records in ``storage.output_prefix`` while it
runs (sweep/tracking/store_copies.py does the work, on its own thread): one when the sweep starts (the
parent's id), after each trial that ended, and every few minutes while trials run."""

from __future__ import annotations

from ray.tune import Callback

from sweep.tracking.store_copies import StoreCopies


class CopyTheRecords(Callback):
    def __init__(self, copies: StoreCopies) -> None:
        self.copies = copies

    def __getstate__(self) -> dict:
        return {}  # Tune pickles its callbacks into the experiment; a resumed sweep makes its own

    def setup(self, **info) -> None:
        self.copies.request()

    def on_step(self, iteration, trials, **info) -> None:
        if self.copies.due():
            self.copies.request()

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self.copies.request()

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self.copies.request()

    def on_experiment_end(self, trials, **info) -> None:
        self.copies.close()
