"""The server's own Prometheus metrics, served with KServe's at ``GET /metrics`` on the HTTP port.

KServe's ``/metrics`` exposes prometheus_client's default registry, where KServe keeps its
``request_{preprocess,predict,postprocess}_seconds`` histograms (per model, REST and gRPC alike);
these ``sweep_`` metrics join them there:

- ``sweep_http_requests_total{method,route,status}``: HTTP requests answered, by route template
  (``/v2/models/{model_name}/infer``; ``unmatched`` for a path no route takes) and status code;
- ``sweep_http_request_duration_seconds{method,route}``: their latency, to the end of the answer;
- ``sweep_batch_size{model}``: texts per forward pass (what the micro-batcher merged);
- ``sweep_prompt_tokens_total{model}``, ``sweep_generated_tokens_total{model}``: a causal LM's prompt
  and completion tokens, as its answers report them.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from prometheus_client import Counter, Histogram

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


def batch_observer(model: str) -> Callable[[int], None]:
    """What the micro-batcher calls with the size of each forward pass of ``model``."""
    return BATCH_SIZE.labels(model=model).observe


def count_tokens(model: str, prompt_tokens: Sequence[int], completion_tokens: Sequence[int]) -> None:
    PROMPT_TOKENS.labels(model=model).inc(sum(prompt_tokens))
    GENERATED_TOKENS.labels(model=model).inc(sum(completion_tokens))


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
