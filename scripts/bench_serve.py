"""Requests/s and p50/p99 latency of the model server with batching on vs off, in one run.

    python scripts/bench_serve.py                      # tiny classifier + tiny GPT-2, on CPU
    python scripts/bench_serve.py --device cuda        # the same on a GPU

For each model (a tiny RoBERTa RTE classifier: one text per request; a tiny GPT-2: one prompt,
16 new greedy tokens per request) and each of batching=true / batching=false, a real server
process is started and a closed loop of C concurrent clients sends requests over HTTP (C=1: a
lone client, where batching can only add its wait; C=64: a busy server). The clients run in this
process, on the same machine: on a 2-core box they take CPU from the server, in both modes alike.
Writes bench_results/serve.json and prints a table with the on/off ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
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

from sweep.serving.tiny import export_tiny_classifier, export_tiny_lm  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model_dir: Path, batching: bool, args: argparse.Namespace, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    command = [
        sys.executable, "-m", "sweep.serve", f"model={model_dir}", f"port={port}", f"batching={str(batching).lower()}",
        f"device={args.device}", f"threads={args.threads}", "log_requests=false",
    ]
    if args.max_latency_ms is not None:
        command.append(f"max_latency_ms={args.max_latency_ms}")
    with log.open("wb") as sink:
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"server not ready: {log.read_text()[-2000:]}")


def request_body(kind: str, i: int, max_new_tokens: int) -> dict[str, Any]:
    text = {"name": "text", "shape": [1], "datatype": "BYTES"}
    if kind == "classifier":
        return {"inputs": [{**text, "data": [f"the {i} old painters see {i % 13} quiet rivers near the village"]}]}
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
            "p99_ms": round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 1),
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
    clients = [httpx.AsyncClient(base_url=url, timeout=300, limits=httpx.Limits(max_connections=1)) for _ in range(concurrency)]
    try:
        # warm-up: every client's connection, and the server's lazy initialisation
        await asyncio.gather(*(client.post(path, json=request_body(kind, i, max_new_tokens)) for i, client in enumerate(clients)))

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--classifier-requests", type=int, default=1600, help="per run at the highest concurrency")
    parser.add_argument("--lm-requests", type=int, default=600, help="per run at the highest concurrency")
    parser.add_argument("--repeats", type=int, default=3, help="runs per mode, on and off alternating")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="the server's torch threads (same in both modes)")
    parser.add_argument("--max-latency-ms", type=float, default=None, help="the server's max_latency_ms (default: its own)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench_results" / "serve.json")
    args = parser.parse_args()

    rows: list[dict[str, Any]] = []
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        models = {
            "classifier": export_tiny_classifier(root / "best" / "RTE", root / "cache"),
            "lm": export_tiny_lm(root / "best" / "wikitext-2", root / "cache"),
        }
        totals = {"classifier": args.classifier_requests, "lm": args.lm_requests}
        try:
            # Every server runs throughout (an idle one costs nothing) so that on and off can
            # alternate: a machine whose load drifts then drifts under both alike.
            urls: dict[tuple[str, bool], str] = {}
            for kind, model_dir in models.items():
                for batching in (True, False):
                    proc, urls[kind, batching] = start_server(model_dir, batching, args, root / f"{kind}-{batching}.log")
                    procs.append(proc)
            for kind in models:
                for concurrency in args.concurrency:
                    total = max(concurrency * 4, totals[kind] // (8 if concurrency == 1 else 1))
                    samples = {True: Samples(), False: Samples()}
                    for repeat in range(args.repeats):
                        for batching in ((True, False) if repeat % 2 == 0 else (False, True)):
                            asyncio.run(closed_loop(urls[kind, batching], kind, concurrency, total, args.max_new_tokens, samples[batching]))
                    for batching in (True, False):
                        row = {"model": kind, "batching": batching, "concurrency": concurrency, **samples[batching].summary()}
                        rows.append(row)
                        print(f"  {kind:<10} batching={'on ' if batching else 'off'} C={concurrency:<3} {row}", flush=True)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(timeout=30)

    ratios = []
    for row in rows:
        if row["batching"]:
            off = next(r for r in rows if not r["batching"] and r["model"] == row["model"] and r["concurrency"] == row["concurrency"])
            ratios.append({
                "model": row["model"], "concurrency": row["concurrency"],
                "requests_per_s_on_over_off": round(row["requests_per_s"] / off["requests_per_s"], 2),
                "p50_on_over_off": round(row["p50_ms"] / off["p50_ms"], 2),
                "p99_on_over_off": round(row["p99_ms"] / off["p99_ms"], 2),
            })
    report = {
        "device": args.device,
        "cpus": os.cpu_count(),
        "load_average_at_end": os.getloadavg(),
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "server": f"python -m sweep.serve threads={args.threads} log_requests=false" + (f" max_latency_ms={args.max_latency_ms:g}" if args.max_latency_ms is not None else ""),
        "rows": rows,
        "ratios": ratios,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))

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
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
