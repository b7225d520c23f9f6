"""Every HTTP request within ``request_timeout_s``: past it, 504 and the work abandoned.

The request's handler is cancelled at the deadline (``asyncio.timeout``): a sequence in the continuous batch
leaves it and frees its slot (continuous.py's ``finally``), a stream's generator ends the same way; a forward
pass already running on the micro-batcher's thread finishes, its answer dropped. A response not yet started
gets a 504 in the family's error body; a stream already under way (its 200 sent) gets an error event and
``[DONE]`` (OpenAI's server-sent events), then ends. One WARNING line either way.
"""

from __future__ import annotations

import asyncio
import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sweep.serving.asgi_errors import logger, send_error, where
from sweep.serving.routes import error_body

# Knative's (so KServe's serverless) default request timeout: the server gives up when the platform in front
# of it would, instead of decoding for a client that has been told 504 already. 0: no deadline.
DEFAULT_REQUEST_TIMEOUT_S = 300.0


class Deadline:
    """ASGI middleware: cancel a request's handling after ``seconds``, answering 504 (or ending its stream)."""

    def __init__(self, app: ASGIApp, seconds: float) -> None:
        self.app, self.seconds = app, seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.seconds:
            await self.app(scope, receive, send)
            return
        started = ended = False
        event_stream = False

        async def noting_send(message: Message) -> None:
            nonlocal started, ended, event_stream
            if message["type"] == "http.response.start":
                started = True
                event_stream = any(k == b"content-type" and v.startswith(b"text/event-stream")
                                   for k, v in message.get("headers", ()))
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                ended = True
            await send(message)

        deadline = asyncio.timeout(self.seconds)
        try:
            async with deadline:
                await self.app(scope, receive, noting_send)
        except TimeoutError:
            if not deadline.expired():  # the handler's own TimeoutError, not ours: a failure like any other
                raise
            if ended:  # the answer went out whole just before the deadline
                return
            message = f"the request took longer than the server's request_timeout_s={self.seconds:g}; abandoned"
            logger.warning("504 %s: %s", where(scope), message)
            if not started:
                await send_error(send, scope, 504, message, "TimeoutError")
                return
            tail = b""
            if event_stream:  # the 200 is sent: the error travels as an event, as a failed stream's does
                error = json.dumps(error_body(scope.get("path", ""), 504, message, "TimeoutError"))
                tail = f"data: {error}\n\ndata: [DONE]\n\n".encode()
            await send({"type": "http.response.body", "body": tail, "more_body": False})
