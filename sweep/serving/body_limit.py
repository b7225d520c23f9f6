"""At most ``max_body_bytes`` of request body: past that, 413 before the body is read.

A declared ``Content-Length`` over the limit is refused from the headers alone; a chunked body is counted
as it arrives and refused at the first chunk past the limit. Either way the 413 carries ``Connection: close``:
the server stops reading that connection (the rest of the body is never read), and the client's next request
opens a new one. A body within the limit is read here whole and handed to the app as one message (every
route of the server reads its body whole anyway), so the app never sees a body over the limit.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sweep.serving.asgi_errors import logger, send_error, where
from sweep.serving.model_kind import CAUSAL_LM, CLASSIFIER

MIB = 1024 * 1024
# A classifier's request is texts it cuts at its context (a few KB each): 8 MiB is thousands of long ones,
# and KServe's own gRPC message limit, so REST and gRPC take the same requests and gRPC refuses nothing it
# took before. A causal LM's prompts (and chat histories, JSON-escaped) may fill a long context several
# times over in one request: twice that (docs/serving.md: Limits).
DEFAULT_MAX_BODY_BYTES = {CLASSIFIER: 8 * MIB, CAUSAL_LM: 16 * MIB}


def default_max_body_bytes(kinds: set[str]) -> int:
    """The default for a server of these model kinds: the largest of theirs."""
    return max(DEFAULT_MAX_BODY_BYTES.get(kind, DEFAULT_MAX_BODY_BYTES[CAUSAL_LM]) for kind in kinds)


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the HTTP parser refuses it before we are asked; count what arrives
    return None


class BodyLimit:
    """ASGI middleware: 413 for a request body over ``max_bytes`` (declared, or counted while it arrives)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _declared_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(scope, send, f"request body of {declared} bytes")
            return
        chunks: list[bytes] = []
        received = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client left before its body ended: nobody to answer
                return
            chunk = message.get("body", b"")
            received += len(chunk)
            if received > self.max_bytes:
                await self._refuse(scope, send, f"chunked request body past {self.max_bytes} bytes")
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        whole: Message | None = {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        async def replay() -> Message:
            nonlocal whole
            if whole is not None:
                message, whole = whole, None
                return message
            return await receive()  # then the real channel: a streaming answer listens for the client leaving

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, send: Send, what: str) -> None:
        message = f"{what}: too large for the server's max_body_bytes={self.max_bytes}"
        logger.warning("413 %s: %s", where(scope), message)
        await send_error(send, scope, 413, message, "RequestTooLargeError", {"Connection": "close"})
