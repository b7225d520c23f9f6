"""S3 in the tests: the ``moto_server`` fixture (a real endpoint over HTTP, ``sweep.testing.services``), the
environment that points this process at it, and staging run in a spawned process."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweep.testing.services import MotoServer, s3_environment, start_moto
from tests.helpers.configs import demo_settings


@pytest.fixture
def moto_server(tmp_path: Path):
    """``moto_server`` on a free port for one test, its requests logged (``MotoServer.gets``)."""
    proc, server = start_moto(tmp_path / "moto.log")
    yield server
    proc.terminate()
    proc.wait(timeout=10)


def s3_env(monkeypatch: pytest.MonkeyPatch, server: MotoServer) -> None:
    """This process (and what it starts) reaches ``server`` with the fake keys, for the test's length."""
    for key, value in s3_environment(server.endpoint).items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)


def stage_in_process(overrides: list[str], barrier) -> tuple[str, str, int]:
    """``ensure_local`` in a spawned process, all peers released at once: (model dir, data dir, bytes)."""
    from sweep.storage.staging import ensure_local

    settings = demo_settings(*overrides)
    barrier.wait(timeout=60)
    sources = ensure_local(settings)
    return str(sources.model_dir), str(sources.data_dir), sources.downloaded
