"""What one generated row becomes: the completion text, cut at the first stop sequence, and its token count.

``generate`` pads rows that finished early (an eos, or a stop string) with the pad token, which
for GPT-2 is the eos token itself; so a row's tokens are read up to its first eos, and a stop
sequence found in the text cuts it there, counting only the tokens it took to produce it. A
streamed row sends, step by step, the part of that text no later token can change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sweep.serving.protocol import Completion

Decode = Callable[[Sequence[int]], str]


def _first_stop(text: str, stops: Sequence[str]) -> int | None:
    """Where the earliest stop sequence starts in ``text``, or None."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None


def finish_completion(
    new_tokens: Sequence[int],
    prompt_tokens: int,
    decode: Decode,
    eos_token_id: int | None,
    stops: Sequence[str],
    max_new_tokens: int,
) -> Completion:
    """Turn one row of new token ids into a ``Completion``."""
    tokens = list(new_tokens)
    ended_by_eos = eos_token_id is not None and eos_token_id in tokens
    if ended_by_eos:
        tokens = tokens[: tokens.index(eos_token_id)]
    text = decode(tokens)
    cut = _first_stop(text, stops)
    if cut is not None:
        # The fewest tokens whose text already holds the stop sequence: what producing it cost.
        used = next(k for k in range(1, len(tokens) + 1) if _first_stop(decode(tokens[:k]), stops) is not None)
        return Completion(text[:cut], prompt_tokens, used, "stop")
    if ended_by_eos:
        return Completion(text, prompt_tokens, len(tokens) + 1, "stop")  # the eos was generated too
    return Completion(text, prompt_tokens, len(tokens), "length" if len(tokens) >= max_new_tokens else "stop")


def _partial_stop(text: str, stops: Sequence[str]) -> int:
    """Length of the longest tail of ``text`` that begins some stop sequence (0: none)."""
    return max((k for s in stops for k in range(min(len(s) - 1, len(text)), 0, -1) if text.endswith(s[:k])), default=0)


def streamable_text(new_tokens: Sequence[int], decode: Decode, eos_token_id: int | None, stops: Sequence[str]) -> str:
    """The part of a row's text so far that no later token can change: what a stream may send now.

    Read as ``finish_completion`` reads it (up to the first eos, cut at the earliest stop sequence),
    less a tail that may yet grow into a stop sequence and a character still missing bytes (a
    multi-byte character split across tokens decodes to U+FFFD until its last byte arrives). So what
    a stream sends is always a prefix of the text ``finish_completion`` makes of the finished row.
    """
    return read_stream(new_tokens, decode, eos_token_id, stops)[0]


def read_stream(new_tokens: Sequence[int], decode: Decode, eos_token_id: int | None,
                stops: Sequence[str]) -> tuple[str, bool]:
    """``streamable_text``, and whether a stop sequence has appeared (the row is done): one decode for both."""
    tokens = list(new_tokens)
    if eos_token_id is not None and eos_token_id in tokens:
        tokens = tokens[: tokens.index(eos_token_id)]
    text = decode(tokens)
    cut = _first_stop(text, stops)
    if cut is not None:
        return text[:cut], True
    return text[: len(text) - _partial_stop(text, stops)].rstrip("\ufffd"), False
