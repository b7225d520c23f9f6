"""How one run's calls reach the store: ``Sender`` makes each call (finding the run it belongs to
there), ``Tracked`` sends a run's calls now or, while the store does not answer, keeps them in the
run's spool file and sends them later, in order. The base of ``SweepTracker`` and ``TrialLogger``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from mlflow import MlflowClient
from mlflow.entities import Metric
from mlflow.exceptions import MlflowException

from sweep.failures import first_line
from sweep.secrets import scrub
from sweep.tracking.spool import Record, Spool, spool_for, unreachable
from sweep.tracking.store import client_for, ensure_experiment, log_params, quote_filter, set_tags, with_retries

log = logging.getLogger(__name__)

ORIGINAL_TAG = "sweep.original_run_id"  # a run made by replay into another store: the id it had
EVALUATION_KEY = "score"  # every evaluation of a trial logs it (hooks/mlflow_runs.evaluation_metrics)
QUIET_S = 10.0  # after a call got no answer, calls go straight to the spool this long, then one tries again
QUIET_MAX_S = 300.0  # ... doubling while the store stays away

T = TypeVar("T")


def child_query(parent_run_id: str, run_name: str) -> str:
    """The search filter for the parent's nested run named ``run_name``."""
    return f"tags.mlflow.parentRunId = '{parent_run_id}' and attributes.run_name = {quote_filter(run_name)}"


def find_child_run(uri: str, experiment_id: str, parent_run_id: str, run_name: str) -> str | None:
    """The id of the parent's nested run named ``run_name`` in the store at ``uri``, else None."""
    runs = with_retries(client_for(uri).search_runs, [experiment_id],
                        filter_string=child_query(parent_run_id, run_name), max_results=1)
    return runs[0].info.run_id if runs else None


class Sender:
    """Applies call records to one store, finding each record's run there (by id, else by its
    parent and name, else creating it) once per run."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.client = client_for(uri)
        self.experiments: dict[tuple[str, str | None], str] = {}
        self.runs: dict[str, str] = {}  # a record's run key -> the run's id in this store
        self.steps: dict[str, set[int]] = {}  # a trial run's id -> the evaluation steps it holds

    def send(self, record: Record) -> str:
        """Make the call of ``record``; the id of the run it went to."""
        run_id, fresh = self._run(record)
        op = record["op"]
        if op == "start":
            self._start(run_id, record, fresh)
        elif op == "metrics":
            metrics = [Metric(k, float(v), int(ts), int(step)) for k, v, ts, step in record["metrics"]]
            if record.get("parent"):  # a trial's evaluation: once per step, however often it is sent
                metrics = self._unlogged(run_id, metrics, fresh)
            for i in range(0, len(metrics), 1000):  # MLflow's most metrics per log_batch
                with_retries(self.client.log_batch, run_id, metrics=metrics[i : i + 1000])
            if run_id in self.steps:  # taken: these steps are in the run now
                self.steps[run_id].update(m.step for m in metrics if m.key == EVALUATION_KEY)
        elif op == "end":
            if record.get("error"):
                with_retries(self.client.set_tag, run_id, "error", record["error"])
            if record.get("tags"):  # why a trial ended early (sweep.stopped), set as it ends
                set_tags(self.client, run_id, record["tags"])
            with_retries(self.client.set_terminated, run_id, record["status"], end_time=record["time"])
        elif op == "text":
            with_retries(self.client.log_text, run_id, record["text"], record["artifact_file"])
        elif op == "artifact":
            if Path(record["path"]).is_file():
                with_retries(self.client.log_artifact, run_id, record["path"])
            else:
                log.warning("tracking: %s is gone; not logged to run %s", record["path"], run_id)
        else:
            raise ValueError(f"unknown MLflow call record op {op!r}")
        return run_id

    def _unlogged(self, run_id: str, metrics: list[Metric], fresh: bool) -> list[Metric]:
        """The metrics of evaluations the trial's run does not hold yet. A trial that goes on from a checkpoint
        evaluates again the steps past it, and a kill may have come after the store took them but before the
        sweep's ledger recorded the checkpoint: a step is logged once (the first value; on CPU the same)."""
        if run_id not in self.steps:
            history = [] if fresh else with_retries(self.client.get_metric_history, run_id, EVALUATION_KEY)
            self.steps[run_id] = {m.step for m in history}
        logged = self.steps[run_id]
        steps = {m.step for m in metrics if m.key == EVALUATION_KEY}
        return [m for m in metrics if m.step not in logged or m.step not in steps]

    def _start(self, run_id: str, record: Record, fresh: bool) -> None:
        logged: Mapping[str, str] = {}
        if not fresh:
            run = with_retries(self.client.get_run, run_id)
            if run.info.status != "RUNNING":
                with_retries(self.client.update_run, run_id, status="RUNNING")
            set_tags(self.client, run_id, self._tags(record))
            logged = run.data.params
        # Params are write-once in MLflow: a resumed run logs only those it lacks.
        log_params(self.client, run_id, {k: v for k, v in record["params"].items() if k not in logged})

    def _tags(self, record: Record) -> dict[str, str]:
        tags = dict(record.get("tags") or {})
        if record.get("parent"):
            tags["mlflow.parentRunId"] = self.runs[f"parent:{record['parent']}"]
        return tags

    def _experiment(self, record: Record) -> str:
        key = (str(record["experiment_id"]), record.get("experiment"))
        if key not in self.experiments:
            found = self._lookup(self.client.get_experiment, key[0])
            if found is not None and found.lifecycle_stage == "active" and key[1] in (None, found.name):
                self.experiments[key] = found.experiment_id
            else:  # another store: the experiment by name (a fresh server gets it created)
                self.experiments[key] = ensure_experiment(self.client, key[1] or f"replayed-{key[0]}", self.uri)
        return self.experiments[key]

    def _lookup(self, call: Callable[..., T], *args: Any) -> T | None:
        """``call(*args)``, None when the store says there is no such thing (not when it does not answer)."""
        try:
            return with_retries(call, *args)
        except MlflowException as e:
            if unreachable(e):
                raise
            return None

    def _existing(self, run_id: str | None, experiment_id: str) -> str | None:
        run = self._lookup(self.client.get_run, run_id) if run_id else None
        return run.info.run_id if run is not None and run.info.experiment_id == experiment_id else None

    def _search(self, experiment_id: str, query: str) -> str | None:
        runs = with_retries(self.client.search_runs, [experiment_id], filter_string=query, max_results=1)
        return runs[0].info.run_id if runs else None

    def _parent(self, parent_id: str, name: str | None, experiment_id: str) -> tuple[str, bool]:
        key = f"parent:{parent_id}"
        fresh = False
        if key not in self.runs:
            found = self._existing(parent_id, experiment_id) or self._search(
                experiment_id, f"tags.{ORIGINAL_TAG} = '{parent_id}'")
            if found is None:  # a store that never saw the sweep: a stand-in parent, found again by its tag
                run = with_retries(self.client.create_run, experiment_id, run_name=name or f"sweep-{parent_id[:8]}",
                                   tags={ORIGINAL_TAG: parent_id})
                found, fresh = run.info.run_id, True
            self.runs[key] = found
        return self.runs[key], fresh

    def _run(self, record: Record) -> tuple[str, bool]:
        """The run ``record`` goes to in this store, and whether it was created just now."""
        experiment_id = self._experiment(record)
        if not record.get("parent"):  # the sweep's own parent run
            return self._parent(record["run_id"], record.get("run_name"), experiment_id)
        parent, _ = self._parent(record["parent"], None, experiment_id)
        key = f"{record['parent']}/{record['run_name']}"
        if key in self.runs:
            return self.runs[key], False
        found = self._existing(record.get("run_id"), experiment_id) or self._search(
            experiment_id, child_query(parent, record["run_name"]))
        fresh = found is None
        if fresh:
            tags = {**self._tags(record), **({ORIGINAL_TAG: record["run_id"]} if record.get("run_id") else {})}
            found = with_retries(self.client.create_run, experiment_id, run_name=record["run_name"],
                                 tags=tags).info.run_id
        self.runs[key] = found
        return found, fresh


class Tracked:
    """One run's calls: sent now, or, while the store does not answer, kept in the run's spool file
    (and training goes on); later calls first send what waits, in order."""

    def __init__(self, uri: str, spool_dir: str | Path | None) -> None:
        self.uri = uri
        self.sender = Sender(uri)
        self.spool_dir = Path(spool_dir) if spool_dir is not None else None
        self.spool: Spool | None = None
        self._backlog = False
        self._quiet_until = 0.0  # after a failure, calls go straight to the spool until then
        self._quiet_s = QUIET_S

    @property
    def client(self) -> MlflowClient:
        return self.sender.client

    @property
    def kept(self) -> bool:
        """Calls of this run wait in its spool (the store did not take them yet)."""
        return self._backlog

    def _use_spool(self, run_name: str) -> None:
        if self.spool_dir is not None:
            self.spool = spool_for(self.spool_dir, run_name)
            self._backlog = self.spool.path.exists()  # a restarted trial: what its last process kept

    def _emit(self, record: Record, last: bool = False) -> None:
        may_try = last or time.monotonic() >= self._quiet_until
        if self._backlog and may_try:
            self.flush()
        if not self._backlog and may_try:
            try:
                self._sent(record, self.sender.send(record))
                return
            except Exception as e:
                if self.spool is None or not unreachable(e):
                    raise
                self._went_away(e)
        if self.spool is not None and self.spool.append(record):
            self._backlog = True

    def flush(self) -> bool:
        """Send what waits, oldest first; True when nothing is left."""
        if self.spool is None:
            return True
        pending = self.spool.pending()
        for i, record in enumerate(pending):
            try:
                self._sent(record, self.sender.send(record))
            except Exception as e:
                if unreachable(e):
                    self.spool.keep(pending[i:])
                    self._went_away(e)
                    return False
                log.warning("tracking: the MLflow store refused a kept call (%s: %s); dropped",
                            record["op"], first_line(e, 300, scrubbed=True))
        self.spool.keep([])
        self._backlog = False
        self._quiet_s = QUIET_S
        if pending:
            log.info("tracking: %d kept MLflow calls sent to %s", len(pending), scrub(self.uri))
        return True

    def _went_away(self, error: BaseException) -> None:
        if time.monotonic() >= self._quiet_until:
            where = self.spool.path if self.spool is not None else "nowhere"
            log.warning("tracking: MLflow at %s did not answer (%s); calls kept in %s, training goes on",
                        scrub(self.uri), first_line(error, 200, scrubbed=True), where)
        self._quiet_until = time.monotonic() + self._quiet_s
        self._quiet_s = min(self._quiet_s * 2, QUIET_MAX_S)  # a long outage is probed less and less often

    def _sent(self, record: Record, run_id: str) -> None:
        """A record reached the store as run ``run_id``."""
