"""Where a sweep's base model and data come from, made local on the machine that needs them.

``storage=local``: the data is a folder (``storage.data_dir``) or, when none is given, synthetic
data in the GLUE layout generated once into the cache; the model is ``model.path``, a staged
folder under ``storage.model_dir``, a tiny model built offline, or a model shipped in a package.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from filelock import FileLock

from sweep.config import Settings, StorageConfig
from sweep.models import resolve_model_dir

SYNTHETIC_VERSION = "v1"  # bump when the generator changes, so old caches are not reused


class StagingError(ValueError):
    """A model or data source is missing or unusable; the message says which and what to do."""


@dataclass(frozen=True)
class LocalSources:
    model_dir: Path
    data_dir: Path


def cache_root(storage: StorageConfig) -> Path:
    return Path(os.path.expanduser(storage.cache_dir))


def synthetic_data_dir(cache_dir: Path) -> Path:
    """GLUE-layout synthetic data for every task, generated once per machine (the demo's data)."""
    from sweep.synthetic import write_synthetic_glue, write_synthetic_wikitext

    target = cache_dir / f"synthetic-{SYNTHETIC_VERSION}"
    if (target / "glue_data").is_dir():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / "glue_data").is_dir():
            return target
        tmp = Path(tempfile.mkdtemp(prefix=".synthetic-", dir=cache_dir))
        try:
            write_synthetic_glue(tmp)
            write_synthetic_wikitext(tmp)
            os.replace(tmp, target)  # atomic: a half-written folder is never seen as done
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def local_data_dir(storage: StorageConfig) -> Path:
    if storage.data_dir is None:
        return synthetic_data_dir(cache_root(storage))
    path = Path(os.path.expanduser(storage.data_dir)).resolve()
    if not path.is_dir():
        raise StagingError(
            f"storage.data_dir: {path} is not a folder; point it at a folder holding "
            "glue_data/<TASK>/ (and wikitext-2/), or leave it unset for the synthetic demo data"
        )
    return path


def ensure_local(settings: Settings) -> LocalSources:
    """The model and data folders on this machine (a no-op when they are already there)."""
    cache = cache_root(settings.storage)
    staged = Path(os.path.expanduser(settings.storage.model_dir)) if settings.storage.model_dir else None
    model_dir = resolve_model_dir(asdict(settings.model), cache, staged)
    return LocalSources(model_dir=model_dir, data_dir=local_data_dir(settings.storage))
