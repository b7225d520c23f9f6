"""The decoding process seen from the server: start it, send it commands, hear its messages on the event loop.

The process (decoding_engine.py) is spawned, not forked: the server has already loaded tokenizers and may
run threads, and a fork would copy their locks mid-use. It is a daemon of the server, so it ends with it;
and it ends itself when the pipe closes (the server killed). What it sends is read on the event loop
itself, when the pipe is readable (a message holds a whole step).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _decoding_main(*args: Any) -> None:
    """In the new process: the engine's heavy imports happen there, not here (the server spawns it early)."""
    from sweep.serving.decoding_engine import decoding_main

    decoding_main(*args)


class Unsupported(Exception):
    """transformers cannot batch this model continuously (the reason is the message)."""


class DecodingGone(RuntimeError):
    """The decoding process has exited: nothing can be decoded until the server restarts (HTTP 503, gRPC
    UNAVAILABLE, with this message)."""

    def __init__(self, exitcode: int | None) -> None:
        super().__init__(f"the decoding process has exited (code {exitcode}); restart the server")
        self.exitcode = exitcode


class DecodingProcess:
    def __init__(self, model_dir: Path, device: str, threads: int | None, kv_cache_mb: int,
                 max_concurrent_sequences: int, stream_interval_ms: float = 0.0) -> None:
        """Start the process; ``wait_ready`` (or ``facts``) waits until its batch runs (``Unsupported``, or
        ``ValueError`` for a bad option or folder). Started first, it loads the model while the server imports."""
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self.process = context.Process(
            target=_decoding_main, name="sweep-decoding", daemon=True,
            args=(str(model_dir), device, threads, kv_cache_mb, max_concurrent_sequences, stream_interval_ms, child),
        )
        self.process.start()
        child.close()  # ours closed: when the process ends, a read here sees the end of the pipe
        self._send_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None  # the one that reads its messages
        self._closing = False  # close() stops the process: its end is expected, and the loop may be gone
        self._facts: dict[str, Any] | None = None

    def wait_ready(self) -> None:
        if self._facts is None:
            self._facts = self._ready()

    @property
    def facts(self) -> dict[str, Any]:
        """What the process says once its batch runs (waited for the first time)."""
        self.wait_ready()
        assert self._facts is not None
        return self._facts

    def _ready(self) -> dict[str, Any]:
        try:
            kind, detail = self._conn.recv()  # loading the model can take minutes: no timeout
        except (EOFError, OSError):
            self.process.join(5)
            raise RuntimeError(f"the decoding process exited (code {self.process.exitcode}) before it was ready; "
                               "its error is above") from None
        if kind == "ready":
            return detail
        self.process.join(10)
        if kind == "unsupported":
            raise Unsupported(detail)
        if kind == "invalid":
            raise ValueError(detail)
        raise RuntimeError(f"the decoding process failed to start:\n{detail}")

    def listen(self, loop: asyncio.AbstractEventLoop, on_message: Callable[[tuple[Any, ...]], None],
               on_exit: Callable[[], None]) -> None:
        """Hand every message to ``on_message`` on ``loop``, read there when the pipe is readable (a reader
        thread between cost a thread's wake-up and a hand-over of the GIL per message); ``on_exit`` once the
        process is gone."""
        fd = self._conn.fileno()

        def read() -> None:
            try:
                while True:  # what is there now, then back to the loop
                    on_message(self._conn.recv())
                    if not self._conn.poll():
                        return
            except (EOFError, OSError):
                loop.remove_reader(fd)
                if not self._closing:
                    # The pipe closes before the process is reaped: its exit code (for the log), off the loop.
                    waited = loop.run_in_executor(None, self.process.join, 5)
                    waited.add_done_callback(lambda _: on_exit())

        loop.add_reader(fd, read)
        self._loop = loop

    @property
    def listening(self) -> bool:
        return self._loop is not None

    def send(self, *command: Any) -> None:
        try:
            with self._send_lock:
                self._conn.send(command)
        except (BrokenPipeError, ConnectionResetError, OSError):
            raise DecodingGone(self.process.exitcode) from None

    def close(self) -> None:
        self._closing = True
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError, ValueError, OSError):  # off the loop's thread, or its fd gone
                self._loop.remove_reader(self._conn.fileno())
        if self.process.is_alive():
            with contextlib.suppress(RuntimeError):  # it may have exited meanwhile
                self.send("stop")
            self.process.join(15)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(5)
        self._conn.close()

