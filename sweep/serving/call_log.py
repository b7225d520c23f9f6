"""One log line per gRPC call, as request_log.py per HTTP request: an access line for a call answered OK
(``log_requests=true``), a refused call's ONE WARNING line (kserve_model.py's interceptors write those), and
the WARNING gRPC itself would never write: a request message over ``max_body_bytes``.

gRPC refuses that message itself (RESOURCE_EXHAUSTED, from its length alone, before reading it): the
handler is never called, so no interceptor of a unary call hears of it. ``CallLog`` serves each unary
method as a stream-unary one (the same on the wire: a unary call is one message each way), whose handler
is called at once with the stream of request messages: a call whose stream ends without its one message
was refused by that limit (a unary client always sends one), and is logged here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from grpc import aio

from sweep.serving.request_log import access_logger, server_logger


def call_name(method_name: str, request: Any) -> str:
    """``/inference.GRPCInferenceService/ModelInfer NAME``: the call a log line is about (the model if it names one)."""
    return f"{method_name} {getattr(request, 'model_name', '')}".strip()


class CallLog(aio.ServerInterceptor):
    """The server's outermost interceptor: the access line of an OK call, the WARNING of an over-limit message."""

    def __init__(self, access: bool, max_message_bytes: int) -> None:
        self.access, self.max_message_bytes = access, max_message_bytes

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]],
                                handler_call_details: Any) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:  # KServe's v2 service has only unary calls
            return handler
        unary, method = handler.unary_unary, handler_call_details.method

        async def one_message(requests: AsyncIterator[Any], context: Any) -> Any:
            started = time.perf_counter()
            request = await anext(aiter(requests), None)
            if request is None:  # gRPC answered RESOURCE_EXHAUSTED already (details: the sizes)
                server_logger.warning("RESOURCE_EXHAUSTED %s: request message over the server's max_body_bytes=%d",
                                      method, self.max_message_bytes)
                # The call is over: ended as a cancelled one, gRPC sends nothing more (any other way out, it tries
                # to send a status of its own on the finished call, and logs the failure with a traceback).
                raise asyncio.CancelledError
            answer = await unary(request, context)  # a refusal raises (its WARNING written): no access line
            if self.access:
                access_logger.info("OK %s %.1f ms", call_name(method, request), (time.perf_counter() - started) * 1000)
            return answer

        return grpc.stream_unary_rpc_method_handler(one_message, handler.request_deserializer,
                                                    handler.response_serializer)
