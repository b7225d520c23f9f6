"""Serve one fine-tuned model: a KServe ``ModelServer`` (the runtime KServe runs for custom predictors).

The command is ``sweep serve model=... [port=8080] ...`` (``python -m sweep serve``; its ``key=value``
arguments are read in sweep/cli/serve.py into a ``ServeOptions``). It speaks the Open Inference Protocol
v2 over REST (every route it answers is in sweep/serving/routes.py), the same v2 service over gRPC on
``grpc_port`` (KServe's servicer), and Prometheus metrics at ``GET /metrics``. A classifier answers labels
and scores for texts or text pairs; a causal LM answers completions with token counts.

``serve`` is the one start-up: one model (``serve_model``) and an adapter pool (adapter_pool.py) only
find and load their models differently.
"""

from __future__ import annotations

import functools
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweep.config.defaults import default_cache_dir
from sweep.serving.cpu_budget import ServerWork, set_server_threads
from sweep.serving.deadline import DEFAULT_REQUEST_TIMEOUT_S
from sweep.serving.guards import Guards
from sweep.serving.routes import announced

DEFAULT_PORT = 8080
DEFAULT_GRPC_PORT = 8081
# Loopback unless told: a server on a laptop is not on the network by accident. Containers and pods pass
# host=0.0.0.0 (deploy/Containerfile, deploy/kserve/servingruntime.yaml).
DEFAULT_HOST = "127.0.0.1"


class ServeError(Exception):
    """A person's mistake (options that clash, a model that cannot be found or loaded, a taken port):
    the command prints it as one line, exit 2."""


@dataclass(frozen=True)
class ServeOptions:
    """What to serve and how; the command line's ``key=value`` names are these fields' names."""

    model: str  # a folder exported by a sweep, models:/<name>@<alias>, or s3://bucket/prefix
    name: str | None = None  # None: the registered name <model>-<task>
    adapters: str | None = None  # LoRA adapters on the base model= (sweep/serving/adapter_pool.py serves them)
    port: int = DEFAULT_PORT
    grpc_port: int = DEFAULT_GRPC_PORT
    grpc: bool = True
    batching: bool = True
    max_batch_size: int = 32
    max_latency_ms: float = 0.0
    device: str = "auto"
    threads: int | None = None  # None: the measured default, within the usable CPUs (cpu_budget.py)
    tracking_uri: str | None = None
    cache_dir: str | None = None
    log_requests: bool = True
    generation: str = "continuous"  # continuous | batched: a causal LM's generation (sweep/serving/continuous.py)
    kv_cache_mb: int = 256  # the continuous batch's KV cache
    max_concurrent_sequences: int = 64  # sequences in the continuous batch at once (as many as 64 clients stream)
    stream_interval_ms: float = 10.0  # streamed tokens sent at most this often (sweep/serving/held_outputs.py)
    max_queued: int = 1024  # sequences waiting for a slot; past that, 429
    unstreamed: str = "continuous"  # continuous | batched: unstreamed requests' generation beside the batch
    host: str = DEFAULT_HOST  # the address the HTTP and gRPC servers bind
    max_body_bytes: int | None = None  # None: by the model's kind (body_limit.py)
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S  # 0: none
    max_output_tokens: int | None = None  # a causal LM's most new tokens per request; None: its context's
    api_key: str | None = field(default=None, repr=False)  # None: $SWEEP_API_KEY, else no key (api_key.py)


def host_error(host: str) -> str | None:
    """Why this machine cannot listen on ``host`` (not one of its addresses, a name that resolves to none), or
    None: asked before the model loads, so that the mistake is one line, not uvicorn's traceback after it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
    except OSError as e:
        return (f"host: cannot listen on {host!r} ({e.strerror or e}); 127.0.0.1 (this machine) or 0.0.0.0 (every "
                "interface)")
    return None


def port_taken(port: int, host: str = DEFAULT_HOST) -> bool:
    """Whether something listens on ``port`` of ``host``. gRPC binds with SO_REUSEPORT, so a second server on a
    taken gRPC port would start and silently share its calls with the first: ask before."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT leftovers are no listener
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def build_model(model_dir: Path, name: str, options: ServeOptions) -> Any:
    """The KServe model for the folder: a classifier, or a causal LM that also speaks OpenAI's API."""
    from sweep.serving.decoding_process import DecodingProcess
    from sweep.serving.model_kind import CLASSIFIER, model_kind

    kind = model_kind(model_dir)
    decoding = None
    if kind != CLASSIFIER and options.generation == "continuous":  # first: it loads the model while we import
        decoding = DecodingProcess(model_dir, options.device, options.threads, options.kv_cache_mb,
                                   options.max_concurrent_sequences, options.stream_interval_ms)
    from sweep.serving import server_metrics
    from sweep.serving.engines import Classifier, Generator
    from sweep.serving.kserve_model import ClassifierModel, GeneratorModel

    batcher_options = {
        "enabled": options.batching,
        "max_batch_size": options.max_batch_size,
        "max_latency_ms": options.max_latency_ms,
        "observe_batch": server_metrics.batch_observer(name),
    }
    generator_options = {**batcher_options, "unstreamed_batched": options.unstreamed == "batched"}
    if kind == CLASSIFIER:
        set_server_threads(options.threads, ServerWork.CLASSIFIES)
        return ClassifierModel(name, Classifier(model_dir, options.device), batcher_options)
    engine = Generator(model_dir, options.device, weights=False)
    from sweep.serving.continuous import continuous_batch

    continuous = continuous_batch(engine, decoding, name, options.max_concurrent_sequences, options.max_queued)
    if continuous is None or options.unstreamed == "batched":  # this process generates too
        set_server_threads(options.threads, ServerWork.DECODES)
        engine.load_weights()
    else:
        set_server_threads(options.threads, ServerWork.TOKENIZES)
    try:  # KServe's OpenAI types come from vLLM (kserve's llm extra; the Makefile installs them)
        from sweep.serving.openai_model import OpenAIGeneratorModel
    except ModuleNotFoundError as e:
        logging.getLogger("kserve").warning(
            f"no OpenAI endpoints: KServe's OpenAI support needs {e.name!r} (pip install --no-deps vllm==0.24.0 "
            "and its protocol dependencies: see the Makefile); serving v2 only"
        )
        return GeneratorModel(name, engine, generator_options, continuous)
    return OpenAIGeneratorModel(name, engine, generator_options, continuous)


def bound_output_tokens(models: list[Any], options: ServeOptions) -> None:
    """A causal LM's requests within ``max_output_tokens=`` (a classifier generates nothing)."""
    for model in models:
        if hasattr(model, "max_output_tokens"):
            model.max_output_tokens = options.max_output_tokens


@dataclass(frozen=True)
class Served:
    """What a server serves: its models, and what its start-up line says of them."""

    models: list[Any]
    what: str  # "NAME (kind, DIR)", or "N adapter(s) on DIR (kind): NAME, NAME"
    route_name: str  # the model's name in the routes the line names ("<name>" for several)
    batching: str


Loader = Callable[[], Served]


def serve(options: ServeOptions, find: Callable[[ServeOptions], Loader]) -> None:
    """The one start-up of a server: options checked, models found (``find``), the gRPC port checked, the
    models loaded, one line said, then served until stopped. Every mistake is a ``ServeError``, raised
    before the server starts; the heavier imports come stage by stage, so that a mistake is reported fast."""
    if options.grpc and options.grpc_port == options.port:
        raise ServeError(f"grpc_port: must differ from port (both {options.port}); or grpc=false")
    if (why := host_error(options.host)) is not None:
        raise ServeError(why)
    load = find(options)
    grpc_port = options.grpc_port if options.grpc else None
    if grpc_port and port_taken(grpc_port, options.host):
        raise ServeError(f"grpc_port: port {grpc_port} is in use (another server?); "
                         "choose another grpc_port= or grpc=false")
    from sweep.serving.third_party_logs import quiet_third_party

    quiet_third_party()  # before the model loads: a causal LM's imports bring vLLM's loggers
    served = load()
    guards = guards_for(options, served)
    print(startup_line(served, options, grpc_port, guards), flush=True)
    from sweep.serving.kserve_model import serve as run

    run(served.models, options.port, options.log_requests, grpc_port, options.host, guards)


def guards_for(options: ServeOptions, served: Served) -> Guards:
    """The body limit (by the models' kind unless given), the deadline and the key (the option or the env's)."""
    from sweep.serving.api_key import api_key_from
    from sweep.serving.body_limit import default_max_body_bytes

    max_body = options.max_body_bytes or default_max_body_bytes({m.engine.kind for m in served.models})
    return Guards(max_body, options.request_timeout_s, api_key_from(options.api_key))


def startup_line(served: Served, options: ServeOptions, grpc_port: int | None, guards: Guards) -> str:
    """What is served where, in one line (the routes named from routes.py's table); the key never, only whether
    one is needed."""
    routes = announced(served.route_name, hasattr(served.models[0], "create_completion"))
    grpc = f"gRPC v2 on port {grpc_port}" if grpc_port else "gRPC off"
    return (f"serving {served.what} on port {options.port} of {options.host}: {routes}; {grpc}; {served.batching}; "
            f"{guards.describe()}")


def serve_model(options: ServeOptions) -> None:
    """``sweep serve model=...``: one model, found, loaded and served."""
    serve(options, find_model)


def find_model(options: ServeOptions) -> Loader:
    """The model's folder (downloaded if it must be) and name; what loads it."""
    from sweep.errors import StagingError
    from sweep.serving.model_location import ModelSourceError, published_name, resolve_model_source

    try:
        cache_dir = Path(options.cache_dir).expanduser() if options.cache_dir else Path(default_cache_dir())
        model_dir = resolve_model_source(options.model, cache_dir, options.tracking_uri)
        name = options.name or published_name(model_dir, options.model)
    except (ModelSourceError, StagingError) as e:  # StagingError: an s3:// source (credentials, key, archive)
        raise ServeError(str(e)) from None
    return functools.partial(load_model, model_dir, name, options)


def load_model(model_dir: Path, name: str, options: ServeOptions) -> Served:
    """The loaded model, or a ``ServeError`` saying why it cannot be."""
    from sweep.serving.model_kind import ModelKindError

    try:
        model = build_model(model_dir, name, options)
        bound_output_tokens([model], options)
    except ModelKindError as e:
        raise ServeError(str(e)) from None
    except (OSError, ValueError) as e:  # transformers' way of saying the folder is incomplete or corrupt
        raise ServeError(f"model={options.model}: cannot load the model in {model_dir}: "
                         f"{' '.join(str(e).split())}") from None
    return Served([model], f"{name} ({model.engine.kind}, {model_dir})", name, _batching(model, options))


def _batching(model: Any, options: ServeOptions) -> str:
    batching = (
        f"batching on (up to {options.max_batch_size} texts, waits <= {options.max_latency_ms:g} ms)"
        if options.batching else "batching off"
    )
    continuous = getattr(model, "continuous", None)
    if continuous is None:
        return batching
    unstreamed = "; unstreamed requests: the micro-batcher" if options.unstreamed == "batched" else ""
    return f"{continuous.describe()}{unstreamed}; {batching}"
