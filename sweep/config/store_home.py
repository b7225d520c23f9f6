"""Where the default MLflow store lives: ``runs/mlflow.db``, its artifacts in ``runs/mlartifacts/``.

One folder beside the README's sweeps (``out_dir=runs/tour``), which ``make clean`` removes, rather than
two entries loose in the working folder. A folder where an earlier version of sweep left ``./mlflow.db``
keeps using that store, as MLflow itself keeps ``./mlruns`` where it holds data: its registry, the
champions and the runs to compare carry on. Its experiments record their artifacts' absolute location, so
the store is not moved for the user; a line says how to start the new one.
"""

from __future__ import annotations

import logging
import os

from sweep.config.defaults import LEGACY_STORE_FILE, STORE_FILE

log = logging.getLogger(__name__)
_told: set[str] = set()  # the earlier store is named once per process, not at each resolution


def default_store_file(cwd: str) -> str:
    """The absolute path of the default store's file for a command run in ``cwd``."""
    new = os.path.normpath(os.path.join(cwd, STORE_FILE))
    old = os.path.normpath(os.path.join(cwd, LEGACY_STORE_FILE))
    if os.path.isfile(old) and not os.path.exists(new):
        if old not in _told:
            _told.add(old)
            log.warning("tracking: using %s, the MLflow store an earlier sweep left in this folder (the default "
                        "is now %s; move mlflow.db and mlartifacts/ out of this folder to start a new store there)",
                        old, STORE_FILE)
        return old
    return new
