"""Continuous batching (``generation=continuous``, the default for a causal LM) and admission under overload.

Admission's queue logic first (no server), then ONE real ``python -m sweep serve`` of the tiny GPT-2 for
the module (16 sequences at once, 16 more may wait), asked through the real ``openai`` client, httpx
and KServe's gRPC client: streams share the batch, streamed text is the whole text, a newcomer starts at
the next step, a client that leaves frees its slot, the queue bound answers 429 / RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sweep.plan.cpus import usable_cpus
from sweep.serving.admission import Admission, Overloaded
from sweep.serving.cpu_budget import DEFAULT_DECODING_THREADS
from sweep.train.tiny_exports import export_tiny_lm
from tests.helpers.serving import LM_NAME, Server, grpc_infer, serving, start_server, texts, wait_grpc_ready

openai = pytest.importorskip("openai")  # the dev extra

SLOTS, QUEUED = 16, 16
PROMPTS = ["The meaning of life is", "Once upon a time", "In 1850 the city", "She opened the door and",
           "Rain fell on", "The committee decided", "A small dog", "Numbers: one two three"]


# ---------------------------------------------------------------------------------------------
# Admission, on its own.

def test_admission_queues_in_order_and_refuses_past_the_bound() -> None:
    async def scenario() -> None:
        seen: list[tuple[int, int]] = []
        rejected: list[int] = []
        admission = Admission(2, 3, lambda r, w: seen.append((r, w)), lambda: rejected.append(1))
        first = admission.enter(3)  # two slots now, one waits
        assert [s.done() for s in first] == [True, True, False] and seen[-1] == (2, 1)
        second = admission.enter(2)  # the queue: 3 of 3
        with pytest.raises(Overloaded, match="max_queued=3"):
            admission.enter(1)
        assert rejected == [1] and admission.waiting == 3
        admission.leave(first[0])  # a finished sequence hands its slot to the oldest waiter
        assert first[2].done() and not second[0].done()
        waiter = asyncio.ensure_future(Admission.wait(second[1]))
        await asyncio.sleep(0)
        waiter.cancel()  # a client that left while waiting gives up its place
        admission.leave(second[1])
        assert admission.waiting == 1
        for slot in (first[1], first[2]):
            admission.leave(slot)
        assert second[0].done() and (admission.running, admission.waiting) == (1, 0)
        admission.leave(second[0])
        assert seen[-1] == (0, 0)

    asyncio.run(scenario())


def test_a_streams_tokens_are_sent_once_and_a_cancelled_one_leaves_no_count() -> None:
    from sweep.serving.decoding_engine import SentTokens

    sent = SentTokens(remember=2)
    assert sent.new_tokens("a", [1, 2], finished=False) == [1, 2]
    assert sent.new_tokens("a", [1, 2, 3], finished=False) == [3]
    assert sent.new_tokens("a", [1, 2, 3, 4], finished=True) == [4] and len(sent) == 0
    # cancelled mid-stream; the batch's output of the step under way still comes after the cancel
    sent.new_tokens("b", [5], finished=False)
    sent.cancel("b")
    assert sent.new_tokens("b", [5, 6], finished=False) == [5, 6] and len(sent) == 0
    # only the latest cancels are remembered (2 here), the oldest forgotten first
    sent.cancel("c")
    sent.cancel("d")
    assert sent.new_tokens("b", [7], finished=False) == [7] and len(sent) == 1
    sent.new_tokens("d", [8], finished=False)
    assert len(sent) == 1


@pytest.mark.parametrize("clean_up_spaces", [False, True])
def test_the_streams_decode_is_the_tokenizers(tmp_path: Path, cache_dir: Path, clean_up_spaces: bool) -> None:
    """What the event loop decodes after every step is ``tokenizer.decode``'s text, by the Rust tokenizer
    itself when the tokenizer cleans up no spaces (else by ``tokenizer.decode``)."""
    import json
    import random

    from sweep.serving.engines import Generator

    folder = export_tiny_lm(tmp_path / "lm", cache_dir)
    config = folder / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "clean_up_tokenization_spaces": clean_up_spaces}))
    engine = Generator(folder, "cpu", weights=False)
    tokenizer = engine.tokenizer
    assert (engine._rust_decode is None) == clean_up_spaces
    draw = random.Random(0)
    ids = [tokenizer.eos_token_id, *tokenizer("Hello, world! It's a test: a (b) c.")["input_ids"]]
    for length in range(0, 60, 3):
        row = [draw.choice(ids) if draw.random() < 0.3 else draw.randrange(len(tokenizer)) for _ in range(length)]
        assert engine.decode_on_loop(row) == tokenizer.decode(row, skip_special_tokens=True), row


def test_greedy_steps_skip_the_logits_processing_and_sampling_rows_still_sample(tmp_path: Path,
                                                                                 cache_dir: Path) -> None:
    """transformers' batch manager as the decoding process builds it: a greedy request decodes
    ``generate``'s greedy tokens with the batch's logits processing off for its steps; requests that sample
    (temperature 5 over the tiny GPT-2's ~2,000 tokens) draw other tokens, each its own."""
    import torch

    from sweep.serving.decoding_engine import build_manager
    from sweep.serving.engines import Generator

    engine = Generator(export_tiny_lm(tmp_path / "lm", cache_dir), "cpu")
    manager = build_manager(engine, 4096, 4, lambda _: None)
    prompt = engine.tokenizer("Once upon a time")["input_ids"]
    with torch.no_grad():
        expected = engine.model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, min_new_tokens=12,
                                         pad_token_id=engine.tokenizer.pad_token_id)[0, len(prompt):].tolist()

    def decode(rid: str, greedy: int, temperature: float) -> list[int]:
        manager.add_request(prompt, request_id=rid, max_new_tokens=12, streaming=False, eos_token_id=-1,
                            temperature=temperature, top_p=1.0, greedy=greedy)
        result = manager.get_result(request_id=rid, timeout=60)
        assert result is not None and result.error is None, result
        return list(result.generated_tokens)

    manager.start()
    try:
        assert decode("greedy", 1, 1.0) == expected
        assert manager.logit_processor.do_processing is False  # its steps: greedy rows only
        drawn = [decode(f"sampled-{i}", 0, 5.0) for i in range(2)]
        assert expected not in drawn and drawn[0] != drawn[1]
    finally:
        manager.stop(block=True, timeout=10)


def test_a_sequence_is_sent_to_the_decoding_process_before_the_request_waits(tmp_path: Path, cache_dir: Path) -> None:
    """``open_stream`` sends an admitted sequence to the batch before it returns (not a turn of the event loop
    later); a stream cancelled before its tasks ever ran still frees its slot and leaves the batch. The decoding
    process holds a stream's tokens for ``stream_interval_ms`` (100 here): a long stream comes in a few updates,
    its first token at once, its text the whole text."""
    from sweep.serving.continuous import continuous_batch
    from sweep.serving.decoding_process import DecodingProcess
    from sweep.serving.engines import Generator
    from sweep.serving.protocol import GenerationParams

    folder = export_tiny_lm(tmp_path / "lm", cache_dir)
    engine = Generator(folder, "cpu", weights=False)
    # one sequence at a time: a sequence the decoding process still decodes holds back the next
    batch = continuous_batch(engine, DecodingProcess(folder, "cpu", 1, 8, 1, stream_interval_ms=100), "lm", 1, 4)
    assert batch is not None
    params, long = GenerationParams(max_new_tokens=8), GenerationParams(max_new_tokens=200)

    async def scenario() -> None:
        stream = batch.open_stream(params, ["Once upon a time"])
        assert len(batch._sequences) == 1 and batch.admission.running == 1  # sent, with no await in between
        texts = [texts async for texts in stream.updates()]
        (result,) = await stream.results()
        assert texts and result.text.startswith(texts[-1][0]) and result.completion_tokens == 8
        whole = await batch.generate(params, ["Once upon a time"])
        assert whole[0].text == result.text

        gone = batch.open_stream(params, ["She opened the door and"])
        gone.cancel()  # before the event loop has run any of its tasks
        await asyncio.sleep(0.5)
        assert (batch.admission.running, batch.admission.waiting, len(batch._sequences)) == (0, 0, 0)
        after = await batch.generate(params, ["Once upon a time"])  # the batch goes on
        assert after[0].text == result.text

        started = time.perf_counter()
        (long_whole,) = await batch.generate(long, ["In 1850 the city"])
        whole_s = time.perf_counter() - started
        streamed = batch.open_stream(long, ["In 1850 the city"])
        started = time.perf_counter()
        updates = [(time.perf_counter() - started, texts[0]) async for texts in streamed.updates()]
        (long_streamed,) = await streamed.results()
        assert long_streamed.text == long_whole.text and long_streamed.completion_tokens == 200
        # held for 100 ms at a time (the first token not): a handful of updates, not one per token
        assert 1 <= len(updates) <= 2 + whole_s / 0.1 * 2 < 200, (len(updates), whole_s)
        assert updates[0][0] < whole_s / 4 and long_whole.text.startswith(updates[-1][1]), (updates[0], whole_s)
        leaving = batch.open_stream(long, ["In 1850 the city"])
        await leaving.updates().__anext__()
        leaving.cancel()  # mid-stream, as a client that leaves: its sequence leaves the decoding process too
        started = time.perf_counter()
        await batch.generate(params, ["Once upon a time"])
        assert time.perf_counter() - started < whole_s / 2, "the cancelled sequence still held the batch's one slot"

    try:
        asyncio.run(scenario())
    finally:
        batch.close()


def test_bad_options_exit_2_with_one_line() -> None:
    for argv, message in [
        (["model=x", "generation=fast"], "error: generation: expected continuous or batched, got 'fast'"),
        (["model=x", "kv_cache_mb=0"], "error: kv_cache_mb: must be >= 1, got 0"),
        (["model=x", "max_concurrent_sequences=0"], "error: max_concurrent_sequences: must be >= 1, got 0"),
        (["model=x", "max_queued=-1"], "error: max_queued: must be >= 0, got -1"),
        (["model=x", "unstreamed=later"], "error: unstreamed: expected continuous or batched, got 'later'"),
        (["model=x", "stream_interval_ms=-5"], "error: stream_interval_ms: must be >= 0, got -5"),
    ]:
        done = subprocess.run([sys.executable, "-m", "sweep", "serve", *argv], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], done.stderr


# ---------------------------------------------------------------------------------------------
# One real server.

@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("serve-continuous")
    lm_dir = export_tiny_lm(root / "best" / "wikitext-2", cache_dir)
    started = {"lm": start_server(LM_NAME, lm_dir, root / "lm.log", cache_dir, "log_requests=false",
                                  f"max_concurrent_sequences={SLOTS}", f"max_queued={QUEUED}", threads=None)}
    with serving(started):
        wait_grpc_ready(started["lm"])
        yield started["lm"]


def _client(server: Server) -> Any:
    return openai.AsyncOpenAI(base_url=f"{server.url}/openai/v1", api_key="none", max_retries=0, timeout=60)


async def _stream(client: Any, prompt: str, max_tokens: int, **fields: Any) -> dict[str, Any]:
    """A streamed completion: its text, the times of its first and last text, its finish reason."""
    start = time.perf_counter()
    first = None
    parts: list[str] = []
    reason = None
    stream = await client.completions.create(model=LM_NAME, prompt=prompt, max_tokens=max_tokens, stream=True,
                                             **fields)
    async for chunk in stream:
        choice = chunk.choices[0]
        if choice.text and first is None:
            first = time.perf_counter() - start
        parts.append(choice.text)
        reason = choice.finish_reason or reason
    return {"text": "".join(parts), "first": first, "end": time.perf_counter() - start, "start": start,
            "finish_reason": reason}


async def _whole(client: Any, prompt: str, max_tokens: int, **fields: Any) -> Any:
    return (await client.completions.create(model=LM_NAME, prompt=prompt, max_tokens=max_tokens, **fields)).choices[0]


def test_sixteen_streams_all_start_before_any_finishes(server: Server) -> None:
    async def run() -> list[dict[str, Any]]:
        client = _client(server)
        return await asyncio.gather(*(_stream(client, PROMPTS[i % 8], 120, temperature=0) for i in range(16)))

    streams = asyncio.run(run())
    first_token = max(s["start"] + s["first"] for s in streams)
    first_finish = min(s["start"] + s["end"] for s in streams)
    assert first_token < first_finish, [(s["first"], s["end"]) for s in streams]


def test_streamed_text_is_the_whole_text_under_concurrency(server: Server, cache_dir: Path) -> None:
    async def run() -> tuple[list[dict[str, Any]], list[Any]]:
        client = _client(server)
        streamed = [_stream(client, p, 40, temperature=0) for p in PROMPTS]
        whole = [_whole(client, p, 40, temperature=0) for p in PROMPTS]
        results = await asyncio.gather(*streamed, *whole)
        return results[:8], results[8:]

    streamed, whole = asyncio.run(run())
    for prompt, s, w in zip(PROMPTS, streamed, whole):
        assert s["text"] == w.text and s["finish_reason"] == w.finish_reason, prompt
    # Greedy in the batch is exact greedy: the text of transformers' own generate, one prompt alone.
    from sweep.serving.engines import Generator
    from sweep.serving.protocol import GenerationParams

    engine = Generator(Path(server.log).parent / "best" / "wikitext-2", "cpu")
    for prompt, w in zip(PROMPTS, whole):  # each of the 16 sequences decoded together equals its own generate
        alone = engine.generate(GenerationParams(max_new_tokens=40), [prompt])[0]
        assert alone.text == w.text, prompt


def test_a_long_stream_does_not_hold_back_a_short_request(server: Server) -> None:
    async def run() -> tuple[float, float, dict[str, Any]]:
        client = _client(server)
        idle = (await _stream(client, "Hi there", 4, temperature=0))["first"]
        long = asyncio.ensure_future(_stream(client, PROMPTS[0], 230, temperature=0))
        await asyncio.sleep(0.3)  # the long one is decoding
        short = await _stream(client, "Hi there", 4, temperature=0)
        return idle, short["first"], await long

    idle, busy, long = asyncio.run(run())
    step = long["end"] / 230
    assert busy <= max(0.25, idle + 10 * step), (idle, busy, step)
    assert busy < long["end"] / 3  # it did not wait for the long one to finish


def test_stop_and_max_tokens_per_request_under_concurrency(server: Server) -> None:
    async def run() -> tuple[list[Any], list[Any], list[Any]]:
        client = _client(server)
        full = await asyncio.gather(*(_whole(client, p, 30, temperature=0) for p in PROMPTS))
        stops = [f.text[6:9] for f in full]
        stopped = [_whole(client, p, 30, temperature=0, stop=[stop]) for p, stop in zip(PROMPTS, stops)]
        lengths = [_whole(client, p, 3 + i, temperature=0) for i, p in enumerate(PROMPTS)]
        results = await asyncio.gather(*stopped, *lengths)
        return full, results[:8], results[8:]

    full, stopped, lengths = asyncio.run(run())
    for f, s in zip(full, stopped):
        stop = f.text[6:9]
        assert s.text == f.text[: f.text.find(stop)] and s.finish_reason == "stop", (f.text, stop, s.text)
    for i, (f, short) in enumerate(zip(full, lengths)):
        assert f.text.startswith(short.text), (f.text, short.text)
        if f.finish_reason == "length":
            assert short.finish_reason == "length" and short.text != f.text, i


def test_a_client_that_leaves_frees_its_slot(server: Server) -> None:
    async def run() -> float:
        client = _client(server)
        streams = [await client.completions.create(model=LM_NAME, prompt=PROMPTS[i % 8], max_tokens=230,
                                                   stream=True, temperature=0) for i in range(SLOTS)]
        for stream in streams:  # every slot is generating
            await stream.__anext__()
        await streams[0].close()  # one client leaves
        await asyncio.sleep(0.1)
        newcomer = await _stream(client, "Hi there", 4, temperature=0)
        for stream in streams[1:]:
            await stream.close()
        return newcomer["first"]

    assert asyncio.run(run()) < 0.5


def test_overload_answers_429_and_resource_exhausted_and_keeps_serving(server: Server) -> None:
    body = {"inputs": [texts("text", ["Hello"])], "parameters": {"max_new_tokens": 4}}

    assert _grpc_status(server, body) == "OK"  # and the gRPC client is imported before the clock matters

    async def run() -> tuple[list[str], httpx.Response, Any, str]:
        async with httpx.AsyncClient(timeout=60) as http:
            payload = {"model": LM_NAME, "prompt": "Once", "max_tokens": 250, "temperature": 0, "stream": True}
            held = []
            for _ in range(SLOTS + QUEUED):  # every slot and every place in the queue
                request = http.build_request("POST", f"{server.url}/openai/v1/completions", json=payload)
                response = await http.send(request, stream=True)
                assert response.status_code == 200
                held.append(response)
            grpc_status = await asyncio.to_thread(_grpc_status, server, body)
            rest = await http.post(f"{server.url}/v2/models/{LM_NAME}/infer", json=body)
            try:
                await _whole(_client(server), "Hello", 4)
                refused: Any = None
            except openai.RateLimitError as e:
                refused = e
            # The admitted streams still run to the end.
            lasts = []
            for response in held[:2] + held[-2:]:
                lines = [line async for line in response.aiter_lines() if line.startswith("data:")]
                lasts.append(lines[-1])
            for response in held:
                await response.aclose()
            return lasts, rest, refused, grpc_status

    lasts, rest, refused, grpc_status = asyncio.run(run())
    assert rest.status_code == 429 and rest.headers["Retry-After"] == "1" and "overloaded" in rest.json()["error"]
    assert refused is not None and refused.response.headers["Retry-After"] == "1"
    assert grpc_status == "RESOURCE_EXHAUSTED"
    assert lasts == ["data: [DONE]"] * 4
    after = httpx.post(f"{server.url}/v2/models/{LM_NAME}/infer", json=body, timeout=60)
    assert after.status_code == 200
    metrics = httpx.get(f"{server.url}/metrics").text
    rejected = next(line for line in metrics.splitlines() if line.startswith("sweep_rejected_requests_total"))
    assert float(rejected.split()[-1]) >= 3
    for name in ("sweep_sequences_running", "sweep_sequences_waiting", "sweep_tokens_per_step_bucket",
                 "sweep_time_to_first_token_seconds_bucket", "sweep_time_per_output_token_seconds_bucket"):
        assert f"\n{name}{{" in metrics, name


def test_grpc_and_rest_answer_alike_from_the_batch(server: Server) -> None:
    body = {"inputs": [texts("text", PROMPTS[:3])], "parameters": {"max_new_tokens": 12}}

    async def run() -> tuple[Any, Any]:
        async with httpx.AsyncClient(timeout=60) as http:
            return await asyncio.gather(http.post(f"{server.url}/v2/models/{LM_NAME}/infer", json=body),
                                        asyncio.to_thread(grpc_infer, server, body))

    rest, grpc_answer = asyncio.run(run())
    assert rest.status_code == 200 and isinstance(grpc_answer, dict), grpc_answer
    assert [o["data"] for o in rest.json()["outputs"]] == [o["data"] for o in grpc_answer["outputs"]]


def _grpc_status(server: Server, body: dict[str, Any]) -> str:
    answer = grpc_infer(server, body)
    return "OK" if isinstance(answer, dict) else answer[0]


# ---------------------------------------------------------------------------------------------
# The decoding process: the server's child, never outliving it; its loss is said, not hung on.

def _decoding_pid(server: Server) -> int:
    match = re.search(r"generation continuous in process (\d+)", server.log_tail())
    assert match, server.log_tail()
    return int(match.group(1))


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state == "Z":  # exited; its parent (the killed server, or init) has not reaped it yet
            return True
        time.sleep(0.1)
    return False


def test_the_batch_decodes_in_a_child_process_that_never_outlives_the_server(tmp_path: Path, cache_dir: Path) -> None:
    lm_dir = export_tiny_lm(tmp_path / "best" / "wikitext-2", cache_dir)
    # 1. The decoding process is the server's child; a server killed outright (no clean-up runs) still takes
    # it along: it reads the end of its pipe and exits.
    started = {"lm": start_server(LM_NAME, lm_dir, tmp_path / "a.log", cache_dir, "grpc=false")}
    with serving(started):
        server = started["lm"]
        pid = _decoding_pid(server)
        assert _parent(pid) == server.proc.pid
        answer = httpx.post(f"{server.url}/openai/v1/completions", timeout=60,
                            json={"model": LM_NAME, "prompt": "Hi there", "max_tokens": 5, "temperature": 0})
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 5, answer.text
        server.proc.kill()
        server.proc.wait()
        assert _gone_within(pid, 20), f"decoding process {pid} outlived its server"

    # 2. A decoding process that dies: the model is no longer ready (every route answers 503 at once, gRPC
    # UNAVAILABLE, and a readiness probe takes the pod out), each answer and the log say why; nothing hangs,
    # and the server still stops cleanly. (A third server starts beside it, for 3.)
    started = {"lm": start_server(LM_NAME, lm_dir, tmp_path / "b.log", cache_dir),
               "terminated": start_server(LM_NAME, lm_dir, tmp_path / "c.log", cache_dir, "grpc=false")}
    with serving(started):
        server = started["lm"]
        pid = _decoding_pid(server)
        url = f"{server.url}/v2/models/{LM_NAME}"
        body = {"inputs": [texts("text", ["Hi there"])], "parameters": {"max_new_tokens": 5}}
        assert httpx.post(f"{url}/infer", json=body, timeout=60).status_code == 200
        wait_grpc_ready(server)
        os.kill(pid, signal.SIGKILL)
        assert _gone_within(pid, 20)
        time.sleep(0.5)  # the server's reader sees the pipe's end
        assert httpx.get(f"{url}/ready", timeout=10).status_code != 200
        why = "the decoding process has exited (code -9); restart the server"
        failed = httpx.post(f"{url}/infer", json=body, timeout=60)
        assert failed.status_code == 503 and why in failed.json()["error"], failed.text
        failed = httpx.post(f"{server.url}/openai/v1/completions", timeout=60,
                            json={"model": LM_NAME, "prompt": "Hi there", "max_tokens": 5, "temperature": 0})
        assert failed.status_code == 503, failed.text
        assert "not ready" in failed.json()["error"]["message"] and why in failed.json()["error"]["message"]
        assert grpc_infer(server, body) == ("UNAVAILABLE", why)
        deadline = time.monotonic() + 10  # the log line is written by the server's loop, soon after the exit
        while "decoding process has exited (code -9)" not in server.log.read_text():
            assert time.monotonic() < deadline, server.log.read_text()[-2000:]
            time.sleep(0.2)
        server.proc.terminate()
        assert server.proc.wait(timeout=30) is not None

        # 3. SIGTERM (what Kubernetes sends a pod): the server stops its decoding process and exits cleanly.
        server = started["terminated"]
        pid = _decoding_pid(server)
        answer = httpx.post(f"{server.url}/openai/v1/completions", timeout=60,
                            json={"model": LM_NAME, "prompt": "Hi there", "max_tokens": 5, "temperature": 0})
        assert answer.status_code == 200, answer.text
        server.proc.terminate()
        assert server.proc.wait(timeout=30) == 0, server.log_tail()
        assert _gone_within(pid, 1), f"decoding process {pid} outlived its server"
        assert "Traceback" not in server.log.read_text(), server.log_tail()


# ---------------------------------------------------------------------------------------------
# The decoding process's threads: sized from the CPUs the server may use, asleep when idle.

def test_the_default_decoding_threads_are_the_measured_best_within_the_usable_cpus(server: Server) -> None:
    """The module's server runs with no threads= option, as a user starts it."""
    usable = usable_cpus()  # the server's process is in this one's cgroup, with its affinity
    assert _threads_line(server) == (max(1, min(DEFAULT_DECODING_THREADS, int(usable))), usable)


def _threads_line(server: Server) -> tuple[int, float]:
    match = re.search(r"(\d+) torch thread\(s\) of ([\d.]+) usable CPU\(s\)", server.log.read_text(errors="replace"))
    assert match, server.log_tail()  # the serving line, the log's first
    return int(match.group(1)), float(match.group(2))


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_the_decoding_threads_follow_the_cpus_the_server_may_use_and_sleep_when_idle(tmp_path: Path,
                                                                                    cache_dir: Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs to pin the server to one of them")
    lm_dir = export_tiny_lm(tmp_path / "best" / "wikitext-2", cache_dir)
    started = {
        # asked for 2 threads, pinned to one core: one thread (a second would only wait for the core)
        "pinned": start_server(LM_NAME, lm_dir, tmp_path / "pinned.log", cache_dir, "grpc=false", threads=2,
                               preexec=lambda: os.sched_setaffinity(0, {cpus[-1]})),
        "two": start_server(LM_NAME, lm_dir, tmp_path / "two.log", cache_dir, "grpc=false", threads=2),
    }
    with serving(started):
        assert _threads_line(started["pinned"]) == (1, 1.0)
        assert os.sched_getaffinity(_decoding_pid(started["pinned"])) == {cpus[-1]}  # the child inherits it
        assert _threads_line(started["two"]) == (min(2, int(usable_cpus())), usable_cpus())

        # Idle after work, the decoding process sleeps: OpenMP's workers do not spin (OMP_WAIT_POLICY), and
        # the batch's loop waits for requests without polling.
        server = started["two"]
        answer = httpx.post(f"{server.url}/openai/v1/completions", timeout=60,
                            json={"model": LM_NAME, "prompt": "Hi there", "max_tokens": 16, "temperature": 0})
        assert answer.status_code == 200, answer.text
        pid = _decoding_pid(server)
        time.sleep(0.5)
        before = _cpu_seconds(pid)
        time.sleep(3.0)
        idle = _cpu_seconds(pid) - before
        assert idle < 0.15, f"the idle decoding process used {idle:.2f} CPU-seconds in 3 s"


def _cpu_cgroup(name: str, cpus: float) -> Path | None:
    """A cgroup of this machine limited to ``cpus`` CPUs (v2's cpu.max, else v1's cpu controller), or None
    where this process may not make one."""
    root = Path("/sys/fs/cgroup")
    for folder, limit in ((root / name, ("cpu.max", f"{int(cpus * 100000)} 100000")),
                          (root / "cpu" / name, ("cpu.cfs_quota_us", str(int(cpus * 100000))))):
        if not (folder.parent / limit[0]).exists() and folder.parent != root / "cpu":
            continue
        try:
            folder.mkdir(exist_ok=True)
            (folder / limit[0]).write_text(limit[1])
            return folder
        except OSError:
            continue
    return None


def test_the_decoding_threads_follow_a_cgroup_cpu_limit(tmp_path: Path, cache_dir: Path) -> None:
    """A pod's CPU limit is a cgroup quota: a server in a cgroup of one CPU decodes on one thread,
    whatever it asked for and however many cores the host has."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs for the limit to be below them")
    group = _cpu_cgroup(f"sweep-test-{os.getpid()}", 1.0)
    if group is None:
        pytest.skip("this process may not make a cgroup (no writable cgroupfs)")
    try:
        lm_dir = export_tiny_lm(tmp_path / "best" / "wikitext-2", cache_dir)

        def join() -> None:
            (group / "cgroup.procs").write_text(str(os.getpid()))

        started = {"limited": start_server(LM_NAME, lm_dir, tmp_path / "limited.log", cache_dir, "grpc=false",
                                           threads=2, preexec=join)}
        with serving(started):
            assert _threads_line(started["limited"]) == (1, 1.0)
    finally:
        for _ in range(50):  # the server's processes leave the group as they exit
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.2)
