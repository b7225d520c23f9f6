"""The model server's v2 gRPC service and its Prometheus metrics, against the REST answers.

Three real ``python -m sweep serve`` processes run for the module, on free ports: the tiny RTE
classifier and the tiny GPT-2 language model with gRPC on, and the classifier again with
``grpc=false``. Every gRPC answer and error is compared with what REST says to the same request.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sweep.cli.key_values import parse_key_values
from sweep.serving.batcher import MicroBatcher
from sweep.serving.protocol import parameters_for_grpc, parameters_from_grpc
from sweep.testing.local_cluster import free_port
from sweep.train.tiny_exports import export_tiny_classifier, export_tiny_lm
from tests.helpers.serving import (
    CLASSIFIER_NAME,
    LM_NAME,
    RecordingModel,
    Server,
    grpc_infer,
    output,
    serving,
    start_server,
    texts,
    wait_grpc_ready,
)

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------
# Without a server.

def test_grpc_options_and_defaults() -> None:
    from sweep.cli.serve import OPTIONS
    from sweep.serving.server import DEFAULT_GRPC_PORT

    defaults = parse_key_values(["model=/m"], OPTIONS)
    assert defaults["grpc"] is True and defaults["grpc_port"] == DEFAULT_GRPC_PORT == 8081
    given = parse_key_values(["model=/m", "grpc=false", "grpc_port=9001"], OPTIONS)
    assert given["grpc"] is False and given["grpc_port"] == 9001


def test_serve_cli_bad_grpc_arguments_exit_2_with_one_line() -> None:
    for argv, message in [
        (["model=x", "grpc_port=0"], "error: grpc_port: must be a port in 1..65535, got 0"),
        (["model=x", "grpc_port=x"], "error: grpc_port: expected a whole number, got 'x'"),
        (["model=x", "port=9000", "grpc_port=9000"], "error: grpc_port: must differ from port (both 9000)"),
        (["model=x", "grpc=maybe"], "error: grpc: expected true or false"),
    ]:
        done = subprocess.run([sys.executable, "-m", "sweep", "serve", *argv], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], done.stderr


def test_float_parameters_travel_over_grpc_as_decimal_strings() -> None:
    # KServe's gRPC InferParameter has no double: bool, int64 and string only.
    rest = {"max_new_tokens": 5, "temperature": 0.7, "top_p": 1.0, "seed": 3, "stop": "\n"}
    sent = parameters_for_grpc(rest)
    assert sent == {"max_new_tokens": 5, "temperature": "0.7", "top_p": "1.0", "seed": 3, "stop": "\n"}
    assert parameters_from_grpc(sent) == rest
    # A string that is no number stays one, for the parameter check to name it; other keys are untouched.
    assert parameters_from_grpc({"temperature": "hot", "stop": "1.5"}) == {"temperature": "hot", "stop": "1.5"}


def test_batcher_tells_the_size_of_every_forward_pass() -> None:
    sizes: list[int] = []
    batcher = MicroBatcher(RecordingModel(), max_batch_size=8, max_latency_ms=50, observe_batch=sizes.append)

    async def submit_all() -> list[Any]:
        return await asyncio.gather(*(batcher.submit("k", [i, i + 100]) for i in range(6)))

    asyncio.run(submit_all())
    assert sizes == [8, 4]
    batcher.close()


# ---------------------------------------------------------------------------------------------
# The real servers.

@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[dict[str, Server]]:
    root = tmp_path_factory.mktemp("serve-grpc")
    classifier_dir = export_tiny_classifier(root / "best" / "RTE", cache_dir)
    lm_dir = export_tiny_lm(root / "best" / "wikitext-2", cache_dir)
    started = {
        "classifier": start_server(CLASSIFIER_NAME, classifier_dir, root / "classifier.log", cache_dir),
        # The micro-batcher: its metrics test counts forward passes (continuous batching over gRPC:
        # tests/test_serve_continuous.py).
        "lm": start_server(LM_NAME, lm_dir, root / "lm.log", cache_dir, "generation=batched"),
        "rest-only": start_server(CLASSIFIER_NAME, classifier_dir, root / "rest-only.log", cache_dir, "grpc=false"),
    }
    with serving(started):
        wait_grpc_ready(started["classifier"])
        wait_grpc_ready(started["lm"])
        yield started


def _rest(server: Server, body: Any, name: str | None = None) -> httpx.Response:
    return httpx.post(f"{server.url}/v2/models/{name or server.name}/infer", json=body, timeout=60)


@pytest.mark.slow
def test_grpc_classifier_answers_as_rest(servers: dict[str, Server]) -> None:
    server = servers["classifier"]
    for body in [
        {"inputs": [texts("text", ["the cat sees a dog", "a quiet river"]), texts("text_pair", ["a dog", "water"])]},
        {"inputs": [texts("text", ["the cat sleeps"]), texts("text_pair", ["a cat is asleep"])]},
    ]:
        rest = _rest(server, body)
        assert rest.status_code == 200, rest.text
        answer = grpc_infer(server, body)
        assert isinstance(answer, dict), answer
        assert output(answer, "label") == output(rest.json(), "label")
        assert output(answer, "score") == pytest.approx(output(rest.json(), "score"), abs=1e-6)
        assert answer["model_name"] == server.name


@pytest.mark.slow
def test_grpc_language_model_answers_as_rest(servers: dict[str, Server]) -> None:
    server = servers["lm"]
    for parameters in [
        {"max_new_tokens": 7},  # greedy
        {"max_new_tokens": 6, "temperature": 0.9, "top_p": 0.95, "seed": 7},  # floats as strings over gRPC
    ]:
        body = {"inputs": [texts("text", ["The meaning of life is", "the old painter"])], "parameters": parameters}
        rest = _rest(server, body)
        assert rest.status_code == 200, rest.text
        answer = grpc_infer(server, body)
        assert isinstance(answer, dict), answer
        for name in ("text", "prompt_tokens", "completion_tokens", "finish_reason"):
            assert output(answer, name) == output(rest.json(), name), name
        assert all(n >= 1 for n in output(answer, "completion_tokens"))


GRPC_BAD_REQUESTS: list[tuple[str, str, dict[str, Any]]] = [
    # (id, server, body): REST answers 400 with an error, gRPC INVALID_ARGUMENT with the same text
    ("wrong-datatype", "classifier", {"inputs": [texts("text", [1.0], datatype="FP32")]}),
    ("missing-input", "classifier", {"inputs": []}),
    ("shape-mismatch", "classifier", {"inputs": [texts("text", ["a"], [3])]}),
    ("pair-count", "classifier", {"inputs": [texts("text", ["a", "b"]), texts("text_pair", ["c"])]}),
    ("pair-missing", "classifier", {"inputs": [texts("text", ["a"])]}),  # RTE: a pair task
    ("prompt-too-long", "lm", {"inputs": [texts("text", ["the cat " * 200])]}),
    ("unknown-parameter", "lm", {"inputs": [texts("text", ["a"])], "parameters": {"max_tokens": 3}}),
    ("bad-parameter", "lm", {"inputs": [texts("text", ["a"])], "parameters": {"temperature": "hot"}}),
    ("bad-float", "lm", {"inputs": [texts("text", ["a"])], "parameters": {"top_p": 0.0}}),
]


def _still_answers(server: Server, kind: str) -> None:
    if kind == "lm":
        good = grpc_infer(server, {"inputs": [texts("text", ["still here"])], "parameters": {"max_new_tokens": 2}})
    else:
        good = grpc_infer(server, {"inputs": [texts("text", ["still here"]), texts("text_pair", ["it is"])]})
    assert isinstance(good, dict), good


@pytest.mark.parametrize(("server_kind", "body"), [b[1:] for b in GRPC_BAD_REQUESTS],
                         ids=[b[0] for b in GRPC_BAD_REQUESTS])
@pytest.mark.slow
def test_grpc_bad_request_is_invalid_argument_with_the_rest_message(
    servers: dict[str, Server], server_kind: str, body: dict[str, Any]
) -> None:
    server = servers[server_kind]
    rest = _rest(server, body)
    assert rest.status_code == 400, rest.text
    assert grpc_infer(server, body) == ("INVALID_ARGUMENT", rest.json()["error"])
    _still_answers(server, server_kind)


@pytest.mark.slow
def test_grpc_bad_request_is_one_log_line(servers: dict[str, Server]) -> None:
    """INVALID_ARGUMENT is the client's mistake: one WARNING line (KServe's own is an ERROR and a traceback)."""
    server = servers["classifier"]
    logged = server.log.stat().st_size
    answer = grpc_infer(server, {"inputs": [texts("text", ["the cat sleeps"])]})
    assert isinstance(answer, tuple) and answer[0] == "INVALID_ARGUMENT" and "'text_pair'" in answer[1], answer
    time.sleep(0.5)  # the line is written before the answer; a moment for anything that might follow it
    with server.log.open("rb") as log:
        lines = log.read()[logged:].decode(errors="replace").splitlines()
    about = [line for line in lines if "text_pair" in line]
    assert len(about) == 1 and not any("Traceback" in line for line in lines), "\n".join(lines)
    assert " WARNING " in about[0] and f"INVALID_ARGUMENT /inference.GRPCInferenceService/ModelInfer {server.name}: " \
        "missing input 'text_pair'" in about[0], about[0]


@pytest.mark.slow
def test_grpc_unknown_model_is_not_found_with_the_rest_message(servers: dict[str, Server]) -> None:
    server = servers["lm"]
    body = {"inputs": [texts("text", ["a"])]}
    rest = _rest(server, body, name="no-such-model")
    assert rest.status_code == 404, rest.text
    assert grpc_infer(server, body, name="no-such-model") == ("NOT_FOUND", rest.json()["error"])
    _still_answers(server, "lm")


def _refuses(address: str) -> bool:
    host, _, port = address.rpartition(":")
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex((host, int(port))) != 0


@pytest.mark.slow
def test_startup_line_names_the_grpc_port_and_grpc_false_listens_on_none(servers: dict[str, Server]) -> None:
    for kind in ("classifier", "lm"):
        first = servers[kind].log.read_text().splitlines()[0]
        assert f"gRPC v2 on port {servers[kind].grpc_address.rpartition(':')[2]}" in first, first
        assert not _refuses(servers[kind].grpc_address)
    rest_only = servers["rest-only"]
    assert "gRPC off" in rest_only.log.read_text().splitlines()[0]
    assert _refuses(rest_only.grpc_address)
    pair = {"inputs": [texts("text", ["a cat"]), texts("text_pair", ["an animal"])]}
    assert _rest(rest_only, pair).status_code == 200


@pytest.mark.slow
def test_a_second_server_on_a_taken_grpc_port_exits_2_with_one_line(servers: dict[str, Server]) -> None:
    # gRPC binds with SO_REUSEPORT: unchecked, this server would start and share the first one's calls.
    model_arg = next(a for a in servers["classifier"].proc.args if str(a).startswith("model="))
    taken = servers["lm"].grpc_address.rpartition(":")[2]
    done = subprocess.run([sys.executable, "-m", "sweep", "serve", str(model_arg), f"port={free_port()}",
                           f"grpc_port={taken}", "threads=1"], capture_output=True, text=True, timeout=120, cwd=REPO)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error: grpc_port: port {taken} is in use"), done.stderr
    still = grpc_infer(servers["lm"], {"inputs": [texts("text", ["a"])], "parameters": {"max_new_tokens": 1}})
    assert isinstance(still, dict)


# ---------------------------------------------------------------------------------------------
# The inference command over gRPC.

def _infer_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sweep", "infer", *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO)


@pytest.mark.slow
def test_infer_cli_over_grpc_prints_what_rest_prints(servers: dict[str, Server]) -> None:
    lm, clf = servers["lm"], servers["classifier"]
    for server, args in [
        (lm, ["--model", lm.name, "--max-new-tokens", "8", "The meaning of life is", "the old painter"]),
        (lm, ["--model", lm.name, "--max-new-tokens", "5", "--temperature", "0.8", "--top-p", "0.9", "--seed", "4",
              "--stop", "zz", "hello"]),
        (clf, ["--model", clf.name, "a cat", "the river", "--pair", "an animal", "--pair", "water"]),
    ]:
        by_rest = _infer_cli("--url", server.url, *args)
        by_grpc = _infer_cli("--grpc", server.grpc_address, *args)
        assert by_rest.returncode == 0 == by_grpc.returncode, (by_rest.stderr, by_grpc.stderr)
        assert by_grpc.stdout == by_rest.stdout and by_rest.stdout.strip()
        assert by_grpc.stderr == by_rest.stderr  # the LM's token-count notes


@pytest.mark.slow
def test_infer_cli_over_grpc_errors_are_one_clear_line(servers: dict[str, Server]) -> None:
    lm = servers["lm"]
    for args, message in [
        (["--grpc", lm.grpc_address, "--model", "no-such-model", "hi"],
         "error: the server answered NOT_FOUND: Model with name no-such-model does not exist."),
        (["--grpc", lm.grpc_address, "--model", lm.name, "--top-p", "0", "hi"],
         "error: the server answered INVALID_ARGUMENT: parameter top_p: must be in (0.0, 1.0]"),
        (["--grpc", f"127.0.0.1:{free_port()}", "--model", lm.name, "hi"],
         "error: cannot reach the gRPC server at 127.0.0.1:"),
        (["--grpc", servers["rest-only"].grpc_address, "--model", CLASSIFIER_NAME, "hi"],
         "error: cannot reach the gRPC server"),
        (["--grpc", "localhost", "--model", lm.name, "hi"], "error: --grpc 'localhost': expected HOST:PORT"),
    ]:
        done = _infer_cli(*args)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1 and lines[0].startswith(message), done.stderr
    # a usage mistake, found before any connection: argparse's usage and its one error line, exit 2
    done = _infer_cli("--grpc", lm.grpc_address, "hi")
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].endswith(
        "error: --grpc needs --model NAME: the v2 gRPC protocol has no list of models"), done.stderr


# ---------------------------------------------------------------------------------------------
# Metrics.

def _scrape(server: Server) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    response = httpx.get(f"{server.url}/metrics", timeout=30)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def _value(metrics: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return metrics.get((name, frozenset(labels.items())), 0.0)


INFER_ROUTE = {"method": "POST", "route": "/v2/models/{model_name}/infer"}


@pytest.mark.slow
def test_metrics_count_requests_batches_and_tokens(servers: dict[str, Server]) -> None:
    lm = servers["lm"]
    model = {"model": lm.name}
    before = _scrape(lm)
    n = 4
    prompts = [["once upon a time"], ["the river", "a quiet morning"], ["it was"], ["the doctor said"]]
    bodies = [_rest(lm, {"inputs": [texts("text", p)], "parameters": {"max_new_tokens": 3 + i}}).json()
              for i, p in enumerate(prompts)]
    assert all("outputs" in b for b in bodies), bodies
    grpc_answer = grpc_infer(lm, {"inputs": [texts("text", ["by grpc"])], "parameters": {"max_new_tokens": 2}})
    assert isinstance(grpc_answer, dict), grpc_answer
    bad = _rest(lm, {"inputs": [texts("text", ["a"])], "parameters": {"max_tokens": 3}})
    assert bad.status_code == 400
    after = _scrape(lm)

    def moved(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert moved("sweep_http_requests_total", **INFER_ROUTE, status="200") == n
    assert moved("sweep_http_requests_total", **INFER_ROUTE, status="400") == 1
    assert moved("sweep_http_request_duration_seconds_count", **INFER_ROUTE) == n + 1
    assert moved("sweep_http_request_duration_seconds_sum", **INFER_ROUTE) > 0
    # One forward pass per request (they came one at a time), REST and gRPC alike; the 400 ran none.
    assert moved("sweep_batch_size_count", **model) == n + 1
    assert moved("sweep_batch_size_sum", **model) == sum(len(p) for p in prompts) + 1
    answers = [*bodies, grpc_answer]
    assert moved("sweep_generated_tokens_total", **model) == sum(sum(output(b, "completion_tokens")) for b in answers)
    assert moved("sweep_prompt_tokens_total", **model) == sum(sum(output(b, "prompt_tokens")) for b in answers)
    # KServe's own per-model histograms are on the same page, counting gRPC calls too.
    assert moved("request_predict_seconds_count", model_name=lm.name) == n + 2  # the 400 fails inside predict


@pytest.mark.slow
def test_metrics_label_routes_by_template_and_unknown_paths_as_one(servers: dict[str, Server]) -> None:
    clf = servers["classifier"]
    before = _scrape(clf)
    assert httpx.get(f"{clf.url}/v2/models/{clf.name}", timeout=30).status_code == 200
    assert _rest(clf, {"inputs": [texts("text", ["a"])]}, name="no-such-model").status_code == 404
    for path in ("/no/such/path", "/another/one"):
        assert httpx.get(f"{clf.url}{path}", timeout=30).status_code == 404
    after = _scrape(clf)

    def moved(**labels: str) -> float:
        return (_value(after, "sweep_http_requests_total", **labels)
                - _value(before, "sweep_http_requests_total", **labels))

    assert moved(method="GET", route="/v2/models/{model_name}", status="200") == 1
    assert moved(**INFER_ROUTE, status="404") == 1
    assert moved(method="GET", route="unmatched", status="404") == 2
    assert not any("no/such/path" in str(labels) for _, labels in after)
