"""A real ``mlflow server`` process for the remote-store tests, and a trial body for spawned processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# A restart on a busy 2-core machine (Ray trials beside it) can take far longer than a first start.
SERVER_START_TIMEOUT = 180.0


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


class ServerProcess:
    """An ``mlflow server`` on a fixed port and store that can be killed (its whole process group, as
    a lost machine) and started again on the same port with the same store."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> ServerProcess:
        self.starts += 1
        log = self.root / f"server-{self.starts}.log"
        with log.open("w") as out:
            self.proc = subprocess.Popen(_server_command(self.root, self.port), stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self._wait_healthy(log)
        return self

    def _wait_healthy(self, log: Path) -> None:
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {self.proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1):
                    return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"mlflow server not healthy after {SERVER_START_TIMEOUT:.0f} s:\n{log.read_text()[-3000:]}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> MlflowServer:
    """``mlflow server`` on a free port of 127.0.0.1 with a sqlite backend and proxied artifacts."""
    server = ServerProcess(tmp_path_factory.mktemp("mlflow-server")).start()
    try:
        yield MlflowServer(server.url, server.root)
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
