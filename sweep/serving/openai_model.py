"""OpenAI-compatible completions for a causal LM, through KServe's own OpenAI support.

``OpenAIGeneratorModel`` is both the v2 ``GeneratorModel`` (a ``kserve.Model``) and KServe's
``OpenAIGenerativeModel``: ONE object, registered once under the model's name. KServe's
``ModelServer`` serves it over v2 (``/v2/models/NAME/infer``) because it is an ``InferenceModel``,
and, because it is an ``OpenAIModel``, adds KServe's OpenAI routes to the same app:
``POST /openai/v1/completions``, ``POST /openai/v1/chat/completions`` and ``GET /openai/v1/models``
(``kserve.protocol.rest.openai.config.maybe_register_openai_endpoints``). A classifier is never an
``OpenAIModel``, so its server has no OpenAI routes at all (404).

KServe 0.21 takes its OpenAI types from vLLM (its ``llm`` extra): this module imports only where
vLLM's protocol modules import. Nothing of vLLM's engine runs: generation is the server's own
``Generator``, the same as v2.

- Not streamed: the prompts (``n`` copies of each) go through the same ``MicroBatcher`` with the
  same batch keys as v2 requests, so they share forward passes with v2 and OpenAI requests alike;
  the ``X-Batch-Size`` response header says how many texts shared the pass.
- Streamed (``stream: true``): one ``generate`` call of its own on the batcher's forward thread
  (``MicroBatcher.run_alone``: no waiting for a batch to form), sending each row's text as
  Server-Sent Events after every decoding step (``engines.RowTextStreamer``). What it sends is the
  part of the text no later token can change (``generation.streamable_text``); the last chunk of
  each choice carries the rest of the text ``finish_completion`` makes of the row, and its
  ``finish_reason``: so a stream's text, token counts and finish reasons are exactly the v2 ones.
- With ``generation=continuous`` (sweep/serving/continuous.py) both go to the running batch instead,
  each row its own sequence: a stream is admitted before its 200 (or refused with a 429), and its
  generator's ``finally`` cancels its sequences when the client leaves.
- A client that disconnects mid-stream: Starlette cancels the response's iteration, the generator's
  ``finally`` sets the request's ``cancelled`` event, and ``StopWhenCancelled`` ends ``generate``
  at its next step, freeing the forward thread for the next request.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import threading
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Sequence
from http import HTTPStatus
from typing import Any

# vLLM would give its loggers a handler of their own at import and log INFO lines there (its engine's
# "Triton not installed" above the server's startup line): leave its records to KServe's logging.
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")

from fastapi import Request  # noqa: E402
from fastapi.exceptions import RequestValidationError  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402
from kserve.errors import ModelNotFound, generic_exception_handler  # noqa: E402
from kserve.logging import logger  # noqa: E402
from kserve.protocol.rest.openai import OpenAIGenerativeModel  # noqa: E402
from kserve.protocol.rest.openai.errors import create_error_response  # noqa: E402
from kserve.protocol.rest.openai.types import (  # noqa: E402
    ChatCompletion,
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    ChoiceDelta,
    ChunkChoice,
    Completion,
    CompletionChoice,
    CompletionChunk,
    CompletionChunkChoice,
    CompletionRequest,
    ErrorResponse,
    UsageInfo,
)

from sweep.serving import server_metrics  # noqa: E402
from sweep.serving.batcher import Batched  # noqa: E402
from sweep.serving.continuous import Stream  # noqa: E402
from sweep.serving.kserve_model import (  # noqa: E402
    GeneratorModel,
    exception_handlers as server_exception_handlers,
    log_client_error,
    validation_error,
    validation_problems,
)
from sweep.serving.openai_protocol import OpenAIJob, chat_messages, completion_prompts, openai_job  # noqa: E402
from sweep.serving.protocol import (
    Completion as Generated,  # noqa: E402
    RequestError,  # noqa: E402
)
from sweep.serving.routes import OPENAI_CHAT, OPENAI_COMPLETIONS, OPENAI_PREFIX, Handler, is_openai  # noqa: E402

BATCH_SIZE_HEADER = "X-Batch-Size"
OPENAI_MODELS_PATH = f"{OPENAI_PREFIX}/v1/models"  # GET: the served models (routes.py's OPENAI family)


def error_response(message: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST, param: str = "") -> ErrorResponse:
    """KServe's OpenAI error body: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = "BadRequestError" if status == HTTPStatus.BAD_REQUEST else "InternalServerError"
    return create_error_response(message, err_type=kind, param=param, status_code=status)


def _refused(message: str, chat: bool) -> ErrorResponse:
    """A request the model refuses (400), logged as one WARNING line as a v2 route's 400 is."""
    route = OPENAI_CHAT if chat else OPENAI_COMPLETIONS
    log_client_error("400", str(route), RequestError(message))
    return error_response(message)


def validation_error_response(message: str) -> JSONResponse:
    """A body FastAPI could not parse into the request type, in OpenAI's error shape."""
    return JSONResponse(status_code=400, content=error_response(message).model_dump())


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """OpenAI's error body on the OpenAI routes; the v2 one (``kserve_model.validation_error``) elsewhere."""
    if is_openai(request.url.path):
        return validation_error_response(f"malformed request: {validation_problems(exc) or 'not a JSON object'}")
    return await validation_error(request, exc)


def _raised_reading_the_body(exc: BaseException) -> bool:
    """Whether FastAPI was still parsing the request body when ``exc`` was raised, or pydantic validating it
    (KServe's embeddings and rerank routes validate theirs in the handler: ``EmbeddingRequestAdapter``).

    vLLM's request validators read the body with ``data.get(...)`` before pydantic checks its type,
    so a JSON array or string body raises AttributeError (and a wrong-typed field may raise
    TypeError) instead of a validation error: the client's mistake all the same. (An embeddings body
    that pydantic first matches to one request type, then hands to another's validator, raised
    ``'EmbeddingBatchChatRequest' object has no attribute 'get'``: a 500 until the fuzzing found it.)
    """
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if (code.co_name == "request_body_to_args" and "fastapi" in code.co_filename) or (
                code.co_name.startswith("validate_") and "pydantic" in code.co_filename):
            return True
        tb = tb.tb_next
    return False


async def _body_error(request: Request, exc: Exception) -> JSONResponse:
    if is_openai(request.url.path) and _raised_reading_the_body(exc) and isinstance(exc, ImportError):
        # vLLM validates a response_format of type structural_tag with xgrammar/llguidance, which the server
        # does not install (it refuses response_format anyway): a 500 until the fuzzing found it
        return validation_error_response(f"unsupported request: a field needs what this server lacks ({exc})")
    if is_openai(request.url.path) and _raised_reading_the_body(exc):
        return validation_error_response(
            f"malformed request: the body must be a JSON object of the request's fields, each of its type ({exc})"
        )
    return await generic_exception_handler(request, exc)  # what KServe answers any other failure with


_UNASKED = object()


def _asked_model(exc: BaseException) -> Any:
    """The model name a KServe OpenAI route looked up when ``exc`` was raised: its ``DataPlane.model_ready``'s
    ``model_name``, the body's ``"model"`` (``_UNASKED``: not raised there). vLLM's request types take a body
    without ``"model"`` (None), and KServe then looks up a model named None: "Model with name None does not
    exist", a 404 until the fuzzing found it (the traceback tells None from a model named "None")."""
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == "model_ready" and "kserve" in code.co_filename:
            return tb.tb_frame.f_locals.get("model_name", _UNASKED)
        tb = tb.tb_next
    return _UNASKED


async def _model_not_found(request: Request, exc: ModelNotFound) -> JSONResponse:
    """An OpenAI body without a model's name (no ``"model"``, null, ""): 400 naming the field, in OpenAI's error
    body; any other miss is the server's 404 naming the models it serves."""
    asked = _asked_model(exc)
    if is_openai(request.url.path) and (asked is None or asked == ""):
        what = "must not be empty" if asked == "" else "required"
        message = (f"malformed request: model: {what}; name the model to use (GET {OPENAI_MODELS_PATH} lists the "
                   "served ones)")
        log_client_error("400", f"{request.method} {request.url.path}", RequestError(message))
        return JSONResponse(status_code=400, content=error_response(message, param="model").model_dump())
    return await server_exception_handlers(())[ModelNotFound](request, exc)


def _sse(chunk: Any) -> str:
    payload = chunk if isinstance(chunk, str) else chunk.model_dump_json(exclude_unset=True)
    return f"data: {payload}\n\n"


def _usage(job: OpenAIJob, results: Sequence[Generated]) -> UsageInfo:
    """Each prompt's tokens once (whatever ``n``), every choice's completion tokens."""
    completion = sum(r.completion_tokens for r in results)
    prompt = sum(job.prompt_tokens)
    return UsageInfo(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def _completion(model: str, job: OpenAIJob, results: Sequence[Generated]) -> Completion:
    return Completion(
        id=f"cmpl-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=model,
        choices=[CompletionChoice(index=i, text=r.text, logprobs=None, finish_reason=r.finish_reason)
                 for i, r in enumerate(results)],
        usage=_usage(job, results),
    )


def _chat_completion(model: str, job: OpenAIJob, results: Sequence[Generated]) -> ChatCompletion:
    return ChatCompletion(
        id=f"chatcmpl-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=model,
        choices=[ChatCompletionChoice(index=i, message=ChatMessage(role="assistant", content=r.text), logprobs=None,
                                      finish_reason=r.finish_reason) for i, r in enumerate(results)],
        usage=_usage(job, results),
    )


_PLACEHOLDER = "\ue000sweep\ue000"  # a private-use text no tokenizer makes: where a chunk's text goes in its template


class _Chunks:
    """The stream's JSON chunks, for a completion or a chat completion.

    A chunk of new text is most of a stream: it is KServe's chunk type rendered once per choice with a
    placeholder for the text (``_text_template``), the text then put in its place, JSON-escaped. The same
    JSON, without building and validating a pydantic chunk per token (measured: about a tenth of the
    server's event-loop time at 16 streams). The first and last chunks of a choice go through the types.
    """

    def __init__(self, model: str, chat: bool) -> None:
        self.model, self.chat = model, chat
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self._templates: dict[int, tuple[str, str]] = {}

    def _text_template(self, index: int) -> tuple[str, str]:
        """The JSON of choice ``index``'s text chunk before and after its (escaped) text."""
        if index not in self._templates:
            rendered = self._typed_text(index, _PLACEHOLDER).model_dump_json(exclude_unset=True)
            before, after = rendered.split(json.dumps(_PLACEHOLDER, ensure_ascii=False)[1:-1])
            self._templates[index] = before, after
        return self._templates[index]

    def _wrap(self, choices: list[Any], usage: UsageInfo | None = None) -> Any:
        if self.chat:
            chunk = ChatCompletionChunk(id=self.id, object="chat.completion.chunk", created=self.created,
                                        model=self.model, choices=choices)
        else:
            chunk = CompletionChunk(id=self.id, object="text_completion", created=self.created, model=self.model,
                                    choices=choices)
        if usage is not None:
            chunk.usage = usage
        return chunk

    def opening(self, rows: int) -> list[Any]:
        """A chat stream first names the speaker of every choice."""
        if not self.chat:
            return []
        return [self._wrap([ChunkChoice(index=i, delta=ChoiceDelta(role="assistant", content=""), logprobs=None,
                                        finish_reason=None)]) for i in range(rows)]

    def text(self, index: int, text: str, finish_reason: str | None = None) -> Any:
        """Choice ``index``'s chunk of ``text`` (JSON, or the typed chunk for a last or empty one)."""
        if finish_reason is None and text:
            before, after = self._text_template(index)
            return before + json.dumps(text, ensure_ascii=False)[1:-1] + after
        return self._typed_text(index, text, finish_reason)

    def _typed_text(self, index: int, text: str, finish_reason: str | None = None) -> Any:
        if self.chat:
            delta = ChoiceDelta(content=text) if text else ChoiceDelta()
            choice: Any = ChunkChoice(index=index, delta=delta, logprobs=None, finish_reason=finish_reason)
        else:
            choice = CompletionChunkChoice(index=index, text=text, logprobs=None, finish_reason=finish_reason)
        return self._wrap([choice])

    def usage(self, usage: UsageInfo) -> Any:
        return self._wrap([], usage)


class OpenAIGeneratorModel(GeneratorModel, OpenAIGenerativeModel):
    """The causal LM over v2 (``GeneratorModel``) and over KServe's OpenAI endpoints."""

    def exception_handlers(self) -> dict[type[BaseException], Handler]:
        """OpenAI's error body for a body KServe's OpenAI routes could not read (in place of v2's handler), and
        for one that names no model (in place of the 404 of a model nobody serves)."""
        body_errors: dict[type[BaseException], Handler] = {
            kind: _body_error for kind in (AttributeError, TypeError, KeyError, IndexError, ImportError)}
        return {**super().exception_handlers(), **body_errors, RequestValidationError: _validation_error,
                ModelNotFound: _model_not_found}

    # -- the OpenAI endpoints (called by KServe's OpenAIDataPlane) ----------------------------

    async def create_completion(
        self, request: CompletionRequest, raw_request: Request | None = None, context: dict[str, Any] | None = None
    ) -> AsyncGenerator[str, None] | Completion | ErrorResponse:
        try:
            prompts = completion_prompts(request.prompt)
        except RequestError as e:
            return _refused(str(e), chat=False)
        return await self._answer(request, prompts, request.max_tokens, "max_tokens", context, chat=False)

    async def create_chat_completion(
        self, request: ChatCompletionRequest, raw_request: Request | None = None, context: dict[str, Any] | None = None
    ) -> AsyncGenerator[str, None] | ChatCompletion | ErrorResponse:
        template = getattr(request, "chat_template", None)
        if template is None and not self.engine.has_chat_template:
            return _refused(
                f"model {self.name} has no chat template (its tokenizer defines none), so it cannot take chat "
                "messages: use /openai/v1/completions with a plain-text prompt", chat=True
            )
        try:
            prompt = self.engine.render_chat(chat_messages(request.messages), template)
        except RequestError as e:
            return _refused(str(e), chat=True)
        except Exception as e:  # noqa: BLE001 - a template that fails on these messages: jinja's message says why
            return _refused(f"messages: the chat template failed on them: {' '.join(str(e).split())}", chat=True)
        if request.max_completion_tokens is not None:
            max_tokens, field = request.max_completion_tokens, "max_completion_tokens"
        else:
            max_tokens, field = request.max_tokens, "max_tokens"
        return await self._answer(request, [prompt], max_tokens, field, context, chat=True)

    # -- generation -----------------------------------------------------------------------------

    async def _answer(self, request: Any, prompts: list[str], max_tokens: int | None, field: str,
                      context: dict[str, Any] | None, chat: bool
                      ) -> AsyncGenerator[str, None] | Completion | ChatCompletion | ErrorResponse:
        """Both endpoints once the prompts are known: the job (or the request's error), then a stream
        or the finished rows as a (chat) completion."""
        try:
            job = openai_job(request, prompts, self.engine.count_tokens, self.engine.context_length, max_tokens, field,
                             self.max_output_tokens)
        except RequestError as e:
            return _refused(str(e), chat)
        if job.stream:
            if self.continuous is not None:  # admitted now: a 429 goes out before the stream's 200
                return self._stream_continuous(job, _Chunks(self.name, chat=chat),
                                               self.continuous.open_stream(job.params, job.rows))
            return self._stream(job, _Chunks(self.name, chat=chat))
        try:
            results = await self._complete(job, context)
        except RequestError as e:
            return _refused(str(e), chat)
        return (_chat_completion if chat else _completion)(self.name, job, results)

    async def _complete(self, job: OpenAIJob, context: dict[str, Any] | None) -> list[Generated]:
        """Not streamed: the rows join the micro-batcher like v2 requests with the same settings."""
        rows = [(row, job.params) for row in job.rows]
        if self.continuous is not None and self.unstreamed_batched and not job.params.seeded:
            batched = await self.continuous.admitted(len(rows), lambda: self.batcher.submit(job.params.batch_key, rows))
        elif self.continuous is not None:
            sharing = self.continuous.sharing(len(job.rows))
            batched = Batched(await self.continuous.generate(job.params, job.rows), sharing)
        else:
            batched = await self.batcher.submit(job.params.batch_key, rows)
        response = (context or {}).get("response")
        if response is not None:  # KServe hands the endpoint's FastAPI Response: its headers are sent
            response.headers[BATCH_SIZE_HEADER] = str(batched.batch_size)
        return batched.results

    async def _stream_continuous(self, job: OpenAIJob, chunks: _Chunks, stream: Stream) -> AsyncGenerator[str, None]:
        """The Server-Sent Events of a stream in the continuous batch; a client that leaves cancels its sequences."""
        sent = [""] * len(job.rows)
        try:
            for chunk in chunks.opening(len(job.rows)):
                yield _sse(chunk)
            async for texts in stream.updates():
                for i, text in enumerate(texts):
                    if len(text) > len(sent[i]) and text.startswith(sent[i]):
                        yield _sse(chunks.text(i, text[len(sent[i]):]))
                        sent[i] = text
            results = await stream.results()
            for i, result in enumerate(results):
                rest = result.text[len(sent[i]):] if result.text.startswith(sent[i]) else ""
                yield _sse(chunks.text(i, rest, result.finish_reason))
            if job.include_usage:
                yield _sse(chunks.usage(_usage(job, results)))
            yield _sse("[DONE]")
        except Exception as e:  # noqa: BLE001 - the 200 is sent: the error travels as an event
            logger.exception(f"{self.name}: streamed generation failed")
            yield _sse(error_response(f"generation failed: {e}", HTTPStatus.INTERNAL_SERVER_ERROR).model_dump_json())
            yield _sse("[DONE]")
        finally:
            stream.cancel()  # a no-op once it has finished; otherwise its sequences leave the batch now

    async def _stream(self, job: OpenAIJob, chunks: _Chunks) -> AsyncGenerator[str, None]:
        """Server-Sent Events: text as each decoding step makes it, then finish reasons, usage, ``[DONE]``."""
        loop = asyncio.get_running_loop()
        steps: asyncio.Queue[list[str] | None] = asyncio.Queue()
        cancelled = threading.Event()
        rows = job.rows
        delivered = False

        def on_texts(texts: list[str]) -> None:  # on the forward thread
            loop.call_soon_threadsafe(steps.put_nowait, texts)

        def finished(future: asyncio.Future[list[Generated]]) -> None:
            steps.put_nowait(None)
            if future.cancelled() or future.exception() is not None:
                return
            results = future.result()
            server_metrics.count_tokens(self.name, [r.prompt_tokens for r in results],
                                        [r.completion_tokens for r in results])
            if delivered:
                return
            made = max(r.completion_tokens for r in results)
            logger.info(f"{self.name}: stream cancelled by the client; generation stopped after {made} of "
                        f"{job.params.max_new_tokens} tokens")

        generate: Callable[[], list[Generated]] = functools.partial(
            self.engine.generate, job.params, rows, on_texts=on_texts, cancelled=cancelled
        )
        started = loop.create_task(self.batcher.run_alone(generate))
        started.add_done_callback(finished)
        sent = [""] * len(rows)
        try:
            for chunk in chunks.opening(len(rows)):
                yield _sse(chunk)
            while (texts := await steps.get()) is not None:
                for i, text in enumerate(texts):
                    if len(text) > len(sent[i]) and text.startswith(sent[i]):
                        yield _sse(chunks.text(i, text[len(sent[i]):]))
                        sent[i] = text
            results = await started
            for i, result in enumerate(results):
                rest = result.text[len(sent[i]):] if result.text.startswith(sent[i]) else ""
                yield _sse(chunks.text(i, rest, result.finish_reason))
            delivered = True
            if job.include_usage:
                yield _sse(chunks.usage(_usage(job, results)))
            yield _sse("[DONE]")
        except Exception as e:  # noqa: BLE001 - the 200 is sent: the error travels as an event
            delivered = True
            logger.exception(f"{self.name}: streamed generation failed")
            yield _sse(error_response(f"generation failed: {e}", HTTPStatus.INTERNAL_SERVER_ERROR).model_dump_json())
            yield _sse("[DONE]")
        finally:
            cancelled.set()  # a no-op once generate has returned; otherwise it stops at its next step
