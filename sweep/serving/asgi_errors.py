"""An error answered by one of our ASGI middlewares (api_key.py, body_limit.py, deadline.py) before or instead
of the app: one JSON line in the route family's error body (routes.py ``error_body``) and ONE WARNING line
naming the reason, the way the app's own handlers answer a client's mistake (kserve_model.py)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

from starlette.types import Scope, Send

logger = logging.getLogger("kserve")  # the server's logger (kserve.logging's), without importing kserve


def where(scope: Scope) -> str:
    """``POST /v2/models/NAME/infer``: the request a log line is about (never its headers or body)."""
    return f"{scope.get('method', '')} {scope.get('path', '')}"


async def send_error(send: Send, scope: Scope, status: int, message: str, kind: str,
                     headers: Mapping[str, str] | None = None) -> None:
    """The whole answer: status, headers, the family's error body (the WARNING line is the caller's)."""
    from sweep.serving.routes import error_body

    body = json.dumps(error_body(scope.get("path", ""), status, message, kind)).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})
