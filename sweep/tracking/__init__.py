"""Experiment tracking over MLflow's client API: a parent run per sweep, a nested run per trial, the registry.

Trials log from other processes (Ray workers), so every call names its run id through an
``MlflowClient``; nothing relies on MLflow's global active run (but ``model_flavor``, on the driver: the
flavor's ``log_model`` exists only in the fluent API, so it sets the URI for the call and restores it).
Everything that reaches the store (params, tags, text artifacts, error messages) goes through ``scrub``
first, and params whose key looks like a credential are dropped. Calls retry with jittered backoff on
a locked sqlite file or a transient server error, so concurrent trials can share one store.

A store that stops answering during a sweep does not stop it: with a spool folder (the sweep's
``out_dir/mlflow-unsent``) every call after the parent's start that gets no answer is kept on disk
(``spool.py``), sent in order once the store answers again, and at the end of the sweep
what is left is one file for ``sweep replay FILE [--uri URI]`` (sweep/cli/replay.py).

- ``store.py``:     the client, retries on a busy store, keys / flattened and scrubbed params and tags,
                    ``check_reachable`` (a server that answers, else the local fallback), ``ensure_experiment``
- ``spool.py``:     calls the store did not answer, kept on disk one file per run (``unreachable`` says which)
- ``sender.py``:    ``Sender`` makes a kept or fresh call in a store (finding its run), ``Tracked`` sends or keeps
- ``parent.py``:    the driver's ``SweepTracker`` (the parent run), ``TrialTracking``, ``saved_parent``, summary metrics
- ``trial_run.py``: a trial's ``TrialLogger`` (its nested run, tagged with node and device)
- ``registry.py``:  ``register_best``: a new model version, alias champion only when it beats the champion
- ``one_copy.py``:  the export's files hard-linked to the registry's byte-identical copies (one copy on disk)
- ``model_flavor.py``: the best model as an MLflow Model (transformers flavor) on its trial's run; a logged
                    model's files back into one folder for the server
- ``store_upload.py``: after the sweep, a sqlite store (a consistent copy) and its artifacts to
                    ``<output_prefix>/mlflow/``, openable where it is downloaded (over sweep/storage/s3.py)
- ``store_copies.py``: the same while the sweep runs (``StoreCopies``), taken back by a resumed sweep on a new
                    cluster (``restore_store``)
- ``session.py``:   ``TrackingSession``: every MLflow call of one sweep behind one object (``NoTracking``:
                    tracking=none), what the driver, the hooks and the end of the sweep call
- ``replaying.py``: ``replay`` kept calls into a store (the command: ``sweep replay``)
- ``ui_urls.py``:   MLflow's UI on a store: the URLs of a sweep's runs, ``mlflow server``'s command (``sweep ui``)
- ``ui_app.py``:    the ``mlflow.app`` plugin ``sweep ui`` starts the server with: a landing page that opens a
                    sweep's runs in the Model training view with its parent expanded

What other modules import is re-exported here: ``from sweep.tracking import SweepTracker``. The names load on
first use (PEP 562), so that importing a module of the package (``store_upload`` for ``sweep upload-mlflow``,
``sweep submit``) does not import MLflow.
"""

from __future__ import annotations

from typing import Any

# public name -> the module of the package that defines it
_HOMES = {
    "TrackingError": "sweep.errors",
    **dict.fromkeys(("FINAL_WAIT_S", "PARENT_FILE", "SweepTracker", "TrialTracking", "saved_parent"),
                    "sweep.tracking.parent"),
    **dict.fromkeys(("CHAMPION", "RegistrationResult", "register_best"), "sweep.tracking.registry"),
    **dict.fromkeys(("Replayed", "replay"), "sweep.tracking.replaying"),
    **dict.fromkeys(("ORIGINAL_TAG", "find_child_run"), "sweep.tracking.sender"),
    **dict.fromkeys(("FALLBACK_URI", "check_reachable", "ensure_experiment"), "sweep.tracking.store"),
    "TrialLogger": "sweep.tracking.trial_run",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'sweep.tracking' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value  # once: the next lookup is a plain attribute
    return value
