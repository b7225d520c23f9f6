"""A real S3 endpoint over HTTP: ``moto_server`` on a free port, with its request log for counting GETs."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from configs import demo_config
from mlflow_fixtures import free_port

ACCESS_KEY = "AKIAMOTOTESTKEY01"
SECRET_KEY = "moto-test-secret-value-0123456789"  # searched for in logs and errors: must never appear


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


def s3_env(monkeypatch: pytest.MonkeyPatch, server: MotoServer) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)


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


@pytest.fixture
def moto_server(tmp_path: Path):
    proc, server = start_moto(tmp_path / "moto.log")
    yield server
    proc.terminate()
    proc.wait(timeout=10)


def upload(bucket: str, *folders: tuple[Path, str]) -> None:
    """Create ``bucket`` (the environment points at the server) and upload each (folder, key) with
    ``python -m sweep.upload``, as a user would."""
    import boto3

    client = boto3.client("s3")
    if bucket not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
        client.create_bucket(Bucket=bucket)
    for folder, key in folders:
        subprocess.run([sys.executable, "-m", "sweep.upload", str(folder), "--bucket", bucket, "--key", key],
                       check=True, capture_output=True, timeout=120)


def compose_settings(*overrides: str):
    """A validated sweep config (the demo's) with ``overrides``."""
    from sweep.config.validate import validate
    return validate(demo_config("tracking=none", *overrides))


def stage_in_process(overrides: list[str], barrier) -> tuple[str, str, int]:
    """``ensure_local`` in a spawned process, all peers released at once: (model dir, data dir, bytes)."""
    from sweep.storage.staging import ensure_local

    settings = compose_settings(*overrides)
    barrier.wait(timeout=60)
    sources = ensure_local(settings)
    return str(sources.model_dir), str(sources.data_dir), sources.downloaded


class FaultyProxy:
    """An HTTP proxy in front of the S3 endpoint that answers the first ``fail`` GETs of a key (of
    every key: ``key_path=None``) with ``status`` (503: transient, 403: permanent) and forwards
    everything else unchanged. ``fail_left`` can be raised again later: a new outage."""

    def __init__(self, upstream: str, key_path: str | None, status: int, fail: int):
        import http.server
        import threading
        import urllib.request

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
