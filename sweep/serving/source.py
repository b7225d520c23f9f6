"""Where the served model comes from, and the name it is published under.

``model=`` is one of: a folder written by a sweep's export (``<out_dir>/best/<TASK>/``), a model
registry URI ``models:/<name>@<alias>`` (or ``models:/<name>/<version>``), or ``s3://bucket/prefix``.
Each becomes a local folder; registry and S3 copies are cached under ``cache_dir``.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

from sweep.results import MADE_BY

MODELS_SCHEME = "models:/"
S3_SCHEME = "s3://"
_REGISTRY_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/@]+)|/(?P<version>\d+))$")


class ModelSourceError(ValueError):
    """The model source cannot be used: says what was given and what is expected."""


def resolve_model_source(source: str, cache_dir: Path, tracking_uri: str | None = None) -> Path:
    """A local ``save_pretrained`` folder for ``source`` (see the module docstring)."""
    if source.startswith(S3_SCHEME):
        from sweep.s3 import download_prefix  # lazily: only S3 users need boto3 set up

        dest = Path(cache_dir) / "serve" / "s3" / re.sub(r"[^\w.-]", "_", source[len(S3_SCHEME):].strip("/"))
        return _require_model_folder(Path(download_prefix(source, dest)), source)
    if source.startswith(MODELS_SCHEME):
        return _download_registered(source, Path(cache_dir), tracking_uri)
    if "://" in source:
        raise ModelSourceError(f"model={source}: unknown scheme; give a folder, models:/<name>@<alias> or s3://bucket/prefix")
    return _require_model_folder(Path(source).expanduser(), source)


def _require_model_folder(path: Path, source: str) -> Path:
    if not path.is_dir():
        raise ModelSourceError(f"model={source}: {path} is not a folder")
    if not (path / "config.json").is_file():
        raise ModelSourceError(
            f"model={source}: {path} has no config.json (not a save_pretrained folder; "
            "a sweep exports its best model per task to <out_dir>/best/<TASK>/)"
        )
    return path


def registered_name(source: str) -> str | None:
    """``<name>`` of ``models:/<name>@alias``; None for other sources."""
    match = _REGISTRY_URI.match(source)
    return match.group("name") if match else None


def _download_registered(source: str, cache_dir: Path, tracking_uri: str | None) -> Path:
    match = _REGISTRY_URI.match(source)
    if not match:
        raise ModelSourceError(f"model={source}: expected models:/<name>@<alias> or models:/<name>/<version>")
    import mlflow
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    uri = tracking_uri or mlflow.get_tracking_uri()
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
    if (dest / "config.json").is_file():  # a registered version never changes: reuse the copy
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=version.source, dst_path=str(tmp), tracking_uri=uri))
        _require_model_folder(local, source)
        shutil.rmtree(dest, ignore_errors=True)
        local.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def published_name(model_dir: Path, source: str) -> str:
    """The registry name ``<model>-<task>`` the sweep gave this model, else the folder's name."""
    name = registered_name(source)
    if name:
        return name
    made_by = Path(model_dir) / MADE_BY
    if made_by.is_file():
        try:
            info = json.loads(made_by.read_text())
        except json.JSONDecodeError:
            info = {}
        if info.get("model") and info.get("task"):
            # Same rule as tracking.register_best: a hub id's "/" is not allowed in a name.
            return re.sub(r"[^\w\-.]", "-", f"{info['model']}-{info['task']}")
    return re.sub(r"[^\w\-.]", "-", Path(model_dir).resolve().name)
