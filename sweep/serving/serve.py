"""python -m sweep.serve model=<best-model folder | models:/<name>@champion | s3://bucket/prefix> [port=8080] ...

A KServe ``ModelServer`` (the runtime KServe runs for custom predictors) serving one fine-tuned
model over the Open Inference Protocol v2 REST API: ``/v2/health/live``, ``/v2/health/ready``,
``/v2/models/{name}``, ``/v2/models/{name}/ready``, ``/v2/models/{name}/infer`` (and
``GET /v1/models``), the same v2 service over gRPC on ``grpc_port=`` (KServe's gRPC server), and
Prometheus metrics at ``GET /metrics``. A classifier answers labels and scores for texts or text pairs; a causal LM
answers completions with token counts. ``python -m sweep.serve --help`` lists the options.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sweep.serving.cli_args import (
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

DEFAULT_PORT = 8080
DEFAULT_GRPC_PORT = 8081
OPTIONS: dict[str, Option] = {
    "model": Option(non_empty, None,
                    "a folder exported by a sweep (best/<TASK>/), models:/<name>@<alias>, or s3://bucket/prefix",
                    required=True),
    "name": Option(non_empty, None, "name the model is published under (default: its registered name <model>-<task>)"),
    "port": Option(port_number, DEFAULT_PORT, "HTTP port"),
    "grpc_port": Option(port_number, DEFAULT_GRPC_PORT, "gRPC port (Open Inference Protocol v2 over gRPC)"),
    "grpc": Option(as_bool, True, "serve gRPC too (false: REST only)"),
    "batching": Option(as_bool, True, "merge concurrent requests into one forward pass"),
    "max_batch_size": Option(positive_int, 32, "most texts in one forward pass"),
    "max_latency_ms": Option(non_negative_float, 0.0,
                             "longest an idle server holds a request back for others to join it "
                             "(0: never; requests that arrive during a forward pass share the next one anyway)"),
    "device": Option(non_empty, "auto", "cpu, cuda, cuda:N, or auto (a GPU when there is one)"),
    "threads": Option(positive_int, None, "torch CPU threads (default: torch's, one per core of the machine; "
                      "set the pod's CPU limit: more threads than free cores make every pass far slower)"),
    "tracking_uri": Option(non_empty, None,
                           "MLflow tracking URI for models:/ (default: $MLFLOW_TRACKING_URI, else MLflow's default)"),
    "cache_dir": Option(non_empty, None,
                        "where registry and S3 copies are kept (default: $SWEEP_CACHE_DIR or ~/.cache/sweep)"),
    "log_requests": Option(as_bool, True, "log a line per request (access and timing logs)"),
}


def _default_cache_dir() -> Path:
    return Path(os.environ.get("SWEEP_CACHE_DIR") or Path.home() / ".cache" / "sweep")


def _fail(message: object) -> None:
    """A user's mistake: one line, no traceback, exit status 2 (as the main CLI)."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def _port_taken(port: int) -> bool:
    """Whether something listens on ``port``. gRPC binds with SO_REUSEPORT, so a second server on a
    taken gRPC port would start and silently share its calls with the first: ask before."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT leftovers are no listener
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


def build_model(model_dir: Path, name: str, options: Mapping[str, Any]) -> Any:
    """The KServe model for the folder: a classifier, or a causal LM that also speaks OpenAI's API."""
    from sweep.serving import server_metrics
    from sweep.serving.engines import CLASSIFIER, Classifier, Generator, model_kind
    from sweep.serving.kserve_model import ClassifierModel, GeneratorModel

    if options["threads"]:
        import torch

        torch.set_num_threads(options["threads"])
    batcher_options = {
        "enabled": options["batching"],
        "max_batch_size": options["max_batch_size"],
        "max_latency_ms": options["max_latency_ms"],
        "observe_batch": server_metrics.batch_observer(name),
    }
    if model_kind(model_dir) == CLASSIFIER:
        return ClassifierModel(name, Classifier(model_dir, options["device"]), batcher_options)
    engine = Generator(model_dir, options["device"])
    try:  # KServe's OpenAI types come from vLLM (kserve's llm extra; the Makefile installs them)
        from sweep.serving.openai_model import OpenAIGeneratorModel
    except ModuleNotFoundError as e:
        logging.getLogger("kserve").warning(
            f"no OpenAI endpoints: KServe's OpenAI support needs {e.name!r} (pip install --no-deps vllm==0.24.0 "
            "and its protocol dependencies: see the Makefile); serving v2 only"
        )
        return GeneratorModel(name, engine, batcher_options)
    return OpenAIGeneratorModel(name, engine, batcher_options)


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help", "help") for a in args):
        print(usage("python -m sweep.serve", OPTIONS))
        return
    try:
        options = parse_key_values(args, OPTIONS)
    except UsageError as e:
        _fail(e)
    if options["grpc"] and options["grpc_port"] == options["port"]:
        _fail(f"grpc_port: must differ from port (both {options['port']}); or grpc=false")
    # Heavier imports only from here on, stage by stage, so that a mistake is reported fast.
    from sweep.errors import StagingError
    from sweep.serving.source import ModelSourceError, published_name, resolve_model_source

    try:
        cache_dir = Path(options["cache_dir"]).expanduser() if options["cache_dir"] else _default_cache_dir()
        model_dir = resolve_model_source(options["model"], cache_dir, options["tracking_uri"])
        name = options["name"] or published_name(model_dir, options["model"])
    except (ModelSourceError, StagingError) as e:  # StagingError: an s3:// source (credentials, key, archive)
        _fail(e)
    from sweep.serving.engines import ModelKindError
    from sweep.serving.kserve_model import serve

    try:
        model = build_model(model_dir, name, options)
    except ModelKindError as e:
        _fail(e)
    except (OSError, ValueError) as e:  # transformers' way of saying the folder is incomplete or corrupt
        _fail(f"model={options['model']}: cannot load the model in {model_dir}: {' '.join(str(e).split())}")
    batching = (
        f"batching on (up to {options['max_batch_size']} texts, waits <= {options['max_latency_ms']:g} ms)"
        if options["batching"] else "batching off"
    )
    grpc_port = options["grpc_port"] if options["grpc"] else None
    if grpc_port and _port_taken(grpc_port):
        _fail(f"grpc_port: port {grpc_port} is in use (another server?); choose another grpc_port= or grpc=false")
    grpc = f"gRPC v2 on port {grpc_port}" if grpc_port else "gRPC off"
    openai = ", POST /openai/v1/completions (and /chat/completions)" if hasattr(model, "create_completion") else ""
    print(
        f"serving {name} ({model.engine.kind}, {model_dir}) on port {options['port']}: "
        f"POST /v2/models/{name}/infer{openai}, GET /metrics; {grpc}; {batching}",
        flush=True,
    )
    serve(model, options["port"], options["log_requests"], grpc_port)


if __name__ == "__main__":
    main()
