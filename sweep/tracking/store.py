"""The store itself: the MLflow client, retries on a busy store, keys and values MLflow accepts
(params flattened, secrets dropped and scrubbed, tags cut to size), whether a server answers, and
the sweep's experiment.

Calls retry with jittered backoff on a locked sqlite file or a transient server error, so
concurrent trials can share one store.
"""

from __future__ import annotations

import logging
import os
import random
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

from mlflow import MlflowClient
from mlflow.entities import Param, RunTag
from mlflow.exceptions import MlflowException

from sweep.config.defaults import TRACKING_URI
from sweep.errors import TrackingError
from sweep.secrets import scrub, secret_name

log = logging.getLogger(__name__)

FALLBACK_URI = TRACKING_URI  # the default store, sqlite:///runs/mlflow.db (docs/architecture.md §6)
PARAM_LIMIT = 6000  # MLflow's longest param value
TAG_LIMIT = 5000  # the longest tag value every MLflow 2.x/3.x server accepts
BATCH = 100  # MLflow's most params or tags per log_batch
RETRY_ATTEMPTS = 10
TRANSIENT = re.compile(r"database is locked|database table is locked|database is busy|SQLITE_BUSY", re.I)
TRANSIENT_CODES = {"TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED"}
# A store that does not answer fails a call in seconds, not MLflow's minutes of retries (7 with
# backoff 2, 120 s timeout): the call is kept and training goes on. A person's own values win.
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                 "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0.5", "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}

T = TypeVar("T")


# --- secrets -------------------------------------------------------------------------------------


def redact(value: Any) -> Any:
    """A plain YAML-safe copy of a config: secret-named keys dropped, every string scrubbed."""
    if isinstance(value, Mapping):
        return {str(k): redact(v) for k, v in value.items() if not secret_name(str(k))}
    if isinstance(value, (list, tuple, set)):
        return [redact(v) for v in value]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return scrub(str(value))


# --- retries and keys ----------------------------------------------------------------------------


def _transient(error: BaseException) -> bool:
    if isinstance(error, MlflowException) and error.error_code in TRANSIENT_CODES:
        return True
    return bool(TRANSIENT.search(str(error)))


def with_retries(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
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


def clean_key(key: str) -> str:
    """A key MLflow accepts: letters, digits and ``_-. /`` only, at most 250 characters."""
    return re.sub(r"[^\w\-. /]", "_", key)[:250]


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested mappings as ``a.b.c`` -> str(value), truncated to MLflow's param limit."""
    flat: dict[str, str] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            flat.update(flatten_config(v, f"{key}."))
        else:
            flat[clean_key(key)] = str(v)[:PARAM_LIMIT]
    return flat


def clean_params(params: Mapping[str, Any]) -> dict[str, str]:
    return flatten_config(redact(params))


def clean_tags(tags: Mapping[str, Any]) -> dict[str, str]:
    return {clean_key(str(k)): scrub(str(v))[:TAG_LIMIT] for k, v in tags.items() if v is not None}


def log_params(client: MlflowClient, run_id: str, params: Mapping[str, str]) -> None:
    items = [Param(k, v) for k, v in params.items()]
    for i in range(0, len(items), BATCH):
        with_retries(client.log_batch, run_id, params=items[i : i + BATCH])


def set_tags(client: MlflowClient, run_id: str, tags: Mapping[str, str]) -> None:
    items = [RunTag(k, v) for k, v in tags.items()]
    for i in range(0, len(items), BATCH):
        with_retries(client.log_batch, run_id, tags=items[i : i + BATCH])




def metric_key(key: str) -> str:
    """A metric's key as the trial's run logs it."""
    return clean_key(key)


def client_for(uri: str) -> MlflowClient:
    """The client the sweep's own calls use for ``uri`` (MLflow's HTTP timeouts and retries set)."""
    for name, value in HTTP_DEFAULTS.items():  # read by MLflow at each request; Ray workers inherit them
        os.environ.setdefault(name, value)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def quote_filter(text: str) -> str:
    # MLflow's filter grammar takes either quote; our run names never hold both.
    return f'"{text}"' if "'" in text else f"'{text}'"


# --- reachability --------------------------------------------------------------------------------


def http_problem(uri: str, timeout: float = 3.0) -> str | None:
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


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (relative or absolute), None for other URIs."""
    if not uri.startswith("sqlite:///") or uri == "sqlite:///:memory:":
        return None
    return Path(uri.removeprefix("sqlite:///").split("?", 1)[0])


def check_reachable(uri: str, required: bool) -> str:
    """The tracking URI to use: ``uri`` if its server answers; else an error (required) or the local fallback."""
    if urlparse(uri).scheme in ("http", "https"):
        problem = http_problem(uri)
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
    db = sqlite_path(uri)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)  # sqlite creates the file, not its folder
    return uri


# --- experiments ---------------------------------------------------------------------------------


def default_artifact_location(uri: str) -> str | None:
    """Artifacts of a sqlite store beside its file (MLflow would pick ./mlruns of whatever cwd)."""
    db = sqlite_path(uri)
    return (db.resolve().parent / "mlartifacts").as_uri() if db is not None else None


# MLflow 3's experiment kind, what marks a sweep's experiments (sweep ui lists them). MLflow 3.17's UI no
# longer reads it to choose a page: its GenAI / Model training switch does (sweep/tracking/ui_urls.py).
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}


def ensure_experiment(client: MlflowClient, name: str, uri: str) -> str:
    """The id of experiment ``name``, created if missing (safe against a concurrent creator), tagged
    as model development."""
    experiment = with_retries(client.get_experiment_by_name, name)
    if experiment is None:
        try:
            return with_retries(client.create_experiment, name, artifact_location=default_artifact_location(uri),
                                tags=EXPERIMENT_KIND)
        except MlflowException as e:
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            experiment = with_retries(client.get_experiment_by_name, name)
    if experiment.lifecycle_stage == "deleted":
        raise TrackingError(
            f"tracking.experiment: experiment {name!r} (id {experiment.experiment_id}) is deleted; restore it with "
            f"'mlflow experiments restore --experiment-id {experiment.experiment_id}' or choose tracking.experiment=..."
        )
    for key, value in EXPERIMENT_KIND.items():  # an experiment made before the tag, or by someone else
        if key not in experiment.tags:
            with_retries(client.set_experiment_tag, experiment.experiment_id, key, value)
    return experiment.experiment_id

