"""Stand-ins for the services a cluster talks to, started on this machine: ``moto_server`` as S3 (with
its request log, for counting GETs), a proxy in front of it that fails GETs on demand, and an
``mlflow server`` that can be killed and started again on the same port and store; and the wait for a
``sweep serve`` process to answer ``/v2/health/ready`` (the tests' and the benchmarks' servers).

Dev tooling, not the public API: used by scripts/chaos.py and by the tests.
Ray clusters on one machine are in ``sweep.testing.local_cluster``, whose ``free_port`` this uses too.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from sweep.config.defaults import mlflow_server_env
from sweep.testing.local_cluster import free_port

ACCESS_KEY = "AKIAMOTOTESTKEY01"
SECRET_KEY = "moto-test-secret-value-0123456789"  # searched for in logs and errors: must never appear
# A restart on a busy 2-core machine (Ray trials beside it) can take far longer than a first start.
MLFLOW_START_TIMEOUT_S = 180.0


# ---------------------------------------------------------------- S3: moto_server


@dataclass(frozen=True)
class MotoServer:
    endpoint: str
    log: Path

    def requests(self, method: str, path_re: str) -> list[str]:
        """The request lines for ``method`` on paths matching ``path_re`` (e.g. ``/bkt/glue_data$``)."""
        pattern = re.compile(rf'"{method} ({path_re}) HTTP/1\.1')
        return [m.group(1) for line in self.log.read_text().splitlines() if (m := pattern.search(line))]

    def gets(self, bucket: str, key: str) -> int:
        """GETs of one object, or of every object below ``key/`` for a prefix (listings excluded)."""
        return len(self.requests("GET", rf"/{bucket}/{re.escape(key)}(?:/[^ ?]+)?"))


def s3_environment(endpoint: str) -> dict[str, str | None]:
    """The variables a process (a node, the driver) needs to reach ``endpoint`` with the fake keys, as a
    real cluster's pods get them from their secret; None: unset (a profile would win over the keys)."""
    return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_ENDPOINT_URL": endpoint,
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_PROFILE": None}


def start_moto(log: Path) -> tuple[subprocess.Popen, MotoServer]:
    """``moto_server`` on a free port, its requests logged to ``log``; returns once it answers."""
    port = free_port()
    entry = Path(sys.executable).with_name("moto_server")
    with open(log, "w") as out:
        proc = subprocess.Popen([str(entry), "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(endpoint + "/moto-api/", timeout=1)
            return proc, MotoServer(endpoint, log)
        except OSError as e:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"moto_server did not start: {log.read_text()[-2000:]}") from e
            time.sleep(0.2)


def upload(bucket: str, *folders: tuple[Path, str]) -> None:
    """Create ``bucket`` (the environment points at the server) and upload each (folder, key) with
    ``python -m sweep upload``, as a user would."""
    import boto3

    client = boto3.client("s3")
    if bucket not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
        client.create_bucket(Bucket=bucket)
    for folder, key in folders:
        subprocess.run([sys.executable, "-m", "sweep", "upload", str(folder), "--bucket", bucket, "--key", key],
                       check=True, capture_output=True, timeout=120)


class FaultyProxy:
    """An HTTP proxy in front of the S3 endpoint that answers the first ``fail`` GETs of a key (of
    every key: ``key_path=None``) with ``status`` (503: transient, 403: permanent) and forwards
    everything else unchanged. ``fail_left`` can be raised again later: a new outage."""

    def __init__(self, upstream: str, key_path: str | None, status: int, fail: int):
        import http.server
        import threading

        proxy = self
        self.failed = 0
        self.seen = 0
        self.fail_left = fail

        class Handler(http.server.BaseHTTPRequestHandler):
            def _forward(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if self.command == "GET" and key_path in (None, self.path.split("?")[0]):
                    proxy.seen += 1
                    if proxy.fail_left > 0:
                        proxy.fail_left -= 1
                        proxy.failed += 1
                        code = "SlowDown" if status == 503 else "AccessDenied"
                        payload = f"<Error><Code>{code}</Code></Error>".encode()
                        self.send_response(status)
                        self.send_header("Content-Length", str(len(payload)))
                        self.end_headers()
                        self.wfile.write(payload)
                        return
                request = urllib.request.Request(upstream + self.path, data=body, method=self.command,
                                                 headers={k: v for k, v in self.headers.items() if k.lower() != "host"})
                try:
                    response = urllib.request.urlopen(request, timeout=30)
                except urllib.error.HTTPError as e:
                    response = e
                data = response.read()
                self.send_response(response.status if hasattr(response, "status") else response.code)
                for k, v in response.headers.items():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _forward

            def log_message(self, *args):  # quiet
                return

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


# ---------------------------------------------------------------- MLflow: mlflow server


def _mlflow_server_command(root: Path, port: int) -> list[str]:
    entry = Path(sys.executable).with_name("mlflow")
    mlflow = [str(entry)] if entry.exists() else [sys.executable, "-m", "mlflow"]
    return [
        *mlflow, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
        "--backend-store-uri", f"sqlite:///{root}/srv.db", "--artifacts-destination", str(root / "artifacts"),
    ]


class ServerProcess:
    """An ``mlflow server`` on a fixed port and store (``root``: srv.db and artifacts/) that can be
    killed (its whole process group, as a lost machine) and started again on the same port and store."""

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
            self.proc = subprocess.Popen(_mlflow_server_command(self.root, self.port), env=mlflow_server_env(),
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_healthy(log)
        return self

    def _wait_healthy(self, log: Path) -> None:
        deadline = time.monotonic() + MLFLOW_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {self.proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1):
                    return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"mlflow server not healthy after {MLFLOW_START_TIMEOUT_S:.0f} s:\n"
                           f"{log.read_text()[-3000:]}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None


# ---------------------------------------------------------------- sweep serve


def wait_until_serving(url: str, proc: subprocess.Popen, log: Path, timeout_s: float) -> None:
    """Returns once ``sweep serve`` at ``url`` answers ``/v2/health/ready`` with 200; a process that exits, or
    one not ready in ``timeout_s``, is a RuntimeError with the end of its ``log``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:  # not listening yet, or not ready (503)
            pass
        time.sleep(0.2)
    raise RuntimeError(f"server not ready after {timeout_s:.0f} s:\n{log.read_text(errors='replace')[-3000:]}")
