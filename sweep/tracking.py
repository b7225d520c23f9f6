"""Experiment tracking over MLflow's client API: a parent run per sweep, a nested run per trial, the registry.

Trials log from other processes (Ray workers), so every call names its run id through an
``MlflowClient``; nothing relies on MLflow's global active run. Everything that reaches the store
(params, tags, text artifacts, error messages) goes through ``scrub`` first, and params whose key
looks like a credential are dropped. Calls retry with jittered backoff on a locked sqlite file or
a transient server error, so concurrent trials can share one store.
"""

from __future__ import annotations

import logging
import math
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
from sweep.results import TaskSummary, TrialRecord, registry_name
from sweep.secrets import scrub, secret_name

log = logging.getLogger(__name__)

FALLBACK_URI = "sqlite:///mlflow.db"  # MLflow's own default store (DESIGN §5)
PARAM_LIMIT = 6000  # MLflow's longest param value
TAG_LIMIT = 5000  # the longest tag value every MLflow 2.x/3.x server accepts
BATCH = 100  # MLflow's most params or tags per log_batch
CHAMPION = "champion"
RETRY_ATTEMPTS = 10
TRANSIENT = re.compile(r"database is locked|database table is locked|database is busy|SQLITE_BUSY", re.I)
TRANSIENT_CODES = {"TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED"}

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


class SweepTracker:
    """The driver's side: one parent run for the whole sweep, its config, its results and summary."""

    def __init__(self, uri: str, experiment_name: str) -> None:
        self.uri = uri
        self.experiment_name = experiment_name
        self.client = _client(uri)
        self.experiment_id: str | None = None
        self.run_id: str | None = None

    def start(self, settings: Mapping[str, Any], tags: Mapping[str, Any] | None = None, run_name: str | None = None) -> str:
        """Create the parent run, log the config as params and ``config.yaml``; return the run id."""
        self.experiment_id = ensure_experiment(self.client, self.experiment_name, self.uri)
        config = _redact(settings)
        run_tags = {
            **_sweep_tags(config),
            "mlflow.source.git.commit": _git_commit(),
            "sweep.command": " ".join(sys.argv),
            **(tags or {}),
        }
        run = _retry(self.client.create_run, self.experiment_id, run_name=run_name, tags=_clean_tags(run_tags))
        self.run_id = run.info.run_id
        _log_params(self.client, self.run_id, _flatten(config))
        _retry(self.client.log_text, self.run_id, yaml.safe_dump(config, sort_keys=False), "config.yaml")
        return self.run_id

    def finish(
        self,
        records: list[TrialRecord],
        summaries: list[TaskSummary],
        out_dir: Path,
        plot: Path | None = None,
        status: str = "FINISHED",
    ) -> None:
        """Log the result files, the plot and per-task summary metrics, then end the parent run."""
        if self.run_id is None:
            raise TrackingError("SweepTracker.finish called before start")
        for name in ("results.csv", "results.json", "summary.csv"):
            path = Path(out_dir) / name
            if path.is_file():  # text artifacts are scrubbed too: results.json holds error messages
                _retry(self.client.log_text, self.run_id, scrub(path.read_text()), name)
        if plot is not None and Path(plot).is_file():
            _retry(self.client.log_artifact, self.run_id, str(plot))
        metrics = _summary_metrics(records, summaries)
        now = int(time.time() * 1000)
        _retry(self.client.log_batch, self.run_id, metrics=[Metric(k, v, now, 0) for k, v in metrics.items()])
        _retry(self.client.set_terminated, self.run_id, status)


def _summary_metrics(records: list[TrialRecord], summaries: list[TaskSummary]) -> dict[str, float]:
    metrics = {"trials.finished": float(sum(r.ok for r in records)), "trials.failed": float(sum(not r.ok for r in records))}
    for s in summaries:
        for name, value in (("mean", s.mean), ("std", s.std), ("best", s.best_score)):
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


class TrialLogger:
    """A trial's side, built from plain data in whatever process runs the trial: one nested run.

    ``start`` resumes ``run_id`` if given, else the parent's child of the same run name if one
    exists (a retried trial), else creates the run.
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
    ) -> None:
        self.uri = uri
        self.experiment_id = experiment_id
        self.parent_run_id = parent_run_id
        self.run_name = run_name.replace('"', "_")  # so _quote can always quote it for the lookup
        self.params = dict(params)
        self.tags = dict(tags or {})
        self.run_id = run_id
        self.client = _client(uri)

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

    def _existing(self) -> str | None:
        query = f"tags.mlflow.parentRunId = '{self.parent_run_id}' and attributes.run_name = {_quote(self.run_name)}"
        runs = _retry(self.client.search_runs, [self.experiment_id], filter_string=query, max_results=1)
        return runs[0].info.run_id if runs else None

    def start(self) -> str:
        """Create or resume the trial's run, set its tags and log its params; return the run id."""
        tags = self._run_tags()
        self.run_id = self.run_id or self._existing()
        if self.run_id is None:
            run = _retry(self.client.create_run, self.experiment_id, run_name=self.run_name, tags=tags)
            self.run_id = run.info.run_id
            logged: Mapping[str, str] = {}
        else:
            run = _retry(self.client.get_run, self.run_id)
            if run.info.status != "RUNNING":
                _retry(self.client.update_run, self.run_id, status="RUNNING")
            _set_tags(self.client, self.run_id, tags)
            logged = run.data.params
        # Params are write-once in MLflow: a resumed run logs only those it lacks.
        fresh = {k: v for k, v in _clean_params(self.params).items() if k not in logged}
        _log_params(self.client, self.run_id, fresh)
        return self.run_id

    def log_epoch(self, epoch: int, metrics: Mapping[str, float]) -> None:
        """Each metric at step ``epoch``."""
        now = int(time.time() * 1000)
        batch = [Metric(_key(k), float(v), now, epoch) for k, v in metrics.items()]
        _retry(self.client.log_batch, self._started(), metrics=batch)

    def end(self, status: str = "FINISHED", error: str | None = None) -> None:
        """Terminate the run; a failure keeps the (scrubbed) tail of its error as tag ``error``."""
        run_id = self._started()
        if error:
            # The tail of a traceback says what went wrong; keep that end when truncating.
            _retry(self.client.set_tag, run_id, "error", scrub(error)[-TAG_LIMIT:])
        _retry(self.client.set_terminated, run_id, status)

    def _started(self) -> str:
        if self.run_id is None:
            raise TrackingError("TrialLogger used before start()")
        return self.run_id


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

