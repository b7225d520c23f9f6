"""A 10 MB request body against ``sweep serve``'s body limit (issue 55): the time to its 413, and the next request.

Starts ``python -m sweep serve`` on the tiny RoBERTa classifier (default limits: 8 MiB), then, ``--repeats``
times: the body sent whole by httpx (``Content-Length``), sent chunked by httpx (1 MiB chunks), and only the
headers of a 10 MB request over a raw socket (the server must answer without the body); after each, a normal
request must answer 200. Prints the median and max of each, in ms.

    python scripts/bench_body_limit.py [--repeats 10] [--bytes 10000000]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sweep.testing.local_cluster import free_port  # noqa: E402
from sweep.testing.services import wait_until_serving  # noqa: E402
from sweep.train.tiny_exports import export_tiny_classifier  # noqa: E402

NAME = "tiny-roberta-RTE"
CLASSIFY = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a cat sleeps"]},
                       {"name": "text_pair", "shape": [1], "datatype": "BYTES", "data": ["an animal rests"]}]}


def headers_only(host: str, port: int, size: int) -> float:
    """Seconds from sending a request's headers (``Content-Length: size``, no body) to the status line."""
    with socket.create_connection((host, port), timeout=30) as raw:
        start = time.perf_counter()
        raw.sendall(f"POST /v2/models/{NAME}/infer HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {size}\r\n\r\n".encode())
        status = raw.recv(64)
        took = time.perf_counter() - start
    assert status.startswith(b"HTTP/1.1 413 "), status
    return took


def timed(call: object) -> float:
    start = time.perf_counter()
    answer = call()  # type: ignore[operator]
    took = time.perf_counter() - start
    assert answer.status_code == 413, answer.status_code
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--bytes", type=int, default=10_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model_dir = export_tiny_classifier(root / "best" / "RTE", root / "cache")
        port = free_port()
        env = {**os.environ, "SWEEP_CACHE_DIR": str(root / "cache"), "HF_HUB_OFFLINE": "1"}
        env.pop("SWEEP_API_KEY", None)
        with (root / "server.log").open("wb") as log:
            server = subprocess.Popen([sys.executable, "-m", "sweep", "serve", f"model={model_dir}", f"port={port}",
                                       "grpc=false", "log_requests=false"], stdout=log, stderr=subprocess.STDOUT,
                                      env=env, cwd=ROOT)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until_serving(url, server, root / "server.log", 180)
            body = b"x" * args.bytes
            chunks = [body[i:i + 2**20] for i in range(0, len(body), 2**20)]
            infer = f"{url}/v2/models/{NAME}/infer"
            times: dict[str, list[float]] = {"sent whole (httpx, Content-Length)": [],
                                             "sent chunked (httpx, 1 MiB chunks)": [],
                                             "headers only (raw socket, Content-Length)": []}
            for _ in range(args.repeats):
                for label, call in zip(times, (lambda: httpx.post(infer, content=body, timeout=30),
                                               lambda: httpx.post(infer, content=iter(chunks), timeout=30),
                                               None)):
                    times[label].append(timed(call) if call else headers_only("127.0.0.1", port, args.bytes))
                    assert httpx.post(infer, json=CLASSIFY, timeout=30).status_code == 200  # the next one is served
            for label, values in times.items():
                print(f"{args.bytes} bytes {label}: 413 in {statistics.median(values) * 1000:.1f} ms median, "
                      f"{max(values) * 1000:.1f} ms max ({len(values)} repeats; the next request 200 each time)")
        finally:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
