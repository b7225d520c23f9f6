"""Every trial's nested MLflow run, written by the driver from what the trials report to Tune.

A trial may run on any node, and a node of a real cluster has its own disk and maybe no route to
the tracking store (a ``sqlite:///`` file on the head, a server inside the cluster's network): so a
trial never talks to MLflow. It reports every evaluation to Tune, as it must anyway, and this Tune
callback on the driver turns those reports into the trial's nested run under the sweep's parent:
params, each evaluation's metrics at its step, the node it ran on, its end (status, error, why the
rungs stopped it). The same idea as Ray's ``MLflowLoggerCallback``, with runs nested under a parent.

The calls run on one background thread, in order, so a slow or absent store never holds up Tune's
event loop (and with it every trial); what the store does not take waits in the driver's spool
(``tracking.TrialLogger`` with the sweep's spool folder) and is sent when it answers again.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Collection
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ray.tune import Callback

from sweep.config.settings import Settings, with_hparams
from sweep.failures import first_line
from sweep.results.trial_reports import Report, sweep_trial_id, trial_of
from sweep.schedulers.policies import SchedulerPolicy, policies_for

log = logging.getLogger(__name__)

CLOSE_WAIT_S = 600.0  # at the end, how long the driver waits for the calls still queued


def run_name(task: str, seed: int, hparams: dict[str, Any], trial_id: str, sampled: bool) -> str:
    """The trial's run name as the UI's table shows it, ``RTE seed 42 · lr=2e-05, lora.r=8``; a retried
    or resumed trial finds its run again by it, so it is unique in the sweep: (task, seed, grid point)
    is, and a search's samples (which may repeat a point) add the trial's number."""
    point = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(hparams.items()))
    number = f" #{trial_id.rsplit('_', 1)[-1]}" if sampled else ""
    return f"{task} seed {seed}" + (f" · {point}" if point else "") + number


def evaluation_metrics(report: Report, train) -> tuple[int, dict[str, float]] | None:
    """(step, metrics) of one evaluation report as the trial's run logs it; None for a report that
    is no evaluation (a DDP trial's workers-ready report, a trial's error row).

    The step is the epoch with one evaluation per epoch, else the training step (with a fractional
    ``epoch`` metric to plot against)."""
    if not report.is_evaluation:
        return None
    once_per_epoch = train.eval_every is None and train.evals_per_epoch == 1
    step = int(report.epoch if once_per_epoch else report.step)
    metrics = {"train_loss": report.train_loss, "score": report.score,
               "epoch": report.step / report.steps_total * train.epochs if report.steps_total else None,
               **report.metrics,
               # sweep.selection: the report split's, logged at each new best only (the last one is the trial's)
               **{f"report.{k}": v for k, v in report.report.items()},
               **{f"pbt.{k}": v for k, v in report.pbt.items()}}  # PBT's values over the run: a curve
    return step, {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and v == v}


class TrialRuns(Callback):
    """The driver's Tune callback that logs each trial's nested run (see the module's docstring).

    ``tracking``: the sweep's ``TrialTracking`` (store, experiment, parent, spool folder);
    ``launch_id``: this driver's launch, so that a finished trial a resumed sweep reports again
    from its history is not logged twice; ``rungs_board``: the ASHA / seed-halving actor, which
    says why a trial it stopped ended.
    """

    def __init__(self, settings: Settings, tracking, launch_id: str, rungs_board=None,
                 scheduler: SchedulerPolicy | None = None) -> None:
        self.settings, self.tracking, self.launch_id, self.board = settings, tracking, launch_id, rungs_board
        # PBT changes these mid-run: a run's name keeps to what names the trial (task, seed, grid point)
        self.mutated = set(policies_for(settings.sweep, scheduler).scheduler.mutations)
        # a search's samples (and PBT's trials, named without their mutated values) may share a point:
        # names add the number
        self.sampled = bool(settings.sweep.search) or bool(self.mutated)
        self.loggers: dict[str, Any] = {}  # Tune trial id -> TrialLogger (used on the worker thread only)
        self.last: dict[str, Report] = {}  # Tune trial id -> its last evaluation report
        self.busy_s = 0.0  # the driver's time spent in this callback's hooks (bench_tracking reads it)
        self.calls: queue.Queue | None = None
        self.thread: threading.Thread | None = None  # started with the first call

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its run config (callbacks included) into the experiment; a resumed sweep
        # gives Tune a new TrialRuns of its own launch instead (tuner.py), so only plain state.
        return {**self.__dict__, "loggers": {}, "last": {}, "calls": None, "thread": None}

    # --- Tune's hooks (Tune's event loop: only queue work here) ----------------------------------

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        with self._timed():
            self._queue(self._start, _id(trial), trial.config, None)

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        with self._timed():
            report = Report.from_row(result)
            evaluation = evaluation_metrics(report, self._train(trial.config))
            if evaluation is not None:
                self.last[_id(trial)] = report
            self._queue(self._result, _id(trial), trial.config, report, evaluation)

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        with self._timed():
            report = self.last.get(_id(trial)) or Report(_id(trial))
            error = Report.from_row(trial.last_result or {"trial_id": trial.trial_id}).trial_error
            stopped = self._stopped(_id(trial), report) if not error else None
            self._queue(self._end, _id(trial), trial.config, "FAILED" if error else "FINISHED", error, stopped)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        with self._timed():
            self._queue(self._end, _id(trial), trial.config, "FAILED", _error_of(trial), None)

    @contextmanager
    def _timed(self):
        began = time.perf_counter()
        try:
            yield
        finally:
            self.busy_s += time.perf_counter() - began

    def on_experiment_end(self, trials, **info) -> None:
        self.close()

    # --- the driver's side -----------------------------------------------------------------------

    def close(self, wait_s: float = CLOSE_WAIT_S, store_wait_s: float | None = None) -> None:
        """Wait for the queued calls (each one sent or spooled), then up to ``store_wait_s`` (default
        tracking.FINAL_WAIT_S) for a store that went away to take what the runs kept; idempotent."""
        from sweep.tracking.parent import FINAL_WAIT_S, FLUSH_POLL_S

        if self.thread is not None and self.thread.is_alive():
            self.calls.put(None)
            self.thread.join(wait_s)
            if self.thread.is_alive():
                log.warning("tracking: %d MLflow calls still queued after %.0f s", self.calls.qsize(), wait_s)
                return
        # A run whose first calls waited in the spool gets its id once they are sent: the records need it.
        deadline = time.monotonic() + (FINAL_WAIT_S if store_wait_s is None else store_wait_s)
        waiting = [logger for logger in self.loggers.values() if logger.kept]
        while waiting:
            waiting = [logger for logger in waiting if not logger.flush()]
            if not waiting or time.monotonic() >= deadline:
                break
            time.sleep(FLUSH_POLL_S)

    def run_id_of(self, trial_id: str, task: str, seed: int, hparams: dict[str, Any]) -> str:
        """The id of a trial's run in the store, after ``close``: the one this driver logged, else (a
        trial a resumed sweep did not run again) found by its name under the parent; "" when the
        store never took it (its calls wait in the spool)."""
        logger = self.loggers.get(trial_id)
        if logger is not None and logger.run_id:
            return logger.run_id
        from sweep.tracking import find_child_run

        t = self.tracking
        try:
            name = run_name(task, seed, self._named(hparams), trial_id, self.sampled)
            return find_child_run(t.uri, t.experiment_id, t.parent_run_id, name) or ""
        except Exception as e:  # the store is away: the record has no run id, registration says so
            log.warning("tracking: cannot look up the run of trial %s (%s)", trial_id,
                        first_line(e, 200, scrubbed=True))
            return ""

    def reconcile(self, records, histories, reported_ids: dict[str, str], ended_before: Collection[str] = ()) -> int:
        """A resumed sweep, after ``close``: each trial's run made whole from the trial's own history.
        The records it took back from storage.output_prefix are the last copy the old cluster made, so
        evaluations reported after it, or a trial's end, may be missing there; a trial that is not run
        again never reports them anew. Logs each evaluation whose step the run lacks and ends a run
        still RUNNING as its trial ended; the evaluations added. ``reported_ids``: a record's trial folder
        name -> the id its history goes by; ``ended_before``: the records (by trial folder name) of trials an
        earlier launch ended, whose run is made here if the store has none."""
        from mlflow.entities import Metric

        from sweep.tracking.store import client_for, metric_key

        client = client_for(self.tracking.uri)
        added = 0
        for record in records:
            reported = reported_ids.get(record.trial_id)
            if not reported:
                continue
            if not record.run_id and record.trial_id in ended_before:  # ended after the records' last copy and
                record.run_id = self._backfilled_run(record, reported)  # not run again: its run is made here
                if not record.run_id:
                    continue
            try:
                logged = {m.step for m in client.get_metric_history(record.run_id, "score")}
                train = with_hparams(self.settings.train, record.hparams)
                now = int(time.time() * 1000)
                for report in histories.read(reported):
                    evaluation = evaluation_metrics(report, train)
                    if evaluation is None or evaluation[0] in logged:
                        continue
                    step, metrics = evaluation
                    client.log_batch(record.run_id, metrics=[Metric(metric_key(k), v, now, step)
                                                              for k, v in metrics.items()])
                    logged.add(step)
                    added += 1
                if client.get_run(record.run_id).info.status == "RUNNING":
                    client.set_terminated(record.run_id, "FINISHED" if record.status == "TERMINATED" else "FAILED")
            except Exception as e:  # the store is away: the records are written; the line says which run
                log.warning("tracking: the run of trial %s was not made whole (%s)", record.trial_id,
                            first_line(e, 300, scrubbed=True))
        return added

    def _backfilled_run(self, record, reported: str) -> str:
        """The run of a trial that ended in an earlier launch after the records' last copy (so the restored
        store lacks it), made now under its usual name; its evaluations follow in ``reconcile``."""
        from sweep.tracking import TrialLogger

        t = self.tracking
        try:
            grid = {k: v for k, v in record.hparams.items() if k not in self.mutated}
            logger = TrialLogger(
                t.uri, t.experiment_id, t.parent_run_id, run_name=run_name(record.task, record.seed, grid, reported,
                                                                             self.sampled),
                params={"task": record.task, "seed": record.seed,
                        **asdict(with_hparams(self.settings.train, record.hparams)),
                        **{f"sources.{k}": v for k, v in t.sources.items()}},
                tags={"sweep.trial_id": reported, "sweep.hparams": str(record.hparams or {}), "host": "",
                      "node": record.node or "", "device": ""},
                experiment_name=t.experiment_name)
            return logger.start() or ""
        except Exception as e:  # the store is away: the record says it has no run, registration says so
            log.warning("tracking: the run of trial %s was not made (%s)", record.trial_id,
                        first_line(e, 300, scrubbed=True))
            return ""

    def _queue(self, call, *args) -> None:
        if self.thread is None or not self.thread.is_alive():
            self.calls = queue.Queue()
            self.thread = threading.Thread(target=self._work, args=(self.calls,), name="sweep-mlflow-runs", daemon=True)
            self.thread.start()
        self.calls.put((call, args))

    def _work(self, calls: queue.Queue) -> None:
        while True:
            item = calls.get()
            if item is None:
                return
            call, args = item
            try:
                call(*args)
            except Exception as e:  # a store that refused a call: the sweep goes on, the line says what
                log.warning("tracking: MLflow call for trial %s failed (%s)", args[0],
                            first_line(e, 300, scrubbed=True))

    def _named(self, hparams: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in hparams.items() if k not in self.mutated}

    def _train(self, config: dict[str, Any]):
        _, _, hparams = trial_of(config)
        return with_hparams(self.settings.train, hparams)

    def _logger(self, trial_id: str, config: dict[str, Any]):
        from sweep.tracking import TrialLogger

        if trial_id not in self.loggers:
            task, seed, hparams = trial_of(config)
            t = self.tracking
            name = run_name(task, seed, self._named(hparams), trial_id, self.sampled)
            self.loggers[trial_id] = TrialLogger(
                t.uri, t.experiment_id, t.parent_run_id, run_name=name,
                params={"task": task, "seed": seed, **asdict(self._train(config)),
                        **{f"sources.{k}": v for k, v in t.sources.items()}},
                # where it runs comes with its first report; never this driver's own host until then
                tags={"sweep.trial_id": trial_id, "sweep.hparams": str(hparams or {}),
                      "host": "", "node": "", "device": ""},
                experiment_name=t.experiment_name, spool_dir=t.spool_dir,
            )
        return self.loggers[trial_id]

    def _start(self, trial_id: str, config: dict[str, Any], placed: dict[str, Any] | None) -> None:
        logger = self._logger(trial_id, config)
        if placed:  # where the trial runs, from its first report
            logger.tags.update(placed)
        logger.start()  # creates the run, or finds it again (a retried, paused or resumed trial)

    def _result(self, trial_id: str, config: dict[str, Any], report: Report,
                evaluation: tuple[int, dict[str, float]] | None) -> None:
        logger = self._logger(trial_id, config)
        placed = {k: v for k, v in (("node", report.node_ip or report.node), ("host", report.host),
                                    ("device", report.device)) if v}
        # the first report of each run of the trial says where it runs (a retry may be on another
        # node): the run's tags follow (one get_run and one tag batch per placement)
        if not logger.began or any(logger.tags.get(k) != v for k, v in placed.items()):
            self._start(trial_id, config, placed)
        if evaluation is not None and report.launch_id in (None, self.launch_id):
            logger.log_evaluation(*evaluation)  # a finished trial reported again from its history: logged before

    def _end(self, trial_id: str, config: dict[str, Any], status: str, error: str | None,
             stopped: dict[str, Any] | None) -> None:
        logger = self._logger(trial_id, config)
        if not logger.began:  # ended before any report (an error at start)
            logger.start()
        logger.end(status, error, tags=stopped)

    def _stopped(self, trial_id: str, report: Report) -> dict[str, Any] | None:
        """The run's stop tags when the rungs stopped the trial (None: it ran to the end)."""
        if self.board is None:
            return None
        import ray

        try:
            verdict = ray.get(self.board.verdict_of.remote(trial_id), timeout=30)
        except Exception as e:
            log.warning("tracking: cannot ask the rungs board about trial %s (%s)", trial_id, e)
            return None
        if verdict is None or verdict.go_on:
            return None
        return {"sweep.stopped": verdict.stop_text, "sweep.stopped_at_step": report.step}


def _id(trial) -> str:
    """The id the trial reports with: its run's key and name (a resumed launch's trial goes on as an earlier
    launch's, and so does its run)."""
    return sweep_trial_id(trial.trial_id, trial.config)


def _error_of(trial) -> str:
    """The end of a failed trial's error (Tune keeps it in the trial's error file)."""
    try:
        error = trial.get_error()
    except Exception:  # an older Tune, or no error kept
        error = None
    if error is not None:
        return str(error)
    path = getattr(trial, "error_file", None)
    try:
        return Path(path).read_text() if path else "trial failed"
    except OSError:
        return "trial failed"
