"""Continuous batching of a causal LM (``generation=continuous``): every generation joins one running batch.

transformers' own continuous batching (``model.init_continuous_batching()`` -> ``ContinuousBatchingManager``)
runs the decoding loop on its own thread over a paged KV cache: each step decodes the next token of every
running sequence, and a sequence that arrives starts (its prompt is read in) at the next step; one that
ends leaves its slot at once. Every route (v2 REST and gRPC, OpenAI completions and chat, streamed or
whole) sends its sequences here, one ``add_request`` each, through ``admission.py`` (at most
``max_concurrent_sequences`` in the batch, at most ``max_queued`` waiting, else 429).

Per-request settings, where the library decodes a whole batch with one generation config:

- greedy (``temperature`` 0), ``temperature`` and ``top_p``: the batch decodes greedily (exact argmax, the
  text of ``generate``), and ``RowSampling``, a per-request logits processor, draws the token of each row
  that samples, at its own temperature and top_p;
- ``max_tokens``: ``add_request(max_new_tokens=...)``; ``stop``: read after every step (such a sequence is
  streamed internally), the sequence cancelled at the first stop sequence and its text cut there;
- ``seed``: the batch has one random generator, so a seeded sequence runs alone, as ``generation=batched``
  runs it (``Generator.generate``), with the batch paused meanwhile (``manager.pause()``).

A client that disconnects cancels its sequences (``cancel_request``) at once. The KV cache holds
``kv_cache_mb`` MiB (``num_blocks`` pages of ``PAGE_SIZE`` tokens), never a share of the machine's memory,
and no more than ``max_concurrent_sequences`` full contexts (more could never be used).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from transformers.generation.continuous_batching.cb_logits_processors import ContinuousBatchingLogitsProcessor

from sweep.serving import server_metrics
from sweep.serving.admission import Admission
from sweep.serving.engines import Generator
from sweep.serving.generation import finish_completion, streamable_text
from sweep.serving.protocol import Completion, GenerationParams

CONTINUOUS, BATCHED = "continuous", "batched"
logger = logging.getLogger("kserve")  # KServe's logging configuration prints it
# The decoding thread and the event loop (which streams every step's text) take turns with the GIL; at
# Python's default switch interval (5 ms) each could wait that long for the other at every step.
SWITCH_INTERVAL_S = 0.0005
PAGE_SIZE = 64  # tokens per KV-cache page


class RowSampling(ContinuousBatchingLogitsProcessor):
    """Each row decodes as its request asks: greedy, or sampling at its own temperature and top_p.

    The batch itself decodes greedily (``do_sample=False``: the argmax of every row); for a sampling row this
    draws its token and leaves it the only finite score, so the argmax is the draw. Greedy rows cost nothing
    here, and top_p's sort over the vocabulary runs only for rows that ask for it (transformers' per-request
    warpers sort every row at every step: measured, most of a step of the tiny GPT-2).
    """

    supported_kwargs: dict[str, type] = {"greedy": int, "temperature": float, "top_p": float}
    ignored_kwargs: tuple[str, ...] = ()

    def __init__(self) -> None:
        self._rows: torch.Tensor | None = None  # this step's [greedy, temperature, top_p] per row

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.fill_(0)

    def prepare_tensor_args(self, requests_with_new_token: list[Any]) -> torch.Tensor:
        kwargs = [r.state.logit_processor_kwargs for r in requests_with_new_token]
        self._rows = torch.tensor([[float(k.get("greedy", 1)), float(k.get("temperature", 1.0)),
                                    float(k.get("top_p", 1.0))] for k in kwargs], dtype=torch.float32).reshape(-1, 3)
        return torch.zeros(len(kwargs), dtype=torch.int32)

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        rows = self._rows
        if rows is None:
            return scores
        rows = rows[: scores.size(0)].to(scores.device)
        sampled = (rows[:, 0] == 0).nonzero().squeeze(-1)
        if sampled.numel() == 0:
            return scores
        logits = scores[sampled] / rows[sampled, 1:2]
        top_p = rows[sampled, 2:3]
        if bool((top_p < 1).any()):  # as TopPLogitsWarper: drop the least likely tokens outside top_p
            ordered, order = logits.sort(dim=-1)
            drop = ordered.softmax(dim=-1).cumsum(dim=-1) <= (1 - top_p)
            drop[..., -1:] = False
            logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
        drawn = torch.multinomial(logits.softmax(dim=-1), 1).squeeze(-1)
        out = scores.clone()
        out[sampled] = float("-inf")
        out[sampled, drawn] = 0.0
        return out


def kv_bytes_per_token(model: Any) -> int:
    from transformers.generation.continuous_batching.utils import find_head_dim, find_num_key_value_heads

    config = model.config.get_text_config()
    per_layer = find_num_key_value_heads(config) * find_head_dim(config) * model.dtype.itemsize
    return 2 * config.num_hidden_layers * per_layer  # a key and a value per layer


class ContinuousBatch:
    """The running batch of one causal LM, and the admission in front of it; methods run on the event loop."""

    def __init__(self, engine: Generator, name: str, kv_cache_mb: int, max_concurrent_sequences: int,
                 max_queued: int) -> None:
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        self.engine, self.name = engine, name
        self.admission = Admission(max_concurrent_sequences, max_queued, server_metrics.sequences_observer(name),
                                   server_metrics.rejection_counter(name))
        per_token = kv_bytes_per_token(engine.model)
        allowed_tokens = kv_cache_mb * 2**20 // per_token
        useful_tokens = max_concurrent_sequences * engine.context_length
        self.cache_tokens = min(allowed_tokens, useful_tokens)
        if self.cache_tokens < PAGE_SIZE:
            raise ValueError(f"kv_cache_mb={kv_cache_mb}: holds {allowed_tokens} tokens of this model "
                             f"({per_token} bytes each): too few for one page of {PAGE_SIZE}")
        self.cache_mb = self.cache_tokens * per_token / 2**20
        generation_config = GenerationConfig(  # greedy: RowSampling samples the rows that ask for it
            do_sample=False, eos_token_id=engine.eos_token_id, pad_token_id=engine.tokenizer.pad_token_id,
        )
        cb_config = ContinuousBatchingConfig(
            page_size=PAGE_SIZE, num_blocks=self.cache_tokens // PAGE_SIZE,
            max_batch_tokens=max(256, min(engine.context_length, 2048)),
            max_requests_per_batch=max_concurrent_sequences, per_request_processors=True,
            allow_block_sharing=False, auto_switch_to_flash=False, use_cuda_graph=False, use_async_batching=False,
        )
        self.manager = engine.model.init_continuous_batching(generation_config=generation_config,
                                                             continuous_batching_config=cb_config)
        processors = self.manager.logit_processor
        processors.logits_processor.append(RowSampling())
        processors.tensors_required += 1
        processors._retrieve_processors_kwargs()
        processors.do_processing = True
        self._observe_step = server_metrics.step_observer(name)
        self._watch_steps()
        # A seed needs the generator to itself: such a sequence runs alone with the batch paused, through
        # ``Generator.generate``, which needs the model's own attention (CB may have switched it).
        self.seeds_alone = self.manager._original_attn_impl is None
        # What runs beside the batch (seeded requests; unstreamed=batched: whole-batch generates) runs on the
        # micro-batcher's forward thread (``use_forward_thread``): the engine's tokenizer stays on one thread.
        self._alone = ThreadPoolExecutor(max_workers=1, thread_name_prefix="seeded")
        self._run_alone: Callable[[Callable[[], Any]], Awaitable[Any]] | None = None
        self._ids = itertools.count()

    def start(self) -> None:
        """The decoding thread: started when the server starts (a mistake found before then exits at once)."""
        if SWITCH_INTERVAL_S:
            sys.setswitchinterval(SWITCH_INTERVAL_S)
        if not self.manager.is_running():
            self.manager.start()

    def describe(self) -> str:
        return (f"generation continuous (up to {self.admission.max_running} sequences, {self.admission.max_queued} "
                f"queued; KV cache {self.cache_mb:.0f} MiB = {self.cache_tokens} tokens)")

    def use_forward_thread(self, run_alone: Callable[[Callable[[], Any]], Awaitable[Any]]) -> None:
        self._run_alone = run_alone

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
        if self.manager.is_running():
            self.manager.stop(block=True, timeout=10)
        self._alone.shutdown(wait=False, cancel_futures=True)

    def _watch_steps(self) -> None:
        """Observe the tokens of every step: the scheduler's answer, in the processor the loop creates."""
        create = self.manager._create_batch_processor

        def create_watched() -> Any:
            processor = create()
            schedule = processor.scheduler.schedule_batch
            if getattr(schedule, "_sweep_watched", False):
                return processor

            def watched(*args: Any, **kwargs: Any) -> Any:
                scheduled = schedule(*args, **kwargs)
                if scheduled[0]:
                    self._observe_step(scheduled[2])
                return scheduled

            watched._sweep_watched = True  # type: ignore[attr-defined]
            processor.scheduler.schedule_batch = watched
            return processor

        self.manager._create_batch_processor = create_watched

    # -- generation ------------------------------------------------------------------------------

    async def generate(self, params: GenerationParams, prompts: Sequence[str],
                       on_texts: Callable[[list[str]], None] | None = None) -> list[Completion]:
        """The completions of ``prompts``, each its own sequence in the batch; ``Overloaded`` if the queue is full.

        Streamed: ``on_texts`` gets every row's streamable text whenever one grew.
        """
        return await self._run(self.admission.enter(len(prompts)), params, prompts, on_texts)

    def open_stream(self, params: GenerationParams, prompts: Sequence[str]) -> Stream:
        """Admit now (``Overloaded`` before any answer is sent), then stream."""
        return Stream(self, self.admission.enter(len(prompts)), params, prompts)

    async def _run(self, slots: list[asyncio.Future[None]], params: GenerationParams, prompts: Sequence[str],
                   on_texts: Callable[[list[str]], None] | None) -> list[Completion]:
        if params.seeded:
            results = await self._seeded(slots, params, prompts, on_texts)
            server_metrics.count_tokens(self.name, [r.prompt_tokens for r in results],
                                        [r.completion_tokens for r in results])
            return results
        texts = [""] * len(prompts)

        def row_callback(i: int) -> Callable[[str], None] | None:
            if on_texts is None:
                return None

            def on_text(text: str) -> None:
                texts[i] = text
                on_texts(list(texts))

            return on_text

        tasks = [asyncio.ensure_future(self._sequence(slot, params, prompt, row_callback(i)))
                 for i, (slot, prompt) in enumerate(zip(slots, prompts))]
        try:
            results = await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            raise
        server_metrics.count_tokens(self.name, [r.prompt_tokens for r in results],
                                    [r.completion_tokens for r in results])
        return list(results)

    async def _sequence(self, slot: asyncio.Future[None], params: GenerationParams, prompt: str,
                        on_text: Callable[[str], None] | None) -> Completion:
        arrived = time.perf_counter()
        try:
            await self.admission.wait(slot)
            return await self._in_batch(params, prompt, on_text, arrived)
        finally:
            self.admission.leave(slot)

    async def _in_batch(self, params: GenerationParams, prompt: str, on_text: Callable[[str], None] | None,
                        arrived: float) -> Completion:
        engine = self.engine
        ids = engine.token_ids([prompt])[0]
        decode, eos, stops = engine.decode_on_loop, engine.eos_token_id, params.stop
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        request_id = f"{self.name}-{next(self._ids)}"
        streaming = on_text is not None or bool(stops)

        made = 0

        def handle(output: Any) -> None:  # on the event loop, for every step's output (streaming) or the last
            nonlocal made
            made = len(output.generated_tokens)
            if done.done():
                return
            if output.error:
                done.set_exception(RuntimeError(f"generation failed: {output.error}"))
                return
            if output.is_finished():
                done.set_result(output)
                return
            tokens = output.generated_tokens
            if stops and any(stop in decode(tokens) for stop in stops):
                done.set_result(output)  # cut at the stop sequence by finish_completion
                self._cancel(request_id)
                return
            if on_text is not None:
                on_text(streamable_text(tokens, decode, eos, stops))

        self.manager.register_result_handler(request_id, handle)
        sampling = params.sampling
        self.manager.add_request(
            ids, request_id=request_id, max_new_tokens=params.max_new_tokens, streaming=streaming,
            record_timestamps=True, eos_token_id=eos,
            temperature=float(params.temperature) if sampling else 1.0,
            top_p=float(params.top_p) if sampling else 1.0, greedy=0 if sampling else 1,
        )
        try:
            output = await done
        except asyncio.CancelledError:  # the client went away
            self._cancel(request_id)
            logger.info(f"{self.name}: {'stream' if on_text else 'request'} cancelled by the client; generation "
                        f"stopped after {made} of {params.max_new_tokens} tokens")
            raise
        stamps = output.timestamps or []
        if stamps:
            per_token = (stamps[-1] - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else None
            server_metrics.observe_latency(self.name, stamps[0] - arrived, per_token)
        return finish_completion(output.generated_tokens, len(ids), decode, eos, stops, params.max_new_tokens)

    def _cancel(self, request_id: str) -> None:
        self.manager.cancel_request(request_id)
        router = self.manager.output_router  # a cancelled request sends no last output: drop its handler
        with router._lock:
            router.result_handlers.pop(request_id, None)

    async def _seeded(self, slots: list[asyncio.Future[None]], params: GenerationParams, prompts: Sequence[str],
                      on_texts: Callable[[list[str]], None] | None) -> list[Completion]:
        """A seeded request: all its rows in one ``generate`` after one seed (as generation=batched), alone."""
        try:
            if not self.seeds_alone:
                from sweep.serving.protocol import RequestError

                raise RequestError("parameter seed: not supported by this model with generation=continuous "
                                   "(serve it with generation=batched)")
            for slot in slots:
                await self.admission.wait(slot)
            loop = asyncio.get_running_loop()
            cancelled = threading.Event()

            def texts_now(texts: list[str]) -> None:  # on the seeded thread
                if on_texts is not None:
                    loop.call_soon_threadsafe(on_texts, texts)

            def run() -> list[Completion]:
                with self.manager.pause():
                    return self.engine.generate(params, prompts, on_texts=texts_now if on_texts else None,
                                                cancelled=cancelled)

            try:
                if self._run_alone is not None:
                    return await self._run_alone(run)
                return await loop.run_in_executor(self._alone, run)
            finally:
                cancelled.set()
        finally:
            for slot in slots:
                self.admission.leave(slot)


class Stream:
    """One streamed request's sequences: their texts as they grow (``updates``), then ``results``."""

    def __init__(self, batch: ContinuousBatch, slots: list[asyncio.Future[None]], params: GenerationParams,
                 prompts: Sequence[str]) -> None:
        self._updates: asyncio.Queue[list[str] | None] = asyncio.Queue()
        self.task = asyncio.ensure_future(batch._run(slots, params, prompts, self._updates.put_nowait))
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


def continuous_batch(engine: Generator, name: str, generation: str, kv_cache_mb: int, max_concurrent_sequences: int,
                     max_queued: int) -> ContinuousBatch | None:
    """The running batch, or None for ``generation=batched``, or when transformers cannot batch this model
    continuously (the reason is printed: the server falls back to the micro-batcher)."""
    if generation == BATCHED:
        return None
    model = engine.model
    reason = None
    if not hasattr(model, "init_continuous_batching"):
        reason = f"{type(model).__name__} has no continuous batching in this transformers"
    else:
        try:
            return ContinuousBatch(engine, name, kv_cache_mb, max_concurrent_sequences, max_queued)
        except (ValueError, TypeError, AttributeError, NotImplementedError, RuntimeError, MemoryError) as e:
            if isinstance(e, ValueError) and str(e).startswith("kv_cache_mb="):
                raise
            reason = " ".join(str(e).split()) or type(e).__name__
    print(f"generation=batched: transformers cannot batch {type(model).__name__} continuously ({reason}); "
          "generation uses the micro-batcher", flush=True)
    return None
