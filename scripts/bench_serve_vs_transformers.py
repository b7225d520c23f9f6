"""The model server against ``transformers serve --continuous-batching``, on CPU, side by side in one run.

    python scripts/bench_serve_vs_transformers.py            # the full table: 2 models x quiet/busy x 1-64 clients
    python scripts/bench_serve_vs_transformers.py --quick    # a smoke run (~2 min): tiny model, 1 and 16 clients
    python scripts/bench_serve_vs_transformers.py --servers sweep transformers --load quiet --clients 1 16
    python scripts/bench_serve_vs_transformers.py --judge run1.json run2.json   # the goals over runs' repeats

Models: two GPT-2s built offline by ``sweep.models.tiny.build_tiny_model`` (random weights, a BPE
tokenizer of ~2000 tokens, 256 positions): ``tiny`` (conf/model/tiny-gpt2.yaml: 2 layers of 32) and
``6x384`` (6 layers of 384, 6 heads). They are built once into ``<out dir>/serve_vs_transformers/models/``
and reused.

Servers, per model, all started at once on free ports of 127.0.0.1 and kept until the model's last cell
(each its own process group, logs in ``<out dir>/serve_vs_transformers/logs/``; stopped on exit, Ctrl-C
or error, children included):

- ``sweep``: ``python -m sweep serve model=DIR port=P grpc=false device=cpu log_requests=false``, its
  defaults otherwise (generation=continuous: every request in one running batch, decoded in a process of
  its own; its default threads, whatever ``python -m sweep serve --help`` says they are);
- ``sweep-threads=1`` / ``sweep-threads=2``: the same with ``threads=1`` / ``threads=2``;
- ``sweep-stream_interval_ms=0`` (only when ``--servers`` names it): a chunk per decoding step, as before
  streamed tokens were held (sweep/serving/held_outputs.py);
- ``transformers``: ``transformers serve DIR --continuous-batching --device cpu`` with its KV cache
  capped to sweep's: sweep's cache holds ``kv_cache_mb`` (its default) of tokens, never more than
  ``max_concurrent_sequences`` full contexts, in pages of 64 tokens (sweep/serving/decoding_engine.py
  ``cache_tokens``/``PAGE_SIZE``), so transformers gets ``--cb-block-size 64 --cb-num-blocks
  TOKENS/64``, and sweep's tokens per batch step (``--cb-max-batch-tokens``, sweep's
  ``max(256, min(context, 2048))``). The number of tokens sweep's server reports at start is checked
  against the computed one (JSON ``kv_cache``).

Each server is health-checked (sweep ``/v2/health/ready``, transformers ``/health``), asked its model
name (``GET .../v1/models``), then warmed up (a few full-length completions, streamed and not).

Clients: the ``openai`` client (``AsyncOpenAI``, ``completions.create``; sweep at ``/openai/v1``,
transformers at ``/v1``), ``max_tokens`` 64 (``--max-tokens``), ``temperature`` 0, prompts short
English sentences, each request's its own. C = 1, 4, 16, 64 concurrent closed-loop clients
(``--clients``): each client its own ``AsyncOpenAI`` over its own single connection (a pool shared
by many coroutines delays requests in the client, not the server), no retries (a failure counts as an
error); each client sends one 2-token request before the clock starts (its connection). A run is a
fixed number of requests (``--requests``, per model: at C >= 16; C = 4: half, C = 1: a quarter; never
fewer than 2 per client, so that a run is more than the burst of its first wave), streamed or not: a
run takes ~2-10 s on a 2-core box (one server, one repeat of one cell).

Columns of the table (one table per model and load):

- ``clients``, ``streamed?``: C, and whether the completions are streamed (``stream: true``);
- a column per server: ``tok/s · p50/p99``: the aggregate completion tokens per second (all completion
  tokens of the run / its wall time); streamed, then TTFT p50/p99 in ms (request sent -> first chunk whose
  text is not empty); not streamed, the latency p50/p99 in ms (request sent -> answer read). Completion
  tokens come from ``usage`` (streamed: asked by ``stream_options: {include_usage: true}``), else by
  counting the text's tokens with the model's tokenizer; the JSON says which (``tokens_from``);
- ``sweep/tf tok/s``, ``sweep/tf p99``: sweep (default threads) over transformers serve: tokens/s (> 1:
  sweep is faster), and TTFT p99 (streamed) or latency p99 (not streamed) (< 1: sweep answers sooner).

CPU (in the JSON and each run's line, not the table): each server's CPU time over a run per completion
token, in ms, for its own process (``server_cpu_ms_per_token``: the HTTP side) and for its children
(``children_cpu_ms_per_token``: the decoding process; both servers decode in a child), read with psutil
before and after the run. On a busy machine it says where the shared CPU went.

Fairness: every cell (model, load, C, streamed) is measured on all servers in alternation, their order
rotating per repeat (``--repeats``, 2), and each number is the median over the repeats. The clients
run in this process, on the same 2 cores as the servers, in every run alike. This process imports torch
and transformers (millions of objects): they are frozen out of its garbage collector before the cells
(``gc.freeze``), else a full collection here (~0.5 s) stalled whichever server was being measured; the
longest collection of each run is in the JSON (``client_gc_max_ms``) and its line.

Pods (``--pods``, root only): each server, the hog and the clients in a cgroup of its own with the same CPU
weight, as pods on one Kubernetes node. Without it every thread on the machine counts alike for the scheduler,
so a server whose decoding runs two threads gets a larger share of a busy CPU than one that runs one; in a pod,
its share is the pod's.

Load: ``quiet`` (nothing beside), ``busy`` (``--load``): a CPU hog beside the servers: a busy loop pinned
to one core (``os.sched_setaffinity``: the last usable CPU) that holds ``--hog-mb`` MiB (512, every page
written), started before the model's busy cells and killed after them (and it exits by itself after
``--hog-max-s`` or when this script is gone).

Greedy agreement: for ``--agreement-prompts`` prompts (8), each sweep server's non-streamed text
(temperature 0) is compared with transformers serve's, per model; "N/M matched" is printed and the
mismatches are in the JSON. A mismatch does not fail the run.

The full run takes ~30-40 min on a 2-core box (per model: 16 cells x 4 servers x 2 repeats, the busy half
slower). ``--quick``: the tiny model (unless ``--models``), C = 1 and 16, 1 repeat, 16 requests per run at
C = 16 (4 at C = 1), 4 agreement prompts: ~2 min, most of it the servers' start.

At the end, issue [22]'s goals in each cell at 1 and 16 clients (``goals`` in the JSON, and a line each):
sweep's tokens/s at least transformers serve's, its p99 at most 1.2x transformers', and the default threads
within 10% of the best ``threads=``, with the cells that miss them. A cell at parity misses or meets them by
the machine's noise from run to run; ``--judge`` starts nothing and judges the goals over several runs' JSONs:
each repeat's sweep/transformers ratios (its servers side by side in time), their median over all the runs'
repeats (runs on machines of other speeds pool ratios, not tokens/s).

Writes ``bench_results/serve_vs_transformers.json`` (``--out``): the settings, the servers' commands,
the KV cache sizes, the agreement, and per cell every server's median and per-repeat numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import gc
import itertools
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import httpx2
import openai

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.cpu_hog import hog_command, wait_until_ready  # noqa: E402
from sweep.models.tiny import build_tiny_model  # noqa: E402
from sweep.plan.cpus import CGROUP_ROOT, proc_cgroups  # noqa: E402
from sweep.serving.server import ServeOptions  # noqa: E402
from sweep.testing.local_cluster import free_port  # noqa: E402

VENV_BIN = Path(sys.executable).parent
SERVER_KINDS = ("sweep", "sweep-threads=1", "sweep-threads=2", "sweep-stream_interval_ms=0", "transformers")
DEFAULT_KINDS = ("sweep", "sweep-threads=1", "sweep-threads=2", "transformers")  # the table of issue [22]
COLUMNS = {"sweep": "sweep (defaults)", "sweep-threads=1": "sweep `threads=1`", "sweep-threads=2": "sweep `threads=2`",
           "sweep-stream_interval_ms=0": "sweep `stream_interval_ms=0`", "transformers": "transformers serve"}
LOADS = ("quiet", "busy")
SERVER_READY_TIMEOUT_S = 300.0
STOP_GRACE_S = 20.0


@dataclass(frozen=True)
class ModelSpec:
    """A GPT-2 built by ``build_tiny_model``, and how many requests a run sends it at C >= 16."""

    name: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    max_positions: int
    requests: int  # chosen so that a cell takes ~5-10 s on each server of a 2-core box

    @property
    def folder_name(self) -> str:  # the sizes in the name: a changed spec never reuses an old build
        return (f"gpt2-v{self.vocab_size}-h{self.hidden_size}-l{self.num_layers}-a{self.num_heads}"
                f"-p{self.max_positions}")


MODELS = {
    "tiny": ModelSpec("tiny", 2000, 32, 2, 2, 256, requests=128),  # conf/model/tiny-gpt2.yaml's builder
    "6x384": ModelSpec("6x384", 2000, 384, 6, 6, 256, requests=48),
}

WORDS = (  # lengths 7, 11, 13, 17, 19: pairwise coprime, so index i -> a sentence of its own for i < 323323
    ("the", "a", "every", "one", "our", "their", "that"),
    ("old", "quiet", "bright", "small", "famous", "strange", "happy", "distant", "green", "careful", "gentle"),
    ("teacher", "farmer", "painter", "doctor", "student", "child", "friend", "soldier", "driver", "writer",
     "baker", "sailor", "singer"),
    ("sees", "likes", "builds", "finds", "carries", "follows", "remembers", "paints", "opens", "watches",
     "visits", "describes", "protects", "repairs", "collects", "imagines", "crosses"),
    ("river", "house", "city", "garden", "market", "window", "forest", "letter", "bridge", "mountain",
     "village", "song", "machine", "island", "kitchen", "museum", "train", "library", "road"),
)


def prompt(i: int) -> str:
    """A short English sentence, different for every ``i``."""
    det, adj, noun, verb, obj = (words[i % len(words)] for words in WORDS)
    return f"{det.capitalize()} {adj} {noun} {verb} the {obj} and"


# -- processes: servers and the hog, never left behind --------------------------------------------------

_started: list[subprocess.Popen[bytes]] = []


class Pods:
    """``--pods``: each server, the hog and the clients (this process) in a cgroup of its own, all with the CPU
    controller's default weight, as pods on one node. On a busy CPU a process's share is then its pod's, however
    many threads it runs; without them every thread counts alike, and a server whose decoding runs more threads
    takes more of the CPU from its neighbours. Needs root and a writable cgroup CPU controller (v2, or v1's
    ``cpu``); the cgroups are removed at the end."""

    def __init__(self) -> None:
        unified = CGROUP_ROOT / "cgroup.controllers"
        if unified.is_file() and "cpu" in unified.read_text().split():
            self.mount, self.v2 = CGROUP_ROOT, True
        else:
            mount = next((m for m in (CGROUP_ROOT / "cpu", CGROUP_ROOT / "cpu,cpuacct") if m.is_dir()), None)
            if mount is None:
                raise SystemExit("--pods: no cgroup CPU controller under /sys/fs/cgroup")
            self.mount, self.v2 = mount, False
        self.home = self.mount / self._own_path().lstrip("/")  # where this process is now, to go back to
        self.parent = self.mount / f"bench-serve-{os.getpid()}"
        try:
            if self.v2:
                (self.mount / "cgroup.subtree_control").write_text("+cpu")
            self.parent.mkdir()
            if self.v2:
                (self.parent / "cgroup.subtree_control").write_text("+cpu")
        except OSError as e:
            raise SystemExit(f"--pods: cannot make cgroups under {self.mount} ({e}); run as root, or without "
                             "--pods") from None
        self.made: list[Path] = []

    def _own_path(self) -> str:
        for controllers, path in proc_cgroups(0).items():
            if (self.v2 and controllers == "") or (not self.v2 and "cpu" in controllers.split(",")):
                return path
        return "/"

    def procs(self, pod: str) -> Path:
        folder = self.parent / pod
        if not folder.is_dir():
            folder.mkdir()
            self.made.append(folder)
        return folder / "cgroup.procs"

    def join(self, pod: str) -> None:
        """This process (the clients) into ``pod``."""
        self.procs(pod).write_text(str(os.getpid()))

    def remove(self) -> None:
        home = self.home if (self.home / "cgroup.procs").is_file() else self.mount  # a container's own root
        (home / "cgroup.procs").write_text(str(os.getpid()))
        for folder in [*reversed(self.made), self.parent]:
            try:
                folder.rmdir()
            except OSError as e:  # a process still in it: left for the reader to see
                print(f"  --pods: could not remove {folder}: {e}", flush=True)


PODS: Pods | None = None  # set by --pods


def launch(command: list[str], log: Path, env: dict[str, str] | None = None,
           pod: str | None = None) -> subprocess.Popen[bytes]:
    """A process in a session of its own (so that its children can be stopped with it), output to ``log``;
    with ``--pods``, in cgroup ``pod`` from before its first instruction (its children follow it there)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    procs = PODS.procs(pod) if PODS is not None and pod is not None else None

    def enter_pod() -> None:  # in the child, before exec: "0" is the writing process itself
        if procs is not None:
            procs.write_text("0")

    with log.open("wb") as sink:
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
                                env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}, preexec_fn=enter_pod)
    _started.append(proc)
    return proc


def stop(proc: subprocess.Popen[bytes], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM to the process's group (its decoding / model processes too), SIGKILL to what is left after
    ``grace_s``."""
    def signal_group(sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)  # its session's group: the pid is the group id (start_new_session)
        except ProcessLookupError:
            pass

    if proc.poll() is None:
        signal_group(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    signal_group(signal.SIGKILL)  # the children too, even when the leader exited first
    proc.wait()
    if proc in _started:
        _started.remove(proc)


def stop_everything() -> None:
    for proc in list(_started):
        stop(proc, grace_s=5)


def exit_on_sigterm() -> None:
    """SIGTERM / SIGHUP end the script through its ``finally`` blocks, as Ctrl-C does: the servers are stopped."""
    def raise_exit(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, raise_exit)
    signal.signal(signal.SIGHUP, raise_exit)
    atexit.register(stop_everything)  # the last net, for an exit that skips a finally


# -- the servers -------------------------------------------------------------------------------------------


@dataclass
class Server:
    kind: str  # one of SERVER_KINDS
    proc: subprocess.Popen[bytes]
    command: list[str]
    port: int
    log: Path
    model_name: str = ""  # what its /v1/models answers, asked once it is ready

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_base_url(self) -> str:
        return f"{self.url}/openai/v1" if self.kind.startswith("sweep") else f"{self.url}/v1"

    @property
    def health_url(self) -> str:
        return f"{self.url}/v2/health/ready" if self.kind.startswith("sweep") else f"{self.url}/health"


@dataclass(frozen=True)
class KvCache:
    """Sweep's continuous-batch cache for a model at its default options, which transformers serve gets too."""

    tokens: int
    page_size: int
    max_batch_tokens: int
    kv_cache_mb: int
    max_concurrent_sequences: int

    @property
    def blocks(self) -> int:
        return self.tokens // self.page_size


def sweep_kv_cache(model_dir: Path) -> KvCache:
    """What sweep's decoding process computes (decoding_engine.py ``kv_bytes_per_token``, ``cache_tokens``,
    ``build_manager``), here from the model's config, so that transformers serve can start beside sweep."""
    import torch
    from transformers import AutoConfig, AutoTokenizer
    from transformers.generation.continuous_batching.utils import find_head_dim, find_num_key_value_heads

    from sweep.serving.decoding_engine import PAGE_SIZE, cache_tokens
    from sweep.serving.engines import context_length

    defaults = ServeOptions(model=str(model_dir))
    config = AutoConfig.from_pretrained(model_dir, local_files_only=True).get_text_config()
    dtype = getattr(config, "dtype", None) or torch.float32  # a torch.dtype, or its name in an older config
    itemsize = (dtype if isinstance(dtype, torch.dtype) else getattr(torch, str(dtype).removeprefix("torch."))).itemsize
    per_token = 2 * config.num_hidden_layers * find_num_key_value_heads(config) * find_head_dim(config) * itemsize
    context = context_length(config, AutoTokenizer.from_pretrained(model_dir, local_files_only=True).model_max_length)
    tokens = cache_tokens(per_token, context, defaults.kv_cache_mb, defaults.max_concurrent_sequences)
    return KvCache(tokens=tokens, page_size=PAGE_SIZE, max_batch_tokens=max(256, min(context, 2048)),
                   kv_cache_mb=defaults.kv_cache_mb, max_concurrent_sequences=defaults.max_concurrent_sequences)


def logged_number(log: Path, pattern: str) -> int | None:
    """A number a server's start-up line says, e.g. its KV cache's tokens ("KV cache 4 MiB = 8192 tokens")."""
    found = re.search(pattern, log.read_text(errors="replace"))
    return int(found.group(1)) if found else None


def start_server(kind: str, model_dir: Path, kv: KvCache, log_dir: Path, model: str) -> Server:
    """Launches one server; ``wait_ready`` waits for it (so that all of a model's start at once)."""
    port = free_port()
    if kind == "transformers":
        command = [
            str(VENV_BIN / "transformers"), "serve", str(model_dir), "--continuous-batching", "--device", "cpu",
            "--host", "127.0.0.1", "--port", str(port), "--cb-block-size", str(kv.page_size),
            "--cb-num-blocks", str(kv.blocks), "--cb-max-batch-tokens", str(kv.max_batch_tokens),
            "--log-level", "warning",
        ]
    else:
        command = [sys.executable, "-m", "sweep", "serve", f"model={model_dir}", f"port={port}", "grpc=false",
                   "device=cpu", "log_requests=false"]
        if kind != "sweep":
            command.append(kind.removeprefix("sweep-"))  # threads=N
    log = log_dir / f"{model}-{kind.replace('=', '')}.log"
    return Server(kind, launch(command, log, pod=f"{model}-{kind.replace('=', '')}"), command, port, log)


def wait_ready(server: Server, timeout_s: float = SERVER_READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"{server.kind} exited ({server.proc.returncode}): "
                               f"{server.log.read_text(errors='replace')[-3000:]}")
        try:
            if httpx.get(server.health_url, timeout=2).status_code == 200:
                server.model_name = httpx.get(f"{server.openai_base_url}/models", timeout=10).json()["data"][0]["id"]
                return
        except (httpx.HTTPError, KeyError, IndexError, ValueError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{server.kind} not ready after {timeout_s:.0f} s: "
                       f"{server.log.read_text(errors='replace')[-3000:]}")


# -- the CPU hog -------------------------------------------------------------------------------------------

def start_hog(mb: int, max_s: float, log: Path) -> subprocess.Popen[bytes]:
    """The busy loop on the last usable CPU, once its memory is held."""
    proc = launch(hog_command(mb, max_s), log, pod="hog")
    wait_until_ready(proc, log)
    return proc


# -- the clients -------------------------------------------------------------------------------------------


def percentile(ordered: list[float], q: float) -> float:
    """The q-th quantile of sorted values (nearest rank below, as scripts/bench_serve.py takes it)."""
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Completed:
    latency_s: float  # request sent -> last chunk (streamed) / answer read
    ttft_s: float | None  # streamed: request sent -> first chunk with text
    tokens: int
    tokens_from: str  # "usage" or "tokenizer"
    text: str


@dataclass
class RunSamples:
    """What the clients saw in one run against one server."""

    latencies_s: list[float] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    wall_s: float = 0.0
    errors: int = 0
    first_error: str | None = None
    tokens_from: Counter[str] = field(default_factory=Counter)

    def add(self, done: Completed) -> None:
        self.latencies_s.append(done.latency_s)
        if done.ttft_s is not None:
            self.ttft_s.append(done.ttft_s)
        self.completion_tokens += done.tokens
        self.tokens_from[done.tokens_from] += 1

    def summary(self, streamed: bool) -> dict[str, Any]:
        def ms(values: list[float], q: float) -> float | None:
            return round(1000 * percentile(sorted(values), q), 1) if values else None

        out: dict[str, Any] = {
            "requests": len(self.latencies_s),
            "errors": self.errors,
            "wall_s": round(self.wall_s, 3),
            "completion_tokens": self.completion_tokens,
            "tokens_per_s": round(self.completion_tokens / self.wall_s, 1) if self.wall_s else None,
            "latency_p50_ms": ms(self.latencies_s, 0.5),
            "latency_p99_ms": ms(self.latencies_s, 0.99),
            "tokens_from": dict(self.tokens_from),
        }
        if streamed:
            out["ttft_p50_ms"], out["ttft_p99_ms"] = ms(self.ttft_s, 0.5), ms(self.ttft_s, 0.99)
        if self.first_error:
            out["first_error"] = self.first_error
        return out


def new_client(server: Server) -> openai.AsyncOpenAI:
    """One simulated user: its own client over its own single connection, no retries."""
    http = openai.DefaultAsyncHttpxClient(limits=httpx2.Limits(max_connections=1, max_keepalive_connections=1))
    return openai.AsyncOpenAI(base_url=server.openai_base_url, api_key="x", max_retries=0, timeout=300,
                              http_client=http)


async def complete(client: openai.AsyncOpenAI, model_name: str, text: str, max_tokens: int, stream: bool,
                   count_tokens: Callable[[str], int]) -> Completed:
    """One completion, greedy; its tokens from ``usage`` when the server gives it, else counted."""
    start = time.perf_counter()
    if not stream:
        answer = await client.completions.create(model=model_name, prompt=text, max_tokens=max_tokens,
                                                 temperature=0)
        latency = time.perf_counter() - start
        out = answer.choices[0].text if answer.choices else ""
        if answer.usage is not None:
            return Completed(latency, None, answer.usage.completion_tokens, "usage", out)
        return Completed(latency, None, count_tokens(out), "tokenizer", out)
    chunks = await client.completions.create(model=model_name, prompt=text, max_tokens=max_tokens, temperature=0,
                                             stream=True, stream_options={"include_usage": True})
    first: float | None = None
    parts: list[str] = []
    usage_tokens: int | None = None
    async for chunk in chunks:
        if chunk.usage is not None:
            usage_tokens = chunk.usage.completion_tokens
        for choice in chunk.choices or []:
            if choice.text:
                if first is None:
                    first = time.perf_counter()
                parts.append(choice.text)
    latency = time.perf_counter() - start
    out = "".join(parts)
    ttft = (first - start) if first is not None else latency  # no text at all: the wait was the whole stream
    if usage_tokens is not None:
        return Completed(latency, ttft, usage_tokens, "usage", out)
    return Completed(latency, ttft, count_tokens(out), "tokenizer", out)


async def closed_loop(server: Server, concurrency: int, total: int, stream: bool, max_tokens: int,
                      prompts: Iterator[int], count_tokens: Callable[[str], int]) -> RunSamples:
    """``concurrency`` clients, each sending its next request when its last is answered, ``total`` in all."""
    samples = RunSamples()
    remaining = iter(range(total))
    clients = [new_client(server) for _ in range(concurrency)]
    try:
        # untimed: every client's connection, with a 2-token request of the same kind
        await asyncio.gather(*(complete(client, server.model_name, prompt(next(prompts)), 2, stream, count_tokens)
                               for client in clients))

        async def client_loop(client: openai.AsyncOpenAI) -> None:
            for _ in remaining:
                try:
                    samples.add(await complete(client, server.model_name, prompt(next(prompts)), max_tokens, stream,
                                               count_tokens))
                except (openai.OpenAIError, httpx2.HTTPError) as e:
                    samples.errors += 1
                    samples.first_error = samples.first_error or f"{type(e).__name__}: {e}"[:300]

        started = time.perf_counter()
        await asyncio.gather(*(client_loop(client) for client in clients))
        samples.wall_s = time.perf_counter() - started
    finally:
        await asyncio.gather(*(client.close() for client in clients))
    return samples


async def warm_up(server: Server, max_tokens: int, prompts: Iterator[int], count_tokens: Callable[[str], int]) -> None:
    """A few full-length completions, streamed and not, before anything is timed (lazy initialisation)."""
    client = new_client(server)
    try:
        for stream in (True, False):
            await asyncio.gather(*(complete(client, server.model_name, prompt(next(prompts)), max_tokens, stream,
                                            count_tokens) for _ in range(2)))
    finally:
        await client.close()


async def greedy_texts(server: Server, prompt_ids: list[int], max_tokens: int,
                       count_tokens: Callable[[str], int]) -> list[str]:
    """Non-streamed greedy texts, one request at a time."""
    client = new_client(server)
    try:
        return [(await complete(client, server.model_name, prompt(i), max_tokens, False, count_tokens)).text
                for i in prompt_ids]
    finally:
        await client.close()


def check_agreement(servers: dict[str, Server], count: int, max_tokens: int,
                    count_tokens: Callable[[str], int]) -> dict[str, Any]:
    """Every sweep server's greedy texts against transformers serve's; reported, never fatal."""
    reference = servers.get("transformers")
    if reference is None or count <= 0:
        return {"skipped": "no transformers server" if reference is None else "--agreement-prompts 0"}
    prompt_ids = list(range(1_000_000, 1_000_000 + count))  # apart from the benchmark's prompts
    expected = asyncio.run(greedy_texts(reference, prompt_ids, max_tokens, count_tokens))
    report: dict[str, Any] = {"prompts": count, "max_tokens": max_tokens}
    for kind, server in servers.items():
        if kind == "transformers":
            continue
        got = asyncio.run(greedy_texts(server, prompt_ids, max_tokens, count_tokens))
        mismatches = [{"prompt": prompt(i), "sweep": g, "transformers": e}
                      for i, g, e in zip(prompt_ids, got, expected) if g != e]
        report[kind] = {"matched": count - len(mismatches), "mismatches": mismatches[:3]}
    return report


# -- cells: every server in alternation, the median over repeats ----------------------------------------------

MEDIAN_KEYS = ("tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "latency_p50_ms", "latency_p99_ms", "wall_s",
               "server_cpu_ms_per_token", "children_cpu_ms_per_token")


def requests_per_run(base: int, concurrency: int, per_client: int) -> int:
    """``base`` at C >= 16, half at C = 4, a quarter at C = 1 (a lone client is slow); at least ``per_client``
    per client (2: a run is more than the burst of its first wave; 1 in a --quick run)."""
    share = 1.0 if concurrency >= 16 else 0.5 if concurrency >= 4 else 0.25
    return max(per_client * concurrency, round(base * share))


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in MEDIAN_KEYS:
        values = [run[key] for run in runs if run.get(key) is not None]
        out[key] = round(statistics.median(values), 3 if key.endswith("_per_token") else 1) if values else None
    out["errors"] = sum(run["errors"] for run in runs)
    out["tokens_from"] = dict(sum((Counter(run["tokens_from"]) for run in runs), Counter()))
    return out


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


class CollectorPauses:
    """The longest garbage collection of this process (the clients) since ``reset``, in ms."""

    def __init__(self) -> None:
        self._started = 0.0
        self.longest_ms = 0.0
        gc.callbacks.append(self._observe)

    def _observe(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.longest_ms = max(self.longest_ms, 1000 * (time.perf_counter() - self._started))

    def reset(self) -> None:
        self.longest_ms = 0.0


COLLECTOR = CollectorPauses()


def cpu_seconds(server: Server) -> tuple[float, float]:
    """CPU-seconds so far of the server's own process and of all its children (the decoding process)."""
    import psutil

    root = psutil.Process(server.proc.pid)
    own = sum(root.cpu_times()[:2])
    children = 0.0
    for child in root.children(recursive=True):
        try:
            children += sum(child.cpu_times()[:2])
        except psutil.Error:  # a helper that ended meanwhile
            pass
    return own, children


def measure_cell(servers: dict[str, Server], concurrency: int, stream: bool, total: int, args: argparse.Namespace,
                 prompts: Iterator[int], count_tokens: Callable[[str], int], label: str) -> dict[str, Any]:
    kinds = list(servers)
    runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    for repeat in range(args.repeats):
        shift = repeat % len(kinds)  # rotate: each server goes first in turn, load drift hits all alike
        for kind in kinds[shift:] + kinds[:shift]:
            own, children = cpu_seconds(servers[kind])
            COLLECTOR.reset()
            samples = asyncio.run(closed_loop(servers[kind], concurrency, total, stream, args.max_tokens, prompts,
                                              count_tokens))
            own_after, children_after = cpu_seconds(servers[kind])
            summary = samples.summary(stream)
            summary["client_gc_max_ms"] = round(COLLECTOR.longest_ms, 1)
            if samples.completion_tokens:
                summary["server_cpu_ms_per_token"] = round(1000 * (own_after - own) / samples.completion_tokens, 3)
                summary["children_cpu_ms_per_token"] = round(
                    1000 * (children_after - children) / samples.completion_tokens, 3)
            runs[kind].append(summary)
            print(f"    {label} {kind:<16} repeat {repeat}: {summary['tokens_per_s']} tok/s, "
                  f"{'TTFT' if stream else 'latency'} p50/p99 "
                  f"{summary['ttft_p50_ms' if stream else 'latency_p50_ms']}/"
                  f"{summary['ttft_p99_ms' if stream else 'latency_p99_ms']} ms, {summary['wall_s']} s, "
                  f"CPU ms/token {summary.get('server_cpu_ms_per_token')} + "
                  f"{summary.get('children_cpu_ms_per_token')}, "
                  f"client GC max {summary['client_gc_max_ms']} ms"
                  + (f", {summary['errors']} errors ({summary.get('first_error')})" if summary["errors"] else ""),
                  flush=True)
    medians = {kind: median_of(runs[kind]) for kind in kinds}
    return {"clients": concurrency, "streamed": stream, "requests_per_run": total,
            "median": medians, "runs": runs, "ratios": ratios_to_transformers(medians, stream)}


def p99_key(stream: bool) -> str:
    """The p99 a cell is judged on: time to first token when streamed, the whole answer's latency when not."""
    return "ttft_p99_ms" if stream else "latency_p99_ms"


def ratios_to_transformers(medians: dict[str, dict[str, Any]], stream: bool) -> dict[str, Any]:
    """Each sweep server's median tokens/s and p99 over transformers serve's."""
    p99 = p99_key(stream)
    return {
        f"{kind}/transformers": {"tokens_per_s": ratio(medians[kind]["tokens_per_s"],
                                                       medians["transformers"]["tokens_per_s"]),
                                 p99: ratio(medians[kind][p99], medians["transformers"][p99])}
        for kind in medians if kind != "transformers" and "transformers" in medians
    }


# -- the table -------------------------------------------------------------------------------------------------


def cell_text(m: dict[str, Any] | None, stream: bool) -> str:
    if m is None:
        return "-"
    p50, p99 = (m["ttft_p50_ms"], m["ttft_p99_ms"]) if stream else (m["latency_p50_ms"], m["latency_p99_ms"])
    fmt = lambda v: "-" if v is None else f"{v:.0f}"  # noqa: E731
    text = f"{fmt(m['tokens_per_s'])} · {fmt(p50)}/{fmt(p99)}"
    return text + (f" ({m['errors']} err)" if m["errors"] else "")


def print_table(model: str, load: str, cells: list[dict[str, Any]]) -> None:
    print(f"\n{model}, {load}: tok/s · TTFT p50/p99 ms (streamed) or latency p50/p99 ms (not streamed)")
    kinds = [kind for kind in SERVER_KINDS if any(kind in c["median"] for c in cells)]
    print("| model | load | clients | streamed? | " + " | ".join(COLUMNS[kind] for kind in kinds)
          + " | sweep/tf tok/s | sweep/tf p99 |")
    print("|---|---|---|---|" + "---|" * len(kinds) + "---|---|")
    for c in cells:
        stream = c["streamed"]
        own = c["ratios"].get("sweep/transformers", {})
        p99 = own.get(p99_key(stream))
        print(f"| {model} | {load} | {c['clients']} | {'yes' if stream else 'no'} | "
              + " | ".join(cell_text(c["median"].get(kind), stream) for kind in kinds)
              + f" | {own.get('tokens_per_s', '-') or '-'} | {p99 or '-'} |")
    print(flush=True)


# -- a model's part of the run ---------------------------------------------------------------------------------


def build_model(spec: ModelSpec, cache: Path) -> Path:
    return build_tiny_model(cache / spec.folder_name, "gpt2", spec.vocab_size, spec.hidden_size, spec.num_layers,
                            spec.num_heads, spec.max_positions)


def token_counter(model_dir: Path) -> Callable[[str], int]:
    """Counts a completion's tokens with the model's tokenizer, for a server that sends no usage."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])


def run_model(spec: ModelSpec, args: argparse.Namespace, work: Path, prompts: Iterator[int]) -> dict[str, Any]:
    model_dir = build_model(spec, work / "models")
    kv = sweep_kv_cache(model_dir)
    count_tokens = token_counter(model_dir)
    base = args.requests if args.requests is not None else spec.requests
    report: dict[str, Any] = {"model": spec.name, "folder": str(model_dir), "spec": spec.__dict__,
                              "kv_cache": {**kv.__dict__, "blocks": kv.blocks}, "servers": {}, "cells": []}
    servers: dict[str, Server] = {}
    hog: subprocess.Popen[bytes] | None = None
    try:
        started = time.perf_counter()
        for kind in args.servers:  # all at once: they load in parallel
            servers[kind] = start_server(kind, model_dir, kv, work / "logs", spec.name)
        for server in servers.values():
            wait_ready(server)
        report["servers_ready_s"] = round(time.perf_counter() - started, 1)
        gc.collect()
        gc.freeze()  # what is loaded by now is never garbage: no full collection rescans it mid-run
        for kind, server in servers.items():
            report["servers"][kind] = {"command": " ".join(server.command), "log": str(server.log),
                                       "model_name": server.model_name}
            if kind.startswith("sweep"):
                report["servers"][kind]["decoding_threads_reported"] = logged_number(
                    server.log, r"(\d+) torch thread\(s\)")
                logged = logged_number(server.log, r"KV cache \d+ MiB = (\d+) tokens")
                report["kv_cache"][f"{kind}_reports_tokens"] = logged
                if logged is not None and logged != kv.tokens:
                    print(f"  WARNING: {kind} says its KV cache holds {logged} tokens, transformers got {kv.tokens}",
                          flush=True)
        print(f"== {spec.name}: {len(servers)} servers ready in {report['servers_ready_s']} s; KV cache "
              f"{kv.tokens} tokens = {kv.blocks} blocks of {kv.page_size}", flush=True)
        for server in servers.values():
            asyncio.run(warm_up(server, args.max_tokens, prompts, count_tokens))
        report["agreement"] = check_agreement(servers, args.agreement_prompts, args.max_tokens, count_tokens)
        agreed = ", ".join(f"{kind} {v['matched']}/{args.agreement_prompts}"
                           for kind, v in report["agreement"].items() if isinstance(v, dict))
        print(f"  greedy agreement with transformers serve ({spec.name}): "
              f"{agreed or report['agreement'].get('skipped')}", flush=True)
        for load in args.load:
            load_started = time.perf_counter()
            if load == "busy":
                hog = start_hog(args.hog_mb, args.hog_max_s, work / "logs" / f"{spec.name}-hog.log")
            cells = []
            for concurrency in args.clients:
                total = requests_per_run(base, concurrency, 1 if args.quick else 2)
                for stream in (True, False):
                    label = f"{spec.name} {load} C={concurrency} {'streamed' if stream else 'whole'}"
                    cell = measure_cell(servers, concurrency, stream, total, args, prompts, count_tokens, label)
                    cells.append({"model": spec.name, "load": load, **cell})
            if hog is not None:
                stop(hog, grace_s=2)
                hog = None
            report["cells"] += cells
            report[f"{load}_wall_s"] = round(time.perf_counter() - load_started, 1)
            print_table(spec.name, load, cells)
    finally:
        if hog is not None:
            stop(hog, grace_s=2)
        for server in servers.values():
            stop(server.proc)
    return report


# Issue [22]'s goals, in each cell at 1 and 16 clients: tokens/s at least transformers serve's, its p99 (TTFT
# streamed, latency not) at most 1.2x transformers', and the default within 10% of the best ``threads=``.
GOAL_TOKENS, GOAL_P99, GOAL_DEFAULT = 1.0, 1.2, 0.9
GOAL_CLIENTS = (1, 16)


def goals(models: list[dict[str, Any]]) -> dict[str, Any]:
    """Which cells meet each goal (a goal that a run's servers cannot judge is left out)."""
    met: dict[str, list[str]] = {"tokens_per_s": [], "p99": [], "default_vs_best_threads": []}
    missed: dict[str, list[str]] = {key: [] for key in met}

    def judge(goal: str, cell: str, ok: bool) -> None:
        (met if ok else missed)[goal].append(cell)

    for model in models:
        for c in model["cells"]:
            if c["clients"] not in GOAL_CLIENTS:
                continue
            name = f"{c['model']} {c['load']} C={c['clients']} {'streamed' if c['streamed'] else 'whole'}"
            p99 = p99_key(c["streamed"])
            vs_tf = c["ratios"].get("sweep/transformers", {})
            if vs_tf.get("tokens_per_s") is not None:
                judge("tokens_per_s", f"{name} ({vs_tf['tokens_per_s']}x{paired_range(c)})",
                      vs_tf["tokens_per_s"] >= GOAL_TOKENS)
            if vs_tf.get(p99) is not None:
                judge("p99", f"{name} ({vs_tf[p99]}x)", vs_tf[p99] <= GOAL_P99)
            fixed = [c["median"][k]["tokens_per_s"] for k in ("sweep-threads=1", "sweep-threads=2")
                     if c["median"].get(k) and c["median"][k]["tokens_per_s"]]
            default = (c["median"].get("sweep") or {}).get("tokens_per_s")
            if default and fixed:
                share = round(default / max(fixed), 2)
                judge("default_vs_best_threads", f"{name} ({share}x)", share >= GOAL_DEFAULT)
    return {"met": met, "missed": missed}


def paired_ratios(cell: dict[str, Any]) -> list[float]:
    """sweep/transformers tokens/s of each repeat, its two runs side by side in time (the order rotates
    within a repeat); a pooled cell (``--judge``) has them from each of its runs."""
    if "pairs" in cell:
        return [round(r, 2) for r in cell["pairs"].get("sweep", {}).get("tokens_per_s", [])]
    pairs = [ratio(a["tokens_per_s"], b["tokens_per_s"])
             for a, b in zip(cell["runs"].get("sweep", []), cell["runs"].get("transformers", []))]
    return [p for p in pairs if p is not None]


def paired_range(cell: dict[str, Any]) -> str:
    """The spread of the repeats' ratios (what the noise of this machine is) next to the median's ratio."""
    pairs = paired_ratios(cell)
    if len(pairs) < 2:
        return ""
    return f", repeats {min(pairs)}-{max(pairs)}, their median {round(statistics.median(pairs), 2)}"


CELL_KEYS = ("model", "load", "clients", "streamed")


def pooled_models(paths: list[Path]) -> list[dict[str, Any]]:
    """The cells of several runs' JSONs, each cell's repeats those of all runs. Runs on other machines (or
    the same one at another moment) differ in speed, so a pooled cell compares servers repeat by repeat:
    each sweep server's tokens/s and p99 over transformers serve's in the same repeat, and the median of
    those ratios over all runs. Its ``median`` tokens/s are those ratios (transformers serve = 1)."""
    cells: dict[tuple[Any, ...], dict[str, Any]] = {}
    for path in paths:
        try:
            models = json.loads(path.read_text())["models"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"--judge: {path} is not a result of this script ({type(e).__name__}: {e})") from None
        for model in models:
            for c in model["cells"]:
                pooled = cells.setdefault(tuple(c[k] for k in CELL_KEYS),
                                          {**{k: c[k] for k in CELL_KEYS}, "pairs": {}})
                p99 = p99_key(c["streamed"])
                for kind, runs in c["runs"].items():
                    if kind == "transformers":
                        continue
                    pairs = pooled["pairs"].setdefault(kind, {"tokens_per_s": [], p99: []})
                    for own, reference in zip(runs, c["runs"].get("transformers", [])):
                        for key in pairs:
                            if own.get(key) and reference.get(key):
                                pairs[key].append(own[key] / reference[key])
    models_out: dict[str, dict[str, Any]] = {}
    for c in cells.values():
        c["ratios"] = {f"{kind}/transformers": {key: round(statistics.median(values), 2) if values else None
                                                for key, values in pairs.items()}
                       for kind, pairs in c["pairs"].items()}
        c["median"] = {kind: {"tokens_per_s": r["tokens_per_s"]} for kind, r in
                       ((name.removesuffix("/transformers"), r) for name, r in c["ratios"].items())}
        models_out.setdefault(c["model"], {"model": c["model"], "cells": []})["cells"].append(c)
    return list(models_out.values())


def judge_runs(paths: list[Path]) -> None:
    """``--judge``: the goals over the repeats of several earlier runs, no server started."""
    models = pooled_models(paths)
    print(f"{len(paths)} runs pooled: each cell's sweep/transformers, the median of its repeats' ratios "
          "(tokens/s; p99: TTFT streamed, latency not)")
    for model in models:
        for c in model["cells"]:
            name = f"{c['model']} {c['load']} C={c['clients']} {'streamed' if c['streamed'] else 'whole'}"
            p99 = p99_key(c["streamed"])
            print(f"  {name:<28} " + "; ".join(
                f"{kind} {c['ratios'][f'{kind}/transformers']['tokens_per_s']}x tok/s, "
                f"p99 {c['ratios'][f'{kind}/transformers'][p99]}x ({len(pairs['tokens_per_s'])} repeats)"
                for kind, pairs in c["pairs"].items()))
    print_goals(goals(models))


def print_goals(summary: dict[str, Any]) -> None:
    titles = {"tokens_per_s": f"tokens/s >= {GOAL_TOKENS}x transformers serve",
              "p99": f"p99 <= {GOAL_P99}x transformers serve's",
              "default_vs_best_threads": f"default threads >= {GOAL_DEFAULT}x the best threads="}
    print("goals ([22]):")
    if not any(summary["met"][goal] or summary["missed"][goal] for goal in titles):
        print("  none judged: the run needs sweep (default threads) and transformers serve, or a fixed threads=")
    for goal, title in titles.items():
        met, missed = summary["met"][goal], summary["missed"][goal]
        if met or missed:
            print(f"  {title}: {len(met)}/{len(met) + len(missed)} cells"
                  + (f"; missed: {'; '.join(missed)}" if missed else ""))


def tokens_from_by_server(models: list[dict[str, Any]]) -> dict[str, Any]:
    """Where each server's completion tokens came from, over the whole run."""
    counts: dict[str, Counter[str]] = {}
    for model in models:
        for cell in model["cells"]:
            for kind, m in cell["median"].items():
                counts.setdefault(f"{kind} {'streamed' if cell['streamed'] else 'not streamed'}", Counter()).update(
                    m["tokens_from"])
    return {key: dict(value) for key, value in counts.items()}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=None,
                        help="default: all (--quick: tiny)")
    parser.add_argument("--servers", nargs="+", choices=SERVER_KINDS, default=list(DEFAULT_KINDS),
                        help="which servers to start and compare (the ratios need sweep and transformers)")
    parser.add_argument("--load", nargs="+", choices=LOADS, default=list(LOADS))
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16, 64], help="concurrent closed-loop clients")
    parser.add_argument("--requests", type=int, default=None,
                        help="requests per run at C >= 16 (C=4: half, C=1: a quarter; default: per model, "
                             + ", ".join(f"{m.name} {m.requests}" for m in MODELS.values()) + ")")
    parser.add_argument("--repeats", type=int, default=2, help="runs per server and cell, the order rotating")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--agreement-prompts", type=int, default=8, help="prompts of the greedy agreement check")
    parser.add_argument("--hog-mb", type=int, default=512, help="memory the busy load's hog holds")
    parser.add_argument("--hog-max-s", type=float, default=3 * 3600, help="the hog ends by itself after this")
    parser.add_argument("--pods", action="store_true",
                        help="each server, the hog and the clients in a cgroup of its own, as pods on one node "
                             "(a process's share of a busy CPU is its pod's, not its threads'); needs root")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: tiny model, clients 1 and 16, 1 repeat, few requests")
    parser.add_argument("--out", type=Path, default=ROOT / "bench_results" / "serve_vs_transformers.json")
    parser.add_argument("--judge", type=Path, nargs="+", metavar="JSON",
                        help="start nothing: pool the repeats of earlier runs' JSONs (--out) per cell, each "
                             "repeat's sweep/transformers ratios, and print the goals over them")
    args = parser.parse_args()
    if args.quick:
        args.models, args.clients, args.repeats = args.models or ["tiny"], [1, 16], 1
        args.requests = args.requests or 16
        args.agreement_prompts = min(args.agreement_prompts, 4)
    args.models = args.models or list(MODELS)
    args.servers = [kind for kind in SERVER_KINDS if kind in args.servers]  # the table's order
    return args


def main() -> None:
    args = parse_args()
    if args.judge:
        judge_runs(args.judge)
        return
    exit_on_sigterm()
    work = args.out.parent / "serve_vs_transformers"
    prompts = itertools.count()  # one sequence for the whole run: every request its own sentence
    started = time.perf_counter()
    models: list[dict[str, Any]] = []
    global PODS
    PODS = Pods() if args.pods else None
    try:
        if PODS is not None:
            PODS.join("clients")
        for name in args.models:
            models.append(run_model(MODELS[name], args, work, prompts))
    finally:
        stop_everything()
        if PODS is not None:
            PODS.remove()
    report: dict[str, Any] = {
        "cpus": len(os.sched_getaffinity(0)),
        "load_average_at_end": os.getloadavg(),
        "wall_s": round(time.perf_counter() - started, 1),
        "settings": {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items()},
        "client": "openai.AsyncOpenAI per simulated client, one connection each, max_retries=0; "
                  "completions.create(max_tokens, temperature=0), streamed with "
                  "stream_options={include_usage: true}",
        "ttft": "request sent -> first chunk whose choices[0].text is not empty",
        "tokens_per_s": "all completion tokens of a run / its wall time; median over repeats",
        "completion_tokens_from": "usage when the server sends it, else the model's tokenizer on the text; "
                                  "counts of requests per server and mode under tokens_from_by_server",
        "tokens_from_by_server": tokens_from_by_server(models),
        "models": models,
        "goals": goals(models),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print_goals(report["goals"])
    print(f"wrote {args.out} ({report['wall_s']} s)")


if __name__ == "__main__":
    main()
