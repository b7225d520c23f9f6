"""The model server: plain logic (requests, batcher, generation, sources) and the real server over HTTP.

Two real ``python -m sweep serve`` processes run for the module, on free ports: a tiny RoBERTa RTE
classifier and a tiny GPT-2 language model, each saved as a sweep exports its best model
(save_pretrained + tokenizer + ``sweep_made_by.json``).
"""

from __future__ import annotations

import ast
import asyncio
import json
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from sweep.cli.key_values import UsageError, parse_key_values
from sweep.results.export_layout import MADE_BY
from sweep.serving.batcher import MicroBatcher
from sweep.serving.generation import finish_completion
from sweep.serving.model_location import ModelSourceError, published_name, resolve_model_source
from sweep.serving.protocol import (
    GenerationParams,
    RequestError,
    TaskInputs,
    Tensor,
    check_context,
    parse_classify,
    parse_generate,
)
from sweep.testing.local_cluster import free_port
from sweep.train.tiny_exports import export_tiny_classifier, export_tiny_lm
from tests.helpers.serving import (
    CLASSIFIER_NAME,
    LM_NAME,
    RecordingModel,
    Server,
    output,
    serving,
    start_server,
    texts,
)

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy" / "kserve"
LM_CONTEXT = 256


def tensor(name: str, values: list[Any], shape: list[int] | None = None, datatype: str = "BYTES") -> Tensor:
    return Tensor(**texts(name, values, shape, datatype))


# ---------------------------------------------------------------------------------------------
# Requests.

def test_classify_request_singles_and_pairs() -> None:
    single = parse_classify([tensor("text", ["a cat", "a dog"])], None)
    assert single.items == [("a cat", None), ("a dog", None)] and single.batch_key is False
    pairs = parse_classify([tensor("text", [["a"], ["b"]], [2, 1]), tensor("text_pair", ["x", "y"])], {})
    assert pairs.items == [("a", "x"), ("b", "y")] and pairs.batch_key is True


@pytest.mark.parametrize(
    ("inputs", "parameters", "message"),
    [
        ([], None, "missing input 'text'"),
        ([tensor("text", [])], None, "is empty"),
        ([tensor("text", ["a", ""])], None, "'text'[1] is an empty string"),
        ([tensor("text", ["a"], [2])], None, "shape [2] says 2 element(s), data has 1"),
        ([tensor("text", ["a", "b"], [1, 2])], None, "shape must be [n] or [n, 1]"),
        ([tensor("text", [1.5], datatype="FP32")], None, "datatype must be BYTES"),
        ([tensor("text", [3])], None, "expected a string, got int"),
        ([tensor("txt", ["a"])], None, "unknown input 'txt'"),
        ([tensor("text", ["a"]), tensor("text", ["b"])], None, "given twice"),
        ([tensor("text", ["a", "b"]), tensor("text_pair", ["x"])], None, "one pair each"),
        ([tensor("text", ["a"])], {"temperature": 1.0}, "unknown parameter(s) temperature"),
    ],
)
def test_classify_request_errors(inputs: list[Tensor], parameters: dict[str, Any] | None, message: str) -> None:
    with pytest.raises(RequestError) as err:
        parse_classify(inputs, parameters)
    assert message in str(err.value)


def test_a_task_takes_its_own_inputs_only() -> None:
    """A pair task's model needs text_pair, a one-sentence task's refuses it; a folder with no task takes either."""
    one, two = [tensor("text", ["a cat"])], [tensor("text", ["a cat"]), tensor("text_pair", ["an animal"])]
    with pytest.raises(RequestError, match="missing input 'text_pair': .* sentence pairs \\(task RTE\\)"):
        parse_classify(one, None, TaskInputs("RTE", pair=True))
    with pytest.raises(RequestError, match="input 'text_pair': .* single sentences \\(task SST-2\\)"):
        parse_classify(two, None, TaskInputs("SST-2", pair=False))
    assert parse_classify(two, None, TaskInputs("RTE", pair=True)).items == [("a cat", "an animal")]
    assert parse_classify(one, None, TaskInputs("SST-2", pair=False)).items == [("a cat", None)]
    assert parse_classify(one, None).items == [("a cat", None)]


def test_generate_request_defaults_and_settings() -> None:
    default = parse_generate([tensor("text", ["hello"])], None, context_length=256)
    assert default.prompts == ("hello",)
    assert default.params == GenerationParams(max_new_tokens=32, temperature=0.0, top_p=1.0, stop=(), seed=None)
    request = parse_generate(
        [tensor("text", ["a", "b"]), tensor("stop", ["\n", "."])],
        {"max_new_tokens": 5, "temperature": 1, "top_p": 0.9, "seed": 7, "stop": "!"},
        context_length=256,
    )
    assert request.params == GenerationParams(5, 1.0, 0.9, ("!", "\n", "."), 7)


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens: must be in [1, 255]"),
        ({"max_new_tokens": 2.5}, "max_new_tokens: must be an integer"),
        ({"max_new_tokens": True}, "max_new_tokens: must be an integer"),
        ({"temperature": "hot"}, "temperature: must be a number"),
        ({"temperature": -1}, "temperature: must be in [0.0, 100.0]"),
        ({"top_p": 0}, "top_p: must be in (0.0, 1.0]"),
        ({"seed": -3}, "seed: must be in [0,"),
        ({"stop": ""}, "stop: must be a non-empty string"),
        ({"max_tokens": 5}, "unknown parameter(s) max_tokens; allowed: max_new_tokens, seed, stop, temperature, top_p"),
    ],
)
def test_generate_request_errors(parameters: dict[str, Any], message: str) -> None:
    with pytest.raises(RequestError) as err:
        parse_generate([tensor("text", ["hello"])], parameters, context_length=256)
    assert message in str(err.value)


def test_prompt_longer_than_context_names_the_limit() -> None:
    check_context([10, 200], max_new_tokens=56, context_length=256)  # exactly fits
    with pytest.raises(RequestError, match=r"prompt 1 is 201 tokens; with max_new_tokens=56 .* context of 256 tokens"):
        check_context([10, 201], max_new_tokens=56, context_length=256)


def test_batch_keys_merge_only_what_can_share_a_generate_call() -> None:
    greedy = GenerationParams(max_new_tokens=8)
    # Greedy decoding ignores temperature-only settings: the same key, so these share a batch.
    assert greedy.batch_key == GenerationParams(max_new_tokens=8, top_p=0.5, seed=3).batch_key
    assert greedy.batch_key != GenerationParams(max_new_tokens=9).batch_key
    assert greedy.batch_key != GenerationParams(max_new_tokens=8, stop=("\n",)).batch_key
    sampled = GenerationParams(temperature=0.7)
    assert (sampled.batch_key == GenerationParams(temperature=0.7).batch_key
            != GenerationParams(temperature=0.8).batch_key)
    assert GenerationParams(temperature=0.7, seed=1).batch_key is None  # a seeded request runs alone


# ---------------------------------------------------------------------------------------------
# Batcher.

async def _submit_all(batcher: MicroBatcher[int, int], requests: list[tuple[Any, list[int]]]) -> list[Any]:
    return await asyncio.gather(*(batcher.submit(k, items) for k, items in requests), return_exceptions=True)


def test_batcher_merges_concurrent_requests_and_keeps_results_aligned() -> None:
    model = RecordingModel()
    batcher = MicroBatcher(model, max_batch_size=8, max_latency_ms=50)
    requests = [("k", [i, i + 100]) for i in range(6)]  # 12 items: a batch of 8, then one of 4
    answers = asyncio.run(_submit_all(batcher, requests))
    assert [a.results for a in answers] == [[i * 10, (i + 100) * 10] for i in range(6)]
    assert [len(items) for _, items in model.calls] == [8, 4]
    assert [a.batch_size for a in answers] == [8, 8, 8, 8, 4, 4]
    batcher.close()


def test_batcher_never_merges_different_keys_or_none() -> None:
    model = RecordingModel()
    batcher = MicroBatcher(model, max_batch_size=32, max_latency_ms=50)
    requests = [("a", [1]), ("b", [2]), ("a", [3]), (None, [4]), (None, [5]), ("b", [6])]
    answers = asyncio.run(_submit_all(batcher, requests))
    assert [a.results for a in answers] == [[10], [20], [30], [40], [50], [60]]
    assert sorted((str(k), items) for k, items in model.calls) == [
        ("None", [4]), ("None", [5]), ("a", [1, 3]), ("b", [2, 6])
    ]
    batcher.close()


def test_batcher_off_runs_every_request_alone() -> None:
    model = RecordingModel()
    batcher = MicroBatcher(model, enabled=False)
    answers = asyncio.run(_submit_all(batcher, [("k", [i]) for i in range(5)]))
    assert [a.results for a in answers] == [[i * 10] for i in range(5)]
    assert len(model.calls) == 5 and all(a.batch_size == 1 for a in answers)
    batcher.close()


def test_batcher_failure_reaches_every_request_of_the_batch_and_it_keeps_working() -> None:
    model = RecordingModel(fail_on=2)
    batcher = MicroBatcher(model, max_batch_size=8, max_latency_ms=50)

    async def scenario() -> tuple[list[Any], Any]:
        failed = await _submit_all(batcher, [("k", [1]), ("k", [2])])
        return failed, await batcher.submit("k", [3])

    failed, later = asyncio.run(scenario())
    assert all(isinstance(f, RuntimeError) and "boom on 2" in str(f) for f in failed)
    assert later.results == [30]
    batcher.close()


def test_batcher_rejects_bad_limits() -> None:
    with pytest.raises(ValueError, match="max_batch_size"):
        MicroBatcher(RecordingModel(), max_batch_size=0)
    with pytest.raises(ValueError, match="max_latency_ms"):
        MicroBatcher(RecordingModel(), max_latency_ms=-1)


# ---------------------------------------------------------------------------------------------
# Generation post-processing (one "token" per character here, to make the counts visible).

def _decode(ids: list[int]) -> str:
    return "".join(chr(i) for i in ids)


def test_completion_is_cut_at_the_earliest_stop_sequence() -> None:
    ids = [ord(c) for c in "Hello. World\nmore"]
    done = finish_completion(ids, 4, _decode, eos_token_id=0, stops=["\n", "."], max_new_tokens=20)
    assert (done.text, done.prompt_tokens, done.completion_tokens, done.finish_reason) == ("Hello", 4, 6, "stop")


def test_completion_ends_at_eos_or_length() -> None:
    eos = 0
    by_eos = finish_completion([ord("a"), ord("b"), eos, eos, eos], 2, _decode, eos, [], max_new_tokens=5)
    assert (by_eos.text, by_eos.completion_tokens, by_eos.finish_reason) == ("ab", 3, "stop")
    by_length = finish_completion([ord("a")] * 5, 2, _decode, eos, ["zz"], max_new_tokens=5)
    assert (by_length.text, by_length.completion_tokens, by_length.finish_reason) == ("aaaaa", 5, "length")


# ---------------------------------------------------------------------------------------------
# Command line and model sources.

def test_key_value_arguments() -> None:
    from sweep.cli.serve import OPTIONS
    from sweep.serving.server import DEFAULT_PORT

    options = parse_key_values(["model=/m", "port=9000", "batching=false", "max_latency_ms=2.5"], OPTIONS)
    assert options["model"] == "/m" and options["port"] == 9000 and options["batching"] is False
    assert options["max_latency_ms"] == 2.5 and options["max_batch_size"] == 32
    assert parse_key_values(["model=/m"], OPTIONS)["port"] == DEFAULT_PORT == 8080
    for argv, message in [
        (["model=/m", "prot=1"], "prot: unknown option"),
        (["model=/m", "--port", "1"], "arguments are key=value"),
        (["model=/m", "port=http"], "port: expected a whole number, got 'http'"),
        (["model=/m", "port=70000"], "port: must be a port in 1..65535"),
        (["model=/m", "batching=maybe"], "batching: expected true or false"),
        (["model=/m", "model=/n"], "model: given twice"),
        (["port=1"], "model: required"),
    ]:
        with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
            parse_key_values(argv, OPTIONS)


def test_serve_cli_bad_arguments_exit_2_with_one_line(tmp_path: Path) -> None:
    encoder_only = tmp_path / "encoder"
    encoder_only.mkdir()
    (encoder_only / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    for argv, message in [
        (["prot=1", "model=x"], "error: prot: unknown option"),
        (["model=x", "port=0"], "error: port: must be a port in 1..65535, got 0"),
        ([f"model={tmp_path / 'missing'}"], "does not exist"),
        ([f"model={tmp_path}"], "has no config.json"),
        ([f"model={encoder_only}"], "is neither a sequence classifier nor a causal LM"),
    ]:
        done = subprocess.run([sys.executable, "-m", "sweep", "serve", *argv], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], done.stderr


def test_published_name_is_the_registered_name(tmp_path: Path) -> None:
    folder = tmp_path / "best" / "RTE"
    folder.mkdir(parents=True)
    assert published_name(folder, str(folder)) == "RTE"  # no sweep_made_by.json: the folder's name
    (folder / MADE_BY).write_text(json.dumps({"model": "org/roberta-base", "task": "RTE"}))
    assert published_name(folder, str(folder)) == "org-roberta-base-RTE"  # as tracking.register_best names it
    assert published_name(folder, "models:/roberta-base-WNLI@champion") == "roberta-base-WNLI"


def test_model_source_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError, match="does not exist"):
        resolve_model_source(str(tmp_path / "nope"), tmp_path)
    with pytest.raises(ModelSourceError, match="unknown scheme"):
        resolve_model_source("gs://bucket/model", tmp_path)
    with pytest.raises(ModelSourceError, match=r"expected models:/<name>@<alias>"):
        resolve_model_source("models:/a/b/c", tmp_path, tracking_uri=f"sqlite:///{tmp_path}/m.db")


@pytest.mark.slow
def test_registered_champion_is_downloaded_and_named(tmp_path: Path, cache_dir: Path) -> None:
    from mlflow.tracking import MlflowClient

    from sweep.config.tasks import load_task
    from sweep.tracking import register_best

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    model_dir = export_tiny_classifier(tmp_path / "best" / "RTE", cache_dir)
    client = MlflowClient(tracking_uri=uri)
    run = client.create_run(client.create_experiment("serve-test", artifact_location=str(tmp_path / "artifacts")))
    register_best(uri, "tiny-roberta", load_task("RTE"), run.info.run_id, model_dir, 0.5)
    source = "models:/tiny-roberta-RTE@champion"
    local = resolve_model_source(source, tmp_path / "cache", tracking_uri=uri)
    assert (local / "config.json").is_file() and (local / "model.safetensors").is_file()
    assert local.name == "tiny-roberta-RTE-v1" and published_name(local, source) == "tiny-roberta-RTE"
    assert resolve_model_source(source, tmp_path / "cache", tracking_uri=uri) == local  # cached copy reused
    with pytest.raises(ModelSourceError, match="not found in the registry"):
        resolve_model_source("models:/tiny-roberta-RTE@nope", tmp_path / "cache", tracking_uri=uri)


# ---------------------------------------------------------------------------------------------
# Deploy files.

def _kserve_container() -> dict[str, Any]:
    """The container KServe runs for the InferenceService: the ServingRuntime's kserve-container."""
    runtime = yaml.safe_load((DEPLOY / "servingruntime.yaml").read_text())
    assert (runtime["apiVersion"], runtime["kind"]) == ("serving.kserve.io/v1alpha1", "ServingRuntime")
    (container,) = runtime["spec"]["containers"]
    assert container["name"] == "kserve-container"
    return container


def test_inferenceservice_runs_the_same_server_command_and_port() -> None:
    """The InferenceService selects the runtime; the runtime runs this server on its ports (the
    schemas and KServe's own rules: tests/test_kserve_manifests.py)."""
    from sweep.cli.serve import OPTIONS
    from sweep.serving.server import DEFAULT_PORT

    runtime = yaml.safe_load((DEPLOY / "servingruntime.yaml").read_text())
    isvc = yaml.safe_load((DEPLOY / "inferenceservice.yaml").read_text())
    assert (isvc["apiVersion"], isvc["kind"]) == ("serving.kserve.io/v1beta1", "InferenceService")
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    assert model["storageUri"].startswith("s3://")
    container = _kserve_container()
    assert container["command"] == ["python", "-m", "sweep", "serve"]
    args = [a.replace("{{.Name}}", isvc["metadata"]["name"]) for a in container["args"]]  # as KServe renders them
    options = parse_key_values(args, OPTIONS)  # the server itself accepts these arguments
    assert options["model"] == "/mnt/models" and options["port"] == DEFAULT_PORT
    assert options["host"] == "0.0.0.0"  # the server's default, 127.0.0.1, is unreachable from outside a container
    assert options["name"] == isvc["metadata"]["name"]
    assert [(p["name"], p["containerPort"]) for p in container["ports"]] == [("http", DEFAULT_PORT),
                                                                             ("h2c", options["grpc_port"])]
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": DEFAULT_PORT}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": DEFAULT_PORT}

    (secret,) = yaml.safe_load_all((DEPLOY / "s3-secret.yaml").read_text())
    (account,) = yaml.safe_load_all((DEPLOY / "serviceaccount.yaml").read_text())
    assert ((account["kind"], account["metadata"]["name"])
            == ("ServiceAccount", isvc["spec"]["predictor"]["serviceAccountName"]))
    assert account["secrets"] == [{"name": secret["metadata"]["name"]}]
    assert secret["kind"] == "Secret" and "serving.kserve.io/s3-endpoint" in secret["metadata"]["annotations"]
    assert set(secret["stringData"]) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}


def test_containerfile_serves_with_the_command_the_deploy_yaml_names() -> None:
    from sweep.cli.serve import OPTIONS
    from sweep.serving.server import DEFAULT_PORT

    lines = (REPO / "deploy" / "Containerfile").read_text().splitlines()
    instruction = {line.split()[0]: line.split(None, 1)[1]
                   for line in lines if line and not line.startswith(("#", " "))}
    assert "ENTRYPOINT" not in instruction  # KubeRay and KServe set the command; the ServingRuntime names it
    command = _kserve_container()["command"]
    cmd = json.loads(instruction["CMD"])  # a bare `podman run` serves /mnt/models the same way
    assert cmd[: len(command)] == command == ["python", "-m", "sweep", "serve"]
    options = parse_key_values(cmd[len(command):], OPTIONS)
    assert options["model"] == "/mnt/models" and options["port"] == DEFAULT_PORT
    assert options["host"] == "0.0.0.0"  # the server's default, 127.0.0.1, is unreachable from outside a container
    assert {str(DEFAULT_PORT), str(options["grpc_port"])} <= set(instruction["EXPOSE"].split())


# ---------------------------------------------------------------------------------------------
# The real server.

@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[dict[str, Server]]:
    """Both servers, started together (start-up is mostly imports) and stopped at the end."""
    root = tmp_path_factory.mktemp("serve")
    classifier_dir = export_tiny_classifier(root / "best" / "RTE", cache_dir)
    lm_dir = export_tiny_lm(root / "best" / "wikitext-2", cache_dir)
    started = {
        # log_requests=false: its log holds only what the server has to say (a bad request's line)
        "classifier": start_server(CLASSIFIER_NAME, classifier_dir, root / "classifier.log", cache_dir,
                                   "log_requests=false"),
        "lm": start_server(LM_NAME, lm_dir, root / "lm.log", cache_dir),
    }
    with serving(started):
        yield started


def _infer(server: Server, body: Any, name: str | None = None) -> httpx.Response:
    return httpx.post(f"{server.url}/v2/models/{name or server.name}/infer", json=body, timeout=60)


@pytest.mark.slow
def test_health_and_model_endpoints(servers: dict[str, Server]) -> None:
    for kind, server in servers.items():
        assert httpx.get(f"{server.url}/v2/health/live").json() == {"live": True}
        assert httpx.get(f"{server.url}/v2/health/ready").json() == {"ready": True}
        assert httpx.get(f"{server.url}/v1/models").json() == {"models": [server.name]}  # the registered name
        assert httpx.get(f"{server.url}/v2/models/{server.name}/ready").json() == {"name": server.name, "ready": True}
        metadata = httpx.get(f"{server.url}/v2/models/{server.name}").json()
        outputs = {o["name"] for o in metadata["outputs"]}
        assert outputs == ({"label", "score"} if kind == "classifier"
                           else {"text", "prompt_tokens", "completion_tokens", "finish_reason"})


@pytest.mark.slow
def test_classifier_returns_labels_and_scores(servers: dict[str, Server]) -> None:
    server = servers["classifier"]
    pairs = _infer(server, {"inputs": [texts("text", ["the cat sees a dog", "a quiet river"]),
                                       texts("text_pair", ["a dog is seen", "the water is loud"])]})
    assert pairs.status_code == 200, pairs.text
    body = pairs.json()
    assert set(output(body, "label")) <= {"entailment", "not_entailment"} and len(output(body, "label")) == 2
    assert all(0.5 <= s <= 1.0 for s in output(body, "score"))  # probability of the predicted of 2 labels
    other = _infer(server, {"inputs": [texts("text", ["the cat sees a dog"]), texts("text_pair", ["nobody came"])]})
    assert other.status_code == 200 and output(other.json(), "score") != output(body, "score")[:1]  # the pair counts


@pytest.mark.slow
def test_a_pair_task_without_text_pair_is_a_400_logged_in_one_line(servers: dict[str, Server]) -> None:
    """RTE's model refuses one sentence (as MLflow's copy does); the 400 is one log line, no traceback."""
    server = servers["classifier"]
    logged = server.log.stat().st_size
    alone = _infer(server, {"inputs": [texts("text", ["the cat sleeps"])]})
    assert alone.status_code == 400, alone.text
    assert alone.json()["error"].startswith("missing input 'text_pair': this model classifies sentence pairs "
                                            "(task RTE)")
    time.sleep(0.5)  # the line is written before the answer; a moment for anything that might follow it
    with server.log.open("rb") as log:
        lines = log.read()[logged:].decode(errors="replace").splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0], "\n".join(lines)
    assert " WARNING " in lines[0] and f"400 POST /v2/models/{server.name}/infer: missing input 'text_pair'" \
        in lines[0], lines[0]


def _new_lines(server: Server, send: Any) -> list[str]:
    """The log lines a request writes: ``send()`` it, wait for its first line, then a moment for any other."""
    logged = server.log.stat().st_size
    send()
    deadline = time.monotonic() + 10
    while server.log.stat().st_size == logged and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    with server.log.open("rb") as log:
        return log.read()[logged:].decode(errors="replace").splitlines()


@pytest.mark.slow
def test_log_requests_logs_each_request_in_one_access_line(servers: dict[str, Server]) -> None:
    """The default (log_requests=true): ONE line per request, with its status and time, a stream's when it ends;
    none of KServe's timing lines (``kserve.trace``) nor uvicorn's access line. (With log_requests=false the
    classifier's log above holds only its one warning.)"""
    server = servers["lm"]
    v2 = _new_lines(server, lambda: _generate(server, ["hello"], max_new_tokens=2))
    assert len(v2) == 1 and re.search(rf" sweep\.access INFO 200 POST /v2/models/{server.name}/infer \d+\.\d ms$",
                                      v2[0]), v2
    body = {"model": server.name, "prompt": "hello", "max_tokens": 3, "stream": True}
    stream = _new_lines(server, lambda: httpx.post(f"{server.url}/openai/v1/completions", json=body, timeout=60))
    assert len(stream) == 1 and " sweep.access INFO 200 POST /openai/v1/completions " in stream[0], stream


def _app(log_requests: bool, openai: bool = False) -> Any:
    """The server's app (routes.build_app) over KServe's data plane, with one model registered, not started."""
    from sweep.serving.kserve_import import import_kserve

    kserve = import_kserve()
    from kserve.protocol.dataplane import DataPlane
    from kserve.protocol.model_repository_extension import ModelRepositoryExtension

    from sweep.serving.routes import build_app

    if openai:
        from kserve.protocol.rest.openai import OpenAIGenerativeModel

        class Model(OpenAIGenerativeModel):
            async def create_completion(self, *_: Any, **__: Any) -> Any: ...
            async def create_chat_completion(self, *_: Any, **__: Any) -> Any: ...
    else:
        Model = kserve.Model  # noqa: N806
    registry = kserve.ModelRepository()
    registry.update(Model("m"), "m")
    return build_app(DataPlane(model_registry=registry), ModelRepositoryExtension(model_registry=registry), {}, [],
                     log_requests)


@pytest.mark.parametrize("log_requests", [False, True])
def test_the_request_log_is_the_outermost_middleware_and_kserves_timing_is_left_out(log_requests: bool) -> None:
    """One line per request (request_log.py) whatever log_requests says (a 4xx's WARNING is always written); its
    access line as log_requests says; KServe's TimingMiddleware (two kserve.trace lines per request) never."""
    from timing_asgi import TimingMiddleware

    from sweep.serving.request_log import RequestLog

    app = _app(log_requests=log_requests)
    assert app.user_middleware[0].cls is RequestLog and app.user_middleware[0].kwargs == {"access": log_requests}
    assert TimingMiddleware not in [m.cls for m in app.user_middleware]
    # KServe's ORJSONResponse (deprecated by FastAPI; its warning filtered): the answers' bytes as before, and a NaN
    # score null where FastAPI's JSONResponse would make the request a 500
    from fastapi.responses import ORJSONResponse

    chosen = app.router.default_response_class
    assert getattr(chosen, "value", chosen) is ORJSONResponse  # FastAPI wraps only its own default
    assert ORJSONResponse({"score": float("nan")}).body == b'{"score":null}'


@pytest.mark.parametrize("openai", [False, True])
def test_the_app_serves_no_route_outside_the_table(openai: bool) -> None:
    """KServe's registrars add what the table says (a kserve upgrade that adds a route fails here)."""
    from sweep.serving.routes import served_routes

    schema = _app(log_requests=False, openai=openai).openapi()["paths"]
    in_app = {f"{method.upper()} {path}" for path, methods in schema.items() for method in methods}
    assert in_app | {"GET /openapi.json"} <= {str(r) for r in served_routes(openai)}
    assert any(path.startswith("/openai/") for path in schema) == openai


def kserve_attribute_assignments(source: str) -> list[str]:
    """``name.attr = ...`` (or setattr) where ``name`` was imported from kserve or is ``import_kserve()``."""
    tree = ast.parse(source)
    kserve_names = {"kserve"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            kserve_names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("kserve")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kserve"):
            kserve_names |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                and getattr(node.value.func, "id", "") == "import_kserve":
            kserve_names |= {t.id for t in node.targets if isinstance(t, ast.Name)}

    def root(node: ast.AST) -> str:
        while isinstance(node, ast.Attribute):
            node = node.value
        return node.id if isinstance(node, ast.Name) else ""

    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else []
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("setattr", "delattr") and node.args:
            targets = [node.args[0]]
        found += [f"line {node.lineno}: {ast.unparse(t)}" for t in targets
                  if (isinstance(t, ast.Attribute) or isinstance(node, ast.Call)) and root(t) in kserve_names]
    return found


def test_no_module_of_kserve_is_changed_by_assignment() -> None:
    """The server is built on KServe's public parts: nothing of kserve's modules is reassigned (routes.py)."""
    found = {str(path.relative_to(REPO)): kserve_attribute_assignments(path.read_text())
             for path in (REPO / "sweep").rglob("*.py")}
    assert {path: lines for path, lines in found.items() if lines} == {}


def test_the_kserve_assignment_check_can_fail() -> None:
    source = ("from kserve.protocol.rest import server as rest\nimport kserve.model_server\nk = import_kserve()\n"
              "rest.TimingMiddleware = None\nkserve.model_server.app = 1\nk.x += 1\nsetattr(rest, 'y', 2)\n"
              "other.z = 3\n")
    assert kserve_attribute_assignments(source) == [
        "line 4: rest.TimingMiddleware", "line 5: kserve.model_server.app", "line 6: k.x", "line 7: rest"]


def test_the_docs_list_the_route_table() -> None:
    """docs/serving.md's Routes table is routes.py's, row for row."""
    from sweep.serving.routes import FAMILIES

    text = (REPO / "docs" / "serving.md").read_text()
    rows = [line for line in text.split("## Routes", 1)[1].split("\n## ", 1)[0].splitlines() if line.startswith("| ")]
    assert rows[1:] == [f"| {f.name} | `{r.method}` | `{r.path}` |" for f in FAMILIES for r in f.routes]


def _route_counts(server: Server) -> dict[tuple[str, str], float]:
    from prometheus_client.parser import text_string_to_metric_families

    page = httpx.get(f"{server.url}/metrics", timeout=30).text
    counts: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(page):
        for s in family.samples:
            if s.name == "sweep_http_requests_total":  # summed over the status label: a route may have answered both
                key = (s.labels["method"], s.labels["route"])
                counts[key] = counts.get(key, 0.0) + s.value
    return counts


@pytest.mark.slow
def test_every_route_of_the_table_answers(servers: dict[str, Server]) -> None:
    """Each route of routes.py's table is matched (``sweep_http_requests_total`` counts it by its template) on
    the LM's server, which has every family; the classifier's server has no OpenAI routes."""
    from sweep.serving.routes import OPENAI, served_routes

    lm, clf = servers["lm"], servers["classifier"]
    before = _route_counts(lm)
    statuses = {}
    for route in served_routes(openai=True):
        name = "no-such-model" if "/repository/" in route.path else lm.name  # not unloading the fixture's model
        body = {"inputs": [texts("text", ["hello"])], "parameters": {"max_new_tokens": 1}}
        statuses[str(route)] = httpx.request(route.method, f"{lm.url}{route.url(name)}", timeout=60,
                                             json=body if route.method == "POST" else None).status_code
    after = _route_counts(lm)
    counted = {str(r): after.get((r.method, r.path), 0) - before.get((r.method, r.path), 0)
               for r in served_routes(openai=True)}
    # /metrics: the scrape before counts too; /openapi.json: FastAPI's own page, not an API route, is "unmatched"
    assert counted == {**dict.fromkeys(statuses, 1), "GET /metrics": 2, "GET /openapi.json": 0}, statuses
    assert statuses["GET /openapi.json"] == 200
    assert all(status not in (404, 405) or "/repository/" in route for route, status in statuses.items()), statuses
    assert all(status < 500 or status == 501 for status in statuses.values()), statuses  # 501: KServe's "versions"
    for route in OPENAI.routes:
        assert httpx.request(route.method, f"{clf.url}{route.url(clf.name)}", timeout=30).status_code == 404


def _generate(server: Server, prompts: list[str], **parameters: Any) -> dict[str, Any]:
    response = _infer(server, {"inputs": [texts("text", prompts)], "parameters": parameters})
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.slow
def test_language_model_generates_with_token_counts(servers: dict[str, Server]) -> None:
    from sweep.train.loading import load_tokenizer

    server = servers["lm"]
    prompts = ["The meaning of life is", "the old painter"]
    body = _generate(server, prompts, max_new_tokens=7)
    (model_arg,) = [a for a in servers["lm"].proc.args if a.startswith("model=")]
    tokenizer = load_tokenizer(Path(model_arg.split("=", 1)[1]))
    assert output(body, "prompt_tokens") == [len(tokenizer(p)["input_ids"]) for p in prompts]
    for text, n, reason in zip(output(body, "text"), output(body, "completion_tokens"), output(body, "finish_reason")):
        assert text and (reason, n) in {("length", 7), ("stop", n)} and 1 <= n <= 7
    # Greedy decoding is deterministic and does not depend on the batch a prompt shared.
    alone = _generate(server, prompts[1:], max_new_tokens=7)
    assert output(alone, "text") == output(body, "text")[1:]


@pytest.mark.slow
def test_seed_makes_sampling_reproducible(servers: dict[str, Server]) -> None:
    server = servers["lm"]
    first = output(_generate(server, ["the city"], max_new_tokens=16, temperature=1.0, top_p=0.95, seed=7), "text")
    again = output(_generate(server, ["the city"], max_new_tokens=16, temperature=1.0, top_p=0.95, seed=7), "text")
    other = output(_generate(server, ["the city"], max_new_tokens=16, temperature=1.0, top_p=0.95, seed=8), "text")
    assert first == again and first != other


@pytest.mark.slow
def test_stop_sequence_cuts_the_completion(servers: dict[str, Server]) -> None:
    server = servers["lm"]
    full = _generate(server, ["the doctor"], max_new_tokens=16)
    text = output(full, "text")[0]
    assert len(text) > 8, text
    stop = text[5:8]
    cut = _generate(server, ["the doctor"], max_new_tokens=16, stop=stop)
    assert output(cut, "text") == [text[: text.find(stop)]]
    assert output(cut, "finish_reason") == ["stop"] and output(cut, "completion_tokens")[0] < 16
    several = _infer(server, {"inputs": [texts("text", ["the doctor"]), texts("stop", ["zzzz", stop])],
                              "parameters": {"max_new_tokens": 16}})
    assert output(several.json(), "text") == [text[: text.find(stop)]]


MALFORMED = b'{"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["unterminated'
BAD_REQUESTS: list[tuple[str, str, Any, int, str]] = [
    # (id, server, body (bytes: sent as is), status, fragment of the error message)
    ("malformed-json", "lm", MALFORMED, 400, "not valid JSON"),
    ("not-a-v2-request", "lm", [1, 2], 400, "malformed request"),
    ("shape-not-a-list", "lm", {"inputs": [texts("text", ["a"], "x")]}, 400, "inputs.0.shape"),
    ("shape-mismatch", "classifier", {"inputs": [texts("text", ["a"], [3])]}, 400,
     "shape [3] says 3 element(s), data has 1"),
    ("shape-2d", "lm", {"inputs": [texts("text", ["a", "b"], [1, 2])]}, 400, "shape must be [n] or [n, 1]"),
    ("wrong-datatype", "classifier", {"inputs": [texts("text", [1.0], datatype="FP32")]}, 400,
     "datatype must be BYTES"),
    ("number-as-text", "lm", {"inputs": [texts("text", [5])]}, 400, "expected a string"),
    ("empty-input", "lm", {"inputs": [texts("text", [])]}, 400, "is empty"),
    ("empty-string", "classifier", {"inputs": [texts("text", [""])]}, 400, "empty string"),
    ("no-inputs", "classifier", {"inputs": []}, 400, "missing input 'text'"),
    ("pair-count", "classifier", {"inputs": [texts("text", ["a", "b"]), texts("text_pair", ["c"])]}, 400,
     "one pair each"),
    ("prompt-too-long", "lm", {"inputs": [texts("text", ["the cat " * 200])]}, 400,
     f"context of {LM_CONTEXT} tokens"),
    ("unknown-parameter", "lm", {"inputs": [texts("text", ["a"])], "parameters": {"max_tokens": 3}}, 400,
     "unknown parameter(s) max_tokens"),
    ("bad-parameter", "lm", {"inputs": [texts("text", ["a"])], "parameters": {"temperature": "hot"}}, 400,
     "temperature: must be a number"),
    ("unknown-model", "lm", {"inputs": [texts("text", ["a"])]}, 404, "no-such-model"),
]


@pytest.mark.parametrize(("server_kind", "body", "status", "message"), [b[1:] for b in BAD_REQUESTS],
                         ids=[b[0] for b in BAD_REQUESTS])
@pytest.mark.slow
def test_bad_request_gets_4xx_json_and_the_server_keeps_serving(
    servers: dict[str, Server], server_kind: str, body: Any, status: int, message: str
) -> None:
    server = servers[server_kind]
    name = "no-such-model" if status == 404 else server.name
    url = f"{server.url}/v2/models/{name}/infer"
    if isinstance(body, bytes):
        response = httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=30)
    else:
        response = httpx.post(url, json=body, timeout=30)
    assert response.status_code == status, response.text
    assert message in response.json()["error"]
    if server_kind == "lm":
        good = _infer(server, {"inputs": [texts("text", ["still here"])], "parameters": {"max_new_tokens": 2}})
    else:
        good = _infer(server, {"inputs": [texts("text", ["still here"]), texts("text_pair", ["it is"])]})
    assert good.status_code == 200, good.text


async def _concurrent(requests: list[tuple[str, dict[str, Any]]]) -> list[httpx.Response | BaseException]:
    limits = httpx.Limits(max_connections=len(requests), max_keepalive_connections=len(requests))
    async with httpx.AsyncClient(limits=limits, timeout=120) as client:
        return await asyncio.gather(*(client.post(url, json=body) for url, body in requests), return_exceptions=True)


@pytest.mark.slow
def test_200_concurrent_requests_zero_errors_and_batched(servers: dict[str, Server]) -> None:
    clf, lm = servers["classifier"], servers["lm"]
    sentences = [f"the {i} cats see {i % 7} dogs near the river" for i in range(100)]
    prompts = [f"story number {i} begins" for i in range(100)]
    requests = [(f"{clf.url}/v2/models/{clf.name}/infer", {"inputs": [texts("text", [s]), texts("text_pair", [s])]})
                for s in sentences]
    requests += [
        (f"{lm.url}/v2/models/{lm.name}/infer", {"inputs": [texts("text", [p])], "parameters": {"max_new_tokens": 4}})
        for p in prompts
    ]
    responses = asyncio.run(_concurrent(requests))
    errors = [r if isinstance(r, BaseException) else f"{r.status_code} {r.text}" for r in responses
              if isinstance(r, BaseException) or r.status_code != 200]
    assert not errors, errors[:3]
    bodies = [r.json() for r in responses]  # type: ignore[union-attr]
    assert max(b["parameters"]["batch_size"] for b in bodies[:100]) > 1  # concurrent requests did share passes
    assert max(b["parameters"]["batch_size"] for b in bodies[100:]) > 1
    # Each answer is its own request's: the same as asking for all texts in one request.
    together = _infer(clf, {"inputs": [texts("text", sentences), texts("text_pair", sentences)]}).json()
    assert [output(b, "score")[0] for b in bodies[:100]] == pytest.approx(output(together, "score"), abs=1e-5)
    assert [output(b, "label")[0] for b in bodies[:100]] == output(together, "label")
    alone = _generate(lm, prompts[:10], max_new_tokens=4)
    assert [output(b, "text")[0] for b in bodies[100:110]] == output(alone, "text")


# ---------------------------------------------------------------------------------------------
# The inference command.

def _infer_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sweep", "infer", *args], capture_output=True, text=True, timeout=60,
                          cwd=REPO)


@pytest.mark.slow
def test_infer_cli_prints_the_completion(servers: dict[str, Server]) -> None:
    lm = servers["lm"]
    expected = output(_generate(lm, ["The meaning of life is"], max_new_tokens=10), "text")[0]
    done = _infer_cli("--url", lm.url, "--model", lm.name, "--max-new-tokens", "10", "The meaning of life is")
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected + "\n"
    assert "prompt +" in done.stderr and "completion tokens" in done.stderr


@pytest.mark.slow
def test_infer_cli_prints_label_and_score(servers: dict[str, Server]) -> None:
    clf = servers["classifier"]
    expected = _infer(clf, {"inputs": [texts("text", ["a cat"]), texts("text_pair", ["an animal"])]}).json()
    done = _infer_cli("--url", clf.url, "a cat", "--pair", "an animal")  # the server's only model
    assert done.returncode == 0, done.stderr
    label, score = done.stdout.strip().split("\t")
    assert label == output(expected, "label")[0]
    assert float(score) == pytest.approx(output(expected, "score")[0], abs=1e-4)


@pytest.mark.slow
def test_infer_cli_errors_are_one_clear_line(servers: dict[str, Server]) -> None:
    unknown = _infer_cli("--url", servers["lm"].url, "--model", "no-such-model", "hello")
    assert unknown.returncode == 1
    assert unknown.stderr.startswith("error: the server answered 404: Model with name no-such-model")
    refused = _infer_cli("--url", f"http://127.0.0.1:{free_port()}", "hello")
    assert refused.returncode == 1 and "cannot reach the model server" in refused.stderr, shlex.join(refused.args)


def test_stop_sequences_match_only_the_generated_text(cache_dir: Path) -> None:
    import torch

    from sweep.models.local_folder import resolve_model_dir
    from sweep.serving.engines import StopOnText
    from sweep.train.loading import load_tokenizer
    from sweep.train.tiny_exports import TINY_GPT2

    tokenizer = load_tokenizer(resolve_model_dir(TINY_GPT2, cache_dir))
    prompt, completion = tokenizer("the doctor")["input_ids"], tokenizer(" doctor sees")["input_ids"]
    ids = torch.tensor([prompt + completion])
    # "or s" is in the completion; "or d" only straddles the prompt's end, which must not stop the row.
    assert StopOnText(tokenizer, ["or s"], len(prompt))(ids, None).tolist() == [True]
    assert StopOnText(tokenizer, ["or d"], len(prompt))(ids, None).tolist() == [False]
