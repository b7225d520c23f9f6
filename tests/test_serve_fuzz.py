"""The server fuzzed (issue 55): Schemathesis against the OpenAPI schema it publishes, malformed gRPC tensors,
and a storm of clients that leave their streams, against two real ``python -m sweep serve`` processes.

The tiny RoBERTa classifier with ``api_key=`` (fuzzed with the key, to reach the handlers, and without it: every
POST is 401) and the tiny GPT-2 without a key, ``max_output_tokens=`` small so that a generated request decodes
a few dozen tokens at most, not a context's worth. No generated request may get a 5xx or end the server; afterwards
each still answers ``/v2/health/ready`` and a normal inference. Generation is derandomized (Hypothesis' fixed seed,
a bounded number of examples per operation): the same requests every run.

``/openapi.json`` lists every route of the table (sweep/serving/routes.py) but two that FastAPI leaves out of it
(KServe declares them ``include_in_schema=False``): ``GET /v2/models/{model_name}/versions/{model_version}`` and
``POST /v2/models/{model_name}/versions/{model_version}/infer``; they get targeted cases below.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sweep.train.tiny_exports import export_tiny_classifier, export_tiny_lm
from tests.helpers.serving import (
    CLASSIFIER_NAME,
    LM_NAME,
    Server,
    output,
    serving,
    start_server,
    texts,
    wait_grpc_ready,
)

schemathesis = pytest.importorskip("schemathesis")  # the dev extra
pytest.importorskip("openai")  # the OpenAI routes need vLLM's protocol types, installed with it
from hypothesis import (  # noqa: E402  (schemathesis' own dependency)
    HealthCheck,
    Phase,
    given,
    settings,
    strategies as st,  # noqa: E402
)
from schemathesis import GenerationMode  # noqa: E402

KEY = "sk-fuzz-0123456789abcdef"
BEARER = {"Authorization": f"Bearer {KEY}"}
MAX_OUTPUT_TOKENS = 48  # a storm's stream is dropped with most of its tokens still to come
EXAMPLES = 25  # per operation: about 20 operations, a few ms each
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck))
CLASSIFY = {"inputs": [texts("text", ["a cat sleeps"]), texts("text_pair", ["an animal rests"])]}
GENERATE = {"inputs": [texts("text", ["The meaning of life is"])], "parameters": {"max_new_tokens": 2}}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[dict[str, Server]]:
    root = tmp_path_factory.mktemp("fuzz")
    classifier_dir = export_tiny_classifier(root / "best" / "RTE", cache_dir)
    lm_dir = export_tiny_lm(root / "best" / "wikitext-2", cache_dir)
    started = {
        "classifier": start_server(CLASSIFIER_NAME, classifier_dir, root / "classifier.log", cache_dir,
                                   f"api_key={KEY}"),
        "lm": start_server(LM_NAME, lm_dir, root / "lm.log", cache_dir, f"max_output_tokens={MAX_OUTPUT_TOKENS}",
                           "log_requests=false", "stream_interval_ms=0"),  # a chunk per token: a storm's drop is early
    }
    with serving(started):
        for server in started.values():
            wait_grpc_ready(server)
        yield started


def _operations(server: Server) -> list[Any]:
    """Every operation of the schema the server publishes (one that Schemathesis cannot read fails the test)."""
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    return [result.ok() for result in schema.get_all_operations()]


def _aimed(case: Any, name: str) -> Any:
    """The case sent to the served model: its name in the path and in an OpenAI body (else nearly every
    generated request is a 404 that never reaches the model's own checks)."""
    if case.path_parameters and "model_name" in case.path_parameters and "/repository/" not in case.path:
        # (never repository load or unload: an unload the key allows takes the model away, as it should)
        case.path_parameters["model_name"] = name
    if isinstance(case.body, dict) and "model" in case.body:
        case.body["model"] = name
    return case


def _cases(operation: Any, name: str) -> Any:
    """Valid and invalid requests by the schema, as generated, and the same aimed at the served model."""
    positive = operation.as_strategy(GenerationMode.POSITIVE)
    negative = operation.as_strategy(GenerationMode.NEGATIVE)
    return st.one_of(positive, negative, positive.map(lambda c: _aimed(c, name)),
                     negative.map(lambda c: _aimed(c, name)))


def _fuzz(server: Server, send: Callable[[Any], None]) -> list[str]:
    """Send each operation's generated cases; the failures, one line each (every operation is tried)."""
    failures = []
    for operation in _operations(server):

        @FUZZ
        @given(case=_cases(operation, server.name))
        def run(case: Any) -> None:
            send(case)
            _alive(server)

        try:
            run()
        except Exception as e:  # noqa: BLE001  (Hypothesis' shrunk failure, reported with its operation)
            failures.append(f"{operation.label}: {type(e).__name__}: {e}"[:2000])
    return failures


def _alive(server: Server) -> None:
    assert server.proc.poll() is None, f"the server exited with {server.proc.returncode}:\n{server.log_tail()}"


def _still_serving(server: Server, headers: dict[str, str] | None = None) -> None:
    _alive(server)
    assert httpx.get(f"{server.url}/v2/health/ready", timeout=10).status_code == 200
    body = CLASSIFY if server.name == CLASSIFIER_NAME else GENERATE
    answer = httpx.post(f"{server.url}/v2/models/{server.name}/infer", json=body, headers=headers, timeout=60)
    assert answer.status_code == 200, answer.text
    assert output(answer.json(), "label" if server.name == CLASSIFIER_NAME else "text")


# ---------------------------------------------------------------------------------------------
# The schema.

def test_the_schema_covers_the_v2_and_openai_routes(servers: dict[str, Server]) -> None:
    from sweep.serving.routes import served_routes

    missing = {"GET /v2/models/{model_name}/versions/{model_version}",
               "POST /v2/models/{model_name}/versions/{model_version}/infer", "GET /openapi.json"}
    for kind, server in servers.items():
        spec = httpx.get(f"{server.url}/openapi.json", timeout=10).json()
        published = {f"{method.upper()} {path}" for path, ops in spec["paths"].items() for method in ops}
        table = {str(r) for r in served_routes(openai=kind == "lm")}
        assert table - published == missing, kind
        assert published <= table, kind
        assert "POST /openai/v1/completions" in published or kind == "classifier"


# ---------------------------------------------------------------------------------------------
# Every operation of the schema, fuzzed.

def _no_5xx(case: Any, response: Any) -> None:
    """No 5xx, but the documented 501 of a model version (KServe's ``model_version``: none is served)."""
    versioned = "model_version" in (case.path_parameters or {}) or "model_version" in (case.query or {})
    if response.status_code == 501 and versioned:
        return
    assert response.status_code < 500, (case.method, case.formatted_path, case.query, str(case.body)[:500],
                                        response.status_code, response.text[:500])


def test_fuzz_classifier_with_the_key(servers: dict[str, Server]) -> None:
    def send(case: Any) -> None:
        _no_5xx(case, case.call(headers=BEARER, timeout=30))

    failures = _fuzz(servers["classifier"], send)
    assert not failures, "\n".join(failures)


def test_fuzz_classifier_without_the_key_is_401_on_every_post(servers: dict[str, Server]) -> None:
    def send(case: Any) -> None:
        if case.headers:
            case.headers = {k: v for k, v in case.headers.items() if k.lower() != "authorization"}
        response = case.call(timeout=30)
        _no_5xx(case, response)
        if case.method.upper() == "POST":
            assert response.status_code == 401, (case.formatted_path, response.status_code, response.text)

    failures = _fuzz(servers["classifier"], send)
    assert not failures, "\n".join(failures)


def test_fuzz_causal_lm(servers: dict[str, Server]) -> None:
    def send(case: Any) -> None:
        _no_5xx(case, case.call(timeout=60))

    failures = _fuzz(servers["lm"], send)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("kind", ["classifier", "lm"])
@pytest.mark.parametrize(("method", "path", "body"), [
    ("GET", "/v2/models/{name}/versions/1", None),
    ("GET", "/v2/models/{name}/versions/%00", None),
    ("POST", "/v2/models/{name}/versions/1/infer", {"inputs": []}),
    ("POST", "/v2/models/{name}/versions/1/infer", b"\xff\x00not json"),
    ("POST", "/v2/models/no-such-model/versions/x/infer", {"inputs": [{"name": "text"}]}),
])
def test_routes_outside_the_schema(servers: dict[str, Server], kind: str, method: str, path: str,
                                   body: Any) -> None:
    server = servers[kind]
    content = body if isinstance(body, bytes) else None
    answer = httpx.request(method, server.url + path.format(name=server.name), headers=BEARER, timeout=30,
                           json=body if not isinstance(body, bytes) else None, content=content)
    assert answer.status_code == 501 or 400 <= answer.status_code < 500, (answer.status_code, answer.text)


# What the fuzzing found (each a 5xx before its fix), sent as found.
@pytest.mark.parametrize(("method", "path", "body", "status"), [
    # vLLM's embeddings validator calls body.get(...) inside KServe's handler: AttributeError, a 500
    ("POST", "/openai/v1/embeddings", [], 400),
    ("POST", "/openai/v1/embeddings", "a string", 400),
    ("POST", "/openai/v1/rerank", [], 400),
    # vLLM validates a structural_tag response_format with a package the server lacks: ModuleNotFoundError, a 500
    ("POST", "/openai/v1/chat/completions", {"model": LM_NAME, "messages": [{"role": "user", "content": "hi"}],
                                             "response_format": {"type": "structural_tag", "format": {
                                                 "type": "const_string", "value": "a"}}}, 400),
    ("POST", "/openai/v1/completions", {"model": LM_NAME, "prompt": "hi", "response_format": {
        "type": "structural_tag", "format": {"type": "const_string", "value": "a"}}}, 400),
    # KServe's OpenAI model route wraps an unknown model's ModelNotFound in ModelNotReady: a 503
    ("GET", "/openai/v1/models/no-such-model", None, 404),
])
def test_what_the_fuzzing_found(servers: dict[str, Server], method: str, path: str, body: Any, status: int) -> None:
    server = servers["lm"]
    answer = httpx.request(method, server.url + path, json=body, timeout=30)
    assert answer.status_code == status, answer.text
    if status == 400:  # OpenAI's error object, as the completions routes answer
        message = answer.json()["error"]["message"]
        assert message.startswith(("malformed request: ", "unsupported request: ")), answer.text


def test_each_server_still_serves_after_the_fuzzing(servers: dict[str, Server]) -> None:
    _still_serving(servers["classifier"], BEARER)
    _still_serving(servers["lm"])


# ---------------------------------------------------------------------------------------------
# gRPC sent malformed tensors: a client's error status (never INTERNAL or UNKNOWN), and the server goes on.

def _tensor(name: str = "text", datatype: str = "BYTES", shape: tuple[int, ...] = (1,), **contents: Any) -> Any:
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb

    tensor = pb.ModelInferRequest().InferInputTensor(name=name, datatype=datatype, shape=list(shape))
    for field, values in contents.items():
        getattr(tensor.contents, field).extend(values)
    return tensor


def _raw_bytes(*texts_: bytes) -> bytes:
    """The v2 raw BYTES encoding: each element a 4-byte little-endian length, then its bytes."""
    return b"".join(len(t).to_bytes(4, "little") + t for t in texts_)


OVERSIZED = 17 * 1024 * 1024  # over both servers' message limits (max_body_bytes: 8 MiB, a causal LM 16 MiB)
MALFORMED_TENSORS = [  # (id, inputs, raw_input_contents, the statuses allowed)
    ("wrong-datatype-fp32", lambda: [_tensor(datatype="FP32", fp32_contents=[1.0])], [], "INVALID_ARGUMENT"),
    ("wrong-datatype-int64", lambda: [_tensor(datatype="INT64", int64_contents=[7])], [], "INVALID_ARGUMENT"),
    ("unknown-datatype", lambda: [_tensor(datatype="TEXT", bytes_contents=[b"a"])], [], "INVALID_ARGUMENT"),
    ("shape-larger-than-data", lambda: [_tensor(shape=(3,), bytes_contents=[b"a"])], [], "INVALID_ARGUMENT"),
    ("shape-smaller-than-data", lambda: [_tensor(shape=(1,), bytes_contents=[b"a", b"b"])], [], "INVALID_ARGUMENT"),
    ("shape-2d", lambda: [_tensor(shape=(2, 2), bytes_contents=[b"a", b"b", b"c", b"d"])], [], "INVALID_ARGUMENT"),
    ("shape-negative", lambda: [_tensor(shape=(-1,), bytes_contents=[b"a"])], [], "INVALID_ARGUMENT"),
    ("shape-zero", lambda: [_tensor(shape=(0,))], [], "INVALID_ARGUMENT"),
    ("no-inputs", lambda: [], [], "INVALID_ARGUMENT"),
    ("an-input-without-data", lambda: [_tensor()], [], "INVALID_ARGUMENT"),
    ("unknown-input-name", lambda: [_tensor(name="nope", bytes_contents=[b"a"])], [], "INVALID_ARGUMENT"),
    ("text-not-utf8", lambda: [_tensor(bytes_contents=[b"\xff\xfe"])], [], "INVALID_ARGUMENT"),
    ("raw-and-contents", lambda: [_tensor(bytes_contents=[b"a"])], [_raw_bytes(b"a")], "INVALID_ARGUMENT"),
    ("raw-length-prefix-past-the-end", lambda: [_tensor()], [(1000).to_bytes(4, "little") + b"abc"],
     "INVALID_ARGUMENT"),
    ("raw-truncated-prefix", lambda: [_tensor()], [b"\x01\x00"], "INVALID_ARGUMENT"),
    ("raw-more-tensors-than-inputs", lambda: [_tensor()], [_raw_bytes(b"a"), _raw_bytes(b"b")], "INVALID_ARGUMENT"),
    ("raw-fewer-elements-than-shape", lambda: [_tensor(shape=(2,))], [_raw_bytes(b"a")], "INVALID_ARGUMENT"),
    ("raw-oversized", lambda: [_tensor()], [_raw_bytes(b"x" * OVERSIZED)], "RESOURCE_EXHAUSTED"),
]


def _grpc_call(server: Server, inputs: list[Any], raw: list[bytes], name: str | None = None) -> tuple[str, str]:
    """(status code name, details) of one ModelInfer sent as built, with the key where the server needs one."""
    import grpc
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
    from kserve.protocol.grpc.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub

    request = pb.ModelInferRequest(model_name=name or server.name, inputs=inputs, raw_input_contents=raw)
    metadata = [("authorization", f"Bearer {KEY}")] if server.name == CLASSIFIER_NAME else []
    options = [("grpc.max_send_message_length", 64 * 1024 * 1024)]
    with grpc.insecure_channel(server.grpc_address, options=options) as channel:
        try:
            GRPCInferenceServiceStub(channel).ModelInfer(request, metadata=metadata, timeout=60)
        except grpc.RpcError as e:
            return e.code().name, e.details() or ""
    return "OK", ""


@pytest.mark.parametrize("kind", ["classifier", "lm"])
@pytest.mark.parametrize(("inputs", "raw", "status"), [case[1:] for case in MALFORMED_TENSORS],
                         ids=[case[0] for case in MALFORMED_TENSORS])
def test_grpc_malformed_tensors_get_a_clients_error(servers: dict[str, Server], kind: str, inputs: Any,
                                                     raw: list[bytes], status: str) -> None:
    server = servers[kind]
    code, details = _grpc_call(server, inputs(), raw)
    assert code == status, (code, details)
    _alive(server)


def test_grpc_still_serves_after_the_malformed_tensors(servers: dict[str, Server]) -> None:
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb

    for server in servers.values():
        assert _grpc_call(server, [_tensor(bytes_contents=[b"a cat sleeps"])]
                          + ([_tensor("text_pair", bytes_contents=[b"an animal rests"])]
                             if server.name == CLASSIFIER_NAME else []), []) == ("OK", "")
        import grpc
        from kserve.protocol.grpc.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub

        with grpc.insecure_channel(server.grpc_address) as channel:
            assert GRPCInferenceServiceStub(channel).ServerReady(pb.ServerReadyRequest(), timeout=10).ready


# ---------------------------------------------------------------------------------------------
# A disconnect storm: many streams, each dropped by its client mid-way.

STORM = 30
RSS_SLACK_MIB = 32


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _family_rss_mib(pid: int) -> dict[int, float]:
    """VmRSS of the server and of its children (the continuous batch decodes in a process of its own)."""
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(c) for c in (task / "children").read_text().split()]
    return {p: _rss_kib(p) / 1024 for p in [pid, *children]}


def _sequences(server: Server) -> float:
    """Running and waiting sequences of the continuous batch, by its gauges."""
    metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith(("sweep_sequences_running{", "sweep_sequences_waiting{")))


async def _streams(server: Server, drop_after: int | None) -> list[int]:
    """``STORM`` streamed completions at once; each client leaves after ``drop_after`` chunks (None: reads all).
    The chunks each stream read."""
    import asyncio

    payload = {"model": LM_NAME, "prompt": "Once upon a time", "max_tokens": MAX_OUTPUT_TOKENS, "stream": True,
               "temperature": 0}

    async def one(http: httpx.AsyncClient) -> int:
        read = 0
        async with http.stream("POST", f"{server.url}/openai/v1/completions", json=payload) as response:
            assert response.status_code == 200, await response.aread()
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    read += 1
                    if drop_after is not None and read >= drop_after:
                        break  # leaving the block closes the connection mid-stream
        return read

    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=STORM)) as http:
        return await asyncio.gather(*(one(http) for _ in range(STORM)))


def test_a_disconnect_storm_leaves_no_sequence_and_no_memory_behind(servers: dict[str, Server]) -> None:
    """The bound: RSS_SLACK_MIB over the RSS after the same streams read to the end (which allocated what a
    stream needs: the KV pages, the allocator's arenas); a stream that kept its state (its sequence, the
    queue of its chunks, a task) would grow with each storm, and the gauges would not return to 0."""
    import asyncio

    server = servers["lm"]
    whole = asyncio.run(_streams(server, None))
    assert min(whole) > 2, whole  # so that a client leaving after 2 chunks leaves mid-stream
    time.sleep(0.5)
    before = _family_rss_mib(server.proc.pid)
    for _ in range(2):
        dropped = asyncio.run(_streams(server, 2))
        assert dropped == [2] * STORM
    deadline = time.monotonic() + 15
    while _sequences(server) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _sequences(server) == 0
    after = _family_rss_mib(server.proc.pid)
    print(f"chunks of a whole stream {sorted(set(whole))}; RSS MiB before {before}, after {after}")
    assert set(after) == set(before), (before, after)  # no decoding process lost or added
    for pid, mib in after.items():
        assert mib <= before[pid] + RSS_SLACK_MIB, (pid, before, after)
    _still_serving(server)
    assert min(asyncio.run(_streams(server, None))) > 2  # every stream served to its end again
