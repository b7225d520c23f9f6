"""``mlflow server --app-name sweep-ui``: MLflow's own server and UI, opening on a sweep's runs from any URL
it serves, plus one page, ``/sweep/open``, the URL ``sweep ui`` prints for a sweep's runs (sweep/cli/ui.py).

MLflow's documented extension point for its server: an app plugin, a factory in the ``mlflow.app``
entry-point group (pyproject.toml; MLflow's own ``basic-auth`` is one) that takes MLflow's Flask app,
adds to it and returns what the server runs (under uvicorn, MLflow's FastAPI wrapper of it). What it
sets is the browser's local storage of the UI's origin, so it has to come from the UI's own server.

What MLflow 3.17's UI reads (its served bundle, mlflow/server/js/build; checked in headless Chromium,
tests/test_mlflow_ui.py), all in the browser's local storage, each read when the UI or an experiment's
page mounts:

- ``mlflow.workflowType_v1``: the view, ``"genai"`` (a JSON string; MLflow's default while the key is
  absent, and written only when a person clicks the switch) or ``"machine_learning"``, "Model training".
  It alone picks what an experiment opens on (the experiment's ``mlflow.experimentKind`` tag is not
  read): GenAI's Overview, or Model training's runs table.
- ``MLflowLocalStorage-1.1-ExperimentPage-["<id>"]-ReactComponentState``, the experiment page's saved
  state (a JSON object; the key's middle is the JSON list of the page's experiment ids): ``runsExpanded``
  (``{"<run id>": true}``: a parent's trials listed, not collapsed) and ``selectedColumns`` (the runs
  table's columns; MLflow's default is Source, Models, Dataset: no metric). Absent keys take MLflow's
  defaults.

Every URL of the UI is ``<server>/#/...``: a browser that opens one (the root, the experiment list, a
bookmarked experiment) loads the index page first, and the route after ``#`` never reaches the server.
So the index page is where sweep's defaults go in: ``index_page`` adds a script before MLflow's own
(``sweep_defaults``: read from the store at each load) that, before the app reads anything,

- sets the view to Model training where the browser has none (a person's own pick of GenAI is kept);
- for each sweep experiment, shows each sweep parent expanded and each task's metric column, once per
  parent and column (``sweep.ui.offered_v1`` remembers which): a parent a person collapsed, a column
  they hid, stays so; a new sweep's parent and a new task's column show.

``/sweep/open?experiment=<id>[&parent=<run id>...]`` sets the view and the parents expanded (whatever
the browser held), then replaces itself with the experiment's runs table
(``#/experiments/<id>/runs?workflowType=machine_learning``).

Only ids MLflow makes are accepted (an experiment's digits, a run's 32 hex digits) and only metric keys
the sweep logs (``clean_key``'s characters): the pages interpolate nothing else, as JSON, load nothing,
and ``/sweep/open`` answers 400 to anything else.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

APP_NAME = "sweep-ui"  # the entry point's name in pyproject.toml's [project.entry-points."mlflow.app"]
OPEN_PATH = "/sweep/open"
EXPERIMENT_ID = re.compile(r"[0-9]{1,19}")
RUN_ID = re.compile(r"[0-9a-f]{32}")
WORKFLOW_KEY = "mlflow.workflowType_v1"
MODEL_TRAINING = "machine_learning"
MOST_PARENTS = 50
MOST_EXPERIMENTS = 100  # the index page's defaults: the sweep experiments last updated
OFFERED_KEY = "sweep.ui.offered_v1"  # per experiment: the parents and columns sweep's defaults showed once
# MLflow's default columns of the runs table (the page state's selectedColumns while it has none): kept
MLFLOW_COLUMNS = ("attributes.`Source`", "attributes.`Models`", "attributes.`Dataset`")
METRIC_KEY = re.compile(r"[\w\-. /]{1,250}")  # what clean_key leaves: a key MLflow's column id takes unquoted
METRICS_TAG = "sweep.metrics"  # a sweep parent's: its tasks' metric keys, comma-joined (parent.py)
SWEEP_PARENT = "tags.`sweep.tasks` IS NOT NULL"  # a sweep's parent run (its trials are tagged sweep.task)


def experiment_page_key(experiment_id: str) -> str:
    """The local-storage key of an experiment page's saved state (MLflow 3.17's ``LocalStorageUtils``)."""
    return f"MLflowLocalStorage-1.1-ExperimentPage-{json.dumps([experiment_id])}-ReactComponentState"


def runs_route(experiment_id: str) -> str:
    """The UI's route (after ``#``) of an experiment's runs table in the Model training view."""
    return f"/experiments/{experiment_id}/runs?workflowType={MODEL_TRAINING}"


def open_query(experiment_id: str, parents: list[str] | tuple[str, ...] = ()) -> str:
    """The query of ``/sweep/open`` for an experiment and the parent runs to show expanded."""
    return "&".join([f"experiment={experiment_id}", *(f"parent={run_id}" for run_id in parents)])


def check_ids(experiment_id: str | None, parents: list[str]) -> str | None:
    """None when these are ids MLflow makes, else why not (one line)."""
    if experiment_id is None or not EXPERIMENT_ID.fullmatch(experiment_id):
        return "experiment= must be an MLflow experiment id (digits)"
    if len(parents) > MOST_PARENTS:
        return f"at most {MOST_PARENTS} parent= runs"
    bad = [p for p in parents if not RUN_ID.fullmatch(p)]
    if bad:
        return "parent= must be an MLflow run id (32 hex digits)"
    return None


def landing_page(experiment_id: str, parents: list[str]) -> str:
    """The HTML of ``/sweep/open``: the two preferences set, then the runs table in its place (the Back
    button skips this page). Only validated ids are in it (``check_ids``), as JSON."""
    if check_ids(experiment_id, parents) is not None:
        raise ValueError(check_ids(experiment_id, parents))
    route = runs_route(experiment_id)
    values = json.dumps({"workflowKey": WORKFLOW_KEY, "workflow": MODEL_TRAINING,
                         "stateKey": experiment_page_key(experiment_id), "parents": parents, "route": route})
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Opening the sweep's runs in MLflow</title></head>
<body>
<p>Opening the sweep's runs in MLflow: <a href="../#{route}">the runs table</a>.</p>
<script>
(function () {{
  var v = {values};
  try {{
    localStorage.setItem(v.workflowKey, JSON.stringify(v.workflow));
    var state = {{}};
    try {{ state = JSON.parse(localStorage.getItem(v.stateKey) || "{{}}") || {{}}; }} catch (e) {{ state = {{}}; }}
    if (typeof state !== "object" || Array.isArray(state)) state = {{}};
    var expanded = (state.runsExpanded && typeof state.runsExpanded === "object") ? state.runsExpanded : {{}};
    v.parents.forEach(function (id) {{ expanded[id] = true; }});
    state.runsExpanded = expanded;
    localStorage.setItem(v.stateKey, JSON.stringify(state));
  }} catch (e) {{}}
  location.replace(new URL("../#" + v.route, location.href).href);
}})();
</script>
</body></html>
"""


def metric_column(key: str) -> str:
    """The runs table's column id of a metric (what its "Columns" menu stores)."""
    return f"metrics.`{key}`"


class Searchable(Protocol):
    """What ``sweep_defaults`` reads: MLflow's tracking store in the server, or an ``MlflowClient``."""

    def search_experiments(self, *, view_type: int, max_results: int, filter_string: str,
                           order_by: list[str]) -> Any: ...

    def search_runs(self, *, experiment_ids: list[str], filter_string: str, run_view_type: int,
                    max_results: int, order_by: list[str]) -> Any: ...


def parent_metrics(tags: Mapping[str, str], params: Mapping[str, str]) -> list[str]:
    """The metric keys of a sweep parent's tasks: its ``sweep.metrics`` tag; a sweep from before that tag,
    its composed config's (params ``composed.task.<task>.metric``). Only keys a column id takes as is."""
    if METRICS_TAG in tags:
        keys = tags[METRICS_TAG].split(",")
    else:
        keys = [v for k, v in sorted(params.items()) if k.startswith("composed.task.") and k.endswith(".metric")]
    return [k for k in keys if METRIC_KEY.fullmatch(k)]


def sweep_defaults(store: Searchable) -> dict[str, dict[str, list[str]]]:
    """Per sweep experiment (tagged model development, with a sweep's parent run): the parents to show
    expanded (the last ``MOST_PARENTS`` started) and their tasks' metric columns."""
    from mlflow.entities import ViewType

    from sweep.tracking.store import EXPERIMENT_KIND

    (kind, value), = EXPERIMENT_KIND.items()  # what a sweep tags its experiment with
    experiments = store.search_experiments(view_type=ViewType.ACTIVE_ONLY, max_results=MOST_EXPERIMENTS,
                                           filter_string=f"tags.`{kind}` = '{value}'",
                                           order_by=["last_update_time DESC"])
    defaults: dict[str, dict[str, list[str]]] = {}
    for experiment in experiments:
        if not EXPERIMENT_ID.fullmatch(experiment.experiment_id):
            continue
        runs = store.search_runs(experiment_ids=[experiment.experiment_id], filter_string=SWEEP_PARENT,
                                 run_view_type=ViewType.ACTIVE_ONLY, max_results=MOST_PARENTS,
                                 order_by=["attributes.start_time DESC"])
        parents = [r for r in runs if RUN_ID.fullmatch(r.info.run_id)]
        if parents:
            columns = [metric_column(k) for r in parents for k in parent_metrics(r.data.tags, r.data.params)]
            defaults[experiment.experiment_id] = {"parents": [r.info.run_id for r in parents],
                                                  "columns": list(dict.fromkeys(columns))}
    return defaults


def _script_json(value: object) -> str:
    """JSON to put inside a <script>: nothing in it can end the element or start markup."""
    return json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def defaults_script(defaults: Mapping[str, Mapping[str, list[str]]]) -> str:
    """The script the index page runs before MLflow's app: Model training where the browser has no view
    yet; in each sweep experiment, each parent expanded and each metric column shown, once each (see the
    module's docstring). It never stops the UI: a browser without local storage gets MLflow's defaults."""
    values = _script_json({
        "workflowKey": WORKFLOW_KEY, "workflow": MODEL_TRAINING, "offeredKey": OFFERED_KEY,
        "columns": list(MLFLOW_COLUMNS),
        "experiments": {eid: {"stateKey": experiment_page_key(eid), "parents": list(d["parents"]),
                              "columns": list(d["columns"])} for eid, d in defaults.items()}})
    return f"""<script>
/* sweep ui's defaults (sweep/tracking/ui_app.py), set before MLflow's app reads them */
(function () {{
  var v = {values};
  function isObject(o) {{ return !!o && typeof o === "object" && !Array.isArray(o); }}
  function read(key) {{
    try {{ var o = JSON.parse(localStorage.getItem(key) || "{{}}"); return isObject(o) ? o : {{}}; }}
    catch (e) {{ return {{}}; }}
  }}
  function notIn(list) {{ return function (x) {{ return !Array.isArray(list) || list.indexOf(x) < 0; }}; }}
  try {{
    if (localStorage.getItem(v.workflowKey) === null) {{
      localStorage.setItem(v.workflowKey, JSON.stringify(v.workflow));
    }}
    var offered = read(v.offeredKey);
    Object.keys(v.experiments).forEach(function (id) {{
      var e = v.experiments[id], was = isObject(offered[id]) ? offered[id] : {{}};
      var parents = e.parents.filter(notIn(was.parents)), columns = e.columns.filter(notIn(was.columns));
      if (parents.length || columns.length) {{
        var state = read(e.stateKey);
        var expanded = isObject(state.runsExpanded) ? state.runsExpanded : {{}};
        var shown = Array.isArray(state.selectedColumns) ? state.selectedColumns : v.columns.slice();
        parents.forEach(function (p) {{ if (!(p in expanded)) expanded[p] = true; }});
        shown = shown.concat(columns.filter(notIn(shown)));
        state.runsExpanded = expanded;
        state.selectedColumns = shown;
        localStorage.setItem(e.stateKey, JSON.stringify(state));
      }}
      var seen = Array.isArray(was.columns) ? was.columns : [];
      offered[id] = {{parents: e.parents, columns: seen.concat(e.columns.filter(notIn(seen)))}};
    }});
    localStorage.setItem(v.offeredKey, JSON.stringify(offered));
  }} catch (e) {{}}
}})();
</script>"""


def index_page(html: str, defaults: Mapping[str, Mapping[str, list[str]]]) -> str:
    """MLflow's index page with ``defaults_script`` first in its head, before MLflow's (deferred) app."""
    head = re.search(r"<head[^>]*>", html, flags=re.IGNORECASE)
    at = head.end() if head else 0
    return html[:at] + defaults_script(defaults) + html[at:]


def _index_view():
    """MLflow's index page (every UI URL loads it: the route is after ``#``) with sweep's defaults."""
    from flask import Response, current_app
    from mlflow.server import serve as mlflow_index

    index = Path(current_app.static_folder or "") / "index.html"
    if not index.is_file():
        return mlflow_index()  # MLflow's own answer: a source install without the UI's build
    try:
        from mlflow.server.handlers import _get_tracking_store

        defaults = sweep_defaults(_get_tracking_store())
    except Exception as e:  # the UI opens all the same, with the view's default alone
        log.warning("sweep ui: the sweep experiments' defaults could not be read (%s)", str(e)[:300])
        defaults = {}
    return Response(index_page(index.read_text(encoding="utf-8"), defaults), mimetype="text/html",
                    headers={"Cache-Control": "no-store"})  # the defaults follow the store: never a stale copy


def _open_view():
    from flask import Response, request

    experiment_id = request.args.get("experiment")
    parents = request.args.getlist("parent")
    problem = check_ids(experiment_id, parents)
    if problem is not None:
        return Response(f"{problem}\n", status=400, mimetype="text/plain")
    return Response(landing_page(experiment_id, parents), mimetype="text/html",
                    headers={"Cache-Control": "no-store"})


def create_app():
    """The ``mlflow.app`` factory: MLflow's Flask app with ``/sweep/open`` and its index page served with
    sweep's defaults (``_index_view`` in place of MLflow's view of the same route, ``serve``); under uvicorn
    (``mlflow server``'s default) MLflow's FastAPI app around it, as its own ``basic-auth`` plugin does."""
    from mlflow.environment_variables import _MLFLOW_SGI_NAME
    from mlflow.server import app
    from mlflow.server.handlers import _add_static_prefix

    if "sweep_open" not in app.view_functions:
        app.add_url_rule(_add_static_prefix(OPEN_PATH), "sweep_open", _open_view, methods=["GET"])
    app.view_functions["serve"] = _index_view  # the endpoint of MLflow's ``@app.route("/") def serve()``
    if _MLFLOW_SGI_NAME.get() == "uvicorn":
        from mlflow.server.fastapi_app import create_fastapi_app

        return create_fastapi_app(app)
    return app
