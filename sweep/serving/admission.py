"""Admission under overload: at most ``max_concurrent_sequences`` sequences generate, at most ``max_queued`` wait.

A request of ``n`` sequences (prompts times choices) is admitted whole or refused whole, at once: the
sequences that find no free slot queue in arrival order (first come, first served), and when the queue
would pass ``max_queued`` the request is refused with ``Overloaded`` (HTTP 429 with ``Retry-After``, gRPC
``RESOURCE_EXHAUSTED``), so the queue never grows without bound. A slot passes straight from a finished
sequence to the oldest waiting one. ``on_change(running, waiting)`` is told every change (the gauges of
server_metrics.py); it all runs on the event loop, so no lock.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

RETRY_AFTER_S = 1


class Overloaded(Exception):
    """A request refused because the queue is full: HTTP 429 + ``Retry-After``, gRPC ``RESOURCE_EXHAUSTED``."""

    def __init__(self, message: str, retry_after_s: int = RETRY_AFTER_S) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Admission:
    def __init__(self, max_running: int, max_queued: int,
                 on_change: Callable[[int, int], None] | None = None,
                 on_reject: Callable[[], None] | None = None) -> None:
        if max_running < 1:
            raise ValueError(f"max_concurrent_sequences: must be >= 1, got {max_running}")
        if max_queued < 0:
            raise ValueError(f"max_queued: must be >= 0, got {max_queued}")
        self.max_running, self.max_queued = max_running, max_queued
        self.running = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._on_change, self._on_reject = on_change, on_reject

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def enter(self, n: int) -> list[asyncio.Future[None]]:
        """One future per sequence of a request, done once it holds a slot; ``Overloaded`` if the queue is full.

        Each sequence that awaited its future must ``release()`` its slot when it ends (``leave`` does both).
        """
        loop = asyncio.get_running_loop()
        free = 0 if self._waiters else max(0, self.max_running - self.running)
        queued = max(0, n - free)
        if self.waiting + queued > self.max_queued:
            if self._on_reject is not None:
                self._on_reject()
            raise Overloaded(
                f"server overloaded: {self.running} sequences generating and {self.waiting} waiting "
                f"(max_concurrent_sequences={self.max_running}, max_queued={self.max_queued}); "
                f"retry after {RETRY_AFTER_S} s"
            )
        slots = []
        for _ in range(n):
            slot: asyncio.Future[None] = loop.create_future()
            if self.running < self.max_running and not self._waiters:
                self.running += 1
                slot.set_result(None)
            else:
                self._waiters.append(slot)
            slots.append(slot)
        self._changed()
        return slots

    @staticmethod
    async def wait(slot: asyncio.Future[None]) -> None:
        """Until ``slot`` holds a slot (cancelling the wait leaves the slot to ``leave``)."""
        await asyncio.shield(slot)

    def leave(self, slot: asyncio.Future[None]) -> None:
        """The sequence of ``slot`` is done (or never started): its slot, or its place in the queue, goes.

        Exactly once per slot ``enter`` gave (a ``finally`` of the sequence)."""
        if slot.done() and not slot.cancelled():
            self.release()
            return
        slot.cancel()
        try:
            self._waiters.remove(slot)
        except ValueError:
            pass
        self._changed()

    def release(self) -> None:
        self.running -= 1
        while self._waiters and self.running < self.max_running:
            nxt = self._waiters.popleft()
            if not nxt.done():
                self.running += 1
                nxt.set_result(None)
        self._changed()

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(self.running, self.waiting)
