"""One inference call to a model server (``sweep serve``, or the same server running as a KServe
InferenceService); the command is ``sweep infer`` (sweep/cli/infer.py, also ``python -m sweep infer``).

What kind of model it is comes from ``GET /v2/models/NAME``: a causal LM answers completions, a
classifier ``label<TAB>score`` (``format_response``). ``infer_grpc`` makes the same call over the v2
gRPC protocol (KServe's InferenceGRPCClient): the same request, the answer turned into the REST
response it equals. ``stream_completions`` asks a causal LM through the server's OpenAI completions
endpoint with ``stream=true`` instead, writing the tokens as they arrive.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TextIO

import httpx

from sweep.serving.protocol import STOP, TEXT, TEXT_PAIR, parameters_for_grpc, tensor_by_name
from sweep.serving.routes import OPENAI_COMPLETIONS, V1_MODELS, V2_INFER, V2_MODEL


class InferError(RuntimeError):
    """The call failed: the server is unreachable or refused the request (its message included)."""


@dataclass(frozen=True)
class InferOptions:
    """How to ask: a classifier's text pairs, a causal LM's generation settings, how long to wait."""

    pair: tuple[str, ...] = ()  # second text of each pair, one per text (RTE, MRPC, ...)
    max_new_tokens: int = 32
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    seed: int | None = None  # makes sampling reproducible
    stop: tuple[str, ...] = ()  # stop sequences
    timeout: float = 60.0  # seconds
    api_key: str | None = field(default=None, repr=False)  # sent as Authorization: Bearer <key>; never printed

    def headers(self) -> dict[str, str]:
        """The HTTP headers (gRPC metadata, lower-cased) every call carries: the key, where there is one."""
        return {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}


KEY_HINT = "the server needs an API key: --api-key KEY or $SWEEP_API_KEY"


def _bytes_tensor(name: str, texts: Sequence[str]) -> dict[str, Any]:
    return {"name": name, "shape": [len(texts)], "datatype": "BYTES", "data": list(texts)}


def _check(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except json.JSONDecodeError:
        body = {"error": response.text.strip()[:300]}
    if response.status_code >= 400:
        message = body.get("error") if isinstance(body, dict) else None
        if isinstance(message, dict):  # an OpenAI endpoint's error: {"error": {"message": ...}}
            message = message.get("message")
        hint = f" ({KEY_HINT})" if response.status_code == 401 else ""
        raise InferError(f"the server answered {response.status_code}: {message or body}{hint}")
    return body


def _get(client: httpx.Client, path: str) -> dict[str, Any]:
    return _check(client.get(path))


def pick_model(client: httpx.Client, name: str | None) -> str:
    """``name``, or the server's only model."""
    if name:
        return name
    models = _get(client, V1_MODELS.path).get("models", [])
    if len(models) != 1:
        raise InferError(f"the server has {len(models)} models ({', '.join(models)}): choose one with --model")
    return models[0]


def model_kind(output_names: Iterable[str]) -> str:
    """``generator`` (a causal LM answers ``text``) or ``classifier``, from the model's metadata."""
    return "generator" if "text" in set(output_names) else "classifier"


def build_request(kind: str, texts: Sequence[str], options: InferOptions) -> dict[str, Any]:
    """The v2 request as REST sends it (gRPC sends the same, converted by ``_grpc_request``)."""
    if kind == "classifier":
        inputs = [_bytes_tensor(TEXT, texts)]
        if options.pair:
            inputs.append(_bytes_tensor(TEXT_PAIR, options.pair))
        return {"inputs": inputs}
    if options.pair:
        raise InferError("--pair is for classifiers; this model generates text")
    parameters: dict[str, Any] = {"max_new_tokens": options.max_new_tokens, "temperature": options.temperature,
                                  "top_p": options.top_p}
    if options.seed is not None:
        parameters["seed"] = options.seed
    inputs = [_bytes_tensor(TEXT, texts)]
    if options.stop:
        inputs.append(_bytes_tensor(STOP, options.stop))
    return {"inputs": inputs, "parameters": parameters}


def infer(url: str, model: str | None, texts: Sequence[str], options: InferOptions) -> tuple[str, dict[str, Any]]:
    """(kind, v2 response) of one call; ``kind`` is ``classifier`` or ``generator``."""
    with (_http_errors(url, options.timeout),
          httpx.Client(base_url=url.rstrip("/"), timeout=options.timeout, headers=options.headers()) as client):
        name = pick_model(client, model)
        kind = model_kind(o["name"] for o in _get(client, V2_MODEL.url(name)).get("outputs", []))
        return kind, _check(client.post(V2_INFER.url(name), json=build_request(kind, texts, options)))


@contextmanager
def _http_errors(url: str, timeout: float) -> Iterator[None]:
    """httpx's failures as one-line InferErrors."""
    try:
        yield
    except httpx.ConnectError as e:
        raise InferError(
            f"cannot reach the model server at {url} ({e}); is `python -m sweep serve` running there?") from None
    except httpx.TimeoutException:
        raise InferError(f"no answer from {url} within {timeout:g} s (--timeout)") from None
    except httpx.HTTPError as e:
        raise InferError(f"request to {url} failed: {e}") from None


def completion_request(model: str, prompt: str, options: InferOptions) -> dict[str, Any]:
    """The OpenAI completion request ``--stream`` sends: the settings of the v2 request, streamed."""
    body: dict[str, Any] = {
        "model": model, "prompt": prompt, "max_tokens": options.max_new_tokens, "temperature": options.temperature,
        "top_p": options.top_p, "stream": True, "stream_options": {"include_usage": True},
    }
    if options.seed is not None:
        body["seed"] = options.seed
    if options.stop:
        body["stop"] = list(options.stop)
    return body


def sse_events(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The JSON events of a Server-Sent Events stream, up to ``data: [DONE]``."""
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


def stream_completions(url: str, model: str | None, texts: Sequence[str], options: InferOptions,
                       out: TextIO = sys.stdout) -> list[str]:
    """Print each prompt's completion to ``out`` as its tokens arrive, a line each; the notes for stderr."""
    notes = []
    with (_http_errors(url, options.timeout),
          httpx.Client(base_url=url.rstrip("/"), timeout=options.timeout, headers=options.headers()) as client):
        name = pick_model(client, model)
        if model_kind(o["name"] for o in _get(client, V2_MODEL.url(name)).get("outputs", [])) != "generator":
            raise InferError("--stream is for causal LMs; this model is a classifier")
        for text in texts:
            request = completion_request(name, text, options)
            with client.stream(OPENAI_COMPLETIONS.method, OPENAI_COMPLETIONS.path, json=request) as response:
                if response.status_code >= 400:
                    response.read()
                    _check(response)
                finish, usage = None, None
                for event in sse_events(response.iter_lines()):
                    if "error" in event:
                        raise InferError(f"the server failed mid-stream: {event['error'].get('message')}")
                    for choice in event.get("choices", []):
                        out.write(choice.get("text", ""))
                        out.flush()
                        finish = choice.get("finish_reason") or finish
                    usage = event.get("usage") or usage
            out.write("\n")
            out.flush()
            if usage:
                notes.append(f"[{usage['prompt_tokens']} prompt + {usage['completion_tokens']} completion tokens, "
                             f"finish: {finish}]")
    return notes


def _check_grpc_address(address: str) -> None:
    host, sep, port = address.rpartition(":")
    if not (sep and host and port.isdigit() and 1 <= int(port) <= 65535):
        raise InferError(f"--grpc {address!r}: expected HOST:PORT, e.g. 127.0.0.1:8081")


def _grpc_request(model: str, body: dict[str, Any]) -> Any:
    """``build_request``'s REST body as KServe's InferRequest, which its gRPC client sends."""
    from kserve.protocol.infer_type import InferInput, InferRequest

    inputs = [InferInput(i["name"], i["shape"], i["datatype"], i["data"]) for i in body["inputs"]]
    return InferRequest(model, inputs, parameters=parameters_for_grpc(body.get("parameters", {})) or None)


async def _infer_grpc(address: str, model: str, texts: Sequence[str],
                      options: InferOptions) -> tuple[str, dict[str, Any]]:
    import grpc
    from kserve.inference_client import InferenceGRPCClient
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
    from kserve.protocol.grpc.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub

    # The client has no metadata call: ask KServe's generated stub, on a channel of our own.
    async with grpc.aio.insecure_channel(address) as channel:
        metadata = await GRPCInferenceServiceStub(channel).ModelMetadata(pb.ModelMetadataRequest(name=model),
                                                                         timeout=options.timeout)
    kind = model_kind(o.name for o in metadata.outputs)
    async with InferenceGRPCClient(address, timeout=options.timeout) as client:
        response = await client.infer(_grpc_request(model, build_request(kind, texts, options)),
                                      headers=list(options.headers().items()))
    body, _ = response.to_rest()  # KServe's own conversion: what the REST endpoint would have answered
    return kind, body


def infer_grpc(address: str, model: str | None, texts: Sequence[str],
               options: InferOptions) -> tuple[str, dict[str, Any]]:
    """(kind, v2 response as REST gives it) of one call over gRPC to ``address`` (HOST:PORT)."""
    _check_grpc_address(address)
    if not model:
        raise InferError("--grpc needs --model NAME: the v2 gRPC protocol has no list of models")
    from sweep.serving.kserve_import import import_kserve

    import_kserve()  # before grpc and kserve.*: kserve reads sys.argv (``--grpc`` would be its flag)
    logging.getLogger("kserve.trace").setLevel(logging.CRITICAL)  # its client logs each failed call with a traceback
    import grpc

    try:
        return asyncio.run(_infer_grpc(address, model, texts, options))
    except grpc.RpcError as e:
        code, details = e.code(), " ".join(str(e.details() or "").split())
        if code == grpc.StatusCode.UNAVAILABLE:
            raise InferError(f"cannot reach the gRPC server at {address} ({details}); "
                             "is `python -m sweep serve` serving gRPC there?") from None
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise InferError(f"no answer from {address} within {options.timeout:g} s (--timeout)") from None
        if code == grpc.StatusCode.UNAUTHENTICATED:
            raise InferError(f"the server answered {code.name}: {details} ({KEY_HINT})") from None
        raise InferError(f"the server answered {code.name}: {details}") from None


def format_response(kind: str, response: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(lines for stdout, lines for stderr) of a response."""
    outputs = response.get("outputs", [])
    if kind == "generator":
        texts = tensor_by_name(outputs, "text") or []
        prompt = tensor_by_name(outputs, "prompt_tokens") or []
        completion = tensor_by_name(outputs, "completion_tokens") or []
        reasons = tensor_by_name(outputs, "finish_reason") or []
        notes = [f"[{p} prompt + {c} completion tokens, finish: {r}]" for p, c, r in zip(prompt, completion, reasons)]
        return [str(t) for t in texts], notes
    scores = tensor_by_name(outputs, "score") or []
    labels = tensor_by_name(outputs, "label") or [None] * len(scores)
    lines = [f"{label}\t{score:.4f}" if label is not None else f"{score:.4f}" for label, score in zip(labels, scores)]
    return lines, []
