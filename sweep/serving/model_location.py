"""Where the served model comes from, and the name it is published under.

``model=`` is one of: a folder written by a sweep's export (``<out_dir>/best/<TASK>/``) or an MLflow
Model's files (the registry's versions: ``MLmodel``, ``model/``, ``components/tokenizer/``), a model
registry URI ``models:/<name>@<alias>`` (or ``models:/<name>/<version>``), or ``s3://bucket/prefix``.
Each becomes a local folder; registry and S3 copies are cached under ``cache_dir``.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any

from sweep.errors import ModelSourceError
from sweep.files import atomic_folder, is_model_folder, require_model_folder
from sweep.results.export_layout import MADE_BY, is_logged_model, registry_name
from sweep.serving.protocol import TaskInputs

MODELS_SCHEME = "models:/"
S3_SCHEME = "s3://"
_REGISTRY_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/@]+)|/(?P<version>\d+))$")


def resolve_model_source(source: str, cache_dir: Path, tracking_uri: str | None = None) -> Path:
    """A local ``save_pretrained`` folder for ``source`` (see the module docstring)."""
    if source.startswith(S3_SCHEME):
        from sweep.storage.node_cache import download_prefix  # lazily: only S3 users need boto3 set up

        dest = Path(cache_dir) / "serve" / "s3" / re.sub(r"[^\w.-]", "_", source[len(S3_SCHEME):].strip("/"))
        local = Path(download_prefix(source, dest))
        return _assembled(local, dest.with_name(dest.name + ".model")) if is_logged_model(local) \
            else _require_model_folder(local, source)
    if source.startswith(MODELS_SCHEME):
        return _download_registered(source, Path(cache_dir), tracking_uri)
    if "://" in source:
        raise ModelSourceError(f"model={source}: unknown scheme; give a folder, models:/<name>@<alias> or s3://bucket/prefix")
    folder = Path(source).expanduser()
    if is_logged_model(folder):  # an MLflow Model's files (KServe's `mlflow` format in /mnt/models, read-only)
        return _assembled(folder, Path(cache_dir) / "serve" / "mlflow" / re.sub(r"[^\w.-]", "_", str(folder.resolve())))
    return _require_model_folder(folder, source)


def _assembled(logged: Path, dest: Path) -> Path:
    """The logged model's weights and tokenizer as one folder under the cache, made once."""
    from sweep.tracking.model_flavor import assemble_model_folder

    if is_model_folder(dest):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with atomic_folder(dest) as folder:
        assemble_model_folder(logged, folder)
        _require_model_folder(folder, str(logged))
    return dest


def _require_model_folder(path: Path, source: str) -> Path:
    return require_model_folder(path, f"model={source}:",
                                "a sweep exports its best model per task to <out_dir>/best/<TASK>/")


def registered_name(source: str) -> str | None:
    """``<name>`` of ``models:/<name>@alias``; None for other sources."""
    match = _REGISTRY_URI.match(source)
    return match.group("name") if match else None


def _default_tracking_uri() -> str:
    """$MLFLOW_TRACKING_URI (or a URI set in this process), else the store a sweep run here wrote to by default:
    MLflow's own default (./mlflow.db) is not where a sweep keeps it (sweep/config/store_home.py)."""
    import mlflow

    from sweep.config.defaults import TRACKING_URI
    from sweep.config.paths import absolute_store

    return mlflow.get_tracking_uri() if mlflow.is_tracking_uri_set() else absolute_store(TRACKING_URI)


def _download_registered(source: str, cache_dir: Path, tracking_uri: str | None) -> Path:
    match = _REGISTRY_URI.match(source)
    if not match:
        raise ModelSourceError(f"model={source}: expected models:/<name>@<alias> or models:/<name>/<version>")
    import mlflow
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from sweep.tracking.model_flavor import assemble_model_folder

    uri = tracking_uri or _default_tracking_uri()
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    name = match.group("name")
    try:
        if match.group("alias"):
            version = client.get_model_version_by_alias(name, match.group("alias"))
        else:
            version = client.get_model_version(name, match.group("version"))
    except MlflowException as e:
        raise ModelSourceError(f"model={source}: not found in the registry at {uri}: {e.message}") from None
    dest = cache_dir / "serve" / "registry" / f"{name}-v{version.version}"
    if is_model_folder(dest):  # a registered version never changes: reuse the copy
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{dest.name}.download-", dir=dest.parent) as scratch, \
            atomic_folder(dest) as folder:
        # where the files are: a logged model's source (models:/m-…) resolves only at MLflow's global URI
        files = client.get_model_version_download_uri(name, version.version)
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=files, dst_path=scratch, tracking_uri=uri))
        if is_logged_model(local):  # an MLflow Model (the transformers flavor): weights and tokenizer, as one folder
            assemble_model_folder(local, folder)
            _require_model_folder(folder, source)
        else:  # a version registered before the flavor: the folder's files as loose artifacts
            _require_model_folder(local, source)
            for entry in local.iterdir():  # moved (same disk) into the folder that becomes dest
                entry.rename(folder / entry.name)
    return dest


def made_by(model_dir: Path) -> dict[str, Any]:
    """The export's ``sweep_made_by.json`` (how the sweep made it); {} for a folder without a readable one."""
    try:
        info = json.loads((Path(model_dir) / MADE_BY).read_text())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def published_name(model_dir: Path, source: str) -> str:
    """The registry name ``<model>-<task>`` the sweep gave this model, else the folder's name."""
    name = registered_name(source)
    if name:
        return name
    info = made_by(model_dir)
    if info.get("model") and info.get("task"):
        return registry_name(info["model"], info["task"])
    return registry_name(Path(model_dir).resolve().name)


def task_inputs(model_dir: Path) -> TaskInputs | None:
    """The inputs the task of an exported classifier takes (its made-by names the task); None when unknown."""
    from sweep.config.tasks import TaskConfigError, load_task

    task = made_by(model_dir).get("task")
    if not isinstance(task, str) or not task:
        return None
    try:
        spec = load_task(task)
    except (TaskConfigError, ValueError):  # a task this install does not ship: take either input
        return None
    return TaskInputs(spec.name, spec.is_pair)


# ---------------------------------------------------------------------------------------------
# A base model named as the sweep names it (``model=minilm adapters=...``).

def model_config_names() -> list[str]:
    """The names of the model configs (conf/model/*.yaml): what a sweep's ``model=`` takes."""
    from sweep.config.tasks import CONF_DIR

    return sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))


def resolve_model_config(name: str, cache_dir: Path) -> Path:
    """The folder of the model config ``name``, found as the sweep finds it (sweep/models/local_folder.py): its
    package's folder, its tiny build in ``cache_dir`` (the sweep's default cache), or its ``path``."""
    from omegaconf import OmegaConf

    from sweep.config.tasks import CONF_DIR
    from sweep.models.local_folder import resolve_model_dir

    if name not in model_config_names():
        raise ModelSourceError(f"model={name}: no such folder, and no model config of that name; give the base's "
                               f"folder (model=DIR) or a model config: {', '.join(model_config_names())}")
    config = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "model" / f"{name}.yaml"), resolve=True)
    if not (config.get("path") or config.get("builder") or config.get("package")):
        raise ModelSourceError(f"model={name}: the model config {name} names a hub model "
                               f"({config.get('hub_id') or name}), which has no local copy here; give the folder "
                               "the sweep read it from: model=DIR")
    return resolve_model_dir(config, cache_dir)
