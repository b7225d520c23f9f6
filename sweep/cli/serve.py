"""``sweep serve model=<best-model folder | models:/<name>@champion | s3://bucket/prefix> [port=8080] ...``

(also ``python -m sweep serve``, what the KServe ServingRuntime and the image run). Its arguments are
``key=value`` like the sweep's overrides; ``--help`` lists them. The server is sweep/serving/server.py;
with ``adapters=`` (``model=`` is then the base) it is sweep/serving/adapter_pool.py: many LoRA adapters, one base.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import MISSING, fields
from typing import NoReturn

from sweep.cli.key_values import (
    Option,
    UsageError,
    as_bool,
    non_empty,
    non_negative_float,
    parse_key_values,
    port_number,
    positive_int,
    usage,
)
from sweep.config.defaults import CACHE_DIR_ENV
from sweep.serving.api_key import API_KEY_ENV
from sweep.serving.cpu_budget import quiet_openmp_environment
from sweep.serving.server import ServeError, ServeOptions, serve_model

PROG = "sweep serve"


def _generation(text: str) -> str:
    if text not in ("continuous", "batched"):
        raise ValueError(f"expected continuous or batched, got {text!r}")
    return text


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(f"must be >= 0, got {value}")
    return value

_DEFAULTS = {f.name: f.default for f in fields(ServeOptions) if f.default is not MISSING}
OPTIONS: dict[str, Option] = {
    "model": Option(non_empty, None,
                    "a folder exported by a sweep (best/<TASK>/), models:/<name>@<alias>, or s3://bucket/prefix; "
                    "with adapters=: the base model they were trained on (its folder, or the sweep's name for it: "
                    "a model config such as minilm)", required=True),
    "name": Option(non_empty, _DEFAULTS["name"],
                   "name the model is published under (default: its registered name <model>-<task>)"),
    "adapters": Option(non_empty, _DEFAULTS["adapters"],
                       "LoRA adapters to serve on the base model=, loaded once: NAME=DIR,NAME=DIR,... or a sweep's "
                       "output folder (its best/<TASK>/adapter/ exports, each served as <model>-<task>)"),
    "host": Option(non_empty, _DEFAULTS["host"],
                   "the address the HTTP and gRPC servers bind (127.0.0.1: this machine only; 0.0.0.0: every "
                   "interface, as a container or pod needs)"),
    "port": Option(port_number, _DEFAULTS["port"], "HTTP port"),
    "grpc_port": Option(port_number, _DEFAULTS["grpc_port"], "gRPC port (Open Inference Protocol v2 over gRPC)"),
    "grpc": Option(as_bool, _DEFAULTS["grpc"], "serve gRPC too (false: REST only)"),
    "batching": Option(as_bool, _DEFAULTS["batching"], "merge concurrent requests into one forward pass"),
    "max_batch_size": Option(positive_int, _DEFAULTS["max_batch_size"], "most texts in one forward pass"),
    "max_latency_ms": Option(non_negative_float, _DEFAULTS["max_latency_ms"],
                             "longest an idle server holds a request back for others to join it "
                             "(0: never; requests that arrive during a forward pass share the next one anyway)"),
    "generation": Option(_generation, _DEFAULTS["generation"],
                         "continuous: a causal LM's sequences share one running batch, a new one joins at the next "
                         "decoding step (when transformers cannot, the server says why and uses the micro-batcher); "
                         "batched: the micro-batcher's whole-batch generate"),
    "unstreamed": Option(_generation, _DEFAULTS["unstreamed"],
                         "with generation=continuous, how requests that are not streamed generate: in the batch "
                         "(continuous), or by the micro-batcher's whole-batch generate beside it (batched; "
                         "still under max_concurrent_sequences / max_queued)"),
    "kv_cache_mb": Option(positive_int, _DEFAULTS["kv_cache_mb"],
                          "MiB of KV cache for the continuous batch (never more than max_concurrent_sequences "
                          "full contexts)"),
    "max_concurrent_sequences": Option(positive_int, _DEFAULTS["max_concurrent_sequences"],
                                       "sequences in the continuous batch at once; more wait in the queue"),
    "stream_interval_ms": Option(non_negative_float, _DEFAULTS["stream_interval_ms"],
                                 "with generation=continuous, a stream's new tokens are sent at most this often, "
                                 "several to a chunk when decoding is faster (0: a chunk per decoding step); a "
                                 "stream's first token and its end are never held. At many streams the server "
                                 "and its clients wake less often, and the decoding keeps the CPU"),
    "max_queued": Option(non_negative_int, _DEFAULTS["max_queued"],
                         "sequences that may wait for a slot; past that a request gets 429 + Retry-After "
                         "(gRPC RESOURCE_EXHAUSTED)"),
    "device": Option(non_empty, _DEFAULTS["device"], "cpu, cuda, cuda:N, or auto (a GPU when there is one)"),
    "threads": Option(positive_int, _DEFAULTS["threads"],
                      "torch intra-op threads of the decoding (a causal LM) or of the forward passes (a "
                      "classifier). Default: a causal LM's decoding 1 (measured best on CPU: "
                      "scripts/bench_serve_vs_transformers.py), a classifier's every CPU the process may use "
                      "(its affinity and cgroup quota, i.e. the pod's CPU limit, not the host's cores)"),
    "tracking_uri": Option(non_empty, _DEFAULTS["tracking_uri"],
                           "MLflow tracking URI for models:/ (default: $MLFLOW_TRACKING_URI, else a sweep's default "
                           "store, sqlite:///runs/mlflow.db in this folder, or ./mlflow.db where an earlier sweep "
                           "left one)"),
    "cache_dir": Option(non_empty, _DEFAULTS["cache_dir"],
                        f"where registry and S3 copies are kept (default: ${CACHE_DIR_ENV} or ~/.cache/sweep)"),
    "log_requests": Option(as_bool, _DEFAULTS["log_requests"],
                           "an access line per request (status, method, path, ms); false: none (a refused "
                           "request's WARNING stays)"),
    "max_body_bytes": Option(positive_int, _DEFAULTS["max_body_bytes"],
                             "largest request body (bytes; gRPC: largest message); past it 413 before the body is "
                             "read (default: a classifier's 8 MiB, a causal LM's 16 MiB)"),
    "request_timeout_s": Option(non_negative_float, _DEFAULTS["request_timeout_s"],
                                "a request's deadline in seconds: past it 504 (gRPC DEADLINE_EXCEEDED) and its work "
                                "abandoned (0: none)"),
    "max_output_tokens": Option(positive_int, _DEFAULTS["max_output_tokens"],
                                "a causal LM's most new tokens per request (max_new_tokens, max_tokens, "
                                "max_completion_tokens); past it 400 (default: what its context allows)"),
    "api_key": Option(non_empty, _DEFAULTS["api_key"],
                      f"inference routes need Authorization: Bearer <key> (default: ${API_KEY_ENV}, else no key; "
                      "prefer the variable: a command line is visible to every user of the machine)"),
}


def _fail(message: object) -> NoReturn:
    """A user's mistake: one line, no traceback, exit status 2 (as the sweep's)."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def parse(argv: Sequence[str]) -> ServeOptions:
    """The arguments as the server's options (raises ``UsageError``)."""
    return ServeOptions(**parse_key_values(argv, OPTIONS))


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help", "help") for a in args):
        print(usage(prog, OPTIONS))
        return
    try:
        options = parse(args)
    except UsageError as e:
        _fail(e)
    # Before torch loads, here or in the decoding process the server spawns: OpenMP's idle threads sleep
    quiet_openmp_environment()
    try:
        if options.adapters:
            from sweep.serving.adapter_pool import serve_adapters

            serve_adapters(options)
        else:
            serve_model(options)
    except ServeError as e:
        _fail(e)
