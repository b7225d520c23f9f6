"""Continuous batching of a causal LM (``generation=continuous``): every generation joins one running batch.

transformers' own continuous batching (``model.init_continuous_batching()`` -> ``ContinuousBatchingManager``)
runs the decoding loop over a paged KV cache: each step decodes the next token of every running sequence,
and a sequence that arrives starts (its prompt is read in) at the next step; one that ends leaves its slot
at once. The model and that loop run in a process of their own (decoding_engine.py, started by
decoding_process.py), so that the server's event loop, which streams every step's text, never takes the
GIL from the batch. This side admits, tokenizes, sends token ids, and reads each step's new tokens back.
Every route (v2 REST and gRPC, OpenAI completions and chat, streamed or whole) sends its sequences here,
one sequence each, through ``admission.py`` (at most ``max_concurrent_sequences`` in the batch, at most
``max_queued`` waiting, else 429).

Per-request settings, where the library decodes a whole batch with one generation config:

- greedy (``temperature`` 0), ``temperature`` and ``top_p``: the batch decodes greedily (exact argmax, the
  text of ``generate``), and ``RowSampling``, a per-request logits processor, draws the token of each row
  that samples, at its own temperature and top_p;
- ``max_tokens``: ``add_request(max_new_tokens=...)``; ``stop``: read after every step (such a sequence is
  streamed internally), the sequence cancelled at the first stop sequence and its text cut there;
- ``seed``: the batch has one random generator, so a seeded sequence runs alone, as ``generation=batched``
  runs it (``Generator.generate``, in the decoding process), with the batch paused meanwhile.

A client that disconnects cancels its sequences at once. The KV cache holds ``kv_cache_mb`` MiB (pages of
``PAGE_SIZE`` tokens), never a share of the machine's memory, and no more than ``max_concurrent_sequences``
full contexts (more could never be used).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sweep.serving import server_metrics
from sweep.serving.admission import Admission
from sweep.serving.decoding_process import DecodingGone, DecodingProcess, Unsupported
from sweep.serving.engines import Generator
from sweep.serving.generation import finish_completion, read_stream
from sweep.serving.protocol import Completion, GenerationParams, RequestError

logger = logging.getLogger("kserve")  # KServe's logging configuration prints it


@dataclass
class _Sequence:
    """One sequence in the batch, as this side follows it."""

    done: asyncio.Future[Any]
    on_output: Callable[[_Sequence], None]
    tokens: list[int] = field(default_factory=list)
    timing: tuple[float, float, int] | None = None  # first and last token's time, tokens timed


@dataclass
class _Row:
    """One prompt's sequence, from its slot to its end: sent to the batch once ``request_id`` is set."""

    slot: asyncio.Future[None]
    request_id: str | None = None
    sequence: _Sequence | None = None
    prompt_tokens: int = 0
    closed: bool = False


@dataclass
class _Seeded:
    done: asyncio.Future[list[Completion]]
    on_texts: Callable[[list[str]], None] | None


class ContinuousBatch:
    """The running batch of one causal LM (in its decoding process), and the admission in front of it.

    Methods run on the event loop; the decoding process's messages arrive there too (``_on_message``).
    """

    def __init__(self, engine: Generator, name: str, decoding: DecodingProcess, max_concurrent_sequences: int,
                 max_queued: int) -> None:
        self.engine, self.name, self.decoding = engine, name, decoding
        self.admission = Admission(max_concurrent_sequences, max_queued, server_metrics.sequences_observer(name),
                                   server_metrics.rejection_counter(name))
        self.cache_tokens, self.cache_mb = decoding.facts["cache_tokens"], decoding.facts["cache_mb"]
        self.seeds_alone = decoding.facts["seeds_alone"]
        self._observe_step = server_metrics.step_observer(name)
        self._sequences: dict[str, _Sequence] = {}
        self._seeded_requests: dict[str, _Seeded] = {}
        self._exited: DecodingGone | None = None  # once the reader has seen the decoding process exit
        self._ids = itertools.count()

    def describe(self) -> str:
        return (f"generation continuous in process {self.decoding.facts['pid']} (up to {self.admission.max_running} "
                f"sequences, {self.admission.max_queued} queued; KV cache {self.cache_mb:.0f} MiB = "
                f"{self.cache_tokens} tokens; {self.decoding.facts['threads']} torch thread(s) of "
                f"{self.decoding.facts['usable_cpus']:g} usable CPU(s); streamed tokens sent every "
                f"{self.decoding.facts['stream_interval_ms']:g} ms at most)")

    async def admitted(self, rows: int, work: Callable[[], Awaitable[Any]]) -> Any:
        """``work()`` once ``rows`` slots are held (unstreamed=batched: the micro-batcher, under the same bounds)."""
        slots = self.admission.enter(rows)
        try:
            for slot in slots:
                await self.admission.wait(slot)
            return await work()
        finally:
            for slot in slots:
                self.admission.leave(slot)

    def sharing(self, rows: int) -> int:
        """Sequences that will share the batch with a request of ``rows`` arriving now (itself included)."""
        return min(self.admission.running + rows, self.admission.max_running)

    def close(self) -> None:
        self.decoding.close()

    @property
    def gone(self) -> DecodingGone | None:
        """Why nothing can be decoded any more (the decoding process exited), or None while it runs. Asks
        the process too: a readiness probe says so before the reader has handed the exit to the loop."""
        if self._exited is None and not self.decoding.process.is_alive():
            return DecodingGone(self.decoding.process.exitcode)
        return self._exited

    @property
    def alive(self) -> bool:
        return self.gone is None

    # -- the decoding process's messages ------------------------------------------------------------

    def _send(self, *command: Any) -> None:
        if self._exited is not None:
            raise DecodingGone(self._exited.exitcode)
        if not self.decoding.listening:
            self.decoding.listen(asyncio.get_running_loop(), self._on_message, self._on_exit)
        self.decoding.send(*command)

    def _on_message(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "steps":
            for tokens in message[1]:
                self._observe_step(tokens)
            for rid, new_tokens, finished, error, timing in message[2]:
                sequence = self._sequences.get(rid)
                if sequence is None or sequence.done.done():  # cancelled meanwhile
                    continue
                sequence.tokens.extend(new_tokens)
                if error:
                    sequence.done.set_exception(RuntimeError(f"generation failed: {error}"))
                elif finished:
                    sequence.timing = timing
                    sequence.done.set_result(None)
                else:
                    sequence.on_output(sequence)
            return
        request = self._seeded_requests.get(message[1])
        if request is None or request.done.done():
            return
        if kind == "texts" and request.on_texts is not None:
            request.on_texts(message[2])
        elif kind == "done":
            request.done.set_result(message[2])
        elif kind == "failed":
            request.done.set_exception(RuntimeError(f"generation failed: {message[2]}"))

    def _on_exit(self) -> None:
        """The decoding process is gone: every sequence fails now, and so does every later request."""
        self._exited = DecodingGone(self.decoding.process.exitcode)
        logger.error(f"{self.name}: {self._exited}")
        for waiting in [*self._sequences.values(), *self._seeded_requests.values()]:
            if not waiting.done.done():
                waiting.done.set_exception(DecodingGone(self._exited.exitcode))

    # -- generation ------------------------------------------------------------------------------

    async def generate(self, params: GenerationParams, prompts: Sequence[str],
                       on_texts: Callable[[list[str]], None] | None = None) -> list[Completion]:
        """The completions of ``prompts``, each its own sequence in the batch; ``Overloaded`` if the queue is full.

        Streamed: ``on_texts`` gets every row's streamable text whenever one grew.
        """
        return await self._start(self.admission.enter(len(prompts)), params, prompts, on_texts)

    def open_stream(self, params: GenerationParams, prompts: Sequence[str]) -> Stream:
        """Admit now (``Overloaded`` before any answer is sent), then stream."""
        return Stream(self, self.admission.enter(len(prompts)), params, prompts)

    def _start(self, slots: list[asyncio.Future[None]], params: GenerationParams, prompts: Sequence[str],
               on_texts: Callable[[list[str]], None] | None) -> Awaitable[list[Completion]]:
        """The request's sequences, one task each. A sequence whose slot is free is sent to the decoding
        process here, before this returns: it starts at the batch's next step, not after the event loop has
        gone round for the request's tasks (two turns, each as long as a step's streaming at many streams)."""
        arrived = time.perf_counter()
        if params.seeded:
            return self._seeded_run(slots, params, prompts, on_texts)
        texts = [""] * len(prompts)

        def row_callback(i: int) -> Callable[[str], None] | None:
            if on_texts is None:
                return None

            def on_text(text: str) -> None:
                texts[i] = text
                on_texts(list(texts))

            return on_text

        rows = [_Row(slot) for slot in slots]
        tasks: list[asyncio.Future[Completion]] = []
        try:
            for i, (row, prompt) in enumerate(zip(rows, prompts)):
                on_text = row_callback(i)
                if row.slot.done():
                    self._add(row, params, prompt, on_text)
                task = asyncio.ensure_future(self._sequence(row, params, prompt, on_text, arrived))
                task.add_done_callback(lambda _, row=row: self._close(row))  # a task cancelled before it ran
                tasks.append(task)
        except BaseException:  # the decoding process is gone: nothing of the request stays
            for task in tasks:
                task.cancel()
            for row in rows:
                self._close(row)
            raise
        return self._gathered(tasks)

    async def _gathered(self, tasks: list[asyncio.Future[Completion]]) -> list[Completion]:
        try:
            results = await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            raise
        server_metrics.count_tokens(self.name, [r.prompt_tokens for r in results],
                                    [r.completion_tokens for r in results])
        return list(results)

    async def _seeded_run(self, slots: list[asyncio.Future[None]], params: GenerationParams, prompts: Sequence[str],
                          on_texts: Callable[[list[str]], None] | None) -> list[Completion]:
        results = await self._seeded(slots, params, prompts, on_texts)
        server_metrics.count_tokens(self.name, [r.prompt_tokens for r in results],
                                    [r.completion_tokens for r in results])
        return results

    def _add(self, row: _Row, params: GenerationParams, prompt: str, on_text: Callable[[str], None] | None) -> None:
        """Send ``row``'s sequence (its slot held) to the decoding process: it joins the batch's next step."""
        engine = self.engine
        ids = engine.token_ids([prompt])[0]
        decode, eos, stops = engine.decode_on_loop, engine.eos_token_id, params.stop
        request_id = f"{self.name}-{next(self._ids)}"

        def on_output(sequence: _Sequence) -> None:  # on the event loop, after every step (streamed or stops)
            text, stopped = read_stream(sequence.tokens, decode, eos, stops)
            if stopped:
                sequence.done.set_result(None)  # cut at the stop sequence by finish_completion
                self._cancel(request_id)
            elif on_text is not None:
                on_text(text)

        sequence = _Sequence(asyncio.get_running_loop().create_future(), on_output)
        sampling = params.sampling
        self._send("add", request_id, ids, params.max_new_tokens, on_text is not None or bool(stops),
                   float(params.temperature) if sampling else 1.0, float(params.top_p) if sampling else 1.0,
                   0 if sampling else 1)
        self._sequences[request_id] = sequence
        row.request_id, row.sequence, row.prompt_tokens = request_id, sequence, len(ids)

    def _close(self, row: _Row) -> None:
        """``row``'s one end, whichever comes first (its task's ``finally``, or its task cancelled before it
        ran): a sequence still generating is cancelled, and the slot goes."""
        if row.closed:
            return
        row.closed = True
        if row.request_id is not None:
            self._sequences.pop(row.request_id, None)
            done = row.sequence.done if row.sequence is not None else None
            if done is not None and (not done.done() or done.cancelled()):  # cancelled: its task was, awaiting it
                self._cancel(row.request_id)
        self.admission.leave(row.slot)

    async def _sequence(self, row: _Row, params: GenerationParams, prompt: str,
                        on_text: Callable[[str], None] | None, arrived: float) -> Completion:
        try:
            if row.request_id is None:  # queued: sent once a slot frees
                await self.admission.wait(row.slot)
                self._add(row, params, prompt, on_text)
            sequence = row.sequence
            assert sequence is not None and row.request_id is not None
            try:
                await sequence.done
            except asyncio.CancelledError:  # the client went away
                logger.info(f"{self.name}: {'stream' if on_text else 'request'} cancelled by the client; generation "
                            f"stopped after {len(sequence.tokens)} of {params.max_new_tokens} tokens")
                raise
        finally:
            self._close(row)
        if sequence.timing is not None:
            first, last, timed = sequence.timing
            per_token = (last - first) / (timed - 1) if timed > 1 else None
            server_metrics.observe_latency(self.name, first - arrived, per_token)
        engine = self.engine
        return finish_completion(sequence.tokens, row.prompt_tokens, engine.decode_on_loop, engine.eos_token_id,
                                 params.stop, params.max_new_tokens)

    def _cancel(self, request_id: str) -> None:
        if self._exited is None:
            self.decoding.send("cancel", request_id)

    async def _seeded(self, slots: list[asyncio.Future[None]], params: GenerationParams, prompts: Sequence[str],
                      on_texts: Callable[[list[str]], None] | None) -> list[Completion]:
        """A seeded request: all its rows in one ``generate`` after one seed (as generation=batched), alone."""
        try:
            if not self.seeds_alone:
                raise RequestError("parameter seed: not supported by this model with generation=continuous "
                                   "(serve it with generation=batched)")
            for slot in slots:
                await self.admission.wait(slot)
            request_id = f"{self.name}-{next(self._ids)}"
            request = _Seeded(asyncio.get_running_loop().create_future(), on_texts)
            self._seeded_requests[request_id] = request
            try:
                self._send("seeded", request_id, params, list(prompts), on_texts is not None)
                return await request.done
            except asyncio.CancelledError:
                self._cancel(request_id)
                raise
            finally:
                self._seeded_requests.pop(request_id, None)
        finally:
            for slot in slots:
                self.admission.leave(slot)


class Stream:
    """One streamed request's sequences: their texts as they grow (``updates``), then ``results``."""

    def __init__(self, batch: ContinuousBatch, slots: list[asyncio.Future[None]], params: GenerationParams,
                 prompts: Sequence[str]) -> None:
        self._updates: asyncio.Queue[list[str] | None] = asyncio.Queue()
        self.task = asyncio.ensure_future(batch._start(slots, params, prompts, self._updates.put_nowait))
        self.task.add_done_callback(lambda _: self._updates.put_nowait(None))

    async def updates(self) -> AsyncIterator[list[str]]:
        while (texts := await self._updates.get()) is not None:
            while not self._updates.empty():  # only the newest texts matter
                newer = self._updates.get_nowait()
                if newer is None:
                    yield texts
                    return
                texts = newer
            yield texts

    async def results(self) -> list[Completion]:
        return await self.task

    def cancel(self) -> None:
        self.task.cancel()


def continuous_batch(engine: Generator, decoding: DecodingProcess | None, name: str, max_concurrent_sequences: int,
                     max_queued: int) -> ContinuousBatch | None:
    """The running batch once its process is ready, or None for ``generation=batched``, or when transformers
    cannot batch this model continuously (the reason is printed: the server falls back to the micro-batcher)."""
    if decoding is None:
        return None
    try:
        decoding.wait_ready()
    except Unsupported as e:
        print(f"generation=batched: transformers cannot batch {engine.architecture} continuously ({e}); "
              "generation uses the micro-batcher", flush=True)
        return None
    return ContinuousBatch(engine, name, decoding, max_concurrent_sequences, max_queued)
