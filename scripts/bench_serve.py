"""The model server on CPU in one run: batching on vs off, REST vs gRPC, streamed completions.

    python scripts/bench_serve.py                      # all parts: tiny classifier + tiny GPT-2, on CPU
    python scripts/bench_serve.py --parts grpc stream  # only some parts
    python scripts/bench_serve.py --device cuda        # the same on a GPU

Every server needed is started first (a real ``python -m sweep serve`` process each, REST and gRPC
on free ports) and runs throughout; the clients run in this process, on the same machine: on a
2-core box they take CPU from the server, in every mode alike. What is compared is always
measured in alternation (A then B, then B then A, ... per repeat) so that load drift hits both.

``batching``: for each model (a tiny RoBERTa RTE classifier: one sentence pair per request; a tiny GPT-2:
one prompt, 16 new greedy tokens per request) and each of batching=true / batching=false, a closed
loop of C concurrent clients sends v2 requests over HTTP (C=1: a lone client, where batching can
only add its wait; C=64: a busy server). Req/s, p50, p99, mean batch size, on/off ratios.

``grpc``: the classifier server (batching on) answering the same v2 requests over REST
(``POST /v2/models/NAME/infer``, httpx) and over gRPC (``ModelInfer``), by the same closed loop: C
clients, each with its own connection (REST: an ``httpx.AsyncClient`` of one connection; gRPC: a
``grpc.aio`` channel of its own with ``grpc.use_local_subchannel_pool``, since gRPC channels to the
same address otherwise share one TCP connection from gRPC's global subchannel pool), each opened and
used once before the clock starts. gRPC calls go through KServe's generated stub
(``kserve.protocol.grpc.grpc_predict_v2_pb2_grpc.GRPCInferenceServiceStub``) with a
``ModelInferRequest`` built per call, not KServe's ``InferenceGRPCClient``: that one converts an
``InferRequest`` to protobuf and the answer back to an ``InferResponse`` on every call, Python work
the REST client (JSON in, JSON out) does not do, and which on this box would be taken from the
server. Req/s, p50, p99, errors at 1 and 64 clients, and the gRPC/REST ratios.

``continuous``: tiny GPT-2 servers with generation=continuous (every request in one running batch),
generation=batched (the micro-batcher) and generation=continuous unstreamed=batched ("hybrid": streams in
the batch, unstreamed requests by whole-batch generates), alternating, each asked by C = 1, 4, 16, 64
closed-loop clients streamed and not (as in ``stream``), then by a Poisson arrival of streamed requests
(``--poisson-rate``): streamed tokens/s, TTFT p50/p99, per-output-token latency p50 (per stream:
(last text - first text) / (tokens - 1)), unstreamed tokens/s; and the issue's goals, computed.

``stream``: the tiny GPT-2 server (batching on, generation=batched), ``POST /openai/v1/completions`` with greedy
decoding (``temperature: 0``) and ``max_tokens`` (``--stream-tokens``, 64), by C=1 and C=16
closed-loop clients (one httpx connection each), streamed (``stream: true``, Server-Sent Events read
line by line with httpx streaming) and, alternating with it, the same requests not streamed. Per
streamed request: time to first token (TTFT: request sent -> first chunk whose
``choices[0].text`` is not empty), and tokens/s of the stream (completion tokens / (time of the
last chunk with a choice - time of the first text chunk)); per run: the aggregate tokens/s (all
completion tokens / wall time). Completion tokens come from the ``usage`` the server sends in a
last chunk when asked (``stream_options: {include_usage: true}``), else from counting text chunks
(which is not the same: the server holds back text a later token may change), and the JSON says
which (``completion_tokens_from``). Not streamed: the full latency, p50 and p99. Their ratio
(TTFT p50 streamed / latency p50 not streamed) is what streaming buys a client waiting for text.
The server runs each stream alone on its forward thread (no batching of streams), while
non-streamed requests share forward passes, so with 16 clients streams wait for each other.

Writes bench_results/serve.json (``rows``/``ratios`` for batching, ``grpc``, ``stream``) and
prints a table per part.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sweep.testing.local_cluster import free_port  # noqa: E402
from sweep.testing.services import wait_until_serving  # noqa: E402
from sweep.train.tiny_exports import export_tiny_classifier, export_tiny_lm  # noqa: E402

GRPC_REQUESTS = 800  # per run at 64 clients (the grpc part; 1 client: an eighth)
STREAM_REQUESTS = 32  # per run at the highest concurrency (the stream part; 1 client: a third)


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str  # REST base URL
    grpc_address: str  # HOST:PORT of its gRPC port
    log: Path


_ports_given: set[int] = set()


def _new_port() -> int:
    """A free port none of this run's servers was given (they start side by side, gRPC never on the default 8081)."""
    port = free_port()
    while port in _ports_given:
        port = free_port()
    _ports_given.add(port)
    return port


def start_server(model_dir: Path, batching: bool, args: argparse.Namespace, log: Path,
                 generation: str = "batched", *extra: str) -> Server:
    """Launches a server; ``wait_ready`` waits for it (so that several start at once)."""
    port, grpc_port = _new_port(), _new_port()
    command = [
        sys.executable, "-m", "sweep", "serve", f"model={model_dir}", f"port={port}", f"grpc_port={grpc_port}",
        f"batching={str(batching).lower()}", f"device={args.device}", f"threads={args.threads}", "log_requests=false",
        f"generation={generation}", *extra,
    ]
    if args.max_latency_ms is not None:
        command.append(f"max_latency_ms={args.max_latency_ms}")
    with log.open("wb") as sink:
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return Server(proc, f"http://127.0.0.1:{port}", f"127.0.0.1:{grpc_port}", log)


def wait_ready(server: Server, timeout_s: float = 180) -> None:
    wait_until_serving(server.url, server.proc, server.log, timeout_s)


def request_body(kind: str, i: int, max_new_tokens: int) -> dict[str, Any]:
    text = {"name": "text", "shape": [1], "datatype": "BYTES"}
    if kind == "classifier":  # RTE: a pair task, whose model refuses a sentence without its text_pair
        return {"inputs": [{**text, "data": [f"the {i} old painters see {i % 13} quiet rivers near the village"]},
                           {**text, "name": "text_pair", "data": [f"{i % 13} rivers are quiet"]}]}
    return {"inputs": [{**text, "data": [f"story {i}: the teacher"]}], "parameters": {"max_new_tokens": max_new_tokens}}


@dataclass
class Samples:
    """What the clients saw in one or more runs against one server."""

    latencies_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    errors: int = 0
    batch_sizes: list[int] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        ordered = sorted(self.latencies_s)
        return {
            "requests": len(ordered),
            "errors": self.errors,
            "wall_s": round(self.wall_s, 3),
            "requests_per_s": round(len(ordered) / self.wall_s, 1),
            "p50_ms": round(1000 * statistics.median(ordered), 1),
            "p99_ms": round(1000 * percentile(ordered, 0.99), 1),
            "mean_batch_size": round(statistics.fmean(self.batch_sizes), 2) if self.batch_sizes else None,
        }


async def closed_loop(url: str, kind: str, concurrency: int, total: int, max_new_tokens: int, into: Samples) -> None:
    """``concurrency`` clients, each on its own connection, sending its next request when the last is answered.

    One HTTP client per simulated user, not one shared pool: measured with httpx's trace events, a
    pool shared by 64 coroutines held some requests 2-3 s before sending them (the p99 first
    reported for batching came from there, not from the server). Every connection is opened and
    used once before the clock starts.
    """
    next_index = iter(range(total))
    async with httpx.AsyncClient(base_url=url, timeout=300) as probe:
        name = (await probe.get("/v1/models")).json()["models"][0]
    path = f"/v2/models/{name}/infer"
    clients = [httpx.AsyncClient(base_url=url, timeout=300, limits=httpx.Limits(max_connections=1))
               for _ in range(concurrency)]
    try:
        # warm-up: every client's connection, and the server's lazy initialisation
        await asyncio.gather(*(client.post(path, json=request_body(kind, i, max_new_tokens))
                               for i, client in enumerate(clients)))

        async def client_loop(client: httpx.AsyncClient) -> None:
            for i in next_index:
                start = time.perf_counter()
                response = await client.post(path, json=request_body(kind, i, max_new_tokens))
                into.latencies_s.append(time.perf_counter() - start)
                if response.status_code != 200:
                    into.errors += 1
                else:
                    into.batch_sizes.append(response.json()["parameters"]["batch_size"])

        started = time.perf_counter()
        await asyncio.gather(*(client_loop(client) for client in clients))
        into.wall_s += time.perf_counter() - started
    finally:
        await asyncio.gather(*(client.aclose() for client in clients))


def percentile(ordered: list[float], q: float) -> float:
    """The q-th quantile of sorted values, as the batching rows have always taken it (nearest rank below)."""
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- REST vs gRPC ---------------------------------------------------------------------------------


def grpc_request(name: str, body: dict[str, Any]) -> Any:
    """A classifier's v2 REST body as the gRPC ``ModelInferRequest`` that carries the same texts."""
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb

    tensors = [
        pb.ModelInferRequest.InferInputTensor(
            name=t["name"], datatype=t["datatype"], shape=t["shape"],
            contents=pb.InferTensorContents(bytes_contents=[str(x).encode() for x in t["data"]]),
        )
        for t in body["inputs"]
    ]
    return pb.ModelInferRequest(model_name=name, inputs=tensors)


async def grpc_closed_loop(server: Server, concurrency: int, total: int, into: Samples) -> None:
    """``closed_loop`` for the classifier over gRPC: one ``grpc.aio`` channel (one TCP connection) per client."""
    import grpc
    from kserve.protocol.grpc.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub

    next_index = iter(range(total))
    async with httpx.AsyncClient(base_url=server.url, timeout=300) as probe:
        name = (await probe.get("/v1/models")).json()["models"][0]
    # gRPC core shares a connection between channels with the same target and arguments (its global
    # subchannel pool): a local pool per channel gives each client its own, as httpx does for REST.
    channels = [grpc.aio.insecure_channel(server.grpc_address, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(concurrency)]
    stubs = [GRPCInferenceServiceStub(channel) for channel in channels]
    try:
        # warm-up: every channel's connection (waiting for the gRPC port if it is not up yet), the server's lazy init
        await asyncio.gather(*(stub.ModelInfer(grpc_request(name, request_body("classifier", i, 0)), timeout=300,
                                               wait_for_ready=True)
                               for i, stub in enumerate(stubs)))

        async def client_loop(stub: Any) -> None:
            for i in next_index:
                start = time.perf_counter()
                try:
                    response = await stub.ModelInfer(grpc_request(name, request_body("classifier", i, 0)), timeout=300)
                except grpc.aio.AioRpcError:
                    into.latencies_s.append(time.perf_counter() - start)
                    into.errors += 1
                    continue
                into.latencies_s.append(time.perf_counter() - start)
                batch_size = response.parameters.get("batch_size")
                if batch_size is not None:
                    into.batch_sizes.append(batch_size.int64_param)

        started = time.perf_counter()
        await asyncio.gather(*(client_loop(stub) for stub in stubs))
        into.wall_s += time.perf_counter() - started
    finally:
        await asyncio.gather(*(channel.close() for channel in channels))


def run_grpc(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    from sweep.serving.kserve_import import import_kserve

    import_kserve()  # before kserve.protocol.*: kserve reads sys.argv when imported (--parts would reach it)
    rows: list[dict[str, Any]] = []
    for concurrency in args.concurrency:
        total = max(concurrency * 4, args.grpc_requests // (8 if concurrency == 1 else 1))
        samples = {"rest": Samples(), "grpc": Samples()}
        for repeat in range(args.repeats):
            for transport in (("rest", "grpc") if repeat % 2 == 0 else ("grpc", "rest")):
                if transport == "rest":
                    asyncio.run(closed_loop(server.url, "classifier", concurrency, total, 0, samples["rest"]))
                else:
                    asyncio.run(grpc_closed_loop(server, concurrency, total, samples["grpc"]))
        for transport in ("rest", "grpc"):
            row = {"transport": transport, "concurrency": concurrency, **samples[transport].summary()}
            rows.append(row)
            print(f"  classifier {transport:<4} C={concurrency:<3} {row}", flush=True)
    ratios = []
    for concurrency in args.concurrency:
        rest, grpc_ = (next(r for r in rows if r["transport"] == t and r["concurrency"] == concurrency)
                       for t in ("rest", "grpc"))
        ratios.append({
            "concurrency": concurrency,
            "requests_per_s_grpc_over_rest": round(grpc_["requests_per_s"] / rest["requests_per_s"], 2),
            "p50_grpc_over_rest": round(grpc_["p50_ms"] / rest["p50_ms"], 2),
            "p99_grpc_over_rest": round(grpc_["p99_ms"] / rest["p99_ms"], 2),
        })
    print()
    print("| transport | clients | req/s | p50 ms | p99 ms | mean batch | errors |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['transport']} | {r['concurrency']} | {r['requests_per_s']} | {r['p50_ms']} | {r['p99_ms']} | "
              f"{r['mean_batch_size']} | {r['errors']} |")
    for q in ratios:
        print(f"classifier, {q['concurrency']} client(s): gRPC/REST req/s {q['requests_per_s_grpc_over_rest']}x, "
              f"p50 {q['p50_grpc_over_rest']}x, p99 {q['p99_grpc_over_rest']}x")
    print(flush=True)
    return {
        "model": "classifier",
        "server": "batching=true",
        "grpc_client": "grpc.aio, one channel per client (grpc.use_local_subchannel_pool=1), KServe's generated "
                       "GRPCInferenceServiceStub.ModelInfer, a ModelInferRequest built per call",
        "rest_client": "httpx.AsyncClient per client, max_connections=1, POST /v2/models/NAME/infer",
        "requests_at_highest_concurrency": args.grpc_requests,
        "rows": rows,
        "ratios": ratios,
    }


# -- streamed completions ---------------------------------------------------------------------------


@dataclass
class StreamSamples:
    """What the clients saw of OpenAI completions, streamed or not, in one or more runs."""

    latencies_s: list[float] = field(default_factory=list)  # request sent -> last chunk (streamed) / response read
    ttft_s: list[float] = field(default_factory=list)  # streamed: request sent -> first chunk with text
    stream_tokens_per_s: list[float] = field(default_factory=list)  # streamed: per request
    per_token_s: list[float] = field(default_factory=list)  # streamed: (last - first text) / (tokens - 1)
    completion_tokens: int = 0
    wall_s: float = 0.0
    errors: int = 0
    tokens_from: dict[str, int] = field(default_factory=lambda: {"usage": 0, "chunks": 0})

    def summary(self, streamed: bool) -> dict[str, Any]:
        def ms(values: list[float], q: float) -> float | None:
            return round(1000 * percentile(sorted(values), q), 1) if values else None

        done = len(self.latencies_s)
        out: dict[str, Any] = {
            "requests": done,
            "errors": self.errors,
            "wall_s": round(self.wall_s, 3),
            "requests_per_s": round(done / self.wall_s, 2) if self.wall_s else None,
            "completion_tokens": self.completion_tokens,
            "aggregate_tokens_per_s": round(self.completion_tokens / self.wall_s, 1) if self.wall_s else None,
            "latency_p50_ms": ms(self.latencies_s, 0.5),
            "latency_p99_ms": ms(self.latencies_s, 0.99),
        }
        if streamed:
            rates = sorted(self.stream_tokens_per_s)
            out.update({
                "ttft_p50_ms": ms(self.ttft_s, 0.5),
                "ttft_p99_ms": ms(self.ttft_s, 0.99),
                "stream_tokens_per_s_p50": round(statistics.median(rates), 1) if rates else None,
                "stream_tokens_per_s_mean": round(statistics.fmean(rates), 1) if rates else None,
                "per_output_token_p50_ms": ms(self.per_token_s, 0.5),
                "per_output_token_p99_ms": ms(self.per_token_s, 0.99),
                "completion_tokens_from": {k: v for k, v in self.tokens_from.items() if v},
            })
        return out


async def stream_closed_loop(url: str, concurrency: int, total: int, max_tokens: int, stream: bool,
                             into: StreamSamples, arrivals_per_s: float | None = None) -> None:
    """``concurrency`` clients (one connection each) sending OpenAI completions, streamed or not.

    ``arrivals_per_s``: an open loop instead: ``total`` requests arriving as a Poisson process of that
    rate (seeded: the same arrival times in every run), each on the next of the ``concurrency`` connections.
    """
    next_index = iter(range(total))
    async with httpx.AsyncClient(base_url=url, timeout=300) as probe:
        name = (await probe.get("/v1/models")).json()["models"][0]
    path = "/openai/v1/completions"

    def body(i: int, record: bool) -> dict[str, Any]:
        request: dict[str, Any] = {"model": name, "prompt": f"story {i}: the teacher",
                                   "max_tokens": max_tokens if record else 2, "temperature": 0, "stream": stream}
        if stream:
            request["stream_options"] = {"include_usage": True}
        return request

    async def one(client: httpx.AsyncClient, i: int, record: bool) -> None:
        start = time.perf_counter()
        if not stream:
            response = await client.post(path, json=body(i, record))
            elapsed = time.perf_counter() - start
            if not record:
                return
            if response.status_code != 200:
                into.errors += 1
                return
            into.latencies_s.append(elapsed)
            into.completion_tokens += response.json()["usage"]["completion_tokens"]
            return
        first = last = None
        chunks, usage_tokens, done, failed = 0, None, False, False
        async with client.stream("POST", path, json=body(i, record)) as response:
            if response.status_code != 200:
                await response.aread()
                failed = True
            else:
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[len("data:"):].strip()
                    if data == "[DONE]":
                        done = True
                        continue  # read on to the end of the stream: the connection stays reusable
                    now = time.perf_counter()
                    chunk = json.loads(data)
                    if "error" in chunk:
                        failed = True
                        continue
                    if chunk.get("usage"):
                        usage_tokens = chunk["usage"]["completion_tokens"]
                    for choice in chunk.get("choices") or []:
                        last = now
                        if choice.get("text"):
                            chunks += 1
                            if first is None:
                                first = now
        if not record:
            return
        if failed or not done or first is None or last is None:
            into.errors += 1
            return
        tokens = usage_tokens if usage_tokens is not None else chunks
        into.tokens_from["usage" if usage_tokens is not None else "chunks"] += 1
        into.completion_tokens += tokens
        into.ttft_s.append(first - start)
        into.latencies_s.append(last - start)
        if last > first:
            into.stream_tokens_per_s.append(tokens / (last - first))
            if tokens > 1:
                into.per_token_s.append((last - first) / (tokens - 1))

    clients = [httpx.AsyncClient(base_url=url, timeout=300, limits=httpx.Limits(max_connections=1))
               for _ in range(concurrency)]
    try:
        # warm-up: every client's connection and the server's path, with 2-token completions (not timed)
        await asyncio.gather(*(one(client, i, record=False) for i, client in enumerate(clients)))

        async def client_loop(client: httpx.AsyncClient) -> None:
            for i in next_index:
                await one(client, i, record=True)

        async def arrival(client: httpx.AsyncClient, i: int, at: float) -> None:
            await asyncio.sleep(at)
            await one(client, i, record=True)

        started = time.perf_counter()
        if arrivals_per_s is None:
            await asyncio.gather(*(client_loop(client) for client in clients))
        else:
            rng, at, arrivals = random.Random(0), 0.0, []
            for i in range(total):
                at += rng.expovariate(arrivals_per_s)
                arrivals.append(arrival(clients[i % concurrency], i, at))
            await asyncio.gather(*arrivals)
        into.wall_s += time.perf_counter() - started
    finally:
        await asyncio.gather(*(client.aclose() for client in clients))


def run_stream(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for concurrency in args.stream_concurrency:
        total = max(concurrency * 2, args.stream_requests // (3 if concurrency == 1 else 1))
        samples = {True: StreamSamples(), False: StreamSamples()}
        for repeat in range(args.repeats):
            for stream in ((True, False) if repeat % 2 == 0 else (False, True)):
                asyncio.run(stream_closed_loop(server.url, concurrency, total, args.stream_tokens, stream,
                                               samples[stream]))
        streamed, whole = samples[True].summary(streamed=True), samples[False].summary(streamed=False)
        row = {
            "concurrency": concurrency,
            "streamed": streamed,
            "not_streamed": whole,
            "ttft_p50_streamed_over_latency_p50_not_streamed": (
                round(streamed["ttft_p50_ms"] / whole["latency_p50_ms"], 3)
                if streamed["ttft_p50_ms"] and whole["latency_p50_ms"] else None),
            "aggregate_tokens_per_s_streamed_over_not_streamed": (
                round(streamed["aggregate_tokens_per_s"] / whole["aggregate_tokens_per_s"], 2)
                if streamed["aggregate_tokens_per_s"] and whole["aggregate_tokens_per_s"] else None),
        }
        rows.append(row)
        print(f"  lm stream C={concurrency:<3} {row}", flush=True)
    print()
    print("| clients | mode | requests | TTFT p50 ms | TTFT p99 ms | stream tok/s p50 | aggregate tok/s | "
          "latency p50 ms | latency p99 ms | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        for mode, m in (("streamed", r["streamed"]), ("not streamed", r["not_streamed"])):
            print(f"| {r['concurrency']} | {mode} | {m['requests']} | {m.get('ttft_p50_ms', '-')} | "
                  f"{m.get('ttft_p99_ms', '-')} | {m.get('stream_tokens_per_s_p50', '-')} | "
                  f"{m['aggregate_tokens_per_s']} | {m['latency_p50_ms']} | {m['latency_p99_ms']} | {m['errors']} |")
    for r in rows:
        print(f"lm, {r['concurrency']} client(s): TTFT p50 streamed / latency p50 not streamed "
              f"{r['ttft_p50_streamed_over_latency_p50_not_streamed']}x, aggregate tok/s streamed / not streamed "
              f"{r['aggregate_tokens_per_s_streamed_over_not_streamed']}x")
    print(flush=True)
    return {
        "model": "lm",
        "server": "batching=true",
        "endpoint": "POST /openai/v1/completions",
        "max_tokens": args.stream_tokens,
        "temperature": 0,
        "requests_at_highest_concurrency": args.stream_requests,
        "ttft": "request sent -> first chunk whose choices[0].text is not empty",
        "stream_tokens_per_s": "completion tokens / (last chunk with a choice - first chunk with text), per request",
        "completion_tokens_from": "usage of the stream's last chunk (stream_options.include_usage) when sent, "
                                  "else the number of chunks with text; per-row counts under "
                                  "streamed.completion_tokens_from",
        "rows": rows,
    }


# -- continuous batching on vs off ---------------------------------------------------------------------

# continuous: every request in the batch; batched: the micro-batcher; hybrid: streams in the batch,
# unstreamed requests by the micro-batcher's whole-batch generate (generation=continuous unstreamed=batched).
GENERATIONS = ("continuous", "batched", "hybrid")


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def run_continuous(servers: dict[str, Server], args: argparse.Namespace) -> dict[str, Any]:
    """generation=continuous vs generation=batched (the micro-batcher), alternating, streamed and not."""
    rows: list[dict[str, Any]] = []
    for concurrency in args.continuous_concurrency:
        total = max(concurrency * 2, args.stream_requests // (3 if concurrency == 1 else 1))
        samples = {(g, stream): StreamSamples() for g in GENERATIONS for stream in (True, False)}
        order = [(g, stream) for stream in (True, False) for g in GENERATIONS]
        for repeat in range(args.repeats):
            for generation, stream in (order if repeat % 2 == 0 else order[::-1]):
                asyncio.run(stream_closed_loop(servers[generation].url, concurrency, total, args.stream_tokens,
                                               stream, samples[generation, stream]))
        row: dict[str, Any] = {"concurrency": concurrency}
        for generation in GENERATIONS:
            row[generation] = {"streamed": samples[generation, True].summary(streamed=True),
                               "not_streamed": samples[generation, False].summary(streamed=False)}
            print(f"  lm {generation:<10} C={concurrency:<3} {row[generation]}", flush=True)
        rows.append(row)
    poisson: dict[str, Any] = {"arrivals_per_s": args.poisson_rate, "requests": args.poisson_requests}
    samples = {g: StreamSamples() for g in GENERATIONS}
    for repeat in range(args.repeats):
        for generation in (GENERATIONS if repeat % 2 == 0 else GENERATIONS[::-1]):
            asyncio.run(stream_closed_loop(servers[generation].url, args.poisson_requests, args.poisson_requests,
                                           args.stream_tokens, True, samples[generation], args.poisson_rate))
    for generation in GENERATIONS:
        poisson[generation] = samples[generation].summary(streamed=True)
        print(f"  lm poisson {generation:<10} {poisson[generation]}", flush=True)

    def at(concurrency: int, generation: str, mode: str, key: str) -> Any:
        row = next((r for r in rows if r["concurrency"] == concurrency), None)
        return row[generation][mode][key] if row else None

    goals = {
        "streamed_tokens_per_s_16_over_1 (>= 6)": _ratio(at(16, "continuous", "streamed", "aggregate_tokens_per_s"),
                                                        at(1, "continuous", "streamed", "aggregate_tokens_per_s")),
        "ttft_p50_ms_at_16 (<= 150)": at(16, "continuous", "streamed", "ttft_p50_ms"),
        "streamed_over_not_streamed_tokens_per_s_at_16 (>= 0.8)": _ratio(
            at(16, "continuous", "streamed", "aggregate_tokens_per_s"),
            at(16, "continuous", "not_streamed", "aggregate_tokens_per_s")),
        "not_streamed_tokens_per_s_continuous_over_batched (>= 1)": {
            r["concurrency"]: _ratio(r["continuous"]["not_streamed"]["aggregate_tokens_per_s"],
                                     r["batched"]["not_streamed"]["aggregate_tokens_per_s"]) for r in rows},
        "streamed_tokens_per_s_continuous_over_batched": {
            r["concurrency"]: _ratio(r["continuous"]["streamed"]["aggregate_tokens_per_s"],
                                     r["batched"]["streamed"]["aggregate_tokens_per_s"]) for r in rows},
        "hybrid: not_streamed_tokens_per_s_over_batched": {
            r["concurrency"]: _ratio(r["hybrid"]["not_streamed"]["aggregate_tokens_per_s"],
                                     r["batched"]["not_streamed"]["aggregate_tokens_per_s"]) for r in rows},
        "hybrid: streamed_tokens_per_s_16_over_1": _ratio(at(16, "hybrid", "streamed", "aggregate_tokens_per_s"),
                                                          at(1, "hybrid", "streamed", "aggregate_tokens_per_s")),
        "hybrid: ttft_p50_ms_at_16": at(16, "hybrid", "streamed", "ttft_p50_ms"),
        "hybrid: streamed_over_not_streamed_tokens_per_s_at_16": _ratio(
            at(16, "hybrid", "streamed", "aggregate_tokens_per_s"),
            at(16, "hybrid", "not_streamed", "aggregate_tokens_per_s")),
    }
    print()
    print("| clients | generation | streamed tok/s | TTFT p50 ms | TTFT p99 ms | per-token p50 ms | "
          "not streamed tok/s | not streamed p50 ms | errors |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        for generation in GENERATIONS:
            st, ns = r[generation]["streamed"], r[generation]["not_streamed"]
            print(f"| {r['concurrency']} | {generation} | {st['aggregate_tokens_per_s']} | {st['ttft_p50_ms']} | "
                  f"{st['ttft_p99_ms']} | {st['per_output_token_p50_ms']} | {ns['aggregate_tokens_per_s']} | "
                  f"{ns['latency_p50_ms']} | {st['errors'] + ns['errors']} |")
    for generation in GENERATIONS:
        p = poisson[generation]
        print(f"| Poisson {args.poisson_rate:g}/s | {generation} | {p['aggregate_tokens_per_s']} | "
              f"{p['ttft_p50_ms']} | {p['ttft_p99_ms']} | {p['per_output_token_p50_ms']} | - | - | {p['errors']} |")
    print()
    for goal, value in goals.items():
        print(f"{goal}: {value}")
    print(flush=True)
    return {"model": "lm", "endpoint": "POST /openai/v1/completions", "max_tokens": args.stream_tokens,
            "temperature": 0, "servers": {"continuous": "generation=continuous",
                                          "batched": "generation=batched batching=true",
                                          "hybrid": "generation=continuous unstreamed=batched"},
            "rows": rows, "poisson": poisson, "goals": goals}


# -- batching on vs off -------------------------------------------------------------------------------


def run_batching(urls: dict[tuple[str, bool], str],
                 args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    totals = {"classifier": args.classifier_requests, "lm": args.lm_requests}
    rows: list[dict[str, Any]] = []
    for kind in ("classifier", "lm"):
        for concurrency in args.concurrency:
            total = max(concurrency * 4, totals[kind] // (8 if concurrency == 1 else 1))
            samples = {True: Samples(), False: Samples()}
            for repeat in range(args.repeats):
                for batching in ((True, False) if repeat % 2 == 0 else (False, True)):
                    asyncio.run(closed_loop(urls[kind, batching], kind, concurrency, total, args.max_new_tokens,
                                            samples[batching]))
            for batching in (True, False):
                row = {"model": kind, "batching": batching, "concurrency": concurrency, **samples[batching].summary()}
                rows.append(row)
                print(f"  {kind:<10} batching={'on ' if batching else 'off'} C={concurrency:<3} {row}", flush=True)
    ratios = []
    for row in rows:
        if row["batching"]:
            off = next(r for r in rows
                       if not r["batching"] and r["model"] == row["model"] and r["concurrency"] == row["concurrency"])
            ratios.append({
                "model": row["model"], "concurrency": row["concurrency"],
                "requests_per_s_on_over_off": round(row["requests_per_s"] / off["requests_per_s"], 2),
                "p50_on_over_off": round(row["p50_ms"] / off["p50_ms"], 2),
                "p99_on_over_off": round(row["p99_ms"] / off["p99_ms"], 2),
            })
    print()
    print("| model | clients | batching | req/s | p50 ms | p99 ms | mean batch | errors |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['concurrency']} | {'on' if r['batching'] else 'off'} | {r['requests_per_s']} | "
              f"{r['p50_ms']} | {r['p99_ms']} | {r['mean_batch_size']} | {r['errors']} |")
    print()
    for q in ratios:
        print(f"{q['model']}, {q['concurrency']} client(s): on/off req/s {q['requests_per_s_on_over_off']}x, "
              f"p50 {q['p50_on_over_off']}x, p99 {q['p99_on_over_off']}x")
    print(flush=True)
    return rows, ratios


PARTS = ("batching", "grpc", "stream", "continuous")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                        help="which parts to run (default: all)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64], help="clients (batching and grpc parts)")
    parser.add_argument("--classifier-requests", type=int, default=1600, help="per run at the highest concurrency")
    parser.add_argument("--lm-requests", type=int, default=600, help="per run at the highest concurrency")
    parser.add_argument("--repeats", type=int, default=3, help="runs per mode, the modes alternating")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--grpc-requests", type=int, default=GRPC_REQUESTS,
                        help="grpc part: requests per run at 64 clients (1 client: an eighth)")
    parser.add_argument("--stream-concurrency", type=int, nargs="+", default=[1, 16], help="stream part: clients")
    parser.add_argument("--stream-requests", type=int, default=STREAM_REQUESTS,
                        help="stream part: requests per run at the highest concurrency (1 client: a third)")
    parser.add_argument("--stream-tokens", type=int, default=64, help="stream part: max_tokens of each completion")
    parser.add_argument("--continuous-concurrency", type=int, nargs="+", default=[1, 4, 16, 64],
                        help="continuous part: clients")
    parser.add_argument("--poisson-rate", type=float, default=20.0,
                        help="continuous part: streamed requests arriving per second (Poisson)")
    parser.add_argument("--poisson-requests", type=int, default=64, help="continuous part: requests per Poisson run")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="the server's torch threads (same in every mode)")
    parser.add_argument("--max-latency-ms", type=float, default=None,
                        help="the server's max_latency_ms (default: its own)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench_results" / "serve.json")
    args = parser.parse_args()
    parts = [p for p in PARTS if p in args.parts]

    needed: list[tuple[str, bool]] = []  # (model, batching) of the servers to start
    if "batching" in parts:
        needed += [("classifier", True), ("classifier", False), ("lm", True), ("lm", False)]
    if "grpc" in parts and ("classifier", True) not in needed:
        needed.append(("classifier", True))
    if ("stream" in parts or "continuous" in parts) and ("lm", True) not in needed:
        needed.append(("lm", True))
    if "continuous" in parts:
        needed += [("lm", "continuous"), ("lm", "hybrid")]  # type: ignore[list-item]

    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    ratios: list[dict[str, Any]] = []
    grpc_report: dict[str, Any] | None = None
    stream_report: dict[str, Any] | None = None
    continuous_report: dict[str, Any] | None = None
    servers: dict[tuple[str, bool], Server] = {}
    part_wall_s: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        models: dict[str, Path] = {}
        if any(kind == "classifier" for kind, _ in needed):
            models["classifier"] = export_tiny_classifier(root / "best" / "RTE", root / "cache")
        if any(kind == "lm" for kind, _ in needed):
            models["lm"] = export_tiny_lm(root / "best" / "wikitext-2", root / "cache")
        try:
            # Every server runs throughout (an idle one costs nothing) so that the modes compared can
            # alternate: a machine whose load drifts then drifts under both alike.
            for kind, batching in needed:
                if batching in ("continuous", "hybrid"):
                    servers[kind, batching] = start_server(
                        models[kind], True, args, root / f"{kind}-{batching}.log", "continuous",
                        *(["unstreamed=batched"] if batching == "hybrid" else []))
                else:
                    servers[kind, batching] = start_server(models[kind], batching, args,
                                                           root / f"{kind}-{batching}.log")
            for server in servers.values():  # all started at once, not one after another: less waiting
                wait_ready(server)
            part_wall_s["servers_ready"] = round(time.perf_counter() - started, 1)
            for part in parts:
                part_started = time.perf_counter()
                if part == "batching":
                    print("== batching on vs off", flush=True)
                    rows, ratios = run_batching({key: server.url for key, server in servers.items()}, args)
                elif part == "grpc":
                    print("== REST vs gRPC (classifier, batching on)", flush=True)
                    grpc_report = run_grpc(servers["classifier", True], args)
                elif part == "stream":
                    print("== streamed completions (tiny GPT-2, batching on)", flush=True)
                    stream_report = run_stream(servers["lm", True], args)
                else:
                    print("== continuous batching vs the micro-batcher (tiny GPT-2)", flush=True)
                    continuous_report = run_continuous(
                        {"continuous": servers["lm", "continuous"], "batched": servers["lm", True],
                         "hybrid": servers["lm", "hybrid"]}, args)
                part_wall_s[part] = round(time.perf_counter() - part_started, 1)
        finally:
            for server in servers.values():
                server.proc.terminate()
            for server in servers.values():
                try:
                    server.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    server.proc.kill()
                    server.proc.wait()

    report: dict[str, Any] = {
        "device": args.device,
        "cpus": os.cpu_count(),
        "load_average_at_end": os.getloadavg(),
        "parts": parts,
        "wall_s": round(time.perf_counter() - started, 1),
        "part_wall_s": part_wall_s,
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "server": (f"python -m sweep serve threads={args.threads} log_requests=false"
                   + (f" max_latency_ms={args.max_latency_ms:g}" if args.max_latency_ms is not None else "")),
        "rows": rows,
        "ratios": ratios,
    }
    if grpc_report is not None:
        report["grpc"] = grpc_report
    if stream_report is not None:
        report["stream"] = stream_report
    if continuous_report is not None:
        report["continuous"] = continuous_report
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out} ({report['wall_s']} s: {part_wall_s})")


if __name__ == "__main__":
    main()
