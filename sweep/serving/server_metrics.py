"""The server's own Prometheus metrics, served with KServe's at ``GET /metrics`` on the HTTP port.

KServe's ``/metrics`` exposes prometheus_client's default registry, where KServe keeps its
``request_{preprocess,predict,postprocess}_seconds`` histograms (per model, REST and gRPC alike);
these ``sweep_`` metrics join them there:

- ``sweep_http_requests_total{method,route,status}``: HTTP requests answered, by route template
  (``/v2/models/{model_name}/infer``; ``unmatched`` for a path no route takes) and status code;
- ``sweep_http_request_duration_seconds{method,route}``: their latency, to the end of the answer;
- ``sweep_batch_size{model}``: texts per forward pass (what the micro-batcher merged);
- ``sweep_prompt_tokens_total{model}``, ``sweep_generated_tokens_total{model}``: a causal LM's prompt
  and completion tokens, as its answers report them;
- continuous batching (sweep/serving/continuous.py): ``sweep_sequences_running{model}`` and
  ``sweep_sequences_waiting{model}`` (gauges), ``sweep_tokens_per_step{model}`` (tokens one decoding step
  computed: every running sequence's next token, and prompt tokens being read in),
  ``sweep_time_to_first_token_seconds{model}`` and ``sweep_time_per_output_token_seconds{model}``
  (histograms, per sequence), and ``sweep_rejected_requests_total{model}`` (refused as overloaded: 429).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

UNMATCHED = "unmatched"  # one label for every path no route takes: scanners must not grow the series

HTTP_REQUESTS = Counter(
    "sweep_http_requests", "HTTP requests answered, by route template and status code", ["method", "route", "status"]
)
HTTP_LATENCY = Histogram(
    "sweep_http_request_duration_seconds", "HTTP request latency, to the end of the answer", ["method", "route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0),
)
BATCH_SIZE = Histogram(
    "sweep_batch_size", "texts per forward pass (requests merged by the micro-batcher)", ["model"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
PROMPT_TOKENS = Counter("sweep_prompt_tokens", "prompt tokens of the completions a causal LM answered", ["model"])
GENERATED_TOKENS = Counter("sweep_generated_tokens", "tokens a causal LM generated (completion tokens)", ["model"])

RUNNING = Gauge("sweep_sequences_running", "sequences in the continuous batch (generating)", ["model"])
WAITING = Gauge("sweep_sequences_waiting", "sequences admitted and waiting for a slot in the batch", ["model"])
TOKENS_PER_STEP = Histogram(
    "sweep_tokens_per_step", "tokens one continuous-batching step computed (decoded and prompt tokens)", ["model"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048),
)
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
TIME_TO_FIRST_TOKEN = Histogram(
    "sweep_time_to_first_token_seconds", "from a sequence's arrival to its first generated token", ["model"],
    buckets=_LATENCY_BUCKETS,
)
TIME_PER_OUTPUT_TOKEN = Histogram(
    "sweep_time_per_output_token_seconds", "a sequence's mean time per generated token after its first",
    ["model"], buckets=_LATENCY_BUCKETS,
)
REJECTED = Counter("sweep_rejected_requests", "requests refused as overloaded (HTTP 429, gRPC RESOURCE_EXHAUSTED)",
                   ["model"])


def batch_observer(model: str) -> Callable[[int], None]:
    """What the micro-batcher calls with the size of each forward pass of ``model``."""
    return BATCH_SIZE.labels(model=model).observe


def count_tokens(model: str, prompt_tokens: Sequence[int], completion_tokens: Sequence[int]) -> None:
    PROMPT_TOKENS.labels(model=model).inc(sum(prompt_tokens))
    GENERATED_TOKENS.labels(model=model).inc(sum(completion_tokens))


def sequences_observer(model: str) -> Callable[[int, int], None]:
    """What admission calls with the running and waiting sequences of ``model``."""
    running, waiting = RUNNING.labels(model=model), WAITING.labels(model=model)

    def observe(now_running: int, now_waiting: int) -> None:
        running.set(now_running)
        waiting.set(now_waiting)

    return observe


def rejection_counter(model: str) -> Callable[[], None]:
    return REJECTED.labels(model=model).inc


def step_observer(model: str) -> Callable[[int], None]:
    return TOKENS_PER_STEP.labels(model=model).observe


def observe_latency(model: str, first_token_s: float, per_token_s: float | None) -> None:
    TIME_TO_FIRST_TOKEN.labels(model=model).observe(first_token_s)
    if per_token_s is not None:
        TIME_PER_OUTPUT_TOKEN.labels(model=model).observe(per_token_s)


class RequestMetrics:
    """ASGI middleware: counts and times every HTTP request by its route template and status."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # what the client gets when the app raises before answering

        async def send_and_note_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note_status)
        finally:
            # The router records the route it matched in the scope (the same dict) on its way in.
            route = getattr(scope.get("route"), "path", None) or UNMATCHED
            method = scope.get("method", "")
            HTTP_REQUESTS.labels(method=method, route=route, status=str(status)).inc()
            HTTP_LATENCY.labels(method=method, route=route).observe(time.perf_counter() - start)
