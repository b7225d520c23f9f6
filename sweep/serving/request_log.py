"""One log line per HTTP request: an access line (``log_requests=true``), or a 4xx's ONE WARNING line.

``RequestLog`` is the app's outermost middleware. When a request ends (a stream: when its last chunk is
sent or its client leaves) it writes ``200 POST /v2/models/NAME/infer 12.3 ms`` on ``sweep.access`` (if
access lines are on), or for a 4xx, whatever ``log_requests`` says, ONE WARNING on the server's logger,
``400 POST /v2/models/NAME/infer: <the error body's message>``. Code that refuses a request may have
written that WARNING itself (api_key.py, body_limit.py, a model's 400): a filter on the server's logger
notes it for the request (a context variable: middleware, handlers and a stream's tasks share the
request's context), and the line is not written twice. A 5xx keeps the ERROR (and traceback) its handler
writes, and gets the access line.

This module imports neither kserve nor FastAPI: routes.py builds the app with it.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from contextvars import ContextVar
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Message, Receive, Scope, Send

SERVER_LOGGER = "kserve"  # where the server's WARNING lines go (kserve.logging's logger, as asgi_errors.py's)
ACCESS_LOGGER = "sweep.access"
ACCESS_FORMAT = "%(asctime)s.%(msecs)03d %(process)s %(name)s %(levelname)s %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"  # KServe's, so the server's lines line up
MAX_LOGGED_CHARS = 500  # of a client's error message: a request may be megabytes, its log line may not
MAX_ERROR_BODY = 64 * 1024  # of a 4xx body kept to read its message (an error body is one short JSON line)

server_logger = logging.getLogger(SERVER_LOGGER)
access_logger = logging.getLogger(ACCESS_LOGGER)


def one_line(text: str) -> str:
    """A message as one short log line: its newlines (a client's texts may hold some) folded, cut at the limit."""
    flat = " ".join(text.split())
    return flat if len(flat) <= MAX_LOGGED_CHARS else f"{flat[:MAX_LOGGED_CHARS]}..."


def reason(body: bytes) -> str:
    """An error body's message: v2's ``{"error": "..."}``, OpenAI's ``{"error": {"message": ...}}``, Starlette's
    ``{"detail": ...}`` (an unknown path, a wrong method), else the body as text."""
    try:
        content = json.loads(body)
    except ValueError:
        return one_line(body.decode("utf-8", errors="replace"))
    if isinstance(content, dict):
        error = content.get("error", content.get("detail"))
        if isinstance(error, dict) and "message" in error:
            error = error["message"]
        if error is not None:
            return one_line(error if isinstance(error, str) else json.dumps(error))
    return one_line(json.dumps(content))


@dataclass
class _Request:
    method: str
    path: str
    status: int | None = None  # None until the answer starts (or the app raised before it did: a 500)
    body: bytearray = field(default_factory=bytearray)
    warned: list[str] = field(default_factory=list)  # the server logger's WARNING lines written for it

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


_CURRENT: ContextVar[_Request | None] = ContextVar("sweep_request", default=None)


class _NoteWarnings(logging.Filter):
    """Notes the server logger's WARNINGs on the request being answered; never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        request = _CURRENT.get()
        if request is not None and record.levelno >= logging.WARNING:
            request.warned.append(record.getMessage())
        return True


_NOTE_WARNINGS = _NoteWarnings()


def configure_access_lines() -> None:
    """``sweep.access`` to stderr as KServe's own lines (its logging config names only its and uvicorn's loggers)."""
    if access_logger.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(ACCESS_FORMAT, DATE_FORMAT))
    access_logger.addHandler(handler)
    access_logger.setLevel(logging.INFO)
    access_logger.propagate = False


class RequestLog:
    """ASGI middleware: one line per HTTP request (``access``: the access line of a request that is no 4xx)."""

    def __init__(self, app: ASGIApp, access: bool) -> None:
        self.app, self.access = app, access
        if _NOTE_WARNINGS not in server_logger.filters:
            server_logger.addFilter(_NOTE_WARNINGS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = _Request(scope.get("method", ""), scope.get("path", ""))
        started = time.perf_counter()

        async def noting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                request.status = message["status"]
            elif (message["type"] == "http.response.body" and request.status is not None
                  and 400 <= request.status < 500 and len(request.body) < MAX_ERROR_BODY):
                request.body += message.get("body", b"")
            await send(message)

        token = _CURRENT.set(request)
        try:
            await self.app(scope, receive, noting_send)
        finally:
            _CURRENT.reset(token)
            self._log(request, (time.perf_counter() - started) * 1000)

    def _log(self, request: _Request, ms: float) -> None:
        status = request.status or 500  # the app raised before answering: Starlette answers 500
        if 400 <= status < 500:
            if not any(line.startswith(f"{status} ") for line in request.warned):
                server_logger.warning("%s %s: %s", status, request, reason(bytes(request.body)))
        elif self.access:
            access_logger.info("%s %s %.1f ms", status, request, ms)
