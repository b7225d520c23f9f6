"""MLflow in the tests: the ``mlflow_server`` fixture (one real ``mlflow server`` for the session,
``sweep.testing.services.ServerProcess``) and a trial's tracking body for spawned processes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sweep.testing.services import ServerProcess


@dataclass(frozen=True)
class MlflowServer:
    url: str
    root: Path  # holds srv.db and artifacts/: everything the server stores
    session: int  # the server's session (it starts one): its CLI and everything the CLI starts


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> MlflowServer:
    """``mlflow server`` on a free port of 127.0.0.1 with a sqlite backend and proxied artifacts."""
    server = ServerProcess(tmp_path_factory.mktemp("mlflow-server")).start()
    try:
        yield MlflowServer(server.url, server.root, server.proc.pid)
    finally:
        server.kill()


def log_trial_in_process(kwargs: dict[str, Any], barrier: Any, epochs: int) -> None:
    """A trial's tracking in a spawned process: wait for all peers, then log every epoch at once."""
    from sweep.tracking import TrialLogger

    logger = TrialLogger(**kwargs)
    barrier.wait(timeout=60)  # all processes hit the store together, the worst case for sqlite locks
    logger.start()
    for epoch in range(1, epochs + 1):
        logger.log_evaluation(epoch, {"loss": 1.0 / epoch, "acc": 0.5 + epoch / 100})
    logger.end("FINISHED")
