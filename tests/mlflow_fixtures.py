"""A real ``mlflow server`` process for the remote-store tests, and a trial body for spawned processes."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

SERVER_START_TIMEOUT = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class MlflowServer:
    url: str
    root: Path  # holds srv.db and artifacts/: everything the server stores


def _server_command(root: Path, port: int) -> list[str]:
    entry = Path(sys.executable).with_name("mlflow")
    mlflow = [str(entry)] if entry.exists() else [sys.executable, "-m", "mlflow"]
    return [
        *mlflow, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
        "--backend-store-uri", f"sqlite:///{root}/srv.db", "--artifacts-destination", str(root / "artifacts"),
    ]


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1):
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"mlflow server not healthy after {SERVER_START_TIMEOUT:.0f} s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> MlflowServer:
    """``mlflow server`` on a free port of 127.0.0.1 with a sqlite backend and proxied artifacts."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    log = root / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen(_server_command(root, port), stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, log)
        yield MlflowServer(url, root)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def log_trial_in_process(kwargs: dict[str, Any], barrier: Any, epochs: int) -> None:
    """A trial's tracking in a spawned process: wait for all peers, then log every epoch at once."""
    from sweep.tracking import TrialLogger

    logger = TrialLogger(**kwargs)
    barrier.wait(timeout=60)  # all processes hit the store together, the worst case for sqlite locks
    logger.start()
    for epoch in range(1, epochs + 1):
        logger.log_epoch(epoch, {"loss": 1.0 / epoch, "acc": 0.5 + epoch / 100})
    logger.end("FINISHED")
