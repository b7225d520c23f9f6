"""Open Inference Protocol v2 tensors <-> the server's typed requests and results.

A request names its inputs; both kinds of model take the texts as a ``BYTES`` tensor ``text`` of
shape ``[n]`` (or ``[n, 1]``). A classifier also takes ``text_pair`` (same shape) for sentence-pair
tasks; a causal LM takes its sampling settings as request ``parameters`` (``max_new_tokens``,
``temperature``, ``top_p``, ``seed``, ``stop``) and, for several stop sequences, a ``BYTES``
tensor ``stop`` of shape ``[k]``. A classifier whose folder says its task (``sweep_made_by.json``)
takes exactly that task's inputs: ``text_pair`` is required by a pair task and refused by a single-sentence
one, as MLflow's copy of the model (its signature) does. Anything else is a ``RequestError``: the client's
mistake, sent back as a 400 with the message, never a 500.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TEXT = "text"
TEXT_PAIR = "text_pair"
STOP = "stop"
# Request parameters KServe itself reads (binary output encoding): allowed, not ours to check.
PROTOCOL_PARAMETERS = frozenset({"binary_data_output"})

DEFAULT_MAX_NEW_TOKENS = 32
MAX_STOP_SEQUENCES = 16


class RequestError(ValueError):
    """A malformed or unservable request; the message tells the client what to change."""


@dataclass(frozen=True)
class Tensor:
    """One input or output tensor of a v2 request, decoupled from KServe's classes."""

    name: str
    shape: list[int]
    datatype: str
    data: list[Any]


@dataclass(frozen=True)
class TaskInputs:
    """The texts a classifier's task takes: a sentence pair each (RTE, MRPC) or one sentence (SST-2)."""

    task: str
    pair: bool

    @property
    def names(self) -> tuple[str, ...]:
        return (TEXT, TEXT_PAIR) if self.pair else (TEXT,)


@dataclass(frozen=True)
class ClassifyRequest:
    texts: tuple[str, ...]
    pairs: tuple[str, ...] | None  # second sentence of each pair (RTE, MRPC, ...), or None

    @property
    def batch_key(self) -> Hashable:
        # The tokenizer takes a batch of singles or a batch of pairs, never a mix.
        return self.pairs is not None

    @property
    def items(self) -> list[tuple[str, str | None]]:
        return list(zip(self.texts, self.pairs or [None] * len(self.texts)))


@dataclass(frozen=True)
class GenerationParams:
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = 0.0  # 0: greedy decoding, deterministic
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None

    @property
    def sampling(self) -> bool:
        return self.temperature > 0

    @property
    def seeded(self) -> bool:
        """Sampling from a seed: the random generator must be its own (continuous batching pauses for it)."""
        return self.sampling and self.seed is not None

    @property
    def batch_key(self) -> Hashable | None:
        """Requests with equal keys may share one ``generate`` call; None: run this one alone.

        A seeded request runs alone: its random draws must not depend on which other requests
        happened to share its batch, or the same seed would give different text.
        """
        if self.sampling:
            if self.seed is not None:
                return None
            return ("sample", self.max_new_tokens, self.temperature, self.top_p, self.stop)
        return ("greedy", self.max_new_tokens, self.stop)


@dataclass(frozen=True)
class GenerateRequest:
    prompts: tuple[str, ...]
    params: GenerationParams


@dataclass(frozen=True)
class Classification:
    label: str | None  # None for a regression head (STS-B): the score is the prediction
    score: float  # probability of ``label``, or the regression value


@dataclass(frozen=True)
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" (eos or a stop sequence) or "length" (max_new_tokens reached)


# ---------------------------------------------------------------------------------------------
# Inputs.

def _by_name(inputs: Sequence[Tensor], allowed: Iterable[str]) -> dict[str, Tensor]:
    allowed = tuple(allowed)
    found: dict[str, Tensor] = {}
    for tensor in inputs:
        if tensor.name not in allowed:
            raise RequestError(f"unknown input {tensor.name!r}; this model takes: {', '.join(allowed)}")
        if tensor.name in found:
            raise RequestError(f"input {tensor.name!r} is given twice")
        found[tensor.name] = tensor
    return found


def _flatten(data: Any) -> list[Any]:
    if isinstance(data, list):
        return [x for item in data for x in _flatten(item)]
    return [data]


def decode_texts(tensor: Tensor) -> list[str]:
    """The non-empty strings of a ``BYTES`` tensor of shape ``[n]`` or ``[n, 1]``, n >= 1."""
    name = tensor.name
    if tensor.datatype.upper() != "BYTES":
        raise RequestError(f"input {name!r}: datatype must be BYTES (text), got {tensor.datatype}")
    shape = list(tensor.shape)
    if not (len(shape) == 1 or (len(shape) == 2 and shape[1] == 1)) or any(d < 0 for d in shape):
        raise RequestError(f"input {name!r}: shape must be [n] or [n, 1], got {shape}")
    values = _flatten(tensor.data)
    if shape[0] != len(values):
        raise RequestError(f"input {name!r}: shape {shape} says {shape[0]} element(s), data has {len(values)}")
    if not values:
        raise RequestError(f"input {name!r} is empty: send at least one text")
    texts: list[str] = []
    for i, value in enumerate(values):
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError as e:
                raise RequestError(f"input {name!r}[{i}] is not UTF-8: {e}") from None
        if not isinstance(value, str):
            raise RequestError(f"input {name!r}[{i}]: expected a string, got {type(value).__name__}")
        if not value:  # whitespace is text (a "\n" stop sequence); nothing at all is not
            raise RequestError(f"input {name!r}[{i}] is an empty string")
        texts.append(value)
    return texts


def _require(found: Mapping[str, Tensor], name: str) -> Tensor:
    if name not in found:
        raise RequestError(f"missing input {name!r} (a BYTES tensor of shape [n])")
    return found[name]


def _check_parameters(parameters: Mapping[str, Any] | None, allowed: Iterable[str]) -> dict[str, Any]:
    params = dict(parameters or {})
    allowed = set(allowed)
    unknown = sorted(set(params) - allowed - PROTOCOL_PARAMETERS)
    if unknown:
        hint = f"; allowed: {', '.join(sorted(allowed))}" if allowed else "; this model takes none"
        raise RequestError(f"unknown parameter(s) {', '.join(unknown)}{hint}")
    return {k: v for k, v in params.items() if k in allowed}


def _check_pairing(found: Mapping[str, Tensor], task: TaskInputs) -> None:
    """A pair task's model given one sentence (or the reverse) would answer a label that means nothing."""
    if task.pair and TEXT_PAIR not in found:
        raise RequestError(f"missing input {TEXT_PAIR!r}: this model classifies sentence pairs (task {task.task}); "
                           f"send a BYTES tensor {TEXT_PAIR!r}, one second sentence per {TEXT!r} "
                           "(sweep infer: --pair TEXT)")
    if not task.pair and TEXT_PAIR in found:
        raise RequestError(f"input {TEXT_PAIR!r}: this model classifies single sentences (task {task.task}); "
                           f"send {TEXT!r} alone")


def parse_classify(inputs: Sequence[Tensor], parameters: Mapping[str, Any] | None,
                   task: TaskInputs | None = None) -> ClassifyRequest:
    """Texts (and pairs) of a classifier's request; ``task`` None: a model that does not say its task takes either."""
    found = _by_name(inputs, (TEXT, TEXT_PAIR))
    _check_parameters(parameters, ())
    texts = decode_texts(_require(found, TEXT))
    if task is not None:
        _check_pairing(found, task)
    pairs = None
    if TEXT_PAIR in found:
        pairs = decode_texts(found[TEXT_PAIR])
        if len(pairs) != len(texts):
            raise RequestError(
                f"input {TEXT_PAIR!r} has {len(pairs)} text(s), {TEXT!r} has {len(texts)}: one pair each")
    return ClassifyRequest(tuple(texts), tuple(pairs) if pairs is not None else None)


def int_param(params: Mapping[str, Any], key: str, default: int | None, low: int, high: int) -> int | None:
    value = params.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"parameter {key}: must be an integer, got {value!r}")
    if not low <= value <= high:
        raise RequestError(f"parameter {key}: must be in [{low}, {high}], got {value}")
    return value


def float_param(params: Mapping[str, Any], key: str, default: float, low: float, high: float,
                low_open: bool = False) -> float:
    value = params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RequestError(f"parameter {key}: must be a number, got {value!r}")
    if value > high or value < low or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise RequestError(f"parameter {key}: must be in {bracket}{low}, {high}], got {value}")
    return float(value)


def new_tokens_param(params: Mapping[str, Any], key: str, default: int | None, context_length: int,
                     max_output_tokens: int | None = None) -> int | None:
    """The new tokens a request asks for (``key``: max_new_tokens, max_tokens, ...): within the model's context
    and the server's ``max_output_tokens=`` (None: the context alone), each refusal naming its bound."""
    if max_output_tokens is None or max_output_tokens >= context_length - 1:  # the context is the bound
        return int_param(params, key, None if default is None else min(default, context_length - 1),
                         1, context_length - 1)
    value = int_param(params, key, None if default is None else min(default, max_output_tokens), 1, 2**63 - 1)
    if value is not None and value > max_output_tokens:
        raise RequestError(f"parameter {key}: must be in [1, {max_output_tokens}] (the server's "
                           f"max_output_tokens={max_output_tokens}), got {value}")
    return value


def parse_generate(
    inputs: Sequence[Tensor], parameters: Mapping[str, Any] | None, context_length: int,
    max_output_tokens: int | None = None,
) -> GenerateRequest:
    """Prompts and sampling settings; lengths against the context are checked by the model."""
    found = _by_name(inputs, (TEXT, STOP))
    params = _check_parameters(parameters, ("max_new_tokens", "temperature", "top_p", "seed", "stop"))
    prompts = decode_texts(_require(found, TEXT))
    stops: list[str] = []
    if "stop" in params:
        if not isinstance(params["stop"], str) or not params["stop"]:
            raise RequestError(f"parameter stop: must be a non-empty string (several: the input {STOP!r}), "
                               f"got {params['stop']!r}")
        stops.append(params["stop"])
    if STOP in found:
        stops.extend(decode_texts(found[STOP]))
    if len(stops) > MAX_STOP_SEQUENCES:
        raise RequestError(f"at most {MAX_STOP_SEQUENCES} stop sequences, got {len(stops)}")
    generation = GenerationParams(
        max_new_tokens=new_tokens_param(params, "max_new_tokens", DEFAULT_MAX_NEW_TOKENS, context_length,
                                        max_output_tokens),
        temperature=float_param(params, "temperature", 0.0, 0.0, 100.0),
        top_p=float_param(params, "top_p", 1.0, 0.0, 1.0, low_open=True),
        stop=tuple(dict.fromkeys(stops)),
        seed=int_param(params, "seed", None, 0, 2**63 - 1),
    )
    return GenerateRequest(tuple(prompts), generation)


def check_context(prompt_tokens: Sequence[int], max_new_tokens: int, context_length: int,
                  field: str = "max_new_tokens") -> None:
    """A prompt that cannot fit, with the tokens it asks for, in the model's context is refused."""
    for i, n in enumerate(prompt_tokens):
        if n + max_new_tokens > context_length:
            room = context_length - max_new_tokens
            raise RequestError(
                f"prompt {i} is {n} tokens; with {field}={max_new_tokens} that exceeds the model's "
                f"context of {context_length} tokens (prompts may be at most {room} tokens, "
                "or ask for fewer new tokens)"
            )


# ---------------------------------------------------------------------------------------------
# gRPC request parameters. KServe's v2 gRPC ``InferParameter`` holds a bool, an int64 or a string,
# no double: a float parameter (temperature, top_p) travels over gRPC as its decimal string.

FLOAT_PARAMETERS = frozenset({"temperature", "top_p"})


def parameters_for_grpc(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """A client's REST parameters as gRPC can carry them: floats as decimal strings."""
    return {k: repr(v) if isinstance(v, float) else v for k, v in parameters.items()}


def parameters_from_grpc(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """A gRPC request's parameters (plain values) as the REST request would carry them."""
    values = dict(parameters)
    for key in FLOAT_PARAMETERS & values.keys():
        if isinstance(values[key], str):
            try:
                values[key] = float(values[key])
            except ValueError:
                pass  # left as sent: the check names it ("must be a number, got 'hot'")
    return values


# ---------------------------------------------------------------------------------------------
# Outputs.

def classification_outputs(results: Sequence[Classification]) -> list[Tensor]:
    n = len(results)
    outputs = [Tensor("score", [n], "FP32", [r.score for r in results])]
    if all(r.label is not None for r in results):
        outputs.insert(0, Tensor("label", [n], "BYTES", [r.label for r in results]))
    return outputs


def generation_outputs(results: Sequence[Completion]) -> list[Tensor]:
    n = len(results)
    return [
        Tensor("text", [n], "BYTES", [r.text for r in results]),
        Tensor("prompt_tokens", [n], "INT32", [r.prompt_tokens for r in results]),
        Tensor("completion_tokens", [n], "INT32", [r.completion_tokens for r in results]),
        Tensor("finish_reason", [n], "BYTES", [r.finish_reason for r in results]),
    ]


def tensor_by_name(outputs: Iterable[Mapping[str, Any]], name: str) -> list[Any] | None:
    """The data of the output ``name`` in a v2 REST response's ``outputs`` (for clients)."""
    for output in outputs:
        if output.get("name") == name:
            return _flatten(output.get("data", []))
    return None
