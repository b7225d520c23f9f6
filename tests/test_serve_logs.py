"""What a server's log says (issue 55, "quiet logs"), from the output of two real ``python -m sweep serve``
processes: the tiny classifier with ``api_key=`` and access lines on (the default), and the tiny GPT-2 with
``log_requests=false``.

Per request ONE line: an access line (status, method, path, milliseconds), or a 4xx's WARNING with its
reason, never both, never twice; gRPC alike. At start-up: no route announced that is not served, and no
third-party line nobody can act on (vLLM's Triton, FastAPI's deprecation of KServe's response class).
"""

from __future__ import annotations

import logging
import re
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sweep.serving.body_limit import DEFAULT_MAX_BODY_BYTES
from sweep.serving.model_kind import CLASSIFIER
from sweep.serving.request_log import reason
from sweep.serving.third_party_logs import NOISE, DropMessages, quiet_third_party
from sweep.train.tiny_exports import export_tiny_classifier, export_tiny_lm
from tests.helpers.serving import (
    CLASSIFIER_NAME,
    LM_NAME,
    Server,
    grpc_infer,
    serving,
    start_server,
    texts,
    wait_grpc_ready,
)

KEY = "sk-logs-0123456789"
BEARER = {"Authorization": f"Bearer {KEY}"}
GRPC_KEY = {"authorization": f"Bearer {KEY}"}
CLASSIFY = {"inputs": [texts("text", ["a cat sleeps"]), texts("text_pair", ["an animal rests"])]}
GENERATE = {"inputs": [texts("text", ["hello"])], "parameters": {"max_new_tokens": 2}}
MS = r"\d+\.\d ms"


# ---------------------------------------------------------------------------------------------
# Without a server.

@pytest.mark.parametrize(("body", "message"), [
    (b'{"error": "missing input \'text\'"}', "missing input 'text'"),  # v2
    (b'{"error": {"message": "wrong API key", "type": "AuthenticationError"}}', "wrong API key"),  # OpenAI's
    (b'{"detail": "Not Found"}', "Not Found"),  # Starlette's: an unknown path
    (b"plain\ntext", "plain text"),
])
def test_a_4xx_reason_is_its_error_bodys_message(body: bytes, message: str) -> None:
    assert reason(body) == message


def test_third_party_noise_is_dropped_by_its_words_only() -> None:
    """The filter on vLLM's logger drops its Triton line, and nothing else it says."""
    (starts,) = NOISE["vllm.triton_utils.importing"]
    drop = DropMessages(NOISE["vllm.triton_utils.importing"])

    def record(message: str, level: int = logging.INFO) -> logging.LogRecord:
        return logging.LogRecord("vllm.triton_utils.importing", level, __file__, 1, message, None, None)

    assert not drop.filter(record(f"{starts}; certain GPU-related functions will not be available."))
    assert drop.filter(record("Triton is broken", logging.WARNING))


def test_the_filters_are_installed_on_each_logger_and_drop_only_kserves_deprecated_class() -> None:
    from fastapi.exceptions import FastAPIDeprecationWarning
    from fastapi.responses import ORJSONResponse

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # quiet_third_party's one filter goes in front of it
        quiet_third_party()
        ORJSONResponse({})  # what KServe's OpenAI and v1 routes answer with
        warnings.warn("another deprecation", FastAPIDeprecationWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["another deprecation"]
    for name, starts in NOISE.items():
        assert [f.starts for f in logging.getLogger(name).filters if isinstance(f, DropMessages)] == [starts], name


# ---------------------------------------------------------------------------------------------
# The real servers.

@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[dict[str, Server]]:
    root = tmp_path_factory.mktemp("logs")
    started = {
        "classifier": start_server(CLASSIFIER_NAME, export_tiny_classifier(root / "best" / "RTE", cache_dir),
                                   root / "classifier.log", cache_dir, f"api_key={KEY}"),
        "lm": start_server(LM_NAME, export_tiny_lm(root / "best" / "wikitext-2", cache_dir), root / "lm.log",
                           cache_dir, "log_requests=false"),
    }
    with serving(started):
        for server in started.values():
            wait_grpc_ready(server)
        yield started


def lines_of(server: Server, send: Callable[[], Any], expect_none: bool = False) -> list[str]:
    """The log lines one request writes: ``send()`` it, wait for its first line (``expect_none``: a second), then
    a moment for any other."""
    logged = server.log.stat().st_size
    send()
    deadline = time.monotonic() + (1 if expect_none else 10)
    while server.log.stat().st_size == logged and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    with server.log.open("rb") as log:
        return log.read()[logged:].decode(errors="replace").splitlines()


def _post(server: Server, path: str, **kwargs: Any) -> Callable[[], httpx.Response]:
    return lambda: httpx.post(f"{server.url}{path}", timeout=60, **kwargs)


@pytest.mark.slow
def test_each_request_is_one_access_line(servers: dict[str, Server]) -> None:
    server = servers["classifier"]
    infer = f"/v2/models/{server.name}/infer"
    for send, line in [
        (_post(server, infer, json=CLASSIFY, headers=BEARER), f"200 POST {infer} {MS}"),
        (lambda: httpx.get(f"{server.url}/v2/health/ready"), f"200 GET /v2/health/ready {MS}"),
        (lambda: httpx.get(f"{server.url}/metrics"), f"200 GET /metrics {MS}"),
        (lambda: grpc_infer(server, CLASSIFY, metadata=GRPC_KEY),
         f"OK /inference.GRPCInferenceService/ModelInfer {server.name} {MS}"),
    ]:
        lines = lines_of(server, send)
        assert len(lines) == 1 and re.search(rf" sweep\.access INFO {line}$", lines[0]), (line, lines)


def _warning_about(lines: list[str], what: str) -> str:
    """The one line a refused request writes: a WARNING saying ``what``; nothing else (no access line, no trace)."""
    assert len(lines) == 1, lines
    assert " kserve WARNING [" in lines[0] and lines[0].endswith(f"] {what}"), (what, lines[0])
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("refusal", ["malformed JSON", "unknown path", "too large", "no key", "wrong key"])
def test_each_4xx_is_one_warning_line_with_its_reason(servers: dict[str, Server], refusal: str) -> None:
    server = servers["classifier"]
    infer = f"/v2/models/{server.name}/infer"
    limit = DEFAULT_MAX_BODY_BYTES[CLASSIFIER]
    json_body = {**BEARER, "content-type": "application/json"}
    method, path, send, status = {
        "malformed JSON": ("POST", infer, _post(server, infer, content=b'{"inputs": [', headers=json_body), 400),
        "unknown path": ("GET", "/v2/no/such/route", lambda: httpx.get(f"{server.url}/v2/no/such/route"), 404),
        "too large": ("POST", infer, _post(server, infer, content=b"x" * (limit + 1), headers=json_body), 413),
        "no key": ("POST", infer, _post(server, infer, json=CLASSIFY), 401),
        "wrong key": ("POST", infer, _post(server, infer, json=CLASSIFY, headers={"Authorization": "Bearer x"}), 401),
    }[refusal]
    answers: list[httpx.Response] = []
    lines = lines_of(server, lambda: answers.append(send()))
    assert answers[0].status_code == status, answers[0].text
    _warning_about(lines, f"{status} {method} {path}: {reason(answers[0].content)}")


@pytest.mark.slow
def test_grpc_refusals_are_one_warning_line_each(servers: dict[str, Server]) -> None:
    """gRPC's own refusal of a message over the limit (its handler never runs) and the key's, as REST's 413 and 401."""
    server = servers["classifier"]
    limit = DEFAULT_MAX_BODY_BYTES[CLASSIFIER]
    big = {"inputs": [texts("text", ["x" * (limit + 1)])]}
    answers: list[Any] = []
    lines = lines_of(server, lambda: answers.append(grpc_infer(server, big, metadata=GRPC_KEY)))
    assert answers[0][0] == "RESOURCE_EXHAUSTED"
    _warning_about(lines, "RESOURCE_EXHAUSTED /inference.GRPCInferenceService/ModelInfer: request message over "
                          f"the server's max_body_bytes={limit}")
    lines = lines_of(server, lambda: answers.append(grpc_infer(server, CLASSIFY)))
    assert answers[1][0] == "UNAUTHENTICATED"
    _warning_about(lines, f"UNAUTHENTICATED /inference.GRPCInferenceService/ModelInfer {server.name}: {answers[1][1]}")


@pytest.mark.slow
def test_log_requests_false_writes_no_line_for_an_answered_request(servers: dict[str, Server]) -> None:
    server = servers["lm"]
    completions = {"model": server.name, "prompt": "hello", "max_tokens": 3}
    for send in [
        _post(server, f"/v2/models/{server.name}/infer", json=GENERATE),
        _post(server, "/openai/v1/completions", json=completions),
        _post(server, "/openai/v1/completions", json={**completions, "stream": True}),
        lambda: grpc_infer(server, GENERATE),
    ]:
        assert lines_of(server, send, expect_none=True) == []
    # a refusal is still its one WARNING line
    lines = lines_of(server, _post(server, "/openai/v1/completions", json={**completions, "max_tokens": 10_000}))
    assert " WARNING " in lines[0] and "] 400 POST /openai/v1/completions: parameter max_tokens: " in lines[0]
    assert len(lines) == 1, lines


def _announced(server: Server) -> list[tuple[str, str]]:
    """The routes the start-up line names: ``serving ... on port P of HOST: POST /v2/..., GET /metrics; gRPC ...``."""
    line = server.log.read_text(errors="replace").splitlines()[0]
    routes = line.split(": ", 1)[1].split(";", 1)[0]
    return [tuple(route.split(" ", 1)) for route in routes.split(", ")]  # type: ignore[misc]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["classifier", "lm"])
def test_the_startup_says_only_what_is_true_and_nothing_nobody_can_act_on(servers: dict[str, Server],
                                                                          kind: str) -> None:
    server = servers[kind]
    bodies = {"infer": CLASSIFY if kind == "classifier" else GENERATE,
              "completions": {"model": server.name, "prompt": "hello", "max_tokens": 2},
              "chat/completions": {"model": server.name, "messages": [{"role": "user", "content": "hi"}]}}
    announced = _announced(server)
    assert any(path.startswith("/openai/") for _, path in announced) == (kind == "lm"), announced
    for method, path in announced:  # each route the line names is served (the tiny GPT-2 has no chat template: 400)
        body = next((b for end, b in bodies.items() if path.endswith(end)), None)
        answer = httpx.request(method, f"{server.url}{path}", json=body, headers=BEARER, timeout=60)
        assert answer.status_code in (200, 400), (path, answer.status_code, answer.text)
    if kind == "classifier":
        assert httpx.post(f"{server.url}/openai/v1/completions", json=bodies["completions"], headers=BEARER,
                          timeout=60).status_code == 404
    log = server.log.read_text(errors="replace")
    limit = "8 MiB" if kind == "classifier" else "16 MiB"  # the kind's default body limit, as a person reads it
    assert f"bodies <= {limit}, deadline 300 s, api key: " in log, log.splitlines()[:3]
    if kind == "classifier":
        assert "OpenAI" not in log and "openai" not in log.replace("POST /openai/v1/completions: Not Found", ""), log
    for noise in ["Triton", "DeprecationWarning", "ORJSONResponse", "Setting max asyncio worker threads",
                  "Application startup complete", "kserve.trace", "uvicorn.access"]:
        assert noise not in log, (noise, log)
