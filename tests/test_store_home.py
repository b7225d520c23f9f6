"""The default MLflow store's home (sweep/config/store_home.py): ``runs/mlflow.db`` under the folder a
command runs in, an earlier version's ``./mlflow.db`` kept in use there, and ``make clean`` removing both."""

from __future__ import annotations

import logging
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from sweep.config import store_home
from sweep.config.defaults import TRACKING_URI
from sweep.config.paths import absolute_store

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _fresh_notes(monkeypatch):
    monkeypatch.setattr(store_home, "_told", set())  # each test sees the one-time warning afresh


def _store(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    sqlite3.connect(path).close()
    return path


def test_a_fresh_folder_gets_runs_mlflow_db(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        assert absolute_store(TRACKING_URI, str(tmp_path)) == f"sqlite:///{tmp_path}/runs/mlflow.db"
    assert caplog.records == []


def test_an_earlier_store_in_the_folder_stays_in_use_with_one_line(tmp_path, caplog):
    old = _store(tmp_path / "mlflow.db")
    with caplog.at_level(logging.WARNING):
        assert absolute_store(TRACKING_URI, str(tmp_path)) == f"sqlite:///{old}"
        assert absolute_store(TRACKING_URI, str(tmp_path)) == f"sqlite:///{old}"  # resolved again: no second line
    assert [r.getMessage() for r in caplog.records] == [
        f"tracking: using {old}, the MLflow store an earlier sweep left in this folder (the default is now "
        "runs/mlflow.db; move mlflow.db and mlartifacts/ out of this folder to start a new store there)"]


def test_the_new_store_wins_once_it_exists(tmp_path, caplog):
    _store(tmp_path / "mlflow.db")
    new = _store(tmp_path / "runs" / "mlflow.db")
    with caplog.at_level(logging.WARNING):
        assert absolute_store(TRACKING_URI, str(tmp_path)) == f"sqlite:///{new}"
    assert caplog.records == []


@pytest.mark.parametrize("uri", ["sqlite:///mlflow.db", "sqlite:///db/x.db", "http://mlflow:5000"])
def test_a_store_the_user_names_is_left_as_named(tmp_path, uri):
    _store(tmp_path / "mlflow.db")
    expected = uri if uri.startswith("http") else f"sqlite:///{tmp_path}/{uri[len('sqlite:///'):]}"
    assert absolute_store(uri, str(tmp_path)) == expected


def test_sweep_ui_and_serve_default_to_the_same_store(tmp_path, monkeypatch):
    """`sweep ui` with no option opens, and `sweep serve model=models:/…` reads, the store a sweep here wrote."""
    from sweep.cli.ui import choose_store
    from sweep.serving.model_location import _default_tracking_uri

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert choose_store(None, None).uri == _default_tracking_uri() == f"sqlite:///{tmp_path}/runs/mlflow.db"
    old = _store(tmp_path / "mlflow.db")
    assert choose_store(None, None).uri == _default_tracking_uri() == f"sqlite:///{old}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    assert _default_tracking_uri() == "http://mlflow:5000"


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_clean_removes_the_store_with_the_runs(tmp_path):
    for folder in ("outputs/2026-12-07/05-00-00", "runs/tour/best", "runs/mlartifacts/1", "mlartifacts/1", "src"):
        (tmp_path / folder).mkdir(parents=True)
    _store(tmp_path / "runs" / "mlflow.db")
    _store(tmp_path / "mlflow.db")
    subprocess.run(["make", "-s", "-f", str(REPO / "Makefile"), "clean"], cwd=tmp_path, check=True)
    assert [p.name for p in tmp_path.iterdir()] == ["src"]  # what is not a sweep's is left
