"""The KServe side of ``python -m sweep serve``: the ``kserve.Model`` subclasses and the ModelServer.

Imported only once the command line is valid: kserve takes seconds to import, and it parses
``sys.argv`` when imported.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sweep.serving.engines import Classifier, Generator
from sweep.serving.kserve_import import import_kserve

kserve = import_kserve()
import uvicorn  # noqa: E402
from fastapi import Request  # noqa: E402 - after kserve, imported with our argv hidden
from fastapi.exceptions import RequestValidationError  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402
from grpc import StatusCode, aio  # noqa: E402
from grpc_interceptor.exceptions import DeadlineExceeded, GrpcException, Unauthenticated  # noqa: E402
from grpc_interceptor.server import AsyncServerInterceptor  # noqa: E402
from kserve.errors import (  # noqa: E402
    InferenceError,
    InvalidInput,
    ModelNotFound,
    ModelNotReady,
    ServerNotLive,
    ServerNotReady,
    UnsupportedProtocol,
    generic_exception_handler,
    inference_error_handler,
    not_implemented_error_handler,
    server_not_live_handler,
    server_not_ready_handler,
    unsupported_protocol_error_handler,
)
from kserve.logging import logger  # noqa: E402
from kserve.protocol.grpc.grpc_predict_v2_pb2_grpc import add_GRPCInferenceServiceServicer_to_server  # noqa: E402
from kserve.protocol.grpc.interceptors import ExceptionToStatusInterceptor  # noqa: E402
from kserve.protocol.grpc.servicer import InferenceServicer  # noqa: E402
from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse, to_http_parameters  # noqa: E402

from sweep.serving import server_metrics  # noqa: E402
from sweep.serving.admission import Overloaded  # noqa: E402
from sweep.serving.api_key import grpc_method_is_open, refusal  # noqa: E402
from sweep.serving.batcher import Batched, MicroBatcher  # noqa: E402
from sweep.serving.call_log import CallLog, call_name  # noqa: E402
from sweep.serving.continuous import ContinuousBatch  # noqa: E402
from sweep.serving.cpu_budget import freeze_startup_objects  # noqa: E402
from sweep.serving.decoding_process import DecodingGone  # noqa: E402
from sweep.serving.guards import Guards  # noqa: E402
from sweep.serving.protocol import (  # noqa: E402
    STOP,
    TEXT,
    TEXT_PAIR,
    RequestError,
    Tensor,
    check_context,
    classification_outputs,
    generation_outputs,
    parameters_from_grpc,
    parse_classify,
    parse_generate,
)
from sweep.serving.request_log import configure_access_lines, one_line  # noqa: E402
from sweep.serving.routes import Handler, build_app, error_body  # noqa: E402


def _tensor(infer_input: Any) -> Tensor:
    """Our view of a request input; binary-encoded tensors (the v2 binary extension) are decoded."""
    data = infer_input.data
    # Binary data: REST's binary extension, or gRPC's raw_input_contents (data is then an empty
    # list); KServe keeps those bytes in _raw_data, which only as_numpy() reads.
    if data is None or getattr(infer_input, "_raw_data", None) is not None:
        try:
            data = infer_input.as_numpy().tolist()
        except Exception as e:  # noqa: BLE001 - any decoding failure is the client's payload
            raise InvalidInput(f"input {infer_input.name!r}: cannot decode its binary data: {e}") from None
    return Tensor(infer_input.name, list(infer_input.shape or []), infer_input.datatype, data)


def _io_spec(name: str, datatype: str, shape: Sequence[int]) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": list(shape)}


class BatchedTextModel(kserve.Model):
    """A KServe model whose predict decodes the request, batches it with others, encodes the answer."""

    def __init__(self, name: str, batcher: MicroBatcher[Any, Any]) -> None:
        super().__init__(name)
        self.batcher = batcher

    def load(self) -> bool:  # the engine is loaded before the server starts
        self.ready = True
        return self.ready

    def stop(self) -> None:
        self.batcher.close()
        super().stop()

    def why_not_ready(self) -> str | None:
        """Why the model cannot answer though it loaded (the 503 says it), or None."""
        return None

    def exception_handlers(self) -> dict[type[BaseException], Handler]:
        """The app's handlers this model needs beyond the v2 ones (``exception_handlers`` below)."""
        return {}

    def parse(self, inputs: list[Tensor], parameters: Mapping[str, Any] | None) -> tuple[Hashable | None, list[Any]]:
        raise NotImplementedError

    def encode(self, results: list[Any]) -> list[Tensor]:
        raise NotImplementedError

    async def submit(self, key: Hashable | None, items: list[Any], from_grpc: bool) -> Batched[Any]:
        return await self.batcher.submit(key, items)

    async def predict(self, payload: InferRequest, headers: dict[str, str] | None = None) -> InferResponse:
        if not isinstance(payload, InferRequest):  # a v1 body: this server speaks v2
            raise InvalidInput(f"use the v2 protocol: POST /v2/models/{self.name}/infer")
        parameters = payload.parameters
        if payload.from_grpc and parameters:  # InferParameter messages -> the values REST would carry
            parameters = parameters_from_grpc(to_http_parameters(parameters))
        try:
            key, items = self.parse([_tensor(i) for i in payload.inputs], parameters)
        except RequestError as e:
            raise InvalidInput(str(e)) from None
        batched = await self.submit(key, items, payload.from_grpc)
        outputs = [InferOutput(t.name, t.shape, t.datatype, t.data) for t in self.encode(batched.results)]
        return InferResponse(
            response_id=payload.id or str(uuid.uuid4()),
            model_name=self.name,
            infer_outputs=outputs,
            parameters={"batch_size": batched.batch_size},  # texts that shared the forward pass
            use_binary_outputs=payload.use_binary_outputs,
        )


class ClassifierModel(BatchedTextModel):
    def __init__(self, name: str, engine: Classifier, batcher_options: Mapping[str, Any]) -> None:
        super().__init__(name, MicroBatcher(engine.classify, **batcher_options))
        self.engine = engine

    def parse(self, inputs: list[Tensor], parameters: Mapping[str, Any] | None) -> tuple[Hashable | None, list[Any]]:
        request = parse_classify(inputs, parameters, self.engine.inputs)
        return request.batch_key, request.items

    def encode(self, results: list[Any]) -> list[Tensor]:
        return classification_outputs(results)

    def get_input_types(self) -> list[dict[str, Any]]:
        names = self.engine.inputs.names if self.engine.inputs is not None else (TEXT, TEXT_PAIR)
        return [_io_spec(name, "BYTES", [-1]) for name in names]

    def get_output_types(self) -> list[dict[str, Any]]:
        outputs = [_io_spec("score", "FP32", [-1])]
        if not self.engine.regression:
            outputs.insert(0, _io_spec("label", "BYTES", [-1]))
        return outputs


class GeneratorModel(BatchedTextModel):
    max_output_tokens: int | None = None  # the server's max_output_tokens= (None: what the context allows)

    def __init__(self, name: str, engine: Generator, batcher_options: Mapping[str, Any],
                 continuous: ContinuousBatch | None = None) -> None:
        def run_batch(_key: Hashable | None, items: list[tuple[str, Any]]) -> list[Any]:
            completions = engine.generate(items[0][1], [prompt for prompt, _ in items])  # one key: one params
            server_metrics.count_tokens(name, [c.prompt_tokens for c in completions],
                                        [c.completion_tokens for c in completions])
            return completions

        super().__init__(name, MicroBatcher(run_batch, **{k: v for k, v in batcher_options.items()
                                                          if k != "unstreamed_batched"}))
        self.engine = engine
        self.continuous = continuous  # None: generation=batched (the micro-batcher)
        self.unstreamed_batched = bool(batcher_options.get("unstreamed_batched"))

    def stop(self) -> None:
        if self.continuous is not None:
            self.continuous.close()
        super().stop()

    async def healthy(self) -> bool:
        """Not ready once the decoding process is gone: a readiness probe takes the pod out of service."""
        return self.ready and self.why_not_ready() is None

    def why_not_ready(self) -> str | None:
        gone = self.continuous.gone if self.continuous is not None else None
        return str(gone) if gone is not None else None

    async def submit(self, key: Hashable | None, items: list[Any], from_grpc: bool) -> Batched[Any]:
        if self.continuous is None:
            return await self.batcher.submit(key, items)
        sharing = self.continuous.sharing(len(items))
        try:
            if self.unstreamed_batched and not items[0][1].seeded:  # whole-batch generates, under the same bounds
                return await self.continuous.admitted(len(items), lambda: self.batcher.submit(key, items))
            results = await self.continuous.generate(items[0][1], [prompt for prompt, _ in items])
        except Overloaded as e:
            if from_grpc:
                from grpc_interceptor.exceptions import ResourceExhausted

                raise ResourceExhausted(str(e)) from None
            raise
        except DecodingGone as e:
            if from_grpc:  # KServe's interceptor would answer any other exception with a bare INTERNAL
                from grpc_interceptor.exceptions import Unavailable

                raise Unavailable(str(e)) from None
            raise  # 503, from not_ready
        except RequestError as e:
            raise InvalidInput(str(e)) from None
        return Batched(results, sharing)

    def parse(self, inputs: list[Tensor], parameters: Mapping[str, Any] | None) -> tuple[Hashable | None, list[Any]]:
        request = parse_generate(inputs, parameters, self.engine.context_length, self.max_output_tokens)
        check_context(self.engine.count_tokens(request.prompts), request.params.max_new_tokens,
                      self.engine.context_length)
        return request.params.batch_key, [(prompt, request.params) for prompt in request.prompts]

    def encode(self, results: list[Any]) -> list[Tensor]:
        return generation_outputs(results)

    def get_input_types(self) -> list[dict[str, Any]]:
        return [_io_spec(TEXT, "BYTES", [-1]), _io_spec(STOP, "BYTES", [-1])]

    def get_output_types(self) -> list[dict[str, Any]]:
        return [
            _io_spec("text", "BYTES", [-1]),
            _io_spec("prompt_tokens", "INT32", [-1]),
            _io_spec("completion_tokens", "INT32", [-1]),
            _io_spec("finish_reason", "BYTES", [-1]),
        ]


def validation_problems(exc: RequestValidationError) -> str:
    """FastAPI's list of what is wrong with a body, as one line."""
    problems = []
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        if loc and loc[0] == "bytes":  # the raw-bytes branch of the endpoint's body type: not what was meant
            continue
        if err.get("type") == "json_invalid":
            where = f"; character {loc[-1]}" if loc else ""
            problems.append(f"the body is not valid JSON ({err.get('ctx', {}).get('error', 'decode error')}{where})")
            continue
        where = ".".join(loc[1:] if loc and loc[0] == "InferenceRequest" else loc) or "the body"
        problems.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(problems)


async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI answers a body that is not JSON, or not a v2 request, with 422 and a list; v2 says 400 + error.
    (The OpenAI model puts its own handler, with OpenAI's error body, in front of this one.)"""
    message = validation_problems(exc) or "not a v2 inference request"
    return JSONResponse(status_code=400, content={"error": f"malformed request: {message}"})


def _error(request: Request, status: int, message: str, kind: str,
           headers: Mapping[str, str] | None = None) -> JSONResponse:
    """An error answer: OpenAI's error body on its routes, v2's elsewhere."""
    return JSONResponse(status_code=status, content=error_body(request.url.path, status, message, kind),
                        headers=headers)


async def overloaded(request: Request, exc: Overloaded) -> JSONResponse:
    """429 + ``Retry-After``."""
    return _error(request, 429, str(exc), "RateLimitError", {"Retry-After": str(exc.retry_after_s)})


async def not_ready(request: Request, exc: ModelNotReady | DecodingGone) -> JSONResponse:
    """503, saying why where the model knows: KServe's own "not ready" names the model only, and a
    request the decoding process took along when it exited says what happened but not to whom."""
    if isinstance(exc.__cause__, ModelNotFound):  # KServe's OpenAI model route (``GET /openai/v1/models/NAME``)
        return await _unknown_model(request, exc.__cause__)  # wraps a miss in "not ready": the 404 it is
    model = _SERVED.get(getattr(exc, "model_name", ""))
    why = model.why_not_ready() if model is not None else None
    message = f"{exc} {why}" if why and why not in str(exc) else str(exc)
    return _error(request, 503, message, "ServiceUnavailableError")


def log_client_error(status: str, where: str, exc: BaseException) -> None:
    """A client's mistake (400, gRPC INVALID_ARGUMENT) is one WARNING line; its traceback only at DEBUG: the
    server did nothing wrong (KServe's own handlers log an ERROR with the whole traceback). Over HTTP this line
    is the request's one line (request_log.py writes no other)."""
    logger.warning("%s %s: %s", status, where, one_line(str(exc)))
    logger.debug("the traceback of that %s", status, exc_info=exc)


async def bad_request(request: Request, exc: InvalidInput) -> JSONResponse:
    """KServe's 400 (the same body), logged as one line."""
    log_client_error("400", f"{request.method} {request.url.path}", exc)
    return JSONResponse(status_code=400, content={"error": str(exc)})


class ClientErrorsInOneLine(ExceptionToStatusInterceptor):
    """KServe's gRPC exception interceptor, but a call refused on purpose is ONE WARNING line, as over REST: a bad
    request (INVALID_ARGUMENT), an unknown model (NOT_FOUND; KServe logs an ERROR and its traceback), and the
    statuses our code raises (the key's UNAUTHENTICATED, the deadline's DEADLINE_EXCEEDED, a full queue's
    RESOURCE_EXHAUSTED, a decoding process gone: UNAVAILABLE)."""

    async def handle_exception(self, ex: Exception, request_or_iterator: Any, context: Any, method_name: str) -> None:
        where = call_name(method_name, request_or_iterator)
        if isinstance(ex, InvalidInput | ModelNotFound):
            status = StatusCode.INVALID_ARGUMENT if isinstance(ex, InvalidInput) else StatusCode.NOT_FOUND
            log_client_error(status.name, where, ex)
            await context.abort(status, ex.reason)
        if isinstance(ex, GrpcException):
            log_client_error(ex.status_code.name, where, RuntimeError(ex.details))
        await super().handle_exception(ex, request_or_iterator, context, method_name)


class KeyRequired(AsyncServerInterceptor):
    """The API key over gRPC: every call but health and metadata (api_key.py) needs the metadata
    ``authorization: Bearer <key>``; without it UNAUTHENTICATED (its one WARNING line, never the key, written by
    ``ClientErrorsInOneLine`` around it)."""

    def __init__(self, key: str) -> None:
        self.key = key

    async def intercept(self, method: Callable[..., Any], request_or_iterator: Any, context: Any,
                        method_name: str) -> Any:
        if not grpc_method_is_open(method_name):
            metadata = dict(context.invocation_metadata() or ())
            why = refusal(metadata.get("authorization"), self.key)
            if why is not None:
                raise Unauthenticated(why)
        answer = method(request_or_iterator, context)
        return answer if hasattr(answer, "__aiter__") else await answer  # a streaming call's iterator as it is


class CallDeadline(AsyncServerInterceptor):
    """``request_timeout_s`` over gRPC: a call past it is cancelled (a sequence leaves the batch) and answered
    DEADLINE_EXCEEDED, with one WARNING line (``ClientErrorsInOneLine``'s), as HTTP's 504 (deadline.py). A client's
    own shorter deadline cancels it sooner, as gRPC does."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    async def intercept(self, method: Callable[..., Any], request_or_iterator: Any, context: Any,
                        method_name: str) -> Any:
        answer = method(request_or_iterator, context)
        if hasattr(answer, "__aiter__"):  # a streaming call (KServe's v2 service has none): no deadline
            return answer
        deadline = asyncio.timeout(self.seconds)
        try:
            async with deadline:
                return await answer
        except TimeoutError:
            if not deadline.expired():  # the call's own TimeoutError, not the deadline
                raise
            message = f"the call took longer than the server's request_timeout_s={self.seconds:g}; abandoned"
            raise DeadlineExceeded(message) from None


class UnknownModel(ModelNotFound):
    """KServe's "Model with name X does not exist.", naming the models served (a 404; gRPC NOT_FOUND)."""

    def __init__(self, name: str, served: Sequence[str]) -> None:
        super().__init__(name)
        self.reason = f"{self.reason} Served here: {', '.join(sorted(served))}."


class ServedModels(kserve.ModelRepository):
    """KServe's model registry, whose miss says what is served (the v2 REST and gRPC routes ask it)."""

    def get_model(self, name: str) -> Any:
        model = super().get_model(name)
        if model is None:
            raise UnknownModel(name, list(self.get_models()))
        return model


async def _unknown_model(request: Request, exc: ModelNotFound) -> JSONResponse:
    """The 404 of a model nobody serves. The OpenAI routes ask a registry of their own (not ``ServedModels``):
    their miss is KServe's plain one, named here."""
    served = "" if isinstance(exc, UnknownModel) else f" Served here: {', '.join(sorted(_SERVED))}."
    return JSONResponse(status_code=404, content={"error": f"{exc}{served}"})


_SERVED: dict[str, BatchedTextModel] = {}  # the models serve() registered, by name


def exception_handlers(models: Sequence[BatchedTextModel]) -> dict[type[BaseException], Handler]:
    """The handlers kserve 0.21's RESTServer adds, four of them ours, and whatever the models add (OpenAI's)."""
    handlers: dict[type[BaseException], Handler] = {
        InvalidInput: bad_request, InferenceError: inference_error_handler, ModelNotFound: _unknown_model,
        ModelNotReady: not_ready, NotImplementedError: not_implemented_error_handler,
        UnsupportedProtocol: unsupported_protocol_error_handler, ServerNotLive: server_not_live_handler,
        ServerNotReady: server_not_ready_handler, Exception: generic_exception_handler,
        RequestValidationError: validation_error, Overloaded: overloaded, DecodingGone: not_ready,
    }
    for model in models:
        handlers.update(model.exception_handlers())
    return handlers


def grpc_server(server: Any, port: int, log_requests: bool, host: str, guards: Guards) -> aio.Server:
    """KServe's v2 gRPC service (its ``InferenceServicer``) on a server of ours: our interceptors passed to it
    (the call's one log line outermost, then the key and the deadline inside the one that turns their refusals
    into statuses). A message over ``max_body_bytes`` is gRPC's own RESOURCE_EXHAUSTED (call_log.py logs it)."""
    options = vars(kserve.model_server.args)
    interceptors: list[Any] = [CallLog(log_requests, guards.max_body_bytes), ClientErrorsInOneLine()]
    if guards.api_key:
        interceptors.append(KeyRequired(guards.api_key))
    if guards.request_timeout_s:
        interceptors.append(CallDeadline(guards.request_timeout_s))
    grpc = aio.server(ThreadPoolExecutor(max_workers=server.max_threads), interceptors=interceptors,
                      options=[("grpc.max_send_message_length", options.get("grpc_max_send_message_length")),
                               ("grpc.max_receive_message_length", guards.max_body_bytes)])
    add_GRPCInferenceServiceServicer_to_server(InferenceServicer(server.dataplane, server.model_repository_extension),
                                               grpc)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    grpc.add_insecure_port(address)
    logger.info("gRPC server on %s", address)
    return grpc


async def _run(rest: uvicorn.Server, grpc_factory: Callable[[], aio.Server] | None, grace_s: float) -> None:
    """gRPC (made here: it binds to the running loop), then REST until SIGINT/SIGTERM (uvicorn catches
    them), then gRPC stopped."""
    grpc = grpc_factory() if grpc_factory is not None else None
    if grpc is not None:
        await grpc.start()
    try:
        await rest.serve()
    finally:
        if grpc is not None:
            await grpc.stop(grace=grace_s)


def _register(server: Any, models: Sequence[BatchedTextModel]) -> None:
    """The models loaded, in KServe's registry, started (what ``ModelServer.start`` does first, kserve 0.21)."""
    for model in models:
        model.load()
        server.register_model(model)
        model.enable_latency_logging = False  # a kserve.trace line per request: the access line has the time
        model.start()


def serve(models: Sequence[BatchedTextModel], port: int, log_requests: bool, grpc_port: int | None, host: str,
          guards: Guards) -> None:
    """Run the models until SIGINT/SIGTERM: our app (routes.py) on ``host:port``, KServe's v2 gRPC service on
    ``host:grpc_port`` unless it is None, both behind ``guards``; KServe's ModelServer holds the models, its data
    plane answers."""
    _SERVED.clear()
    _SERVED.update({m.name: m for m in models})
    server = kserve.ModelServer(http_port=port, grpc_port=grpc_port or 0, enable_grpc=grpc_port is not None,
                                enable_latency_logging=False, workers=1, registered_models=ServedModels())
    configure_access_lines()  # one line per request (request_log.py, call_log.py), not uvicorn's nor KServe's
    _register(server, models)
    # sweep_http_* on GET /metrics outside the guards: their 401, 413 and 504 are counted too
    middleware = [(server_metrics.RequestMetrics, {}), *guards.middleware()]
    app = build_app(server.dataplane, server.model_repository_extension, exception_handlers(models), middleware,
                    log_requests)
    rest = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False,
                                         timeout_graceful_shutdown=server.grace_period,
                                         timeout_keep_alive=server.timeout_keep_alive, loop=server.event_loop))
    grpc = (functools.partial(grpc_server, server, grpc_port, log_requests, host, guards)
            if grpc_port is not None else None)
    freeze_startup_objects()
    server.setup_event_loop()
    server.register_signal_handler()  # after uvicorn's exit: KServe's stop, which unloads (stops) the models
    asyncio.run(_run(rest, grpc, server.grace_period))
