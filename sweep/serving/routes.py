"""Every HTTP route the model server answers, in one table, and the FastAPI app built from it.

The app is our own (``build_app``), made of KServe's public parts (kserve 0.21): its route registrars
(``register_v1_endpoints``, ``register_v2_endpoints``, ``maybe_register_openai_endpoints``), its
``metrics_handler`` and ``DataPlane.live`` and its exception handlers, with ours added by FastAPI's
``add_exception_handler`` and ``add_middleware`` (request_log.py's one line per request outermost). Nothing
of KServe's modules is reassigned. Each ``Family`` is the routes one registrar adds; ``ROUTES`` is all
of them, what the start-up line, the OpenAI error bodies, the docs and the tests read.

This module imports neither kserve nor FastAPI until an app is built: the client reads the table too.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import FastAPI

MODEL = "{model_name}"
VERSION = "{model_version}"
OPENAI_PREFIX = "/openai"  # KServe's default OPENAI_ROUTE_PREFIX (env KSERVE_OPENAI_ROUTE_PREFIX)
OPENAI_PACKAGE = "kserve.protocol.rest.openai"  # KServe's OpenAI model class and routes (it imports vLLM)


@dataclass(frozen=True)
class Route:
    """One route: its method and FastAPI path template (the ``route`` label of ``sweep_http_requests_total``)."""

    method: str
    path: str

    def url(self, model: str, version: str = "1") -> str:
        """The path with the model's name (and a version) filled in."""
        return self.path.replace(MODEL, model).replace(VERSION, version)

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


@dataclass(frozen=True)
class Family:
    """The routes one registrar adds to the app; ``openai_only``: only when an OpenAI model is served."""

    name: str
    routes: tuple[Route, ...]
    openai_only: bool = False


def _get(*paths: str) -> tuple[Route, ...]:
    return tuple(Route("GET", p) for p in paths)


V2_INFER = Route("POST", f"/v2/models/{MODEL}/infer")
V2_MODEL = Route("GET", f"/v2/models/{MODEL}")
V2_LIVE, V2_READY = _get("/v2/health/live", "/v2/health/ready")
V1_MODELS = Route("GET", "/v1/models")
METRICS = Route("GET", "/metrics")
LIVE = Route("GET", "/")  # KServe's DataPlane.live: {"status": "alive"}
OPENAI_COMPLETIONS = Route("POST", f"{OPENAI_PREFIX}/v1/completions")
OPENAI_CHAT = Route("POST", f"{OPENAI_PREFIX}/v1/chat/completions")

ROOT = Family("root", (LIVE, METRICS))
OPENAPI = Family("openapi", _get("/openapi.json"))  # FastAPI's own schema page
V1 = Family("v1", (V1_MODELS, Route("GET", f"/v1/models/{MODEL}"), Route("POST", f"/v1/models/{MODEL}:predict"),
                   Route("POST", f"/v1/models/{MODEL}:explain")))
V2 = Family("v2", (
    *_get("/v2"), V2_LIVE, V2_READY, *_get("/v2/models"), V2_MODEL, *_get(f"/v2/models/{MODEL}/versions/{VERSION}"),
    *_get(f"/v2/models/{MODEL}/ready", f"/v2/models/{MODEL}/versions/{VERSION}/ready"),
    V2_INFER, Route("POST", f"/v2/models/{MODEL}/versions/{VERSION}/infer"),
    Route("POST", f"/v2/repository/models/{MODEL}/load"), Route("POST", f"/v2/repository/models/{MODEL}/unload"),
))
OPENAI = Family("openai", (
    OPENAI_COMPLETIONS, OPENAI_CHAT, Route("POST", f"{OPENAI_PREFIX}/v1/embeddings"),
    Route("POST", f"{OPENAI_PREFIX}/v1/rerank"),
    *_get(f"{OPENAI_PREFIX}/v1/models", f"{OPENAI_PREFIX}/v1/models/{MODEL}"),
), openai_only=True)

FAMILIES = (ROOT, OPENAPI, V1, V2, OPENAI)
ANNOUNCED = (V2_INFER, OPENAI_COMPLETIONS, OPENAI_CHAT, METRICS)  # what the start-up line names
OPENAI_BODY_PATHS = (OPENAI_COMPLETIONS.path, OPENAI_CHAT.path)  # the OpenAI routes whose body we parse
# With an API key (api_key.py) every POST route needs it (inference, v1 predict/explain, repository load/unload);
# the GET routes stay open: probes (health, readiness), metrics, and the metadata clients read before a call.
OPEN_METHODS = frozenset({"GET", "HEAD"})
KEYED = tuple(r for f in FAMILIES for r in f.routes if r.method not in OPEN_METHODS)


def served_routes(openai: bool) -> list[Route]:
    """Every route of a server, with or without an OpenAI model among its models."""
    return [r for f in FAMILIES if openai or not f.openai_only for r in f.routes]


def announced(model: str, openai: bool) -> str:
    """The start-up line's routes: ``POST /v2/models/NAME/infer, ..., GET /metrics``."""
    served = served_routes(openai)
    return ", ".join(f"{r.method} {r.url(model)}" for r in ANNOUNCED if r in served)


def is_openai(path: str) -> bool:
    """Whether a request path is one of the OpenAI routes (whose errors have OpenAI's body)."""
    return path.startswith(f"{OPENAI_PREFIX}/")


def error_body(path: str, status: int, message: str, kind: str) -> dict[str, Any]:
    """The error body of a route's family: OpenAI's error object on its routes, v2's ``{"error": ...}`` elsewhere."""
    if is_openai(path):
        return {"error": {"message": message, "type": kind, "param": None, "code": str(status)}}
    return {"error": message}


Handler = Callable[..., Any]


def register_families(app: FastAPI, dataplane: Any, repository_extension: Any) -> None:
    """Each family's registrar, KServe's own where it has one; OpenAI's adds routes only for OpenAI models."""
    from kserve.protocol.rest.server import metrics_handler
    from kserve.protocol.rest.v1_endpoints import register_v1_endpoints
    from kserve.protocol.rest.v2_endpoints import register_v2_endpoints

    app.add_api_route(LIVE.path, dataplane.live, methods=[LIVE.method])
    app.add_api_route(METRICS.path, metrics_handler, methods=[METRICS.method])
    register_v1_endpoints(app, dataplane, repository_extension)
    register_v2_endpoints(app, dataplane, repository_extension)
    # A model is an OpenAI model only if KServe's OpenAI package was imported (openai_model.py does); asking
    # imports it, and vLLM with it: seconds, and vLLM's start-up lines, for a classifier that has none.
    if OPENAI_PACKAGE in sys.modules:
        from kserve.protocol.rest.openai.config import get_open_ai_models, maybe_register_openai_endpoints

        if get_open_ai_models(dataplane.model_registry):  # ours first: KServe's GET /openai/v1/models/NAME is null
            add_openai_model_routes(app, dataplane.model_registry)
        maybe_register_openai_endpoints(app, dataplane.model_registry)


def add_openai_model_routes(app: FastAPI, model_registry: Any) -> None:
    """``GET /openai/v1/models`` and ``GET /openai/v1/models/{model_name}``, ours, added to the app BEFORE KServe's
    OpenAI routes (the first route to match a request answers it). KServe's model route
    (``OpenAIEndpoints.health``) checks the model and answers 200 with ``null``; ours runs the same check (404 for
    a model nobody serves, 503 for one not ready), then answers the OpenAI model object, the entry the list has for
    it (``id``, ``object: "model"``, ``created``, ``owned_by``). Both are answered by one ``OpenAIEndpoints`` of
    KServe's on the OpenAI models, as ``maybe_register_openai_endpoints`` makes its own: the same list, and the
    same ``created`` in the list and the object. ``register_families`` calls it where a model is an OpenAI model."""
    from kserve.errors import ModelNotFound
    from kserve.model_repository import ModelRepository
    from kserve.protocol.rest.openai.config import get_open_ai_models
    from kserve.protocol.rest.openai.dataplane import OpenAIDataPlane
    from kserve.protocol.rest.openai.endpoints import OpenAIEndpoints

    openai_models = ModelRepository()
    for name, model in get_open_ai_models(model_registry).items():
        openai_models.update(model, name)
    endpoints = OpenAIEndpoints(OpenAIDataPlane(openai_models))

    async def retrieve_model(model_name: str) -> Any:
        await endpoints.health(model_name)  # ModelNotReady, from a ModelNotFound where nobody serves it
        listed = next((m for m in (await endpoints.models()).data if m.id == model_name), None)
        if listed is None:
            raise ModelNotFound(model_name)
        return listed

    # out of the schema: KServe's two routes, added next, describe the same paths
    app.add_api_route(f"{OPENAI_PREFIX}/v1/models", endpoints.models, methods=["GET"], include_in_schema=False)
    app.add_api_route(f"{OPENAI_PREFIX}/v1/models/{MODEL}", retrieve_model, methods=["GET"], include_in_schema=False)


Middleware = tuple[type, Mapping[str, Any]]  # an ASGI middleware class and its keyword arguments


def add_middleware(app: FastAPI, middleware: Sequence[Middleware], log_requests: bool) -> None:
    """The first given outermost; outside them all the request's one log line (request_log.py), there whatever
    ``log_requests`` says: a 4xx's WARNING is always written. (KServe's own timing middleware wrote two more
    lines per request: it is left out.)"""
    from sweep.serving.request_log import RequestLog

    for cls, options in reversed(middleware):  # each added goes outside the ones before
        app.add_middleware(cls, **options)
    app.add_middleware(RequestLog, access=log_requests)


def build_app(dataplane: Any, repository_extension: Any, handlers: Mapping[type[BaseException], Handler],
              middleware: Iterable[Middleware], log_requests: bool) -> FastAPI:
    """The server's app: the table's routes, the exception handlers given, our middleware and the request log."""
    from importlib import metadata

    from fastapi import FastAPI
    from fastapi.responses import ORJSONResponse

    # kserve.model_server's app, with the docs page off. Its ORJSONResponse, which FastAPI deprecates (the warning
    # is filtered: third_party_logs.py), keeps every answer's bytes as before and writes a NaN score as null
    # where FastAPI's default JSONResponse would fail the request with a 500.
    app = FastAPI(title="KServe ModelServer", version=metadata.version("kserve"), docs_url=None, redoc_url=None,
                  default_response_class=ORJSONResponse)
    add_middleware(app, list(middleware), log_requests)
    register_families(app, dataplane, repository_extension)
    for exception, handler in handlers.items():
        app.add_exception_handler(exception, handler)
    return app
