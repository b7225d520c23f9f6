"""The serving tests' shared parts: real ``python -m sweep serve`` processes (start on a free port,
wait, stop), the names they serve, the v2 protocol's request and response helpers, and a stand-in
forward pass for the batcher."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from sweep.serving.cpu_budget import QUIET_OPENMP
from sweep.testing.local_cluster import free_port
from sweep.testing.services import wait_until_serving

REPO = Path(__file__).resolve().parents[2]
SERVER_START_TIMEOUT = 120.0
CLASSIFIER_NAME = "tiny-roberta-RTE"  # what the servers of tiny_exports' models publish
LM_NAME = "tiny-gpt2-wikitext-2"


def texts(name: str, values: list[Any], shape: list[int] | None = None, datatype: str = "BYTES") -> dict[str, Any]:
    """One v2 input tensor as JSON (BYTES by default: texts)."""
    return {"name": name, "shape": shape if shape is not None else [len(values)], "datatype": datatype, "data": values}


def output(body: dict[str, Any], name: str) -> list[Any]:
    """The data of the output ``name`` of a v2 response."""
    return next(o["data"] for o in body["outputs"] if o["name"] == name)


@dataclass
class RecordingModel:
    """A stand-in forward pass that records each batch and answers item * 10."""

    delay_s: float = 0.02
    fail_on: int | None = None

    def __post_init__(self) -> None:
        self.calls: list[tuple[Any, list[int]]] = []

    def __call__(self, key: Any, items: list[int]) -> list[int]:
        self.calls.append((key, list(items)))
        time.sleep(self.delay_s)
        if self.fail_on is not None and self.fail_on in items:
            raise RuntimeError(f"boom on {self.fail_on}")
        return [i * 10 for i in items]


@dataclass
class Server:
    name: str
    url: str
    proc: subprocess.Popen[bytes]
    log: Path
    grpc_address: str = ""  # HOST:PORT of its gRPC port (nothing listens there with grpc=false)

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


def start_server(name: str, model_dir: Path, log: Path, cache: Path, *args: str, threads: int | None = 1,
                 preexec: Callable[[], None] | None = None, env: Mapping[str, str] | None = None) -> Server:
    """``threads``: None for the server's own default; ``preexec``: runs in the server's process before it
    starts (an affinity, a cgroup); ``env``: variables beside the tests' ($SWEEP_API_KEY)."""
    port = free_port()
    grpc_port = free_port()  # never the default 8081: servers run side by side (and gRPC shares ports: SO_REUSEPORT)
    while grpc_port == port:
        grpc_port = free_port()
    # without the tests' quiet OpenMP (tests/conftest.py): the server's own setting is what runs, as for a user
    # and never a key from the tests' own environment: only the one a test gives
    inherited = {k: v for k, v in os.environ.items() if k not in QUIET_OPENMP and k != "SWEEP_API_KEY"}
    env = {**inherited, "SWEEP_CACHE_DIR": str(cache), "HF_HUB_OFFLINE": "1", **(env or {})}
    command = [sys.executable, "-m", "sweep", "serve", f"model={model_dir}", f"port={port}", f"grpc_port={grpc_port}",
               "max_latency_ms=10", *([f"threads={threads}"] if threads else []), *args]
    with log.open("wb") as sink:  # a file, not a pipe: a full pipe would block the server
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                preexec_fn=preexec)
    return Server(name, f"http://127.0.0.1:{port}", proc, log, f"127.0.0.1:{grpc_port}")


def wait_ready(server: Server) -> None:
    wait_until_serving(server.url, server.proc, server.log, SERVER_START_TIMEOUT)


def wait_grpc_ready(server: Server, timeout: float = 30.0) -> None:
    """Until the gRPC port takes connections (it starts next to the REST one, in the same event loop)."""
    import grpc

    with grpc.insecure_channel(server.grpc_address) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise RuntimeError(
                f"gRPC not ready at {server.grpc_address} after {timeout} s:\n{server.log_tail()}") from None


def stop_server(server: Server) -> None:
    server.proc.terminate()
    try:
        server.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()


@contextmanager
def serving(started: dict[str, Server]) -> Iterator[dict[str, Server]]:
    """Wait until every started server answers, hand them over, stop them all at the end (even on failure)."""
    try:
        for server in started.values():
            wait_ready(server)
        yield started
    finally:
        for server in started.values():
            stop_server(server)


def ask_a_pair(model_dir: Path, log: Path, cache: Path) -> httpx.Response:
    """``sweep serve`` on an exported classifier, asked one (text, text_pair) over v2 REST; its answer."""
    with serving({"model": start_server("model", model_dir, log, cache)}) as servers:
        url = servers["model"].url
        (name,) = httpx.get(f"{url}/v1/models").json()["models"]
        body = {"inputs": [texts("text", ["The cat sees a dog."]), texts("text_pair", ["A dog."])]}
        return httpx.post(f"{url}/v2/models/{name}/infer", json=body, timeout=30)


def grpc_infer(server: Server, body: dict[str, Any], name: str | None = None,
               metadata: Mapping[str, str] | None = None) -> dict[str, Any] | tuple[str, str]:
    """The REST-shaped answer of a v2 request body sent over gRPC (KServe's client) to ``name`` (default:
    the server's model) with ``metadata`` (``authorization``), or (status code name, details) when the call fails."""
    from sweep.serving.kserve_import import import_kserve

    import_kserve()
    import grpc
    from kserve.inference_client import InferenceGRPCClient
    from kserve.protocol.infer_type import InferInput, InferRequest

    from sweep.serving.protocol import parameters_for_grpc

    inputs = [InferInput(t["name"], list(t["shape"]), t["datatype"], list(t["data"])) for t in body.get("inputs", [])]
    request = InferRequest(name or server.name, inputs,
                           parameters=parameters_for_grpc(body.get("parameters", {})) or None)

    async def call() -> Any:
        async with InferenceGRPCClient(server.grpc_address, timeout=60) as client:
            return await client.infer(request, headers=list((metadata or {}).items()) or None)

    try:
        return asyncio.run(call()).to_rest()[0]
    except grpc.RpcError as e:
        return e.code().name, e.details()
