"""Every path option made absolute once, on the driver, against the folder the user ran the command in.

A trial runs in a Ray worker's own working folder (``.../working_dirs/<job>/``): a relative path that
reached it would name a folder there, not the user's. So ``validate`` resolves each path option here,
and the absolute ``Settings`` travel down; nothing below resolves a path option again.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING

from sweep.config.defaults import TRACKING_URI
from sweep.config.store_home import default_store_file

if TYPE_CHECKING:
    from sweep.config.settings import Settings

SQLITE = "sqlite:///"


def absolute_path(path: str | None, cwd: str) -> str | None:
    """``~`` expanded, then joined onto ``cwd`` unless absolute; None stays None."""
    if not path:
        return path
    return os.path.normpath(os.path.join(cwd, os.path.expanduser(path)))


def is_uri(path: str) -> bool:
    """s3://…, gs://…, file://…: a URI, left as it is (a folder is a plain path)."""
    return "://" in path


def absolute_folder_or_uri(path: str | None, cwd: str) -> str | None:
    return path if path is None or is_uri(path) else absolute_path(path, cwd)


def absolute_store(uri: str | None, cwd: str | None = None) -> str | None:
    """``sqlite:///runs/mlflow.db`` is relative to the working directory: every process gets the same file.
    The default store may be the one an earlier version left in that folder (sweep/config/store_home.py)."""
    if uri == TRACKING_URI:
        return SQLITE + default_store_file(cwd or os.getcwd())
    if uri and uri.startswith(SQLITE) and not uri.startswith(SQLITE + "/"):
        return SQLITE + absolute_path(uri[len(SQLITE):], cwd or os.getcwd())
    return uri


def absolute_paths(settings: Settings, cwd: str | None = None) -> Settings:
    """``settings`` with storage.data_dir / model_dir / cache_dir, model.path, out_dir, a sqlite
    tracking.uri and a folder cluster.storage_path absolute (``task.path`` is made so by tasks.py)."""
    cwd = cwd or os.getcwd()
    storage = settings.storage
    return replace(
        settings,
        storage=replace(storage, data_dir=absolute_path(storage.data_dir, cwd),
                        model_dir=absolute_path(storage.model_dir, cwd),
                        cache_dir=absolute_path(storage.cache_dir, cwd)),
        model=replace(settings.model, path=absolute_path(settings.model.path, cwd)),
        tracking=replace(settings.tracking, uri=absolute_store(settings.tracking.uri, cwd)),
        cluster=replace(settings.cluster, storage_path=absolute_folder_or_uri(settings.cluster.storage_path, cwd)),
        out_dir=absolute_path(settings.out_dir, cwd),
    )
