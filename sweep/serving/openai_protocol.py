"""OpenAI completion and chat completion requests -> the prompts and ``GenerationParams`` of the server.

The request objects are KServe's (its OpenAI types are vLLM's pydantic models, ``CompletionRequest``
and ``ChatCompletionRequest``); this module reads their fields by name and imports neither, so it
loads without vLLM. Defaults are the OpenAI API's: ``temperature`` 1, ``top_p`` 1, ``n`` 1,
``max_tokens`` 16 for a completion and, for a chat, the room the context leaves. What the server
does not implement (echo, logprobs, penalties, beam search, tools, ...) is refused with a 400 that
names the field, never silently ignored. Anything else wrong is a ``RequestError`` too: one line,
sent back as a 400.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sweep.serving.protocol import (
    MAX_STOP_SEQUENCES,
    GenerationParams,
    RequestError,
    check_context,
    float_param,
    int_param,
    new_tokens_param,
)

OPENAI_TEMPERATURE = 1.0  # the OpenAI API samples unless told otherwise; temperature=0 is greedy
MAX_CHOICES = 16  # n: choices per prompt
MAX_SEED = 2**63 - 1

# Request fields this server does not implement, with the values that mean "not used".
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "echo": (None, False),
    "suffix": (None,),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "prompt_logprobs": (None,),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0.0),
    "frequency_penalty": (None, 0.0),
    "repetition_penalty": (None, 1.0),
    "top_k": (None, 0, -1),
    "min_p": (None, 0.0),
    "min_tokens": (None, 0),
    "ignore_eos": (None, False),
    "best_of": (None, 1),
    "use_beam_search": (None, False),
    "stop_token_ids": (None, []),
    "allowed_token_ids": (None,),
    "bad_words": (None, []),
    "response_format": (None,),
    "structured_outputs": (None,),
    "tools": (None, []),
    "prompt_embeds": (None,),
    "truncate_prompt_tokens": (None,),
    "continue_final_message": (None, False),
    "chat_template_kwargs": (None,),
    "documents": (None,),
}


@dataclass(frozen=True)
class OpenAIJob:
    """A validated request: distinct prompts, ``n`` choices of each, one set of generation settings."""

    prompts: tuple[str, ...]
    prompt_tokens: tuple[int, ...]
    params: GenerationParams
    n: int
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with the usage

    @property
    def rows(self) -> list[str]:
        """One prompt per choice, prompt-major: choice ``i * n + j`` is prompt i's j-th (the OpenAI order)."""
        return [prompt for prompt in self.prompts for _ in range(self.n)]


def completion_prompts(prompt: Any) -> list[str]:
    """The prompts of a completion request: a string or a list of strings (token ids are refused)."""
    if isinstance(prompt, str):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = prompt
    elif isinstance(prompt, list) and prompt and all(isinstance(p, int | list) for p in prompt):
        raise RequestError("prompt: token ids are not supported; send the prompt as text")
    else:
        raise RequestError(f"prompt: must be a string or a non-empty list of strings, got {_short(prompt)}")
    for i, text in enumerate(prompts):
        if not text:
            raise RequestError(f"prompt: prompt {i} is an empty string")
    return list(prompts)


def _field(message: Any, name: str) -> Any:
    return message.get(name) if isinstance(message, Mapping) else getattr(message, name, None)


def chat_messages(messages: Sequence[Any]) -> list[dict[str, str]]:
    """``{"role", "content"}`` dicts for the chat template; content parts must be text."""
    if not messages:
        raise RequestError("messages: must not be empty")
    chat: list[dict[str, str]] = []
    for i, message in enumerate(messages):
        role, content = _field(message, "role"), _field(message, "content")
        if not isinstance(role, str) or not role:
            raise RequestError(f"messages[{i}].role: must be a string such as 'user', got {_short(role)}")
        if isinstance(content, list):
            texts = []
            for part in content:
                kind = _field(part, "type")
                if kind != "text":
                    raise RequestError(
                        f"messages[{i}].content: only text parts are supported, got a part of type {kind!r}")
                texts.append(_field(part, "text") or "")
            content = "\n".join(texts)
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise RequestError(
                f"messages[{i}].content: must be a string or a list of text parts, got {_short(content)}")
        chat.append({"role": role, "content": content})
    return chat


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _unused(value: Any, unused: tuple[Any, ...]) -> bool:
    for u in unused:
        if value is None or u is None:
            if value is u:
                return True
        elif isinstance(value, bool) == isinstance(u, bool) and value == u:  # 0 is 0.0, but False is not 0
            return True
    return False


def refuse_unsupported(request: Any) -> None:
    missing = object()
    for name, unused in UNSUPPORTED.items():
        value = getattr(request, name, missing)
        if value is not missing and not _unused(value, unused):
            raise RequestError(f"{name}: not supported by this server (got {_short(value)}); leave it out")


def _stops(stop: Any) -> tuple[str, ...]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    for value in stops:
        if not isinstance(value, str) or not value:
            raise RequestError(f"parameter stop: stop sequences must be non-empty strings, got {_short(value)}")
    if len(stops) > MAX_STOP_SEQUENCES:
        raise RequestError(f"parameter stop: at most {MAX_STOP_SEQUENCES} stop sequences, got {len(stops)}")
    return tuple(dict.fromkeys(stops))


def openai_job(
    request: Any,
    prompts: Sequence[str],
    count_tokens: Callable[[Sequence[str]], list[int]],
    context_length: int,
    max_tokens: int | None,
    max_tokens_field: str = "max_tokens",
    max_output_tokens: int | None = None,
) -> OpenAIJob:
    """Validate a request's settings against the model and the server's ``max_output_tokens=``; ``max_tokens``
    None: what the context leaves (within that bound)."""
    refuse_unsupported(request)
    given = {k: v for k in ("n", "temperature", "top_p", "seed") if (v := getattr(request, k, None)) is not None}
    n = int_param(given, "n", 1, 1, MAX_CHOICES)
    temperature = float_param(given, "temperature", OPENAI_TEMPERATURE, 0.0, 2.0)
    top_p = float_param(given, "top_p", 1.0, 0.0, 1.0, low_open=True)
    seed = int_param(given, "seed", None, 0, MAX_SEED)
    stops = _stops(getattr(request, "stop", None))
    if max_tokens is not None:
        max_tokens = new_tokens_param({max_tokens_field: max_tokens}, max_tokens_field, None, context_length,
                                      max_output_tokens)
    prompt_tokens = count_tokens(prompts)
    if max_tokens is None:
        i, longest = max(enumerate(prompt_tokens), key=lambda p: p[1])
        if longest >= context_length:
            raise RequestError(
                f"prompt {i} is {longest} tokens: the model's context of {context_length} tokens "
                "leaves no room for an answer"
            )
        max_tokens = context_length - longest
        if max_output_tokens is not None:
            max_tokens = min(max_tokens, max_output_tokens)
    check_context(prompt_tokens, max_tokens, context_length, field=max_tokens_field)
    stream = bool(getattr(request, "stream", False))
    options = getattr(request, "stream_options", None)
    params = GenerationParams(max_new_tokens=max_tokens, temperature=temperature, top_p=top_p, stop=stops, seed=seed)
    return OpenAIJob(
        prompts=tuple(prompts),
        prompt_tokens=tuple(prompt_tokens),
        params=params,
        n=n,  # type: ignore[arg-type]  # int_param with a default never gives None
        stream=stream,
        include_usage=bool(stream and options is not None and getattr(options, "include_usage", False)),
    )
