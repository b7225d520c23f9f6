"""deploy/kserve/, checked offline: each document against its CRD schema (unknown fields refused), then
what KServe's controller does with them (runtime selection, the container it runs, its Service's ports,
the storage initializer's credentials), with the model server's own option parser. No cluster."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.manifests import (
    DEPLOYMENT_MODE,
    KSERVE_CONTAINER,
    MODEL_MOUNT,
    PLACEHOLDER,
    S3_ENDPOINT,
    S3_KEYS,
    kserve_stack_errors,
    load_yaml_documents,
    manifest_errors,
    selected_runtime,
    server_options,
    storage_credential_errors,
    storage_version,
)

KSERVE = Path(__file__).resolve().parents[1] / "deploy" / "kserve"
FILES = sorted(KSERVE.glob("*.yaml"))


def _docs() -> list[dict[str, Any]]:
    """Every document of deploy/kserve/, fresh copies to mutate."""
    return [copy.deepcopy(doc) for path in FILES for doc in load_yaml_documents(path)]


def _kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [doc] = [d for d in docs if d["kind"] == kind]
    return doc


def _container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [container] = [c for c in _kind(docs, "ServingRuntime")["spec"]["containers"] if c["name"] == KSERVE_CONTAINER]
    return container


def all_errors(docs: list[dict[str, Any]], crds) -> list[str]:
    """What this suite checks about the folder: each document, then the documents together."""
    errors = [f"{d['kind']}/{(d.get('metadata') or {}).get('name')}: {e}"
              for d in docs for e in manifest_errors(d, crds)]
    return errors + kserve_stack_errors(docs)


# ---------------------------------------------------------------------------------------------
# The shipped files.

def test_the_folder_holds_the_stack_in_the_current_api_versions(crds) -> None:
    docs = _docs()
    assert sorted(d["kind"] for d in docs) == ["InferenceService", "Secret", "ServiceAccount", "ServingRuntime"]
    for doc in docs:
        if "/" in doc["apiVersion"]:
            group, _, version = doc["apiVersion"].rpartition("/")
            assert version == storage_version(crds[(group, doc["kind"])])


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_every_file_validates_against_its_schema_and_kserve_rules(path: Path, crds) -> None:
    for doc in load_yaml_documents(path):
        assert manifest_errors(doc, crds) == [], doc["kind"]


def test_the_documents_agree_with_each_other(crds) -> None:
    assert all_errors(_docs(), crds) == []


def test_runtime_serves_http_and_grpc_as_kserve_expects() -> None:
    """The facts the README and clients rely on, spelled out (the rules above check they agree)."""
    from sweep.serving.server import DEFAULT_PORT

    docs = _docs()
    runtime, isvc = _kind(docs, "ServingRuntime"), _kind(docs, "InferenceService")
    model_format, mlflow_format = runtime["spec"]["supportedModelFormats"]
    assert model_format["name"] == "sweep-hf" and model_format["autoSelect"] is True
    assert mlflow_format == {"name": "mlflow", "autoSelect": False}  # KServe's mlserver claims it unless named
    assert runtime["spec"]["protocolVersions"] == ["v2", "grpc-v2"]
    assert runtime["spec"]["annotations"] == {"prometheus.kserve.io/port": str(DEFAULT_PORT),
                                              "prometheus.kserve.io/path": "/metrics"}
    container = _container(docs)
    assert container["command"] == ["python", "-m", "sweep", "serve"]
    options = server_options(container["args"])  # the server's own parser: grpc_port must be one of its options
    assert options["model"] == MODEL_MOUNT and options["port"] == DEFAULT_PORT
    assert options["host"] == "0.0.0.0"  # the server's default, 127.0.0.1, would leave probes and the Service out
    assert [(p["name"], p["containerPort"]) for p in container["ports"]] == [("http", DEFAULT_PORT),
                                                                             ("h2c", options["grpc_port"])]
    assert options["grpc_port"] == 8081
    model = isvc["spec"]["predictor"]["model"]
    assert ((model["modelFormat"]["name"], model["runtime"], model["protocolVersion"])
            == ("sweep-hf", runtime["metadata"]["name"], "v2"))
    assert model["storageUri"].startswith("s3://") and model["storageUri"].endswith("/best/wikitext-2")
    assert isvc["metadata"]["annotations"][DEPLOYMENT_MODE] == "RawDeployment"


def test_storage_initializer_credentials() -> None:
    docs = _docs()
    isvc, account, secret = (_kind(docs, k) for k in ("InferenceService", "ServiceAccount", "Secret"))
    assert account["metadata"]["name"] == isvc["spec"]["predictor"]["serviceAccountName"]
    assert account["secrets"] == [{"name": secret["metadata"]["name"]}]
    assert ({S3_ENDPOINT, "serving.kserve.io/s3-usehttps", "serving.kserve.io/s3-region"}
            <= set(secret["metadata"]["annotations"]))
    assert secret["stringData"] == {key: PLACEHOLDER for key in S3_KEYS}


def test_the_mlflow_variant_is_served_by_this_runtime_from_a_logged_models_files(crds) -> None:
    """mlflow/inferenceservice.yaml: KServe's `mlflow` format, with the folder's runtime, secret and account."""
    [variant] = load_yaml_documents(KSERVE / "mlflow" / "inferenceservice.yaml")
    docs = [d for d in _docs() if d["kind"] != "InferenceService"] + [variant]
    assert all_errors(docs, crds) == []
    model = variant["spec"]["predictor"]["model"]
    assert (model["modelFormat"]["name"], model["runtime"], model["protocolVersion"]) == ("mlflow", "sweep-runtime",
                                                                                         "v2")
    assert model["storageUri"].startswith("s3://") and "/mlflow/mlartifacts/" in model["storageUri"]
    assert model["storageUri"].endswith("/artifacts")  # a logged model's files: MLmodel, model/, components/
    unnamed = copy.deepcopy(variant)
    del unnamed["spec"]["predictor"]["model"]["runtime"]  # the format is not auto-selected: KServe's own would win
    assert any("no ServingRuntime auto-selects 'mlflow'" in e
               for e in all_errors([d for d in docs if d is not variant] + [unnamed], crds))


# KServe's own Hugging Face runtime as its install defines it (config/runtimes/kserve-huggingfaceserver.yaml):
# a ClusterServingRuntime that auto-selects the `huggingface` format, v2 and v1
KSERVE_HF_RUNTIME = {
    "apiVersion": "serving.kserve.io/v1alpha1", "kind": "ServingRuntime",
    "metadata": {"name": "kserve-huggingfaceserver"},
    "spec": {"supportedModelFormats": [{"name": "huggingface", "version": "1", "autoSelect": True}],
             "protocolVersions": ["v2", "v1"],
             "containers": [{"name": KSERVE_CONTAINER, "image": "kserve/huggingfaceserver:latest",
                             "args": ["--model_name={{.Name}}"]}]},
}


def test_the_vllm_variant_serves_the_same_export_on_kserves_huggingface_runtime_with_a_gpu(crds) -> None:
    """vllm/inferenceservice.yaml: KServe's `huggingface` format (its runtime, not ours), the vLLM backend
    forced, a GPU asked, and the same storageUri and S3 credentials as the folder's InferenceService."""
    [variant] = load_yaml_documents(KSERVE / "vllm" / "inferenceservice.yaml")
    assert manifest_errors(variant, crds) == []
    folder = _docs()
    assert storage_credential_errors(variant, folder) == []
    model = variant["spec"]["predictor"]["model"]
    assert model["storageUri"] == _kind(folder, "InferenceService")["spec"]["predictor"]["model"]["storageUri"]
    assert "runtime" not in model  # auto-selected: KServe's Hugging Face runtime, which OpenShift AI picks for GPUs
    runtime, errors = selected_runtime(variant, {"sweep-runtime": _runtime(folder),
                                                 "kserve-huggingfaceserver": KSERVE_HF_RUNTIME})
    assert errors == [] and runtime is KSERVE_HF_RUNTIME  # ours does not claim the format
    args = dict(arg.split("=", 1) for arg in model["args"])
    assert args["--backend"] == "vllm" and args["--model_dir"] == MODEL_MOUNT
    assert args["--model_name"] == variant["metadata"]["name"]
    for side in ("requests", "limits"):
        assert model["resources"][side]["nvidia.com/gpu"] == "1"
    wrong = copy.deepcopy(variant)
    wrong["spec"]["predictor"]["model"]["protocolVersion"] = "grpc-v2"
    assert any("'grpc-v2'" in e and "not one the runtime speaks" in e
               for e in selected_runtime(wrong, {"kserve-huggingfaceserver": KSERVE_HF_RUNTIME})[1])


# ---------------------------------------------------------------------------------------------
# The rules can fail: each broken folder is refused, naming what is wrong.

def _runtime(d: list[dict]) -> dict:
    return _kind(d, "ServingRuntime")


def _model(d: list[dict]) -> dict:
    return _kind(d, "InferenceService")["spec"]["predictor"]["model"]


def _set_arg(key: str, value: str) -> Callable[[list[dict]], None]:
    def change(d: list[dict]) -> None:
        args = _container(d)["args"]
        args[[a.split("=", 1)[0] for a in args].index(key)] = f"{key}={value}"
    return change


BROKEN: dict[str, tuple[Callable[[list[dict]], None], str]] = {
    "misspelled runtime field": (
        lambda d: _runtime(d)["spec"].__setitem__("supportedModelFormat",
                                                  _runtime(d)["spec"].pop("supportedModelFormats")),
        "'supportedModelFormat' was unexpected"),
    "misspelled InferenceService field": (lambda d: _model(d).__setitem__("storageURI", _model(d).pop("storageUri")),
                                          "'storageURI' was unexpected"),
    "misspelled ServiceAccount field": (
        lambda d: _kind(d, "ServiceAccount").__setitem__("secret", _kind(d, "ServiceAccount").pop("secrets")),
        "secret: not a field of ServiceAccount"),
    "unsupported model format": (lambda d: _model(d)["modelFormat"].__setitem__("name", "pytorch"),
                                 "'pytorch' is not a format ServingRuntime 'sweep-runtime' supports"),
    "no runtime named, none auto-selects": (
        lambda d: (_model(d).pop("runtime"), _runtime(d)["spec"]["supportedModelFormats"][0].pop("autoSelect")),
        "no ServingRuntime auto-selects 'sweep-hf'"),
    "unknown runtime": (lambda d: _model(d).__setitem__("runtime", "caikit-tgis-runtime"),
                        "no ServingRuntime 'caikit-tgis-runtime'"),
    "protocol left to KServe's default v1": (lambda d: _model(d).pop("protocolVersion"),
                                             "'v1' (KServe's default when unset is 'v1')"),
    "HTTP port mismatch": (lambda d: _container(d)["ports"][0].__setitem__("containerPort", 8000),
                           "ports[0].containerPort: 8000 but the server listens on port=8080"),
    "gRPC port mismatch": (_set_arg("grpc_port", "9000"), "gRPC ports [8081] are not the server's grpc_port=9000"),
    "gRPC port first": (lambda d: _container(d)["ports"].reverse(), "ports[0]: 'h2c' is the gRPC port"),
    "gRPC port unnamed": (lambda d: _container(d)["ports"][1].pop("name"),
                          "gRPC ports [] are not the server's grpc_port=8081"),
    "probe on the gRPC port": (lambda d: _container(d)["readinessProbe"]["httpGet"].__setitem__("port", 8081),
                               "readinessProbe.httpGet.port: 8081 is not the HTTP port 8080"),
    "probe on another path": (lambda d: _container(d)["livenessProbe"]["httpGet"].__setitem__("path", "/healthz"),
                              "livenessProbe.httpGet.path: '/healthz', not '/v2/health/live'"),
    "grpc-v2 not declared": (lambda d: _runtime(d)["spec"]["protocolVersions"].remove("grpc-v2"),
                             "grpc-v2 must be listed exactly when a gRPC port is declared"),
    "metrics on another port": (
        lambda d: _runtime(d)["spec"]["annotations"].__setitem__("prometheus.kserve.io/port", "9090"),
        "prometheus.kserve.io/port: '9090' is not the HTTP port 8080"),
    "another command": (lambda d: _container(d).__setitem__("command", ["python", "-m", "sweep"]),
                        "does not run the model server"),
    "model elsewhere than the mount": (_set_arg("model", "/models"), "model=/models is not /mnt/models"),
    "an option the server lacks": (lambda d: _container(d)["args"].append("batch_size=8"),
                                   "python -m sweep serve refuses them: batch_size: unknown option"),
    "a bad option value": (_set_arg("port", "http"), "python -m sweep serve refuses them: port:"),
    "the server's default host, loopback": (lambda d: _container(d)["args"].remove("host=0.0.0.0"),
                                            "host=127.0.0.1 is the pod's loopback"),
    "model ports rename the gRPC port": (
        lambda d: _model(d).__setitem__("ports", [{"containerPort": 8081, "name": "metrics"}]),
        "as run for this InferenceService: spec.containers[0].ports: the gRPC ports [] are not"),
    "InferenceService in another namespace": (
        lambda d: _kind(d, "InferenceService")["metadata"].__setitem__("namespace", "other"),
        "metadata.namespace: not the ServingRuntime's namespace"),
    "model args repeat the runtime's": (lambda d: _model(d).__setitem__("args", ["port=9000"]), "port: given twice"),
    "no kserve-container": (lambda d: _container(d).__setitem__("name", "server"),
                            "no container named 'kserve-container'"),
    "two ports on Knative": (lambda d: _kind(d, "InferenceService")["metadata"].pop("annotations"),
                             "'Serverless' (Knative) serves one container port"),
    "service account missing": (lambda d: d.remove(_kind(d, "ServiceAccount")),
                                "no ServiceAccount 'sweep-s3' beside it"),
    "service account lists no secret": (
        lambda d: _kind(d, "ServiceAccount").__setitem__("secrets", [{"name": "other"}]),
        "names no Secret beside it"),
    "secret without endpoint": (lambda d: _kind(d, "Secret")["metadata"]["annotations"].pop(S3_ENDPOINT),
                                f"no {S3_ENDPOINT} annotation"),
    "secret key under another name": (
        lambda d: _kind(d, "Secret")["stringData"].__setitem__(
            "AWS_SECRET_KEY", _kind(d, "Secret")["stringData"].pop("AWS_SECRET_ACCESS_KEY")),
        "lacks ['AWS_SECRET_ACCESS_KEY']"),
    "a real-looking key": (
        lambda d: _kind(d, "Secret")["stringData"].__setitem__("AWS_SECRET_ACCESS_KEY",
                                                               "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
        f"stringData.AWS_SECRET_ACCESS_KEY: must be the placeholder {PLACEHOLDER!r}"),
    "unquoted annotation": (
        lambda d: _kind(d, "Secret")["metadata"]["annotations"].__setitem__("serving.kserve.io/s3-usehttps", 0),
        "metadata.annotations.serving.kserve.io/s3-usehttps: 0 is not a string"),
    "no storageUri": (lambda d: _model(d).pop("storageUri"), "storageUri: required"),
}


@pytest.mark.parametrize("case", BROKEN, ids=list(BROKEN))
def test_validator_refuses_a_broken_kserve_folder(case: str, crds) -> None:
    break_it, expected = BROKEN[case]
    docs = _docs()
    assert all_errors(docs, crds) == []
    break_it(docs)
    errors = all_errors(docs, crds)
    assert any(expected in e for e in errors), errors
