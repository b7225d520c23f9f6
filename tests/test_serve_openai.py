"""OpenAI-compatible completions: KServe's OpenAI routes on the same server and model name as v2.

Plain logic first (what a stream may send, request validation), then three real
``python -m sweep serve`` processes for the module, asked through the real ``openai`` client: the
tiny GPT-2 as exported (no chat template), the same model with a chat template written into its
folder, and the tiny RoBERTa classifier (no OpenAI routes).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from sweep.serving.generation import finish_completion, read_stream, streamable_text
from sweep.serving.openai_protocol import chat_messages, completion_prompts, openai_job
from sweep.serving.protocol import GenerationParams, RequestError
from sweep.train.tiny_exports import export_tiny_classifier, export_tiny_lm
from tests.helpers.serving import CLASSIFIER_NAME, LM_NAME, Server, serving, start_server

openai = pytest.importorskip("openai")  # the dev extra

REPO = Path(__file__).resolve().parents[1]
CHAT_NAME = "tiny-gpt2-chat"
LM_CONTEXT = 256
PROMPT = "The meaning of life is"
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


# ---------------------------------------------------------------------------------------------
# What a stream may send (one "token" per character, to make it visible).

def _decode(ids: list[int]) -> str:
    return "".join(chr(i) for i in ids)


def test_streamed_text_is_always_a_prefix_of_the_finished_text() -> None:
    eos = 0
    for text, stops in [("Hello. World\nmore", ["\n", "."]), ("abcabcabd", ["abd"]), ("no stop here", ["zz"]),
                        ("ab", [])]:
        ids = [ord(c) for c in text] + [eos, eos]
        final = finish_completion(ids, 1, _decode, eos, stops, max_new_tokens=len(ids))
        sent = ""
        for k in range(len(ids) + 1):
            now = streamable_text(ids[:k], _decode, eos, stops)
            assert now.startswith(sent) and final.text.startswith(now), (text, k, now)
            sent = now
        assert sent == final.text


def test_streamed_text_holds_back_a_possible_stop_and_a_split_character() -> None:
    assert streamable_text([ord(c) for c in "one ab"], _decode, None, ["abd"]) == "one "  # "ab" may become "abd"
    assert streamable_text([ord(c) for c in "one abc"], _decode, None, ["abd"]) == "one abc"
    assert streamable_text([ord(c) for c in "one\ufffd"], _decode, None, []) == "one"  # bytes still to come


def test_a_stream_is_done_from_the_token_that_completes_a_stop_sequence() -> None:
    decoded: list[int] = []

    def counting_decode(ids: list[int]) -> str:
        decoded.append(len(ids))
        return _decode(ids)

    ids = [ord(c) for c in "one abd two"]
    done_at = [k for k in range(len(ids) + 1) if read_stream(ids[:k], counting_decode, None, ["abd"])[1]]
    assert done_at == list(range(len("one abd"), len(ids) + 1))  # done from the token that completes "abd" on
    assert read_stream(ids[:7], _decode, None, ["abd"]) == ("one ", True)
    assert len(decoded) == len(ids) + 1  # one decode per step, for both answers


# ---------------------------------------------------------------------------------------------
# Requests.

def _request(**fields: Any) -> SimpleNamespace:
    base = {"n": 1, "temperature": None, "top_p": None, "seed": None, "stop": [], "stream": False,
            "stream_options": None, "echo": False, "logprobs": None, "presence_penalty": None}
    return SimpleNamespace(**{**base, **fields})


def _count(prompts: list[str]) -> list[int]:
    return [len(p.split()) for p in prompts]


def test_openai_request_defaults_are_the_openai_apis() -> None:
    job = openai_job(_request(), ["a b c"], _count, LM_CONTEXT, 16)
    assert job.params == GenerationParams(max_new_tokens=16, temperature=1.0, top_p=1.0, stop=(), seed=None)
    assert job.n == 1 and job.prompt_tokens == (3,) and not job.stream
    greedy = openai_job(_request(temperature=0, seed=5, stop="\n", n=2, stream=True,
                                 stream_options=SimpleNamespace(include_usage=True)),
                        ["a", "b c"], _count, LM_CONTEXT, 8)
    assert greedy.params == GenerationParams(8, 0.0, 1.0, ("\n",), 5) and greedy.include_usage
    assert greedy.rows == ["a", "a", "b c", "b c"]  # choice i*n+j: prompt i's j-th
    room = openai_job(_request(), ["a b c"], _count, LM_CONTEXT, None)  # a chat's default: what the context leaves
    assert room.params.max_new_tokens == LM_CONTEXT - 3


@pytest.mark.parametrize(
    ("fields", "max_tokens", "prompt", "message"),
    [
        ({}, -5, "a", "parameter max_tokens: must be in [1, 255], got -5"),
        ({}, 0, "a", "parameter max_tokens: must be in [1, 255], got 0"),
        ({}, 250, "a " * 10,
         "prompt 0 is 10 tokens; with max_tokens=250 that exceeds the model's context of 256 tokens"),
        ({}, None, "a " * 300, "prompt 0 is 300 tokens: the model's context of 256 tokens leaves no room"),
        ({"n": 0}, 4, "a", "parameter n: must be in [1, 16], got 0"),
        ({"temperature": 3}, 4, "a", "parameter temperature: must be in [0.0, 2.0], got 3"),
        ({"top_p": 0}, 4, "a", "parameter top_p: must be in (0.0, 1.0]"),
        ({"seed": -1}, 4, "a", "parameter seed: must be in [0,"),
        ({"stop": ["\n", ""]}, 4, "a", "parameter stop: stop sequences must be non-empty strings"),
        ({"logprobs": 2}, 4, "a", "logprobs: not supported by this server (got 2); leave it out"),
        ({"echo": True}, 4, "a", "echo: not supported"),
        ({"presence_penalty": 0.5}, 4, "a", "presence_penalty: not supported"),
    ],
)
def test_openai_request_errors(fields: dict[str, Any], max_tokens: int | None, prompt: str, message: str) -> None:
    with pytest.raises(RequestError) as err:
        openai_job(_request(**fields), [prompt], _count, LM_CONTEXT, max_tokens)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_prompts_and_messages() -> None:
    assert completion_prompts("hi") == ["hi"] and completion_prompts(["a", "b"]) == ["a", "b"]
    for bad, message in [([1, 2], "token ids are not supported"), ([], "non-empty list of strings"),
                         (["a", ""], "empty string")]:
        with pytest.raises(RequestError, match=message):
            completion_prompts(bad)
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert chat_messages(parts) == [{"role": "user", "content": "a\nb"}]
    with pytest.raises(RequestError, match="only text parts are supported, got a part of type 'image_url'"):
        chat_messages([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
    with pytest.raises(RequestError, match="messages: must not be empty"):
        chat_messages([])


# ---------------------------------------------------------------------------------------------
# The real servers.

@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[dict[str, Server]]:
    if importlib.util.find_spec("vllm") is None:
        pytest.fail("KServe's OpenAI endpoints need vLLM's protocol types: `make install` installs vllm (--no-deps)")
    root = tmp_path_factory.mktemp("serve-openai")
    lm_dir = export_tiny_lm(root / "best" / "wikitext-2", cache_dir)
    chat_dir = export_tiny_lm(root / "chat" / "wikitext-2", cache_dir)
    (chat_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE)  # what save_pretrained writes for a chat model
    classifier_dir = export_tiny_classifier(root / "best" / "RTE", cache_dir)
    started = {
        "lm": start_server(LM_NAME, lm_dir, root / "lm.log", cache_dir, "grpc=false"),
        "chat": start_server(CHAT_NAME, chat_dir, root / "chat.log", cache_dir, "grpc=false", f"name={CHAT_NAME}"),
        "classifier": start_server(CLASSIFIER_NAME, classifier_dir, root / "classifier.log", cache_dir, "grpc=false"),
    }
    with serving(started):
        yield started


def _client(server: Server) -> Any:
    return openai.OpenAI(base_url=f"{server.url}/openai/v1", api_key="unused", max_retries=0, timeout=60)


def _v2(server: Server, prompt: str, **parameters: Any) -> dict[str, Any]:
    body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [prompt]}], "parameters": parameters}
    response = httpx.post(f"{server.url}/v2/models/{server.name}/infer", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return {o["name"]: o["data"][0] for o in response.json()["outputs"]}


def _prompt_tokens(server: Server, text: str) -> int:
    from sweep.train.loading import load_tokenizer

    model_dir = next(a.split("=", 1)[1] for a in server.proc.args if str(a).startswith("model="))
    return len(load_tokenizer(Path(model_dir))(text)["input_ids"])


def _stream_text(stream: Any) -> tuple[str, list[float], str | None, Any]:
    """(text, arrival time of each chunk with text, the finish_reason, the usage) of a completion stream."""
    text, times, finish, usage = "", [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.text:
                text += choice.text
                times.append(time.perf_counter())
            finish = choice.finish_reason or finish
    return text, times, finish, usage


@pytest.mark.slow
def test_models_lists_the_model_and_a_classifier_has_no_openai_routes(servers: dict[str, Server]) -> None:
    assert [m.id for m in _client(servers["lm"]).models.list()] == [LM_NAME]
    assert [m.id for m in _client(servers["chat"]).models.list()] == [CHAT_NAME]
    clf = servers["classifier"]
    assert httpx.get(f"{clf.url}/openai/v1/models").status_code == 404  # KServe adds the routes for OpenAI models only
    response = httpx.post(f"{clf.url}/openai/v1/completions", json={"model": CLASSIFIER_NAME, "prompt": "a"})
    assert response.status_code == 404, response.text
    assert httpx.get(f"{clf.url}/v2/models/{CLASSIFIER_NAME}/ready").json()["ready"] is True


@pytest.mark.slow
def test_stream_sends_the_same_text_as_it_is_generated(servers: dict[str, Server]) -> None:
    lm = servers["lm"]
    client = _client(lm)
    settings = {"model": LM_NAME, "prompt": PROMPT, "max_tokens": 200, "temperature": 0, "seed": 3}
    whole = client.completions.create(**settings)
    (choice,) = whole.choices
    prompt_tokens = _prompt_tokens(lm, PROMPT)
    assert choice.finish_reason == "length" and choice.text
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens, whole.usage.total_tokens) == (
        prompt_tokens, 200, prompt_tokens + 200)

    start = time.perf_counter()
    stream = client.completions.create(**settings, stream=True, stream_options={"include_usage": True})
    text, times, finish, usage = _stream_text(stream)
    assert text == choice.text and finish == "length"
    assert ((usage.prompt_tokens, usage.completion_tokens, usage.total_tokens)
            == (prompt_tokens, 200, prompt_tokens + 200))
    first, last = times[0] - start, times[-1] - start
    gap = last - first
    print(f"\nstream of 200 tokens: first chunk after {first * 1000:.0f} ms, last after {last * 1000:.0f} ms "
          f"(gap {gap * 1000:.0f} ms, {len(times)} chunks with text)")
    # as it is generated, not one block at the end: at most every stream_interval_ms (10 ms, the default),
    # several tokens to a chunk when the tiny model decodes faster than that
    assert len(times) > 10
    assert gap > 0.1 and first < 0.25 * last  # the first chunk came long before the last token was generated
    # The same model name answers v2 with the same text and counts.
    v2 = _v2(lm, PROMPT, max_new_tokens=200, seed=3)
    assert (v2["text"], v2["prompt_tokens"], v2["completion_tokens"], v2["finish_reason"]) == (
        choice.text, prompt_tokens, 200, "length")


@pytest.mark.slow
def test_finish_reason_and_usage_with_a_stop_sequence(servers: dict[str, Server]) -> None:
    lm = servers["lm"]
    client = _client(lm)
    full = client.completions.create(model=LM_NAME, prompt="the doctor", max_tokens=16, temperature=0)
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 16
    text = full.choices[0].text
    assert len(text) > 8, text
    stop = text[5:8]
    cut = client.completions.create(model=LM_NAME, prompt="the doctor", max_tokens=16, temperature=0, stop=[stop])
    assert cut.choices[0].text == text[: text.find(stop)] and cut.choices[0].finish_reason == "stop"
    assert cut.usage.completion_tokens < 16
    v2 = _v2(lm, "the doctor", max_new_tokens=16, stop=stop)  # counted as the v2 path counts
    assert (v2["text"], v2["completion_tokens"], v2["finish_reason"]) == (
        cut.choices[0].text, cut.usage.completion_tokens, "stop")
    streamed = client.completions.create(model=LM_NAME, prompt="the doctor", max_tokens=16, temperature=0, stop=stop,
                                         stream=True, stream_options={"include_usage": True})
    text_streamed, _, finish, usage = _stream_text(streamed)
    assert ((text_streamed, finish, usage.completion_tokens)
            == (cut.choices[0].text, "stop", cut.usage.completion_tokens))


@pytest.mark.slow
def test_seed_makes_sampling_reproducible_with_n_choices(servers: dict[str, Server]) -> None:
    client = _client(servers["lm"])

    def sample(seed: int, **extra: Any) -> list[str]:
        answer = client.completions.create(model=LM_NAME, prompt="the city", max_tokens=16, temperature=1.0, top_p=0.95,
                                           seed=seed, n=2, **extra)
        if extra.get("stream"):
            texts = ["", ""]
            for chunk in answer:
                for choice in chunk.choices:
                    texts[choice.index] += choice.text
            return texts
        assert [c.index for c in answer.choices] == [0, 1] and answer.usage.completion_tokens <= 32
        return [c.text for c in answer.choices]

    first = sample(7)
    assert first == sample(7) and first != sample(8)
    assert first[0] != first[1]  # n=2: two samples, not one copied
    assert sample(7, stream=True) == first


@pytest.mark.slow
def test_chat_completion_with_a_chat_template(servers: dict[str, Server]) -> None:
    chat = servers["chat"]
    client = _client(chat)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    answer = client.chat.completions.create(model=CHAT_NAME, messages=messages, max_tokens=12, temperature=0)
    (choice,) = answer.choices
    assert choice.message.role == "assistant" and choice.message.content and choice.finish_reason == "length"
    rendered = "system: be brief\nuser: hello\nassistant:"  # what the template makes of the messages
    plain = client.completions.create(model=CHAT_NAME, prompt=rendered, max_tokens=12, temperature=0)
    assert choice.message.content == plain.choices[0].text
    assert answer.usage.prompt_tokens == _prompt_tokens(chat, rendered) and answer.usage.completion_tokens == 12
    stream = client.chat.completions.create(model=CHAT_NAME, messages=messages, max_tokens=12, temperature=0,
                                            stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == choice.message.content
    assert chunks[-1].choices[0].finish_reason == "length"


@pytest.mark.slow
def test_chat_without_a_chat_template_is_a_clear_400(servers: dict[str, Server]) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        _client(servers["lm"]).chat.completions.create(model=LM_NAME, messages=[{"role": "user", "content": "hi"}])
    message = err.value.body["message"]
    assert "has no chat template" in message and "/openai/v1/completions" in message and "\n" not in message


COMPLETIONS = "/openai/v1/completions"
BAD_REQUESTS: list[tuple[str, str, Any, int, str]] = [
    # (id, route, body (bytes: sent as is), status, fragment of the one-line message)
    ("malformed-json", COMPLETIONS, b'{"model": "%s", "prompt": "unterminated' % LM_NAME.encode(), 400,
     "not valid JSON"),
    ("array-body", COMPLETIONS, [1, 2], 400, "the body must be a JSON object"),
    ("wrong-type", COMPLETIONS, {"model": LM_NAME, "prompt": "a", "max_tokens": "ten"}, 400,
     "max_tokens: Input should be a valid integer"),
    ("wrong-type-in-validator", COMPLETIONS, {"model": LM_NAME, "prompt": "a", "logprobs": "x"}, 400,
     "the body must be a JSON object"),
    ("negative-max-tokens", COMPLETIONS, {"model": LM_NAME, "prompt": "a", "max_tokens": -5}, 400,
     "max_tokens: must be in [1, 255], got -5"),
    ("prompt-too-long", COMPLETIONS, {"model": LM_NAME, "prompt": "the cat " * 200}, 400,
     f"context of {LM_CONTEXT} tokens"),
    ("no-prompt", COMPLETIONS, {"model": LM_NAME}, 400, "prompt"),
    ("token-id-prompt", COMPLETIONS, {"model": LM_NAME, "prompt": [1, 2]}, 400, "token ids are not supported"),
    ("unsupported", COMPLETIONS, {"model": LM_NAME, "prompt": "a", "logprobs": 1}, 400, "logprobs: not supported"),
    ("chat-messages-not-a-list", "/openai/v1/chat/completions", {"model": LM_NAME, "messages": "hi"}, 400, "messages"),
    ("unknown-model", COMPLETIONS, {"model": "no-such-model", "prompt": "a"}, 404,
     "Model with name no-such-model does not exist"),
]


@pytest.mark.parametrize(("route", "body", "status", "message"), [b[1:] for b in BAD_REQUESTS],
                         ids=[b[0] for b in BAD_REQUESTS])
@pytest.mark.slow
def test_bad_request_gets_4xx_with_one_line_and_the_server_keeps_serving(
    servers: dict[str, Server], route: str, body: Any, status: int, message: str
) -> None:
    lm = servers["lm"]
    url = f"{lm.url}{route}"
    if isinstance(body, bytes):
        response = httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=30)
    else:
        response = httpx.post(url, json=body, timeout=30)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    text = error["message"] if isinstance(error, dict) else error  # OpenAI's body; KServe's own 404 is {"error": "..."}
    assert message in text and "\n" not in text, text
    good = _client(lm).completions.create(model=LM_NAME, prompt="still here", max_tokens=2)
    assert good.choices[0].text and good.usage.completion_tokens <= 2


def _timed(client: Any, max_tokens: int) -> float:
    start = time.perf_counter()
    client.completions.create(model=LM_NAME, prompt="once upon a time", max_tokens=max_tokens, temperature=0)
    return time.perf_counter() - start


@pytest.mark.slow
def test_a_client_leaving_mid_stream_stops_the_generation(servers: dict[str, Server]) -> None:
    lm = servers["lm"]
    client = _client(lm)
    baseline = statistics.median(_timed(client, 4) for _ in range(3))
    whole = _timed(client, 240)  # what a stream left running would hold the forward thread for
    stream = client.completions.create(model=LM_NAME, prompt="once upon a time", max_tokens=240, temperature=0,
                                       stream=True)
    chunks = iter(stream)
    next(chunks), next(chunks)
    stream.close()
    after = _timed(client, 4)
    print(f"\nbaseline {baseline * 1000:.0f} ms, a 240-token request {whole * 1000:.0f} ms, after the abandoned stream "
          f"{after * 1000:.0f} ms")
    assert after < baseline + whole / 2, (baseline, whole, after)
    deadline = time.monotonic() + 10
    while "stream cancelled by the client" not in lm.log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    line = next(li for li in lm.log.read_text().splitlines() if "stream cancelled by the client" in li)
    stopped_after = int(line.split("stopped after ")[1].split()[0])
    assert stopped_after < 240, line


@pytest.mark.slow
def test_concurrent_requests_share_forward_passes(servers: dict[str, Server]) -> None:
    lm = servers["lm"]
    prompts = [f"story number {i} begins" for i in range(12)]

    async def ask_all() -> list[Any]:
        client = openai.AsyncOpenAI(base_url=f"{lm.url}/openai/v1", api_key="unused", max_retries=0, timeout=60)
        async with client:
            return await asyncio.gather(*(
                client.completions.with_raw_response.create(model=LM_NAME, prompt=p, max_tokens=4, temperature=0)
                for p in prompts
            ))

    raws = asyncio.run(ask_all())
    sizes = [int(raw.headers["x-batch-size"]) for raw in raws]  # texts that shared each request's forward pass
    assert max(sizes) > 1, sizes
    texts = [raw.parse().choices[0].text for raw in raws]
    alone = _client(lm).completions.create(model=LM_NAME, prompt=prompts, max_tokens=4, temperature=0)
    assert texts == [c.text for c in alone.choices]  # each answer is its own prompt's, batched or not


@pytest.mark.slow
def test_infer_cli_streams_the_completion(servers: dict[str, Server]) -> None:
    lm = servers["lm"]
    expected = _v2(lm, PROMPT, max_new_tokens=10)
    done = subprocess.run(
        [sys.executable, "-m", "sweep", "infer", "--url", lm.url, "--model", LM_NAME, "--max-new-tokens", "10",
         "--stream", PROMPT],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected["text"] + "\n"
    assert f"[{expected['prompt_tokens']} prompt + 10 completion tokens, finish: length]" in done.stderr
    classifier = subprocess.run(
        [sys.executable, "-m", "sweep", "infer", "--url", servers["classifier"].url, "--stream", "a cat"],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )
    assert classifier.returncode == 1, classifier.stderr
    assert classifier.stderr.startswith("error: --stream is for causal LMs"), classifier.stderr


TRICKY_TEXTS = [" hello", 'a "quoted" \\ back', "line\nbreak\ttab\r", "\x01\x1f control", "é ü 中文 🙂",
                "\u2028\u2029 separators", "</script>", "\ue000sweep\ue000"]


@pytest.mark.parametrize("chat", [False, True])
def test_a_text_chunk_is_the_json_of_kserves_chunk_type(chat: bool) -> None:
    """The per-token chunk is rendered from a template, not built as a pydantic chunk: the same JSON."""
    from sweep.serving.openai_model import _Chunks, _sse

    chunks = _Chunks("tiny-gpt2", chat=chat)
    for index in (0, 2):
        for text in TRICKY_TEXTS:
            fast = chunks.text(index, text)
            assert isinstance(fast, str)  # the template, not the type
            typed = chunks._typed_text(index, text).model_dump_json(exclude_unset=True)
            assert json.loads(fast) == json.loads(typed), text
            event = _sse(fast)
            assert event.startswith("data: ") and event.endswith("\n\n") and "\n" not in event[:-2], text
    # an empty text and a last chunk (its finish reason) go through the type itself
    assert json.loads(_sse(chunks.text(0, "")).removeprefix("data: ")) == json.loads(
        chunks._typed_text(0, "").model_dump_json(exclude_unset=True))
    last = json.loads(_sse(chunks.text(1, "end", "length")).removeprefix("data: "))
    assert last["choices"][0]["finish_reason"] == "length" and last["choices"][0]["index"] == 1


def test_sse_lines_parse() -> None:
    from sweep.serving.client import sse_events

    lines = ['data: {"a": 1}', "", ": a comment", 'data: {"b": 2}', "", "data: [DONE]", "", 'data: {"c": 3}']
    assert list(sse_events(iter(lines))) == [{"a": 1}, {"b": 2}]
