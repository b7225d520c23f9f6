"""The continuous batch's decoding, in a process of its own (the server's side is decoding_process.py).

One Python process has one GIL: when the server's event loop (HTTP, Server-Sent Events, detokenizing every
step of every stream) and the decoding loop shared it, each streamed chunk was time the batch did not decode
(the server never passed one core: docs/benchmarks.md: Behind the code's choices). So, as vLLM splits its API server
from its engine core,
the model and transformers' ``ContinuousBatchingManager`` live here, and the server only sends token ids in
and reads new token ids out, over one pipe:

- in: ``("add", id, prompt_ids, max_new_tokens, streaming, temperature, top_p, greedy)``, ``("cancel", id)``,
  ``("seeded", id, params, prompts, streamed)`` (a seeded request: ``Generator.generate`` alone, the batch
  paused), ``("stop",)``;
- out: first ``("ready", facts)`` (or ``("unsupported", why)``: the server falls back to its micro-batcher;
  ``("invalid", why)``: a bad option), then ``("steps", tokens_per_step, outputs)``, sent by the
  generation thread as each step with outputs ends (the sizes of the steps since the last message, the
  step's outputs: ``(id, new_token_ids, finished, error, timing)``), and for seeded
  requests ``("texts", id, texts)`` and ``("done", id, completions)`` / ``("failed", id, why)``.

A pipe that closes (the server is gone) ends the process.
"""

from __future__ import annotations

import os
import signal
import threading
import traceback
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
from transformers.generation.continuous_batching.cb_logits_processors import ContinuousBatchingLogitsProcessor
from transformers.generation.continuous_batching.continuous_api import OutputRouter

from sweep.plan.cpus import usable_cpus
from sweep.serving.cpu_budget import decoding_threads, freeze_startup_objects
from sweep.serving.held_outputs import HeldOutputs

PAGE_SIZE = 64  # tokens per KV-cache page
RECENT_CANCELS = 4096  # cancelled ids remembered: a late output of one comes within a step or two
NO_ARGS = torch.zeros(0, dtype=torch.int32)  # a step of greedy rows: nothing for the processors' storage


class SentTokens:
    """How many tokens of each streamed sequence have been sent: the batch's outputs carry all of a
    sequence's tokens so far, a message only the new ones. The batch applies a cancel at its next step,
    so an output of a cancelled sequence can still come; the ids of recent cancels are remembered so that
    it leaves no count behind (one per such race, for the life of the server). Outputs are read on the
    generation thread, cancels on the command thread: one lock, so that a cancel cannot fall between the check
    and the count."""

    def __init__(self, remember: int = RECENT_CANCELS) -> None:
        self._lock = threading.Lock()
        self._sent: dict[str, int] = {}
        self._cancelled: OrderedDict[str, None] = OrderedDict()  # a bounded set, oldest first
        self._remember = remember

    def __len__(self) -> int:
        return len(self._sent)

    def new_tokens(self, rid: str, tokens: list[int], finished: bool) -> list[int]:
        """The tokens of ``rid``'s output not sent yet; counted as sent."""
        with self._lock:
            start = self._sent.pop(rid, 0)
            if not finished and rid not in self._cancelled:
                self._sent[rid] = len(tokens)
        return list(tokens[start:])

    def cancel(self, rid: str) -> None:
        with self._lock:
            self._sent.pop(rid, None)
            self._cancelled[rid] = None
            while len(self._cancelled) > self._remember:
                self._cancelled.popitem(last=False)


class RowSampling(ContinuousBatchingLogitsProcessor):
    """Each row decodes as its request asks: greedy, or sampling at its own temperature and top_p.

    The batch itself decodes greedily (``do_sample=False``: the argmax of every row); for a sampling row this
    draws its token and leaves it the only finite score, so the argmax is the draw. Greedy rows cost nothing
    here, and top_p's sort over the vocabulary runs only for rows that ask for it (transformers' per-request
    warpers sort every row at every step, most of a small model's step). A step whose rows are
    all greedy (the usual case) turns the batch's logits processing off (``attach``): no tensors are built
    or read for it, less of the decoding process's CPU per token (docs/benchmarks.md: Behind the code's choices).
    """

    supported_kwargs: dict[str, type] = {"greedy": int, "temperature": float, "top_p": float}
    ignored_kwargs: tuple[str, ...] = ()

    def __init__(self) -> None:
        self._rows: torch.Tensor | None = None  # this step's [greedy, temperature, top_p] per row
        self._processors: Any = None

    def attach(self, processors: Any) -> None:
        """Switch ``processors`` (transformers' list, of which this is the only one) on and off per step:
        the model runner reads its ``do_processing`` after the step's arguments are prepared."""
        self._processors = processors

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.fill_(0)

    def prepare_tensor_args(self, requests_with_new_token: list[Any]) -> torch.Tensor:
        kwargs = [r.state.logit_processor_kwargs for r in requests_with_new_token]
        sampling = any(k.get("greedy", 1) == 0 for k in kwargs)
        if self._processors is not None:
            self._processors.do_processing = sampling
        if not sampling:
            self._rows = None
            return NO_ARGS
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


def cache_tokens(per_token: int, context_length: int, kv_cache_mb: int, max_concurrent_sequences: int) -> int:
    """Tokens the KV cache holds (``per_token`` bytes each): ``kv_cache_mb`` of them, but never more than the
    sequences could use."""
    allowed = kv_cache_mb * 2**20 // per_token
    if allowed < PAGE_SIZE:
        raise ValueError(f"kv_cache_mb={kv_cache_mb}: holds {allowed} tokens of this model "
                         f"({per_token} bytes each): too few for one page of {PAGE_SIZE}")
    return min(allowed, max_concurrent_sequences * context_length)


def build_manager(engine: Any, tokens: int, max_concurrent_sequences: int,
                  observe_step: Callable[[int], None]) -> Any:
    """transformers' manager over a cache of ``tokens``: greedy, with ``RowSampling`` and a step watcher."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    generation_config = GenerationConfig(  # greedy: RowSampling samples the rows that ask for it
        do_sample=False, eos_token_id=engine.eos_token_id, pad_token_id=engine.tokenizer.pad_token_id,
    )
    cb_config = ContinuousBatchingConfig(
        page_size=PAGE_SIZE, num_blocks=tokens // PAGE_SIZE,
        max_batch_tokens=max(256, min(engine.context_length, 2048)),
        max_requests_per_batch=max_concurrent_sequences, per_request_processors=True,
        allow_block_sharing=False, auto_switch_to_flash=False, use_cuda_graph=False, use_async_batching=False,
    )
    manager = engine.model.init_continuous_batching(generation_config=generation_config,
                                                    continuous_batching_config=cb_config)
    processors = manager.logit_processor
    sampling = RowSampling()
    if not processors.logits_processor:  # the only processor: its steps of greedy rows skip processing
        sampling.attach(processors)
    processors.logits_processor.append(sampling)
    processors.tensors_required += 1
    processors._retrieve_processors_kwargs()
    processors.do_processing = True
    _watch_steps(manager, observe_step)
    return manager


def _watch_steps(manager: Any, observe_step: Callable[[int], None]) -> None:
    """Observe the tokens of every step: the scheduler's answer, in the processor the loop creates."""
    create = manager._create_batch_processor

    def create_watched() -> Any:
        processor = create()
        schedule = processor.scheduler.schedule_batch
        if getattr(schedule, "_sweep_watched", False):
            return processor

        def watched(*args: Any, **kwargs: Any) -> Any:
            scheduled = schedule(*args, **kwargs)
            if scheduled[0]:
                observe_step(scheduled[2])
            return scheduled

        watched._sweep_watched = True  # type: ignore[attr-defined]
        processor.scheduler.schedule_batch = watched
        return processor

    manager._create_batch_processor = create_watched


class PipeOutputs(OutputRouter):
    """The batch's outputs sent down the pipe by the generation thread itself, as each step ends. A thread
    of ours between the two (a queue, then the send) cost the step more in hand-overs of the GIL than the
    send itself (profiled at one stream of the tiny GPT-2: ~7% of the step waiting, ~3% sending)."""

    def __init__(self, send_outputs: Callable[[list[Any]], None]) -> None:
        super().__init__()
        self._send_outputs = send_outputs

    def deliver(self, output: Any) -> None:
        self._send_outputs([output])

    def deliver_batch(self, outputs: list[Any]) -> None:
        self._send_outputs(outputs)


class DecodingEngine:
    """The manager, the sending of its outputs, and the commands that reach it (in the decoding process)."""

    def __init__(self, engine: Any, manager: Any, steps: list[int], conn: Connection,
                 stream_interval_s: float = 0.0) -> None:
        self.engine, self.manager, self.conn = engine, manager, conn
        self._send_lock = threading.Lock()
        self._steps = steps  # tokens of each step since the last message (appended by the generation thread)
        self._sent = SentTokens()
        self._held = HeldOutputs(stream_interval_s)
        self._seeded = ThreadPoolExecutor(max_workers=1, thread_name_prefix="seeded")
        self._seeded_cancelled: dict[str, threading.Event] = {}
        manager.output_router = PipeOutputs(self.send_outputs)  # before start: the batch processor takes it

    def send(self, message: tuple[Any, ...]) -> None:
        with self._send_lock:
            self.conn.send(message)

    def send_outputs(self, outputs: list[Any]) -> None:
        """One step's outputs, from the generation thread: sent with the steps' sizes since the last message
        once the stream interval has passed (or one of them is urgent), else held until then."""
        outputs = self._held.take(outputs)
        if outputs:
            self._send_outputs_now(outputs)

    def _send_outputs_now(self, outputs: list[Any]) -> None:
        taken = len(self._steps)
        steps = self._steps[:taken]
        del self._steps[:taken]
        self.send(("steps", steps, [self._output(o) for o in outputs]))

    def _output(self, output: Any) -> tuple[str, list[int], bool, str | None, tuple[float, float, int] | None]:
        rid, tokens, finished = output.request_id, output.generated_tokens, output.is_finished()
        stamps = output.timestamps or []
        timing = (stamps[0], stamps[-1], len(stamps)) if finished and stamps else None
        return rid, self._sent.new_tokens(rid, tokens, finished), finished, output.error, timing

    def serve_commands(self) -> None:
        while True:
            try:
                command = self.conn.recv()
            except (EOFError, OSError):  # the server is gone
                return
            kind = command[0]
            if kind == "stop":
                return
            if kind == "add":
                _, rid, ids, max_new_tokens, streaming, temperature, top_p, greedy = command
                self.manager.add_request(
                    ids, request_id=rid, max_new_tokens=max_new_tokens, streaming=streaming, record_timestamps=True,
                    eos_token_id=self.engine.eos_token_id, temperature=temperature, top_p=top_p, greedy=greedy,
                )
            elif kind == "cancel":
                rid = command[1]
                if (event := self._seeded_cancelled.get(rid)) is not None:  # a seeded request: not in the batch
                    event.set()
                else:
                    self.manager.cancel_request(rid)
                    self._held.forget(rid)
                    self._sent.cancel(rid)
            elif kind == "seeded":
                _, rid, params, prompts, streamed = command
                self._seeded_cancelled[rid] = threading.Event()
                self._seeded.submit(self._run_seeded, rid, params, prompts, streamed)

    def _run_seeded(self, rid: str, params: Any, prompts: list[str], streamed: bool) -> None:
        """A seeded request: all its rows in one ``generate`` after one seed (as generation=batched), alone."""
        cancelled = self._seeded_cancelled[rid]
        try:
            on_texts = (lambda texts: self.send(("texts", rid, texts))) if streamed else None
            with self.manager.pause():
                if held := self._held.drain():  # no step comes to send them while the batch is paused
                    self._send_outputs_now(held)
                results = self.engine.generate(params, prompts, on_texts=on_texts, cancelled=cancelled)
            self.send(("done", rid, results))
        except Exception as e:  # noqa: BLE001 - the request fails, the batch goes on
            self.send(("failed", rid, f"{type(e).__name__}: {e}"))
        finally:
            self._seeded_cancelled.pop(rid, None)

    def close(self) -> None:
        if self.manager.is_running():
            self.manager.stop(block=True, timeout=10)
        self._seeded.shutdown(wait=False, cancel_futures=True)


def decoding_main(model_dir: str, device: str, threads: int, kv_cache_mb: int, max_concurrent_sequences: int,
                  stream_interval_ms: float, conn: Connection) -> None:
    """The decoding process: load the model, build and start the batch, then serve the pipe until it closes."""
    # Ctrl-C in a terminal reaches the whole process group: the server shuts down and stops this process
    # (or closes the pipe); a KeyboardInterrupt here would only print a second traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    usable = usable_cpus()
    threads = decoding_threads(threads, usable)
    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)  # the steps run one after another: no inter-op pool to keep warm
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        from sweep.serving.engines import Generator

        try:
            engine = Generator(Path(model_dir), device)
        except (OSError, ValueError) as e:  # an incomplete or corrupt folder: the server says so, in one line
            conn.send(("invalid", " ".join(str(e).split())))
            return
        if not hasattr(engine.model, "init_continuous_batching"):
            conn.send(("unsupported", f"{type(engine.model).__name__} has no continuous batching in this transformers"))
            return
        try:
            per_token = kv_bytes_per_token(engine.model)
            tokens = cache_tokens(per_token, engine.context_length, kv_cache_mb, max_concurrent_sequences)
        except ValueError as e:
            conn.send(("invalid", str(e)))
            return
        steps: list[int] = []
        try:
            manager = build_manager(engine, tokens, max_concurrent_sequences, steps.append)
        except (ValueError, TypeError, AttributeError, NotImplementedError, RuntimeError, MemoryError) as e:
            conn.send(("unsupported", " ".join(str(e).split()) or type(e).__name__))
            return
        decoding = DecodingEngine(engine, manager, steps, conn, stream_interval_ms / 1000)
        manager.start()
    except Exception:  # noqa: BLE001 - the server reports it and exits
        conn.send(("crashed", traceback.format_exc()))
        return
    # A seed needs the generator to itself: such a sequence runs alone with the batch paused, through
    # ``Generator.generate``, which needs the model's own attention (CB may have switched it).
    conn.send(("ready", {"cache_tokens": tokens, "cache_mb": tokens * per_token / 2**20,
                         "seeds_alone": manager._original_attn_impl is None, "pid": os.getpid(),
                         "threads": torch.get_num_threads(), "usable_cpus": usable,
                         "stream_interval_ms": stream_interval_ms}))
    freeze_startup_objects()
    try:
        decoding.serve_commands()
    finally:
        decoding.close()
