"""Experiment tracking over MLflow's client API: a parent run per sweep, a nested run per trial, the registry.

Trials log from other processes (Ray workers), so every call names its run id through an
``MlflowClient``; nothing relies on MLflow's global active run. Everything that reaches the store
(params, tags, text artifacts, error messages) goes through ``scrub`` first, and params whose key
looks like a credential are dropped. Calls retry with jittered backoff on a locked sqlite file or
a transient server error, so concurrent trials can share one store.

A store that stops answering during a sweep does not stop it: with a spool folder (the sweep's
``out_dir/mlflow-unsent``) every call after the parent's start that gets no answer is kept on disk
(``sweep.tracking_spool``), sent in order once the store answers again, and at the end of the sweep
what is left is one file for ``python -m sweep.tracking replay FILE [--uri URI]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

import yaml
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException

from sweep.errors import TrackingError
from sweep.files import write_json
from sweep.results import TaskSummary, TrialRecord, registry_name
from sweep.secrets import scrub, secret_name
from sweep.tracking_spool import UNSENT_FILE, Record, Spool, merge, read_records, spool_files, spool_for, unreachable

log = logging.getLogger(__name__)

FALLBACK_URI = "sqlite:///mlflow.db"  # MLflow's own default store (DESIGN §5)
PARAM_LIMIT = 6000  # MLflow's longest param value
TAG_LIMIT = 5000  # the longest tag value every MLflow 2.x/3.x server accepts
BATCH = 100  # MLflow's most params or tags per log_batch
CHAMPION = "champion"
RETRY_ATTEMPTS = 10
TRANSIENT = re.compile(r"database is locked|database table is locked|database is busy|SQLITE_BUSY", re.I)
TRANSIENT_CODES = {"TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED"}
PARENT_FILE = "mlflow-parent.json"  # in out_dir: the parent run a resumed sweep reopens
ORIGINAL_TAG = "sweep.original_run_id"  # a run made by replay into another store: the id it had
# A store that does not answer fails a call in seconds, not MLflow's minutes of retries (7 with
# backoff 2, 120 s timeout): the call is kept and training goes on. A person's own values win.
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                 "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0.5", "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}
QUIET_S = 10.0  # after a call got no answer, calls go straight to the spool this long, then one tries again
QUIET_MAX_S = 300.0  # ... doubling while the store stays away
FLUSH_POLL_S = 2.0
FINAL_WAIT_S = 20.0  # at the end of a sweep, how long a store that does not answer is waited for

T = TypeVar("T")


# --- secrets -------------------------------------------------------------------------------------


def _redact(value: Any) -> Any:
    """A plain YAML-safe copy of a config: secret-named keys dropped, every string scrubbed."""
    if isinstance(value, Mapping):
        return {str(k): _redact(v) for k, v in value.items() if not secret_name(str(k))}
    if isinstance(value, (list, tuple, set)):
        return [_redact(v) for v in value]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return scrub(str(value))


# --- retries and keys ----------------------------------------------------------------------------


def _transient(error: BaseException) -> bool:
    if isinstance(error, MlflowException) and error.error_code in TRANSIENT_CODES:
        return True
    return bool(TRANSIENT.search(str(error)))


def _retry(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``call(*args, **kwargs)``, retried with jittered exponential backoff on transient store errors."""
    attempt = 1
    while True:
        try:
            return call(*args, **kwargs)
        except Exception as e:
            if attempt >= RETRY_ATTEMPTS or not _transient(e):
                raise
            # Jitter spreads writers that collided so they do not collide again on the next try.
            time.sleep(min(2.0, 0.05 * 2**attempt) * random.uniform(0.5, 1.5))
            attempt += 1


def _key(key: str) -> str:
    """A key MLflow accepts: letters, digits and ``_-. /`` only, at most 250 characters."""
    return re.sub(r"[^\w\-. /]", "_", key)[:250]


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested mappings as ``a.b.c`` -> str(value), truncated to MLflow's param limit."""
    flat: dict[str, str] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            flat.update(_flatten(v, f"{key}."))
        else:
            flat[_key(key)] = str(v)[:PARAM_LIMIT]
    return flat


def _clean_params(params: Mapping[str, Any]) -> dict[str, str]:
    return _flatten(_redact(params))


def _clean_tags(tags: Mapping[str, Any]) -> dict[str, str]:
    return {_key(str(k)): scrub(str(v))[:TAG_LIMIT] for k, v in tags.items() if v is not None}


def _log_params(client: MlflowClient, run_id: str, params: Mapping[str, str]) -> None:
    items = [Param(k, v) for k, v in params.items()]
    for i in range(0, len(items), BATCH):
        _retry(client.log_batch, run_id, params=items[i : i + BATCH])


def _set_tags(client: MlflowClient, run_id: str, tags: Mapping[str, str]) -> None:
    items = [RunTag(k, v) for k, v in tags.items()]
    for i in range(0, len(items), BATCH):
        _retry(client.log_batch, run_id, tags=items[i : i + BATCH])


def _client(uri: str) -> MlflowClient:
    for name, value in HTTP_DEFAULTS.items():  # read by MLflow at each request; Ray workers inherit them
        os.environ.setdefault(name, value)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _quote(text: str) -> str:
    # MLflow's filter grammar takes either quote; our run names never hold both.
    return f'"{text}"' if "'" in text else f"'{text}'"


# --- reachability --------------------------------------------------------------------------------


def _http_problem(uri: str, timeout: float = 3.0) -> str | None:
    """None when an MLflow server answers at ``uri``, else why not (one line)."""
    base = uri.rstrip("/")
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=timeout):
            return None
    except urllib.error.HTTPError:
        pass  # something answered; a server behind a proxy may only route the API: ask that
    except (urllib.error.URLError, OSError) as e:
        return str(getattr(e, "reason", e))
    try:
        with urllib.request.urlopen(f"{base}/api/2.0/mlflow/experiments/search?max_results=1", timeout=timeout):
            return None
    except urllib.error.HTTPError as e:
        # 401/403: the server is there and wants credentials, which the MLflow client sends.
        return None if e.code in (401, 403) else f"HTTP {e.code} from /health and the experiments API"
    except (urllib.error.URLError, OSError) as e:
        return str(getattr(e, "reason", e))


def _sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (relative or absolute), None for other URIs."""
    if not uri.startswith("sqlite:///") or uri == "sqlite:///:memory:":
        return None
    return Path(uri.removeprefix("sqlite:///").split("?", 1)[0])


def check_reachable(uri: str, required: bool) -> str:
    """The tracking URI to use: ``uri`` if its server answers; else an error (required) or the local fallback."""
    if urlparse(uri).scheme in ("http", "https"):
        problem = _http_problem(uri)
        if problem is None:
            return uri
        shown = scrub(uri)
        if required:
            raise TrackingError(
                f"tracking.uri: cannot reach the MLflow tracking server at {shown} ({scrub(problem)}); "
                f"start it or set tracking.uri=..., or tracking.required=false to fall back to a local store"
            )
        log.warning("tracking.uri: cannot reach %s (%s); logging to %s instead", shown, scrub(problem), FALLBACK_URI)
        uri = FALLBACK_URI
    db = _sqlite_path(uri)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)  # sqlite creates the file, not its folder
    return uri


# --- the sweep's parent run ----------------------------------------------------------------------


def _artifact_location(uri: str) -> str | None:
    """Artifacts of a sqlite store beside its file (MLflow would pick ./mlruns of whatever cwd)."""
    db = _sqlite_path(uri)
    return (db.resolve().parent / "mlartifacts").as_uri() if db is not None else None


def ensure_experiment(client: MlflowClient, name: str, uri: str) -> str:
    """The id of experiment ``name``, created if missing (safe against a concurrent creator)."""
    experiment = _retry(client.get_experiment_by_name, name)
    if experiment is None:
        try:
            return _retry(client.create_experiment, name, artifact_location=_artifact_location(uri))
        except MlflowException as e:
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            experiment = _retry(client.get_experiment_by_name, name)
    if experiment.lifecycle_stage == "deleted":
        raise TrackingError(
            f"tracking.experiment: experiment {name!r} (id {experiment.experiment_id}) is deleted; restore it with "
            f"'mlflow experiments restore --experiment-id {experiment.experiment_id}' or choose tracking.experiment=..."
        )
    return experiment.experiment_id


def _git_commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _sweep_tags(config: Mapping[str, Any]) -> dict[str, Any]:
    """Tasks, model and seeds of a resolved config (``asdict(Settings)`` or a Hydra container)."""
    tasks = config.get("tasks", config.get("task")) or []
    names = list(tasks) if isinstance(tasks, Mapping) else [t["name"] if isinstance(t, Mapping) else t for t in tasks]
    return {
        "sweep.tasks": ",".join(map(str, names)) or None,
        "sweep.model": (config.get("model") or {}).get("name"),
        "sweep.seeds": ",".join(map(str, (config.get("sweep") or {}).get("seeds") or [])) or None,
    }


@dataclass(frozen=True)
class TrialTracking:
    """What a trial needs to log its nested run, as plain data (it travels to Ray workers)."""

    uri: str
    experiment_id: str
    parent_run_id: str
    experiment_name: str | None = None  # finds the experiment again in another server (replay)
    spool_dir: str | None = None  # where calls the store did not take wait (None: they raise)


def saved_parent(out_dir: Path, uri: str, experiment: str) -> str | None:
    """The parent run id a sweep in ``out_dir`` saved for this store and experiment (resume), else None."""
    path = Path(out_dir) / PARENT_FILE
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    same = saved.get("uri") == scrub(uri) and saved.get("experiment") == experiment
    return saved.get("run_id") if same else None


class _Sender:
    """Applies call records to one store, finding each record's run there (by id, else by its
    parent and name, else creating it) once per run."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.client = _client(uri)
        self.experiments: dict[tuple[str, str | None], str] = {}
        self.runs: dict[str, str] = {}  # a record's run key -> the run's id in this store

    def send(self, record: Record) -> str:
        """Make the call of ``record``; the id of the run it went to."""
        run_id, fresh = self._run(record)
        op = record["op"]
        if op == "start":
            self._start(run_id, record, fresh)
        elif op == "metrics":
            metrics = [Metric(k, float(v), int(ts), int(step)) for k, v, ts, step in record["metrics"]]
            for i in range(0, len(metrics), 1000):  # MLflow's most metrics per log_batch
                _retry(self.client.log_batch, run_id, metrics=metrics[i : i + 1000])
        elif op == "end":
            if record.get("error"):
                _retry(self.client.set_tag, run_id, "error", record["error"])
            if record.get("tags"):  # why a trial ended early (sweep.stopped), set as it ends
                _set_tags(self.client, run_id, record["tags"])
            _retry(self.client.set_terminated, run_id, record["status"], end_time=record["time"])
        elif op == "text":
            _retry(self.client.log_text, run_id, record["text"], record["artifact_file"])
        elif op == "artifact":
            if Path(record["path"]).is_file():
                _retry(self.client.log_artifact, run_id, record["path"])
            else:
                log.warning("tracking: %s is gone; not logged to run %s", record["path"], run_id)
        else:
            raise ValueError(f"unknown MLflow call record op {op!r}")
        return run_id

    def _start(self, run_id: str, record: Record, fresh: bool) -> None:
        logged: Mapping[str, str] = {}
        if not fresh:
            run = _retry(self.client.get_run, run_id)
            if run.info.status != "RUNNING":
                _retry(self.client.update_run, run_id, status="RUNNING")
            _set_tags(self.client, run_id, self._tags(record))
            logged = run.data.params
        # Params are write-once in MLflow: a resumed run logs only those it lacks.
        _log_params(self.client, run_id, {k: v for k, v in record["params"].items() if k not in logged})

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
            return _retry(call, *args)
        except MlflowException as e:
            if unreachable(e):
                raise
            return None

    def _existing(self, run_id: str | None, experiment_id: str) -> str | None:
        run = self._lookup(self.client.get_run, run_id) if run_id else None
        return run.info.run_id if run is not None and run.info.experiment_id == experiment_id else None

    def _search(self, experiment_id: str, query: str) -> str | None:
        runs = _retry(self.client.search_runs, [experiment_id], filter_string=query, max_results=1)
        return runs[0].info.run_id if runs else None

    def _parent(self, parent_id: str, name: str | None, experiment_id: str) -> tuple[str, bool]:
        key = f"parent:{parent_id}"
        fresh = False
        if key not in self.runs:
            found = self._existing(parent_id, experiment_id) or self._search(
                experiment_id, f"tags.{ORIGINAL_TAG} = '{parent_id}'")
            if found is None:  # a store that never saw the sweep: a stand-in parent, found again by its tag
                run = _retry(self.client.create_run, experiment_id, run_name=name or f"sweep-{parent_id[:8]}",
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
            experiment_id, f"tags.mlflow.parentRunId = '{parent}' and attributes.run_name = {_quote(record['run_name'])}")
        fresh = found is None
        if fresh:
            tags = {**self._tags(record), **({ORIGINAL_TAG: record["run_id"]} if record.get("run_id") else {})}
            found = _retry(self.client.create_run, experiment_id, run_name=record["run_name"], tags=tags).info.run_id
        self.runs[key] = found
        return found, fresh


class _Tracked:
    """One run's calls: sent now, or, while the store does not answer, kept in the run's spool file
    (and training goes on); later calls first send what waits, in order."""

    def __init__(self, uri: str, spool_dir: str | Path | None) -> None:
        self.uri = uri
        self.sender = _Sender(uri)
        self.spool_dir = Path(spool_dir) if spool_dir is not None else None
        self.spool: Spool | None = None
        self._backlog = False
        self._quiet_until = 0.0  # after a failure, calls go straight to the spool until then
        self._quiet_s = QUIET_S

    @property
    def client(self) -> MlflowClient:
        return self.sender.client

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
                            record["op"], scrub(str(e)).splitlines()[0][:300])
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
                        scrub(self.uri), scrub(str(error)).splitlines()[0][:200], where)
        self._quiet_until = time.monotonic() + self._quiet_s
        self._quiet_s = min(self._quiet_s * 2, QUIET_MAX_S)  # a long outage is probed less and less often

    def _sent(self, record: Record, run_id: str) -> None:
        """A record reached the store as run ``run_id``."""


class SweepTracker(_Tracked):
    """The driver's side: one parent run for the whole sweep, its config, its results and summary.

    With ``spool_dir`` the calls after ``start`` never stop the sweep: what the store does not take
    is kept there (one file per run), sent once it answers again, and left for ``replay`` if not.
    """

    def __init__(self, uri: str, experiment_name: str, spool_dir: str | Path | None = None) -> None:
        super().__init__(uri, spool_dir)
        self.experiment_name = experiment_name
        self.experiment_id: str | None = None
        self.run_id: str | None = None
        self.run_name: str | None = None
        self.reopened = False

    def start(self, settings: Mapping[str, Any], tags: Mapping[str, Any] | None = None, run_name: str | None = None,
              reopen: str | None = None) -> str:
        """Create the parent run (or reopen run ``reopen``: a resumed sweep), log the config as
        params and ``config.yaml``; return the run id. The store must answer here."""
        self.experiment_id = ensure_experiment(self.client, self.experiment_name, self.uri)
        config = _redact(settings)
        run_tags = _clean_tags({
            **_sweep_tags(config),
            "mlflow.source.git.commit": _git_commit(),
            "sweep.command": " ".join(sys.argv),
            **(tags or {}),
        })
        run = self.sender._lookup(self.client.get_run, reopen) if reopen else None
        self.reopened = run is not None and run.info.experiment_id == self.experiment_id
        if self.reopened:
            _retry(self.client.update_run, run.info.run_id, status="RUNNING")
            _set_tags(self.client, run.info.run_id, run_tags)
            logged: Mapping[str, str] = run.data.params  # params are write-once: the first launch's stay
        else:
            run = _retry(self.client.create_run, self.experiment_id, run_name=run_name, tags=run_tags)
            logged = {}
        self.run_id, self.run_name = run.info.run_id, run.info.run_name
        _log_params(self.client, self.run_id, {k: v for k, v in _flatten(config).items() if k not in logged})
        _retry(self.client.log_text, self.run_id, yaml.safe_dump(config, sort_keys=False), "config.yaml")
        self._use_spool(f"parent-{self.run_id}")
        return self.run_id

    def save(self, out_dir: Path) -> Path:
        """The parent's identity in ``out_dir``: a resumed sweep (resume=true) reopens this run."""
        payload = {"run_id": self._started(), "experiment_id": self.experiment_id,
                   "experiment": self.experiment_name, "uri": scrub(self.uri)}
        return write_json(Path(out_dir) / PARENT_FILE, payload, indent=1)

    def _record(self, op: str, **args: Any) -> Record:
        return {"v": 1, "uri": scrub(self.uri), "experiment_id": self.experiment_id, "experiment": self.experiment_name,
                "parent": None, "run_name": self.run_name, "run_id": self._started(), "op": op,
                "time": int(time.time() * 1000), **args}

    def finish(
        self,
        records: list[TrialRecord],
        summaries: list[TaskSummary],
        out_dir: Path,
        plot: Path | None = None,
        status: str = "FINISHED",
    ) -> None:
        """Log the result files, the plot and per-task summary metrics, then end the parent run."""
        self._started()
        for name in ("results.csv", "results.json", "summary.csv"):
            path = Path(out_dir) / name
            if path.is_file():  # text artifacts are scrubbed too: results.json holds error messages
                self._emit(self._record("text", text=scrub(path.read_text()), artifact_file=name))
        if plot is not None and Path(plot).is_file():
            self._emit(self._record("artifact", path=str(Path(plot).resolve())))
        now = int(time.time() * 1000)
        metrics = [[k, v, now, 0] for k, v in _summary_metrics(records, summaries).items()]
        self._emit(self._record("metrics", metrics=metrics))
        self._emit(self._record("end", status=status), last=True)

    def fail(self, status: str = "FAILED") -> None:
        """End the parent (FAILED, or KILLED) on the way out of a sweep that raised: never raises itself."""
        if self.run_id is None:
            return
        try:
            self._emit(self._record("end", status=status), last=True)
        except Exception as e:  # the sweep's own error is the one to show
            log.warning("tracking: could not mark MLflow run %s %s (%s)", self.run_id, status, scrub(str(e))[:200])

    def flush_all(self, wait_s: float = 0.0) -> int:
        """Send what every run of the sweep kept (the trials' and the parent's), waiting up to
        ``wait_s`` for a store that does not answer; the count of calls still unsent."""
        if self.spool_dir is None:
            return 0
        deadline = time.monotonic() + wait_s
        while True:
            left = 0
            for path in spool_files(self.spool_dir):
                left += self._flush_file(path)
                if left:
                    break  # the store went away: the other files wait for the next try
            if not left or time.monotonic() >= deadline:
                break
            time.sleep(FLUSH_POLL_S)
        if left:  # count every file's records for the user's line
            left = sum(len(read_records(p)) for p in spool_files(self.spool_dir))
        self._backlog = self.spool is not None and self.spool.path.exists()
        return left

    def _flush_file(self, path: Path) -> int:
        pending = read_records(path)
        spool = Spool(path)
        for i, record in enumerate(pending):
            try:
                self.sender.send(record)
            except Exception as e:
                if unreachable(e):
                    spool.keep(pending[i:])
                    return len(pending) - i
                log.warning("tracking: the MLflow store refused a kept call of %s (%s); dropped",
                            path.name, scrub(str(e)).splitlines()[0][:300])
        spool.keep([])
        return 0

    def close(self, out_dir: Path) -> tuple[int, Path | None]:
        """A last try to send what waits; what is still left moves to ``out_dir/mlflow-unsent.jsonl``:
        (count, that file), or (0, None) when everything arrived."""
        if self.spool_dir is None or self.flush_all() == 0:
            return 0, None
        path = Path(out_dir) / UNSENT_FILE
        merge(self.spool_dir, path)
        return len(read_records(path)), path

    def _started(self) -> str:
        if self.run_id is None:
            raise TrackingError("SweepTracker used before start")
        return self.run_id


def _summary_metrics(records: list[TrialRecord], summaries: list[TaskSummary]) -> dict[str, float]:
    metrics = {"trials.finished": float(sum(r.ok for r in records)), "trials.failed": float(sum(not r.ok for r in records))}
    for s in summaries:
        for name, value in (("mean", s.mean), ("std", s.std), ("best", s.best_score), ("stopped", s.stopped),
                            ("steps", s.steps), ("steps_full", s.steps_full)):
            if value is not None and math.isfinite(value):  # a task with no finished trial has no stats
                metrics[_key(f"{s.task}.{name}")] = float(value)
    return metrics


# --- one trial's nested run ----------------------------------------------------------------------


def _node_tag() -> str:
    # Inside a Ray worker the node's IP names the machine the way Ray's dashboard does.
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return ray.util.get_node_ip_address()
    return socket.gethostname()


def _device_tag() -> str:
    # Only ask torch if the trial already imported it: tracking must not pull torch in.
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return f"cuda:{torch.cuda.current_device()} ({torch.cuda.get_device_name()})"
    return "cpu" if torch is not None else "unknown"


class TrialLogger(_Tracked):
    """A trial's side, built from plain data in whatever process runs the trial: one nested run.

    ``start`` resumes ``run_id`` if given, else the parent's child of the same run name if one
    exists (a retried trial, or a trial of a resumed sweep), else creates the run. With
    ``spool_dir`` no call raises because the store is down: it is kept and sent later.
    """

    def __init__(
        self,
        uri: str,
        experiment_id: str,
        parent_run_id: str,
        run_name: str,
        params: Mapping[str, Any],
        tags: Mapping[str, Any] | None = None,
        run_id: str | None = None,
        experiment_name: str | None = None,
        spool_dir: str | Path | None = None,
    ) -> None:
        super().__init__(uri, spool_dir)
        self.experiment_id = experiment_id
        self.experiment_name = experiment_name
        self.parent_run_id = parent_run_id
        self.run_name = run_name.replace('"', "_")  # so _quote can always quote it for the lookup
        self.params = dict(params)
        self.tags = dict(tags or {})
        self.run_id = run_id
        self._began = False

    def _run_tags(self) -> dict[str, str]:
        return _clean_tags(
            {
                "mlflow.parentRunId": self.parent_run_id,
                "sweep.task": self.params.get("task"),
                "sweep.seed": self.params.get("seed"),
                "host": socket.gethostname(),
                "node": _node_tag(),
                "device": _device_tag(),
                **self.tags,
            }
        )

    def _record(self, op: str, **args: Any) -> Record:
        return {"v": 1, "uri": scrub(self.uri), "experiment_id": self.experiment_id, "experiment": self.experiment_name,
                "parent": self.parent_run_id, "run_name": self.run_name, "run_id": self.run_id, "op": op,
                "time": int(time.time() * 1000), **args}

    def _sent(self, record: Record, run_id: str) -> None:
        self.run_id = run_id

    def start(self) -> str | None:
        """Create or resume the trial's run, set its tags and log its params; return the run id
        (None while the store does not answer: the run is made once it does)."""
        self._use_spool(self.run_name)
        self._began = True
        self._emit(self._record("start", tags=self._run_tags(), params=_clean_params(self.params)))
        return self.run_id

    def log_epoch(self, epoch: int, metrics: Mapping[str, float]) -> None:
        """Each metric at step ``epoch``."""
        self._started()
        now = int(time.time() * 1000)
        self._emit(self._record("metrics", metrics=[[_key(k), float(v), now, epoch] for k, v in metrics.items()]))

    def end(self, status: str = "FINISHED", error: str | None = None, tags: Mapping[str, Any] | None = None) -> None:
        """Terminate the run; a failure keeps the (scrubbed) tail of its error as tag ``error``;
        ``tags`` are set first (an early stop's reason)."""
        self._started()
        # The tail of a traceback says what went wrong; keep that end when truncating.
        self._emit(self._record("end", status=status, error=scrub(error)[-TAG_LIMIT:] if error else None,
                                tags=_clean_tags(tags) if tags else None), last=True)

    def _started(self) -> None:
        if not self._began:
            raise TrackingError("TrialLogger used before start()")


# --- registry ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RegistrationResult:
    name: str
    version: str
    promoted: bool  # the alias "champion" now points at this version
    previous_champion_score: float | None


def _better(score: float, than: float, mode: str) -> bool:
    return score > than if mode == "max" else score < than


def _ensure_registered_model(client: MlflowClient, name: str) -> None:
    try:
        _retry(client.create_registered_model, name)
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise


def _champion_score(client: MlflowClient, name: str) -> float | None:
    """The ``score`` tag of the version holding alias champion (None: no champion, or no score)."""
    version = _retry(client.get_registered_model, name).aliases.get(CHAMPION)
    if version is None:
        return None
    score = _retry(client.get_model_version, name, str(version)).tags.get("score")
    return float(score) if score is not None else None


def register_best(
    uri: str,
    model_name: str,
    task: str,
    run_id: str,
    model_dir: Path,
    score: float,
    mode: str,
    metric: str,
) -> RegistrationResult:
    """Log ``model_dir`` under ``model/`` of ``run_id``, register it as a new version of
    ``<model_name>-<task>`` and move alias ``champion`` to it only if it beats the champion's score."""
    if mode not in ("max", "min"):
        raise ValueError(f"mode: got {mode!r}, allowed: max, min")
    if not Path(model_dir).is_dir():
        raise FileNotFoundError(f"model folder {model_dir} does not exist")
    client = _client(uri)
    name = registry_name(model_name, task)
    _retry(client.log_artifacts, run_id, str(model_dir), "model")
    _ensure_registered_model(client, name)
    tags = {"score": repr(float(score)), "metric": metric, "mode": mode}
    version = _retry(client.create_model_version, name, source=f"runs:/{run_id}/model", run_id=run_id, tags=tags)
    previous = _champion_score(client, name)
    promoted = previous is None or _better(score, previous, mode)
    if promoted:
        _retry(client.set_registered_model_alias, name, CHAMPION, version.version)
    return RegistrationResult(name, str(version.version), promoted, previous)


# --- replaying kept calls: python -m sweep.tracking replay FILE [--uri URI] ----------------------


@dataclass(frozen=True)
class Replayed:
    uri: str
    sent: int
    left: int  # not sent: the store stopped answering, or refused them
    file: Path | None  # where the calls not sent are (None: all sent)


def replay(where: Path, uri: str | None = None) -> Replayed:
    """Send the calls kept in ``where`` (a spool file or folder) to ``uri`` (default: the store they
    were meant for). Runs are found by id, else by parent and name, so a second replay, or one into
    a server that already holds part of the sweep, adds no runs; sent calls leave the file. Stops at
    the first call the store does not answer."""
    files = spool_files(Path(where))
    if uri is None:
        recorded = {r.get("uri") for f in files for r in read_records(f)}
        if len(recorded) != 1:
            raise TrackingError(f"replay: {where} holds calls for {len(recorded)} stores; name one with --uri URI")
        uri = str(recorded.pop())
    sender = _Sender(uri)
    sent = 0
    for path in files:
        pending, refused = read_records(path), []
        for i, record in enumerate(pending):
            try:
                sender.send(record)
                sent += 1
            except Exception as e:
                if unreachable(e):
                    Spool(path).keep(refused + pending[i:])
                    return Replayed(uri, sent, _count(files), path)
                refused.append(record)  # kept for a look, not in the way of the rest
                log.warning("replay: %s refused a %s call of run %s: %s", scrub(uri), record.get("op"),
                            record.get("run_name"), scrub(str(e)).splitlines()[0][:300])
        Spool(path).keep(refused)
    return Replayed(uri, sent, _count(files), next((p for p in files if p.exists()), None))


def _count(files: list[Path]) -> int:
    return sum(len(read_records(p)) for p in files if p.exists())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sweep.tracking")
    commands = parser.add_subparsers(dest="command", required=True)
    cmd = commands.add_parser("replay", help="send the MLflow calls a sweep kept while the store did not answer")
    cmd.add_argument("file", type=Path, help="a sweep's mlflow-unsent.jsonl (or its mlflow-unsent/ folder)")
    cmd.add_argument("--uri", help="the tracking store to send them to (default: the one they were meant for)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if not spool_files(args.file):
        print(f"error: replay: {args.file} is not a file or folder of kept MLflow calls", file=sys.stderr)
        return 2
    try:
        done = replay(args.file, args.uri)
    except TrackingError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"replay: {done.sent} MLflow calls sent to {scrub(done.uri)}")
    if done.left:
        print(f"replay: {done.left} calls not sent (the store did not answer or refused them); they stay in {done.file}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
