"""An API key (``api_key=`` or ``$SWEEP_API_KEY``): every POST route needs ``Authorization: Bearer <key>``.

Which routes need it is routes.py's ``KEYED`` (every POST: inference, v1 predict/explain, repository
load/unload); GET routes stay open, so probes, metrics and the metadata clients read before a call need no
key. A request for no route of the app (an unknown path: 404; a known path asked with a method it does not
take: 405) gets the app's own answer, the same with or without the key: the routes are public
(``GET /openapi.json``), so that answer reveals nothing, and a 401 there would claim a route that does not
exist. Over gRPC the same holds for the calls that are not metadata or health (kserve_model.py's
interceptor): the key travels as the metadata ``authorization: Bearer <key>``. The key is compared in constant time
(``hmac.compare_digest``) and never logged or echoed: a refusal says whether a key was sent, not which.
"""

from __future__ import annotations

import hmac
import os

from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

from sweep.serving.asgi_errors import logger, send_error, where
from sweep.serving.routes import OPEN_METHODS

API_KEY_ENV = "SWEEP_API_KEY"
# gRPC calls a probe or a client makes before inferring: open, as the GET routes are
OPEN_GRPC_METHODS = frozenset({"ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata"})


def api_key_from(option: str | None) -> str | None:
    """The server's key: the option, else ``$SWEEP_API_KEY``, else None (no key needed)."""
    key = option if option is not None else os.environ.get(API_KEY_ENV)
    return key or None


def refusal(authorization: str | None, key: str) -> str | None:
    """Why an ``Authorization`` value does not carry ``key`` (None: it does), without the values in it."""
    if not authorization:
        return "missing API key: send the header Authorization: Bearer <key>"
    scheme, _, given = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return "malformed Authorization header: expected Bearer <key>"
    if not hmac.compare_digest(given.strip().encode(), key.encode()):
        return "wrong API key"
    return None


def grpc_method_is_open(method_name: str) -> bool:
    """``/inference.GRPCInferenceService/ModelInfer`` -> whether it is open without a key."""
    return method_name.rsplit("/", 1)[-1] in OPEN_GRPC_METHODS


def is_routed(scope: Scope) -> bool:
    """Whether the app (Starlette's ``scope["app"]``) has a route for this request's path AND method; True where
    there is no app to ask (the key is then checked, as before routing)."""
    router = getattr(scope.get("app"), "router", None)
    if router is None:
        return True
    probe = dict(scope)  # what matching notes in a scope (FastAPI's included routers do) stays out of the request's
    return any(route.matches(probe)[0] is Match.FULL for route in router.routes)


class ApiKey:
    """ASGI middleware: 401 (with ``WWW-Authenticate: Bearer``) for a keyed route asked without the key; a
    request for no route goes on to the app's 404 or 405 (asked only once the key is refused: a request with
    the key pays nothing)."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app, self.key = app, key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") in OPEN_METHODS:
            await self.app(scope, receive, send)
            return
        authorization = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"authorization"),
                             None)
        why = refusal(authorization, self.key)
        if why is None or not is_routed(scope):
            await self.app(scope, receive, send)
            return
        logger.warning("401 %s: %s", where(scope), why)
        await send_error(send, scope, 401, why, "AuthenticationError", {"WWW-Authenticate": "Bearer"})
