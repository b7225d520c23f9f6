"""``mlflow server --app-name sweep-ui``: MLflow's own server and UI plus one page, ``/sweep/open``, the URL
``sweep ui`` prints for a sweep's runs (sweep/cli/ui.py).

MLflow's documented extension point for its server: an app plugin, a factory in the ``mlflow.app``
entry-point group (pyproject.toml; MLflow's own ``basic-auth`` is one) that takes MLflow's Flask app,
adds to it and returns what the server runs (under uvicorn, MLflow's FastAPI wrapper of it). The page
has to come from the UI's own server: what it sets is the browser's local storage of that origin.

``/sweep/open?experiment=<id>[&parent=<run id>...]`` sets, in the browser, what a person gets by
clicking "Model training" (top left) and the parent run's ``+`` in MLflow 3.17's UI, then replaces
itself with the experiment's runs table (``#/experiments/<id>/runs?workflowType=machine_learning``):

- ``mlflow.workflowType_v1`` = ``"machine_learning"`` (a JSON string; GenAI until set): the view an
  experiment opens in, so that a click in MLflow's experiment list lands on the runs table too;
- ``MLflowLocalStorage-1.1-ExperimentPage-["<id>"]-ReactComponentState``, the experiment page's saved
  state (a JSON object; the key's middle is the JSON list of the page's experiment ids), its
  ``runsExpanded`` object with ``"<run id>": true`` added: the parent's trials listed, not collapsed.
  Whatever else that state holds (columns, sorting) is kept.

Only ids MLflow makes are accepted (an experiment's digits, a run's 32 hex digits): the page
interpolates nothing else, loads nothing, and answers 400 to anything else.
"""

from __future__ import annotations

import json
import re

APP_NAME = "sweep-ui"  # the entry point's name in pyproject.toml's [project.entry-points."mlflow.app"]
OPEN_PATH = "/sweep/open"
EXPERIMENT_ID = re.compile(r"[0-9]{1,19}")
RUN_ID = re.compile(r"[0-9a-f]{32}")
WORKFLOW_KEY = "mlflow.workflowType_v1"
MODEL_TRAINING = "machine_learning"
MOST_PARENTS = 50


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
    """The ``mlflow.app`` factory: MLflow's Flask app with ``/sweep/open``; under uvicorn (``mlflow
    server``'s default) MLflow's FastAPI app around it, as its own ``basic-auth`` plugin does."""
    from mlflow.environment_variables import _MLFLOW_SGI_NAME
    from mlflow.server import app
    from mlflow.server.handlers import _add_static_prefix

    if "sweep_open" not in app.view_functions:
        app.add_url_rule(_add_static_prefix(OPEN_PATH), "sweep_open", _open_view, methods=["GET"])
    if _MLFLOW_SGI_NAME.get() == "uvicorn":
        from mlflow.server.fastapi_app import create_fastapi_app

        return create_fastapi_app(app)
    return app
