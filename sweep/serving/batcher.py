"""An asyncio micro-batcher: concurrent requests share one forward pass.

KServe's Python ``Model`` has no batching of its own (KServe's batcher is a sidecar of the
InferenceService, for the v1 protocol only), so the server batches here. Each request brings a
batch key and a list of items; requests with the same key are merged, in arrival order, into one
call of ``run_batch(key, items)`` of at most ``max_batch_size`` items (a bigger request runs
whole, alone), after waiting at most ``max_latency_ms`` from the oldest request for others to
arrive (default 0: an idle server runs a lone request at once — on 2 CPUs a wait only added itself
to every request (docs/benchmarks.md: Behind the code's choices)). A key of ``None`` means "never
merge". Forward passes run one at a time on a single worker thread, so the event loop keeps
answering (health checks, new requests) meanwhile, and
requests that arrive during a forward pass form the next batch: batching pays exactly when the
server is busy.

With batching off, every request is its own forward pass on the same single thread — the
baseline the benchmark compares against.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")
RunBatch = Callable[[Hashable | None, list[Item]], Sequence[Result]]


@dataclass(frozen=True)
class Batched(Generic[Result]):
    """A request's results and how many items shared its forward pass (itself included)."""

    results: list[Result]
    batch_size: int


@dataclass
class _Pending(Generic[Item, Result]):
    key: Hashable | None
    items: list[Item]
    future: asyncio.Future[Batched[Result]]
    arrived: float = field(default_factory=time.monotonic)


class MicroBatcher(Generic[Item, Result]):
    def __init__(
        self,
        run_batch: RunBatch,
        *,
        enabled: bool = True,
        max_batch_size: int = 32,
        max_latency_ms: float = 0.0,
        observe_batch: Callable[[int], None] | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size: must be >= 1, got {max_batch_size}")
        if max_latency_ms < 0:
            raise ValueError(f"max_latency_ms: must be >= 0, got {max_latency_ms}")
        self._run_batch = run_batch
        self._observe_batch = observe_batch  # told the size of every forward pass (metrics)
        self.enabled = enabled
        self.max_batch_size = max_batch_size
        self.max_latency_s = max_latency_ms / 1000.0
        # One thread: torch already uses every core for one forward pass; two at once just thrash.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="forward")
        self._queue: deque[_Pending[Item, Result]] = deque()
        self._arrived: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None

    async def submit(self, key: Hashable | None, items: list[Item]) -> Batched[Result]:
        """Results for ``items`` (same order), computed together with other requests' items."""
        loop = asyncio.get_running_loop()
        if not self.enabled:
            results = await loop.run_in_executor(self._executor, self._call, key, items)
            return Batched(results, len(items))
        pending: _Pending[Item, Result] = _Pending(key, items, loop.create_future())
        self._queue.append(pending)
        self._ensure_worker()
        assert self._arrived is not None
        self._arrived.set()
        return await pending.future

    async def run_alone(self, fn: Callable[[], Result]) -> Result:
        """``fn()`` on the forward-pass thread, outside any batch: after the pass in progress, before the next batch.

        For work that cannot share a batch (a streamed generation); it still never runs beside a
        forward pass, so torch's global seed and the engine's tokenizer stay single-threaded.
        """
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)

    # -----------------------------------------------------------------------------------------

    def _call(self, key: Hashable | None, items: list[Item]) -> list[Result]:
        if self._observe_batch is not None:
            self._observe_batch(len(items))
        results = list(self._run_batch(key, items))
        if len(results) != len(items):  # a bug in run_batch; never hand out misaligned results
            raise RuntimeError(f"run_batch returned {len(results)} results for {len(items)} items")
        return results

    def _ensure_worker(self) -> None:
        if self._worker is None or self._worker.done():
            self._arrived = asyncio.Event()
            self._worker = asyncio.get_running_loop().create_task(self._work(), name="micro-batcher")

    def _queued_items(self, key: Hashable) -> int:
        return sum(len(p.items) for p in self._queue if p.key == key)

    async def _wait_for_company(self, first: _Pending[Item, Result]) -> None:
        """Give other requests with ``first``'s key until its deadline to arrive, unless the batch is full."""
        assert self._arrived is not None
        if first.key is None:
            return
        deadline = first.arrived + self.max_latency_s
        while self._queued_items(first.key) < self.max_batch_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                return

    def _take_batch(self, first: _Pending[Item, Result]) -> list[_Pending[Item, Result]]:
        """``first`` and the oldest requests with its key that still fit in ``max_batch_size``."""
        batch = [first]
        self._queue.remove(first)
        if first.key is None:
            return batch
        size = len(first.items)
        for pending in list(self._queue):
            if pending.key == first.key and size + len(pending.items) <= self.max_batch_size:
                batch.append(pending)
                size += len(pending.items)
                self._queue.remove(pending)
        return batch

    async def _work(self) -> None:
        assert self._arrived is not None
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            first = self._queue[0]
            await self._wait_for_company(first)
            batch = [p for p in self._take_batch(first) if not p.future.done()]  # skip cancelled clients
            if not batch:
                continue
            items = [item for p in batch for item in p.items]
            try:
                results = await loop.run_in_executor(self._executor, self._call, first.key, items)
            except Exception as error:  # noqa: BLE001 - every waiting request gets the error
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(error)
                continue
            start = 0
            for p in batch:
                if not p.future.done():
                    p.future.set_result(Batched(results[start:start + len(p.items)], len(items)))
                start += len(p.items)
            # Let the woken requests send their answers before the next pass takes the GIL: a
            # pass on the worker thread would otherwise make each of them wait for the GIL.
            await asyncio.sleep(0)
