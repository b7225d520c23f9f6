"""python -m sweep.serve model=<best-model folder | models:/<name>@champion | s3://bucket/prefix> [port=8080] ...

A KServe ``ModelServer`` (the runtime KServe runs for custom predictors) serving one fine-tuned
model over the Open Inference Protocol v2 REST API: ``/v2/health/live``, ``/v2/health/ready``,
``/v2/models/{name}``, ``/v2/models/{name}/ready``, ``/v2/models/{name}/infer`` (and
``GET /v1/models``). A classifier answers labels and scores for texts or text pairs; a causal LM
answers completions with token counts. ``python -m sweep.serve --help`` lists the options.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

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
OPTIONS: dict[str, Option] = {
    "model": Option(non_empty, None, "a folder exported by a sweep (best/<TASK>/), models:/<name>@<alias>, or s3://bucket/prefix", required=True),
    "name": Option(non_empty, None, "name the model is published under (default: its registered name <model>-<task>)"),
    "port": Option(port_number, DEFAULT_PORT, "HTTP port"),
    "batching": Option(as_bool, True, "merge concurrent requests into one forward pass"),
    "max_batch_size": Option(positive_int, 32, "most texts in one forward pass"),
    "max_latency_ms": Option(non_negative_float, 0.0, "longest an idle server holds a request back for others to join it "
                             "(0: never; requests that arrive during a forward pass share the next one anyway)"),
    "device": Option(non_empty, "auto", "cpu, cuda, cuda:N, or auto (a GPU when there is one)"),
    "threads": Option(positive_int, None, "torch CPU threads (default: torch's, one per core of the machine; "
                      "set the pod's CPU limit: more threads than free cores make every pass far slower)"),
    "tracking_uri": Option(non_empty, None, "MLflow tracking URI for models:/ (default: $MLFLOW_TRACKING_URI, else MLflow's default)"),
    "cache_dir": Option(non_empty, None, "where registry and S3 copies are kept (default: $SWEEP_CACHE_DIR or ~/.cache/sweep)"),
    "log_requests": Option(as_bool, True, "log a line per request (access and timing logs)"),
}


def _default_cache_dir() -> Path:
    return Path(os.environ.get("SWEEP_CACHE_DIR") or Path.home() / ".cache" / "sweep")


def _fail(message: object) -> None:
    """A user's mistake: one line, no traceback, exit status 2 (as the main CLI)."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help", "help") for a in args):
        print(usage("python -m sweep.serve", OPTIONS))
        return
    try:
        options = parse_key_values(args, OPTIONS)
    except UsageError as e:
        _fail(e)
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
    from sweep.serving.kserve_model import build_model, serve

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
    print(
        f"serving {name} ({model.engine.kind}, {model_dir}) on port {options['port']}: "
        f"POST /v2/models/{name}/infer; {batching}",
        flush=True,
    )
    serve(model, options["port"], options["log_requests"])


if __name__ == "__main__":
    main()
