"""One sweep's tracking session: every MLflow call of the driver, its hooks and the end of the sweep, behind
one object. ``tracking=none`` is ``NoTracking``: the same calls doing nothing, so no caller checks for None.

The session takes the sections it reads (tracking, storage for the records' copies, the model's name and
the tasks for the registry), never the whole ``Settings``. Every call after the parent's start is
best-effort: the sweep's work is on disk before it, and a store that fails says so in one line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sweep.config.paths import absolute_store
from sweep.config.settings import StorageConfig, TrackingConfig
from sweep.config.tasks import TaskSpec
from sweep.failures import error_line, first_line
from sweep.results.records import TaskSummary, TrialRecord
from sweep.secrets import scrub


class NoTracking:
    """tracking=none: nothing is recorded; each call answers as a session whose work is all done."""

    enabled = False
    uri: str | None = None
    experiment_id: str | None = None
    trials = None  # what a trial's run needs (TrialTracking): none
    run_id: str | None = None

    def open(self, logged: Mapping[str, Any], experiment: str, provenance: Mapping[str, str]) -> None:
        """Start (or reopen) the sweep's parent run."""

    def record_copies(self):
        """The copier of the records to storage.output_prefix while the sweep runs (None: none)."""
        return None

    def end(self, records: list[TrialRecord], summaries: list[TaskSummary], best: Mapping[str, TrialRecord],
            plot: Path | None, failed: bool, soups: Mapping[str, Any] = {}) -> bool:
        """The end of the sweep in the store; whether all of it was recorded."""
        return True

    def fail(self, killed: bool) -> None:
        """The parent ended FAILED (or KILLED: stopped by a signal, for resume=true to finish)."""

    def upload(self, prefix: str) -> None:
        """The store's copy under ``prefix``/mlflow/ (storage.output_prefix)."""

    def look_line(self) -> str | None:
        """How to look at the sweep's runs (None: nothing to look at)."""
        return None


class TrackingSession(NoTracking):
    """tracking=mlflow: the parent run, what the trials' runs need (``trials``: hooks/mlflow_runs.py logs
    them on the driver), the registry, the records' copies in storage.output_prefix and their restore on a
    resumed sweep's new head, and the sweep's end."""

    enabled = True

    def __init__(self, tracking: TrackingConfig, storage: StorageConfig, model_name: str, tasks: Sequence[TaskSpec],
                 out_dir: Path, resume: bool, tracker=None) -> None:
        self.config, self.storage, self.model_name = tracking, storage, model_name
        self.tasks = {spec.name: spec for spec in tasks}
        self.out_dir, self.resume = Path(out_dir), resume
        self.tracker = tracker  # the SweepTracker of the parent run: set by open (given: a parent started elsewhere)
        self.trials = None

    @property
    def uri(self) -> str | None:
        return self.tracker.uri if self.tracker is not None else None

    @property
    def experiment_id(self) -> str | None:
        return self.tracker.experiment_id if self.tracker is not None else None

    @property
    def run_id(self) -> str | None:
        return self.tracker.run_id if self.tracker is not None else None

    def open(self, logged: Mapping[str, Any], experiment: str, provenance: Mapping[str, str]) -> None:
        """The parent run (reopened on resume); an unreachable store fails here, before any trial. Calls the
        store does not answer later wait in ``out_dir/mlflow-unsent/``."""
        from sweep.tracking.parent import SweepTracker, TrialTracking, saved_parent
        from sweep.tracking.spool import SPOOL_DIR
        from sweep.tracking.store import check_reachable

        if self.resume and self.storage.output_prefix:
            self._restore_records()  # a new cluster's head: the records the last one copied
        uri = absolute_store(check_reachable(self.config.uri, self.config.required))
        experiment = self.config.experiment or experiment
        spool_dir = self.out_dir / SPOOL_DIR
        tracker = SweepTracker(uri, experiment, spool_dir)
        reopen = saved_parent(self.out_dir, uri, experiment) if self.resume else None
        parent = tracker.start({**logged, **({"sources": dict(provenance)} if provenance else {})}, reopen=reopen)
        tracker.save(self.out_dir)
        self.tracker = tracker
        verb = "continuing MLflow run" if tracker.reopened else "MLflow run"
        print(f"tracking: {verb} {parent} in experiment {experiment!r} at {uri}")
        self.trials = TrialTracking(uri, tracker.experiment_id, parent, experiment, str(spool_dir), dict(provenance))

    def _restore_records(self) -> None:
        """resume on a head without the sweep's records (a preempted RayJob's new cluster): the copy the sweep
        kept in storage.output_prefix, taken back before the store is opened."""
        from sweep.storage.s3 import make_client
        from sweep.tracking.store_copies import destination, restore_store

        client = make_client(self.storage.endpoint, self.storage.region)
        restored = restore_store(client, absolute_store(self.config.uri), self.storage.output_prefix, self.out_dir)
        if restored:
            print(f"resume: restored {restored} from {destination(self.storage.output_prefix)}/")

    def record_copies(self):
        if not self.storage.output_prefix:
            return None
        from sweep.tracking.store_copies import StoreCopies

        return StoreCopies(self.uri, self.storage.output_prefix, self.out_dir, self.storage.endpoint,
                           self.storage.region, self.config.copy_every_s)

    def end(self, records: list[TrialRecord], summaries: list[TaskSummary], best: Mapping[str, TrialRecord],
            plot: Path | None, failed: bool, soups: Mapping[str, Any] = {}) -> bool:
        """What waits in the spool, each soup's run (sweep.soup: outputs/soup.py's ``Soup`` per task), the
        registry, the parent's results. The results and best models are written by now: a store that fails here
        loses none of them; the line says what was not recorded."""
        from sweep.tracking.parent import FINAL_WAIT_S

        complete = True
        try:
            self.tracker.flush_all(wait_s=FINAL_WAIT_S)  # what the trials' runs kept while the store was away
            for soup in soups.values():
                self._soup_run(soup)
            complete = self.register(best, summaries, soups)
            self.tracker.finish(records, summaries, self.out_dir, plot, status="FAILED" if failed else "FINISHED")
        except Exception as e:  # noqa: BLE001 - the sweep's work is written; one line says what is not recorded
            complete = False
            print(f"tracking: the sweep's results were not all recorded in MLflow at {scrub(self.uri)} "
                  f"({scrub(error_line(e))}); they are in {self.out_dir}")
        return self._close() and complete

    def _close(self) -> bool:
        try:
            unsent, path = self.tracker.close(self.out_dir)
        except Exception as e:  # noqa: BLE001 - as above
            print(f"tracking: could not keep the unsent MLflow calls ({scrub(error_line(e))}); "
                  f"they stay in {self.out_dir}")
            return False
        if unsent:
            print(f"tracking: {unsent} MLflow calls could not be sent; replay them with: "
                  f"python -m sweep replay {path}")
        return not unsent

    def register(self, best: Mapping[str, TrialRecord], summaries: Sequence[TaskSummary] = (),
                 soups: Mapping[str, Any] = {}) -> bool:
        """The best model per task into the registry as <model>-<task> (its soup instead where the soup beat
        the best seed on the selection split); alias champion only on improvement, and never for a task whose
        best learned nothing (within noise of its trivial score). Whether every task's is registered (else a
        resume of the sweep registers it)."""
        unlearned = {s.task for s in summaries if s.learned is False}
        every = True
        for task, record in best.items():
            soup = soups.get(task)
            if soup is not None and soup.wins:
                candidate = ("the soup", soup.run_id, soup.folder, soup.score)
            else:
                candidate = ("the best trial", record.run_id, self.out_dir / "best" / task, record.score)
            every = self._register_one(task, *candidate, task not in unlearned) and every
        return every

    def _register_one(self, task: str, what: str, run_id: str, model: Path, score: float, learned: bool) -> bool:
        from sweep.tracking.registry import register_best
        from sweep.tracking.spool import unreachable

        if not run_id:
            print(f"registry: {task}: {what} has no MLflow run; not registered")
            return False
        synthetic = self.storage.synthetic and not self.config.synthetic_champion
        try:
            result = register_best(self.uri, self.model_name, self.tasks[task], run_id, model, score,
                                   learned=learned, synthetic=synthetic)
        except Exception as e:  # noqa: BLE001 - the sweep's work is done: a registry that fails loses none of it
            why = "does not answer" if unreachable(e) else f"refused it ({scrub(error_line(e))})"
            print(f"registry: {task}: not registered: the MLflow store at {scrub(self.uri)} {why}; the best model "
                  f"stays in {model}; run the same command with resume=true to register it")
            return False
        before = f"{result.previous_champion_score:.4f}" if result.previous_champion_score is not None else "none"
        if result.earlier:
            print(f"registry: {result.name} version {result.version}, registered by an earlier launch of this sweep "
                  f"({'champion' if result.promoted else 'not champion'}); not registered again")
            return True
        verdict = ("now champion" if result.promoted
                   else "not promoted: it learned nothing (within noise of the trivial score)" if not learned
                   else "not promoted: trained on synthetic data (tracking.synthetic_champion=true allows it)"
                   if synthetic
                   else f"not promoted: the champion scores {before}, this {score:.4f}")
        shared = (f"; its weights in {model} are the registry's copy ({result.shared_bytes / 2**20:.0f} MiB stored "
                  "once)" if result.shared_bytes else "")
        print(f"registry: {result.name} version {result.version}, {verdict} (previous champion: {before}){shared}")
        return True

    def _soup_run(self, soup) -> None:
        """A soup's own run beside the trials' (resumed by its name on a resumed end): which seeds, its
        scores as a trial's are named, where its model is; ``soup.run_id`` set (empty while the store is away)."""
        from sweep.tracking.trial_run import TrialLogger

        t = self.trials
        logger = TrialLogger(
            t.uri, t.experiment_id, t.parent_run_id, run_name=f"{soup.task} soup",
            params={"task": soup.task, "soup_of_seeds": ",".join(map(str, soup.seeds)),
                    **{f"hp.{k}": v for k, v in soup.hparams.items()}},
            tags={"sweep.kind": "soup", "sweep.export": str(soup.folder), "sweep.soup_wins": str(soup.wins).lower(),
                  "host": "", "node": "", "device": ""},
            experiment_name=t.experiment_name, spool_dir=t.spool_dir)
        soup.run_id = logger.start() or ""
        scores = {"score": soup.score, **soup.metrics, **{f"report.{k}": v for k, v in soup.report_metrics.items()}}
        logger.log_evaluation(0, {k: v for k, v in scores.items() if v is not None})
        logger.end()

    def fail(self, killed: bool) -> None:
        if self.run_id is None:
            return
        self.tracker.fail("KILLED" if killed else "FAILED")  # never raises: the sweep's own error is shown
        if killed and self.storage.output_prefix:
            self._keep_records()  # a suspended RayJob's head goes next

    def _keep_records(self) -> None:
        """Stopped by a signal (SIGTERM: Kueue suspends the RayJob): the records' last copy, for the resumed
        sweep; one line either way, never an exception over the stop's own."""
        from sweep.storage.s3 import make_client
        from sweep.tracking.store_copies import copy_store, destination

        dest = destination(self.storage.output_prefix)
        try:
            copy_store(make_client(self.storage.endpoint, self.storage.region), self.uri, dest, self.out_dir)
            print(f"tracking: the records are copied to {dest}/ for the resumed sweep")
        except Exception as e:  # noqa: BLE001 - the stop goes on; the periodic copies are there
            print(f"warning: the records were not copied to {dest}/ ({first_line(e, scrubbed=True)})")

    def upload(self, prefix: str) -> None:
        """A sqlite store's consistent copy and its artifacts under ``prefix``/mlflow/ (its failure is one line)."""
        from sweep.tracking.store_upload import upload_mlflow

        if self.config.uri:
            upload_mlflow(absolute_store(self.config.uri), prefix, self.storage.endpoint, self.storage.region,
                          out_dir=self.out_dir)

    def look_line(self) -> str | None:
        from sweep.tracking.ui_urls import look_line

        return look_line(self.uri, self.experiment_id, self.out_dir) if self.uri else None


def tracking_session(tracking: TrackingConfig, storage: StorageConfig, model_name: str, tasks: Sequence[TaskSpec],
                     out_dir: Path, resume: bool) -> NoTracking:
    """The session ``tracking.kind`` asks for."""
    if tracking.kind != "mlflow":
        return NoTracking()
    return TrackingSession(tracking, storage, model_name, tasks, out_dir, resume)
