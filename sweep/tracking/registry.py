"""The model registry: ``register_best`` logs a trial's exported model as an MLflow Model (the
transformers flavor, ``model_flavor``), registers it as a new version of ``<model>-<task>`` and moves
alias ``champion`` to it only if it beats the champion's score and learned something.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from sweep.config.tasks import TaskSpec
from sweep.results.export_layout import registry_name
from sweep.tracking.model_flavor import log_best_model, tracking_at
from sweep.tracking.store import client_for, with_retries

CHAMPION = "champion"


# --- registry ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RegistrationResult:
    name: str
    version: str
    promoted: bool  # the alias "champion" now points at this version
    previous_champion_score: float | None
    earlier: bool = False  # registered by an earlier launch of this sweep (killed after it): not again
    shared_bytes: int = 0  # the export's bytes now one copy with the registry's (hard links: tracking/one_copy.py)


def _better(score: float, than: float, mode: str) -> bool:
    return score > than if mode == "max" else score < than


def _ensure_registered_model(client: MlflowClient, name: str) -> None:
    try:
        with_retries(client.create_registered_model, name)
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise


def _champion_score(client: MlflowClient, name: str) -> float | None:
    """The ``score`` tag of the version holding alias champion (None: no champion, or no score)."""
    version = with_retries(client.get_registered_model, name).aliases.get(CHAMPION)
    if version is None:
        return None
    score = with_retries(client.get_model_version, name, str(version)).tags.get("score")
    return float(score) if score is not None else None


def _version_of_run(client: MlflowClient, name: str, run_id: str) -> str | None:
    """The version of ``name`` already registered from ``run_id`` (None: none, or no such model yet)."""
    try:
        found = with_retries(client.search_model_versions, f"name='{name}' and run_id='{run_id}'")
    except Exception as e:  # noqa: BLE001 - a model not registered yet: nothing earlier
        if "RESOURCE_DOES_NOT_EXIST" in str(e) or "not found" in str(e).lower():
            return None
        raise
    return str(found[0].version) if found else None


def register_best(
    uri: str,
    model_name: str,
    spec: TaskSpec,
    run_id: str,
    model_dir: Path,
    score: float,
    learned: bool = True,
    synthetic: bool = False,
) -> RegistrationResult:
    """Log ``model_dir`` as an MLflow Model on ``run_id`` (once: the flavor's files are the only copy),
    register it as a new version of ``<model_name>-<task>`` and move alias ``champion`` to it only if
    it beats the champion's score (``spec.mode``). ``learned=False`` (its score is within noise of the
    task's trivial score, ``sweep.results.chance``): registered and tagged so, never champion; a model
    answering as a constant would must not be what a server loads by the alias. ``synthetic=True`` (trained on
    generated rows): registered and tagged ``data=synthetic``, never champion."""
    mode = spec.mode
    if mode not in ("max", "min"):
        raise ValueError(f"mode: got {mode!r}, allowed: max, min")
    if not Path(model_dir).is_dir():
        raise FileNotFoundError(f"model folder {model_dir} does not exist")
    client = client_for(uri)
    name = registry_name(model_name, spec.name)
    earlier = _version_of_run(client, name, run_id)
    if earlier is not None:  # one version per task per sweep: a resumed sweep's end does not add another
        champion = with_retries(client.get_registered_model, name).aliases.get(CHAMPION)
        return RegistrationResult(name, str(earlier), str(champion) == str(earlier), _champion_score(client, name),
                                  earlier=True)
    logged = with_retries(log_best_model, uri, run_id, Path(model_dir), spec)
    shared = _share_weights(client, logged.model_id, Path(model_dir))
    _ensure_registered_model(client, name)
    tags = {"score": repr(float(score)), "metric": spec.metric, "mode": mode}
    if not learned:  # the registry UI and a later sweep see why this version never became champion
        tags["learned"] = "false"
    if synthetic:
        tags["data"] = "synthetic"
    with tracking_at(uri):  # a sqlite registry finds the logged model through MLflow's global URI (its own TODO)
        version = with_retries(client.create_model_version, name, source=logged.model_uri, run_id=run_id, tags=tags,
                               model_id=logged.model_id)
    previous = _champion_score(client, name)
    promoted = learned and not synthetic and (previous is None or _better(score, previous, mode))
    if promoted:
        with_retries(client.set_registered_model_alias, name, CHAMPION, version.version)
    return RegistrationResult(name, str(version.version), promoted, previous, shared_bytes=shared)


def _share_weights(client: MlflowClient, model_id: str, model_dir: Path) -> int:
    """The export's weights made one copy with the logged model's (tracking/one_copy.py); the bytes shared."""
    from sweep.tracking.one_copy import local_folder, share_with_artifacts

    artifacts = local_folder(with_retries(client.get_logged_model, model_id).artifact_location)
    return share_with_artifacts(model_dir, artifacts) if artifacts is not None else 0
