"""The server's limits and its API key (issue 55), against two real ``python -m sweep serve`` processes.

A tiny RoBERTa classifier with the default limits and ``api_key=`` (the 413 of a 10 MB body, the key on v2
REST and gRPC, NVIDIA's ``tritonclient`` over HTTP and gRPC), and the tiny GPT-2 with the key from
``$SWEEP_API_KEY``, ONE decoding slot, a 1 s deadline and ``max_output_tokens=100`` (the 504 that frees
its slot on every route, the OpenAI client, the token bound). A client that leaves a stream frees its slot
at once: tests/test_serve_continuous.py::test_a_client_that_leaves_frees_its_slot.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sweep.cli.key_values import UsageError
from sweep.cli.serve import parse
from sweep.serving.body_limit import DEFAULT_MAX_BODY_BYTES
from sweep.serving.guards import Guards
from sweep.serving.model_kind import CLASSIFIER
from sweep.serving.routes import KEYED, served_routes
from sweep.train.tiny_exports import export_tiny_classifier, export_tiny_lm
from tests.helpers.serving import (
    CLASSIFIER_NAME,
    LM_NAME,
    REPO,
    Server,
    grpc_infer,
    output,
    serving,
    start_server,
    texts,
    wait_grpc_ready,
)

openai = pytest.importorskip("openai")  # the dev extra

KEY = "sk-test-0123456789abcdef"  # never in a log line or an answer
BEARER = {"Authorization": f"Bearer {KEY}"}
TEN_MB = 10_000_000
DEADLINE_S = 1.0
MAX_OUTPUT_TOKENS = 100
CLASSIFY = {"inputs": [texts("text", ["a cat sleeps"]), texts("text_pair", ["an animal rests"])]}


def _generate(prompts: list[str], max_new_tokens: int) -> dict[str, Any]:
    return {"inputs": [texts("text", prompts)], "parameters": {"max_new_tokens": max_new_tokens}}


# ---------------------------------------------------------------------------------------------
# Without a server.

def test_every_post_route_needs_the_key_and_every_get_route_is_open() -> None:
    routes = served_routes(openai=True)
    assert {str(r) for r in KEYED} == {str(r) for r in routes if r.method == "POST"}
    assert "GET /v2/health/ready" in {str(r) for r in routes if r not in KEYED}


@pytest.mark.parametrize(("args", "message"), [
    (["max_body_bytes=0"], "max_body_bytes: must be >= 1"),
    (["request_timeout_s=-1"], "request_timeout_s: must be >= 0"),
    (["max_output_tokens=0"], "max_output_tokens: must be >= 1"),
    (["api_key="], "api_key: must not be empty"),
    (["host="], "host: must not be empty"),
])
def test_bad_limit_values_are_one_line(args: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=re.escape(message)):
        parse(["model=x", *args])


def test_a_host_this_machine_cannot_listen_on_is_one_line_before_anything_loads(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "sweep", "serve", f"model={tmp_path / 'nothing'}", "host=192.0.2.1"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 2 and done.stderr.splitlines() == [
        "error: host: cannot listen on '192.0.2.1' (Cannot assign requested address); 127.0.0.1 (this machine) "
        "or 0.0.0.0 (every interface)"], done.stderr


def test_the_key_is_in_no_repr_and_the_defaults_are_documented() -> None:
    options = parse(["model=x", f"api_key={KEY}"])
    guards = Guards(DEFAULT_MAX_BODY_BYTES[CLASSIFIER], options.request_timeout_s, options.api_key)
    assert KEY not in repr(options) and KEY not in repr(guards) and KEY not in guards.describe()
    assert options.host == "127.0.0.1" and options.request_timeout_s == 300
    docs = (REPO / "docs" / "serving.md").read_text()
    for default in ("`host=127.0.0.1`", "`request_timeout_s=300`", "8 MiB", "16 MiB", "`SWEEP_API_KEY`"):
        assert default in docs, default


def test_max_output_tokens_bounds_max_completion_tokens_and_a_chats_default() -> None:
    from types import SimpleNamespace

    from sweep.serving.openai_protocol import openai_job
    from sweep.serving.protocol import RequestError

    request = SimpleNamespace(n=1, temperature=None, top_p=None, seed=None, stop=[], stream=False,
                              stream_options=None)
    count = lambda prompts: [len(p.split()) for p in prompts]  # noqa: E731
    assert openai_job(request, ["a b c"], count, 256, None, "max_completion_tokens", 50).params.max_new_tokens == 50
    assert openai_job(request, ["a b c"], count, 256, 50, "max_completion_tokens", 50).params.max_new_tokens == 50
    with pytest.raises(RequestError, match=re.escape("parameter max_completion_tokens: must be in [1, 50] (the "
                                                     "server's max_output_tokens=50), got 51")):
        openai_job(request, ["a b c"], count, 256, 51, "max_completion_tokens", 50)
    with pytest.raises(RequestError, match=re.escape("parameter max_tokens: must be in [1, 255], got 300")):
        openai_job(request, ["a b c"], count, 256, 300, "max_tokens", None)  # no option: the context bounds it


# ---------------------------------------------------------------------------------------------
# The real servers.

@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[dict[str, Server]]:
    root = tmp_path_factory.mktemp("limits")
    classifier_dir = export_tiny_classifier(root / "best" / "RTE", cache_dir)
    lm_dir = export_tiny_lm(root / "best" / "wikitext-2", cache_dir)
    started = {
        "classifier": start_server(CLASSIFIER_NAME, classifier_dir, root / "classifier.log", cache_dir,
                                   f"api_key={KEY}"),
        "lm": start_server(LM_NAME, lm_dir, root / "lm.log", cache_dir, "max_concurrent_sequences=1",
                           "max_queued=64", f"request_timeout_s={DEADLINE_S:g}",
                           f"max_output_tokens={MAX_OUTPUT_TOKENS}", env={"SWEEP_API_KEY": KEY}),
    }
    with serving(started):
        for server in started.values():
            wait_grpc_ready(server)
        yield started


def _warnings(server: Server, status: str) -> list[str]:
    return [line for line in server.log.read_text(errors="replace").splitlines()
            if " WARNING " in line and f"] {status} " in line]


def _running(server: Server) -> tuple[float, float]:
    """The continuous batch's (running, waiting) sequences, from its gauges."""
    metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    values = [float(line.rsplit(" ", 1)[1]) for name in ("sweep_sequences_running", "sweep_sequences_waiting")
              for line in metrics.splitlines() if line.startswith(f"{name}{{")]
    return values[0], values[1]


def test_the_server_binds_loopback_by_default(servers: dict[str, Server]) -> None:
    log = servers["classifier"].log.read_text(errors="replace")
    assert f"on port {servers['classifier'].url.rpartition(':')[2]} of 127.0.0.1:" in log
    assert f"gRPC server on {servers['classifier'].grpc_address}" in log  # 127.0.0.1:PORT, as REST
    assert "api key: required" in log and KEY not in log


def test_a_body_over_the_limit_is_413_before_it_is_read_and_the_next_request_is_served(
        servers: dict[str, Server]) -> None:
    server = servers["classifier"]
    limit = DEFAULT_MAX_BODY_BYTES[CLASSIFIER]
    url = f"{server.url}/v2/models/{server.name}/infer"
    before = len(_warnings(server, "413"))
    # declared: refused from the headers (the client sends the whole body; the server reads none of it)
    big = httpx.post(url, content=b"x" * TEN_MB, headers=BEARER, timeout=30)
    assert big.status_code == 413, big.text
    assert big.json() == {"error": f"request body of {TEN_MB} bytes: too large for the server's "
                                   f"max_body_bytes={limit}"}
    assert httpx.post(url, json=CLASSIFY, headers=BEARER, timeout=30).status_code == 200
    # chunked: counted while it arrives, refused at the first chunk past the limit
    chunked = httpx.post(url, content=iter([b"x" * 1_000_000] * 10), headers=BEARER, timeout=30)
    assert chunked.status_code == 413 and "chunked request body past" in chunked.json()["error"]
    # the 413 comes with no byte of the body sent: the server answers from the Content-Length alone
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(f"POST /v2/models/{server.name}/infer HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEY}"
                    f"\r\nContent-Type: application/json\r\nContent-Length: {TEN_MB}\r\n\r\n".encode())
        assert raw.recv(4096).startswith(b"HTTP/1.1 413 ")
    assert httpx.post(url, json=CLASSIFY, headers=BEARER, timeout=30).status_code == 200
    assert len(_warnings(server, "413")) == before + 3
    # over gRPC the same limit is gRPC's own message limit
    assert grpc_infer(server, {"inputs": [texts("text", ["x" * TEN_MB])]}, metadata={"authorization": f"Bearer {KEY}"}
                      )[0] == "RESOURCE_EXHAUSTED"


def test_the_key_guards_inference_on_rest_and_grpc_and_leaves_health_and_metrics_open(
        servers: dict[str, Server]) -> None:
    server = servers["classifier"]
    url = f"{server.url}/v2/models/{server.name}/infer"
    before = len(_warnings(server, "401"))
    missing = httpx.post(url, json=CLASSIFY, timeout=30)
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
    assert missing.json() == {"error": "missing API key: send the header Authorization: Bearer <key>"}
    wrong = httpx.post(url, json=CLASSIFY, headers={"Authorization": f"Bearer {KEY}x"}, timeout=30)
    assert wrong.status_code == 401 and wrong.json() == {"error": "wrong API key"}
    right = httpx.post(url, json=CLASSIFY, headers=BEARER, timeout=30)
    assert right.status_code == 200 and output(right.json(), "label")
    for path in ("/", "/v2/health/live", "/v2/health/ready", "/metrics", f"/v2/models/{server.name}", "/v1/models"):
        assert httpx.get(f"{server.url}{path}", timeout=30).status_code == 200, path
    assert grpc_infer(server, CLASSIFY)[0] == "UNAUTHENTICATED"
    assert grpc_infer(server, CLASSIFY, metadata={"authorization": "Bearer nope"}) == ("UNAUTHENTICATED",
                                                                                      "wrong API key")
    assert output(grpc_infer(server, CLASSIFY, metadata={"authorization": f"Bearer {KEY}"}), "label")
    warnings = _warnings(server, "401")[before:]
    assert len(warnings) == 2 and len(_warnings(server, "UNAUTHENTICATED")) >= 2
    assert KEY not in server.log.read_text(errors="replace")


TRITON_CALLS = """
import json, sys
import numpy as np
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

name, key, answers = sys.argv[3], sys.argv[4], {}
for module, url in ((triton_http, sys.argv[1]), (triton_grpc, sys.argv[2])):
    client = module.InferenceServerClient(url=url)
    inputs = [module.InferInput(input, [1], "BYTES") for input in ("text", "text_pair")]
    for tensor, text in zip(inputs, ("a cat sleeps", "an animal rests")):
        tensor.set_data_from_numpy(np.array([text.encode()], dtype=np.object_))
    try:
        client.infer(name, inputs)
        refused = ""
    except Exception as e:
        refused = str(e)
    answer = client.infer(name, inputs, headers={"authorization": f"Bearer {key}"})
    answers[module.__name__] = {"ready": client.is_server_ready() and client.is_model_ready(name),
                                "refused": refused, "label": answer.as_numpy("label").tolist()}
    client.close()
print(json.dumps(answers, default=str))
"""


def test_nvidias_tritonclient_over_http_and_grpc_with_the_key(servers: dict[str, Server]) -> None:
    """In a process of its own: tritonclient.grpc's generated protobuf module and KServe's (imported here by
    the other tests) both define the package ``inference``, which one process's protobuf pool cannot hold."""
    pytest.importorskip("tritonclient")
    server = servers["classifier"]
    done = subprocess.run([sys.executable, "-c", TRITON_CALLS, server.url.removeprefix("http://"),
                           server.grpc_address, server.name, KEY], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    answers = json.loads(done.stdout)
    assert set(answers) == {"tritonclient.http", "tritonclient.grpc"}
    for answer in answers.values():
        assert answer["ready"] and "missing API key" in answer["refused"] and len(answer["label"]) == 1, answer


def test_the_openai_client_and_sweep_infer_with_the_key_from_the_environment(servers: dict[str, Server]) -> None:
    server = servers["lm"]
    for key in ("none", f"{KEY}x"):
        client = openai.OpenAI(base_url=f"{server.url}/openai/v1", api_key=key, max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            client.completions.create(model=LM_NAME, prompt="Hello", max_tokens=4, temperature=0)
    client = openai.OpenAI(base_url=f"{server.url}/openai/v1", api_key=KEY, max_retries=0)
    answer = client.completions.create(model=LM_NAME, prompt="Hello", max_tokens=4, temperature=0)
    assert answer.usage.completion_tokens == 4
    v2 = httpx.post(f"{server.url}/v2/models/{LM_NAME}/infer", json=_generate(["Hello"], 4), headers=BEARER,
                    timeout=30)
    assert v2.status_code == 200 and output(v2.json(), "text") == [answer.choices[0].text]
    env = {k: v for k, v in os.environ.items() if k != "SWEEP_API_KEY"}
    command = [sys.executable, "-m", "sweep", "infer", "--url", server.url, "--max-new-tokens", "4", "Hello"]
    refused = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1 and "answered 401" in refused.stderr and "--api-key" in refused.stderr
    served = subprocess.run(command, env={**env, "SWEEP_API_KEY": KEY}, capture_output=True, text=True, timeout=120)
    assert served.returncode == 0 and served.stdout.strip() == answer.choices[0].text.strip()
    grpc = subprocess.run([*command[:4], "--grpc", server.grpc_address, "--model", LM_NAME, "--api-key", KEY,
                           *command[6:]], env=env, capture_output=True, text=True, timeout=120)
    assert grpc.returncode == 0 and grpc.stdout == served.stdout


def test_max_output_tokens_bounds_v2_and_openai_and_the_context_bounds_the_prompt(
        servers: dict[str, Server]) -> None:
    server = servers["lm"]
    client = openai.OpenAI(base_url=f"{server.url}/openai/v1", api_key=KEY, max_retries=0)
    bound = f"must be in [1, {MAX_OUTPUT_TOKENS}] (the server's max_output_tokens={MAX_OUTPUT_TOKENS})"
    before = len(_warnings(server, "400"))
    with pytest.raises(openai.BadRequestError, match=re.escape(f"parameter max_tokens: {bound}")):
        client.completions.create(model=LM_NAME, prompt="Hello", max_tokens=MAX_OUTPUT_TOKENS + 1)
    assert [line.split("] ", 1)[1] for line in _warnings(server, "400")[before:]] == [
        f"400 POST /openai/v1/completions: parameter max_tokens: {bound}, got {MAX_OUTPUT_TOKENS + 1}"]
    over = httpx.post(f"{server.url}/v2/models/{LM_NAME}/infer", json=_generate(["Hello"], MAX_OUTPUT_TOKENS + 1),
                      headers=BEARER, timeout=30)
    assert over.status_code == 400 and over.json() == {
        "error": f"parameter max_new_tokens: {bound}, got {MAX_OUTPUT_TOKENS + 1}"}
    long = httpx.post(f"{server.url}/v2/models/{LM_NAME}/infer", json=_generate(["word " * 300], 4),
                      headers=BEARER, timeout=30)  # no silent cut: the prompt is refused, naming the context
    assert long.status_code == 400 and "exceeds the model's context of 256 tokens" in long.json()["error"]


def test_a_request_past_its_deadline_is_504_on_every_route_and_frees_its_slot(servers: dict[str, Server]) -> None:
    """One slot: 16 sequences of 100 tokens take seconds one after another, the deadline is 1 s."""
    server = servers["lm"]
    before = len(_warnings(server, "504"))
    start = time.perf_counter()
    late = httpx.post(f"{server.url}/v2/models/{LM_NAME}/infer", json=_generate(["Hello"] * 16, MAX_OUTPUT_TOKENS),
                      headers=BEARER, timeout=30)
    took = time.perf_counter() - start
    assert late.status_code == 504, late.text
    assert late.json() == {"error": f"the request took longer than the server's request_timeout_s={DEADLINE_S:g}; "
                                    "abandoned"}
    assert DEADLINE_S <= took < DEADLINE_S + 2
    client = openai.OpenAI(base_url=f"{server.url}/openai/v1", api_key=KEY, max_retries=0, timeout=30)
    with pytest.raises(openai.InternalServerError) as unstreamed:
        client.completions.create(model=LM_NAME, prompt="Hello", max_tokens=MAX_OUTPUT_TOKENS, n=16, temperature=0)
    assert unstreamed.value.status_code == 504 and unstreamed.value.body["type"] == "TimeoutError"
    with pytest.raises(openai.APIError, match="request_timeout_s") as streamed:
        for _ in client.completions.create(model=LM_NAME, prompt="Hello", max_tokens=MAX_OUTPUT_TOKENS, n=16,
                                           temperature=0, stream=True):
            pass
    assert not isinstance(streamed.value, openai.APIStatusError)  # its 200 was sent: an error event ended it
    assert grpc_infer(server, _generate(["Hello"] * 16, MAX_OUTPUT_TOKENS),
                      metadata={"authorization": f"Bearer {KEY}"})[0] == "DEADLINE_EXCEEDED"
    # The cancels reach the batch: 4 requests' 64 sequences of 100 tokens, one slot, would run far longer than this
    # (5 s was short on a machine at load 13: 1 running, 4 waiting left, the cancels still arriving).
    deadline = time.monotonic() + 10
    while _running(server) != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _running(server) == (0, 0)
    start = time.perf_counter()  # the one slot is free: a short request is served at once
    short = httpx.post(f"{server.url}/v2/models/{LM_NAME}/infer", json=_generate(["Hi"], 4), headers=BEARER,
                       timeout=30)
    assert short.status_code == 200 and time.perf_counter() - start < DEADLINE_S
    assert len(_warnings(server, "504")) == before + 3 and len(_warnings(server, "DEADLINE_EXCEEDED")) >= 1
    assert not [line for line in server.log.read_text(errors="replace").splitlines() if " ERROR " in line]


def test_the_limits_are_answered_in_openais_error_body_on_its_routes(servers: dict[str, Server]) -> None:
    server = servers["lm"]
    url = f"{server.url}/openai/v1/completions"
    unauthorized = httpx.post(url, json={"model": LM_NAME, "prompt": "Hello"}, timeout=30)
    too_large = httpx.post(url, content=b"x" * (16 * 1024 * 1024 + 1), headers=BEARER, timeout=30)
    for answer, status, kind in ((unauthorized, 401, "AuthenticationError"), (too_large, 413, "RequestTooLargeError")):
        assert answer.status_code == status
        assert json.loads(answer.text)["error"]["type"] == kind and answer.json()["error"]["code"] == str(status)
