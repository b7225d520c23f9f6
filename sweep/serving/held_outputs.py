"""Streamed outputs held for a few milliseconds in the decoding process, so that the server wakes once per
interval rather than once per decoding step (``stream_interval_ms``).

At many streams of a small model a decoding step takes a few milliseconds on CPU, and each step's message woke
the server, which wrote a chunk to every stream, which woke every client: on a busy CPU each wake-up took the decoding
thread's CPU from it. Holding the outputs of the steps within an interval and sending the newest of each
sequence once (an output carries all of its sequence's tokens so far) made many streams of a small model
faster on a 2-core machine, most with a CPU hog beside it (docs/benchmarks.md: Behind the code's choices). vLLM's
``--stream-interval`` does the same by tokens; an interval
in time leaves a slow model's steps (longer than it) as they were.

What a client waits on is never held: a sequence's first token, its end (or failure), and everything once the
batch pauses for a seeded request.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any


class HeldOutputs:
    """The outputs (transformers' ``GenerationOutput``) not sent yet: the newest per sequence."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.perf_counter) -> None:
        self._interval = interval_s
        self._clock = clock
        self._held: dict[str, Any] = {}
        self._last_sent = -math.inf
        self._lock = threading.Lock()  # the generation thread takes; the command thread forgets and drains

    def take(self, outputs: list[Any]) -> list[Any]:
        """A step's ``outputs`` in; what to send now out (nothing while the interval runs, unless one is urgent)."""
        with self._lock:
            for output in outputs:
                self._held[output.request_id] = output
            now = self._clock()
            if now - self._last_sent < self._interval and not any(_urgent(o) for o in outputs):
                return []
            self._last_sent = now
            return self._drain()

    def drain(self) -> list[Any]:
        """Everything held, now (the batch pauses: no step will come to send it)."""
        with self._lock:
            return self._drain()

    def forget(self, request_id: str) -> None:
        """A cancelled sequence's held output goes (nobody reads it)."""
        with self._lock:
            self._held.pop(request_id, None)

    def _drain(self) -> list[Any]:
        taken = list(self._held.values())
        self._held.clear()
        return taken


def _urgent(output: Any) -> bool:
    """A first token (time to first token), an end or a failure (the client's answer, the next request)."""
    return output.is_finished() or bool(output.error) or len(output.generated_tokens) <= 1
