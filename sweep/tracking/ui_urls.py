"""MLflow's own UI on a sweep's store: the URLs of a sweep's runs and of the registry, the sweep
experiments a store holds, the ``mlflow server`` command that shows a local store, and the line the end
of a sweep prints to say how to look at it (``sweep ui``: sweep/cli/ui.py).

What MLflow 3.17's UI does with them (found in headless Chromium, tests/test_mlflow_ui.py):

- ``#/experiments/<id>?workflowType=machine_learning`` opens the experiment in the "Model training" view,
  on its runs table (MLflow redirects to ``.../runs?workflowType=machine_learning&...``).
- Without ``workflowType`` the view is the browser's own switch (GenAI / Model training, top left; kept
  in the browser's local storage, ``mlflow.workflowType_v1``, GenAI while it is absent, written only when a
  person clicks the switch), whatever the experiment's ``mlflow.experimentKind`` tag says: in plain MLflow an
  experiment clicked in the experiment list (or on the home page, the root URL) opens on the GenAI "Overview"
  (traces, none here). The URL's ``workflowType`` shows the view without storing it.
- A sweep's trial runs are listed collapsed under its parent run, and nothing in a URL expands them:
  which parents are open (``runsExpanded``) is kept in the browser's local storage per experiment, as are
  the columns shown (``selectedColumns``: no metric by default).

So for a store it serves, ``sweep ui`` runs ``mlflow server --app-name sweep-ui`` (sweep/tracking/ui_app.py,
on MLflow's own server: the same origin as the UI), whose index page, loaded first by every URL of the UI,
sets those in the browser before MLflow's app reads them (Model training where the browser has no view
yet; each sweep's parent expanded and its tasks' metric columns shown, once per browser): the root, the
experiment list and a bookmarked experiment all open on the runs. It prints that server's page for a
sweep, ``<server>/sweep/open?experiment=<id>&parent=<run id>``, which sets them too and shows the runs
table. Someone else's tracking server has neither: its URL is the runs table with
``?workflowType=machine_learning``.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points
from pathlib import Path
from urllib.parse import urlparse

from sweep.secrets import scrub
from sweep.tracking.store import (
    EXPERIMENT_KIND,
    client_for,
    default_artifact_location,
    http_problem,
    sqlite_path,
    with_retries,
)
from sweep.tracking.ui_app import APP_NAME, OPEN_PATH, check_ids, open_query

MODEL_TRAINING = "workflowType=machine_learning"  # the UI's "Model training" view (its other one: genai)


def is_server(uri: str) -> bool:
    """An MLflow tracking server (http/https), as opposed to a store the sweep writes itself (a database)."""
    return urlparse(uri).scheme in ("http", "https")


def server_address(uri: str) -> str:
    """The server's address for a browser: no credentials (a browser asks for its own), no trailing slash."""
    parsed = urlparse(uri)
    netloc = parsed.netloc.rsplit("@", 1)[-1]
    return scrub(parsed._replace(netloc=netloc).geturl()).rstrip("/")


def runs_url(server: str, experiment_id: str) -> str:
    """An experiment's runs table in the Model training view."""
    return f"{server.rstrip('/')}/#/experiments/{experiment_id}?{MODEL_TRAINING}"


def landing_url(server: str, experiment_id: str, parents: Sequence[str] = ()) -> str:
    """The page of ``mlflow server --app-name sweep-ui`` that opens an experiment's runs table with the
    parent runs ``parents`` expanded and "Model training" picked for the browser (sweep/tracking/ui_app.py).
    It takes only ids MLflow makes: a parent that is not one is left out; an experiment's, ``runs_url``."""
    parents = tuple(p for p in parents if check_ids("0", [p]) is None)
    if check_ids(experiment_id, list(parents)) is not None:
        return runs_url(server, experiment_id)
    return f"{server.rstrip('/')}{OPEN_PATH}?{open_query(experiment_id, parents)}"


def app_installed() -> bool:
    """``mlflow server --app-name sweep-ui`` can start: this package's entry point is registered (an
    installed sweep, ``pip install -e .`` included; not a bare source tree on sys.path)."""
    return any(e.name == APP_NAME for e in entry_points(group="mlflow.app"))


def run_url(server: str, experiment_id: str, run_id: str) -> str:
    """One run's page (a sweep's parent: its summary metrics, config and result files)."""
    return f"{server.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?{MODEL_TRAINING}"


def models_url(server: str) -> str:
    """The model registry: every registered model with its aliased versions (``@ champion``)."""
    return f"{server.rstrip('/')}/#/models"


def experiments_url(server: str) -> str:
    return f"{server.rstrip('/')}/#/experiments?{MODEL_TRAINING}"


def server_problem(uri: str) -> str | None:
    """None when an MLflow server answers at ``uri``, else why not (one line)."""
    return http_problem(uri)


def sqlite_file(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` store (None for another store)."""
    return sqlite_path(uri)


def artifact_root(uri: str) -> str | None:
    """Where the sweep puts the artifacts of a sqlite store's experiments (``mlartifacts`` beside the file)."""
    return default_artifact_location(uri)


def sweep_experiments(uri: str) -> list[tuple[str, str]]:
    """(id, name) of the store's active experiments that sweeps made (tagged model development), by name."""
    key, value = next(iter(EXPERIMENT_KIND.items()))
    found = with_retries(client_for(uri).search_experiments, filter_string=f"tags.`{key}` = '{value}'")
    return sorted(((e.experiment_id, e.name) for e in found), key=lambda pair: pair[1])


def server_command(uri: str, host: str, port: int, app: bool = True) -> list[str]:
    """``mlflow server`` on the store ``uri`` (artifacts where the sweep put them), one worker; with ``app``,
    sweep's page for the runs too (``--app-name sweep-ui``: ``landing_url``)."""
    entry = Path(sys.executable).with_name("mlflow")
    command = [str(entry)] if entry.exists() else [sys.executable, "-m", "mlflow"]
    command += ["server", "--backend-store-uri", uri, "--host", host, "--port", str(port), "--workers", "1"]
    if app:
        command += ["--app-name", APP_NAME]
    artifacts = artifact_root(uri)
    if artifacts is not None:  # new experiments there too, and mlflow-artifacts:/ resolved there
        command += ["--default-artifact-root", artifacts, "--artifacts-destination", artifacts]
    return command


def look_line(uri: str, experiment_id: str | None, out_dir: Path) -> str:
    """The end of a sweep: how to look at its runs. A tracking server's runs table is a URL already; a
    store the sweep wrote (sqlite, a database) needs a server first: the ``sweep ui`` command."""
    if is_server(uri) and experiment_id is not None:
        return f"runs: {runs_url(server_address(uri), experiment_id)}"
    return f"runs: sweep ui out_dir={shlex.quote(str(out_dir))}"
