"""deploy/ manifests, checked offline: CRD schemas (unknown fields refused), KubeRay's and Kueue's own
rules, the image's Ray, and the RayJob's command against the package's Hydra config. No cluster, no Ray."""

from __future__ import annotations

import copy
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.manifests import (
    ELASTIC_JOB_ANNOTATION,
    PLACEHOLDER,
    PRIORITY_LABEL,
    QUEUE_LABEL,
    installed_ray_version,
    kueue_stack_errors,
    load_yaml_documents,
    manifest_errors,
    may_preempt,
    storage_version,
    strict_json_schema,
)

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
KUBERAY = DEPLOY / "kuberay"
MANIFEST_FILES = sorted(KUBERAY.glob("*.yaml")) + sorted((DEPLOY / "kserve").glob("*.yaml"))
DOCUMENTS = [(path, i, doc) for path in MANIFEST_FILES for i, doc in enumerate(load_yaml_documents(path))]


def _one(name: str, kind: str) -> dict[str, Any]:
    """The document of ``kind`` (or ``kind/metadata.name``) in deploy/kuberay/<name>, as a fresh copy to mutate."""
    kind, _, named = kind.partition("/")
    [doc] = [d for d in load_yaml_documents(KUBERAY / name)
             if d["kind"] == kind and named in ("", d["metadata"].get("name"))]
    return copy.deepcopy(doc)


def _ray_containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    groups = [spec["headGroupSpec"], *spec.get("workerGroupSpecs", [])]
    return [g["template"]["spec"]["containers"][0] for g in groups]  # KubeRay: the Ray container is the first


# ---------------------------------------------------------------------------------------------
# Every shipped manifest is valid.

def test_deploy_has_the_expected_manifests() -> None:
    kinds = {doc["kind"] for _, _, doc in DOCUMENTS}
    assert {"RayCluster", "RayJob", "ResourceFlavor", "ClusterQueue", "LocalQueue", "WorkloadPriorityClass", "Secret",
            "InferenceService", "ServingRuntime", "ServiceAccount"} <= kinds


@pytest.mark.parametrize(("path", "index", "doc"), DOCUMENTS,
                         ids=[f"{p.parent.name}/{p.name}#{i}" for p, i, _ in DOCUMENTS])
def test_manifest_is_valid(path: Path, index: int, doc: dict[str, Any], crds) -> None:
    assert manifest_errors(doc, crds, installed_ray_version()) == []
    if "/" in doc["apiVersion"]:  # a custom resource: written for the version the server stores today
        group, _, version = doc["apiVersion"].rpartition("/")
        assert version == storage_version(crds[(group, doc["kind"])])


def test_rayjob_is_queued_by_kueue_and_cleans_up() -> None:
    job = _one("rayjob.yaml", "RayJob")
    [queue] = [d for d in load_yaml_documents(KUBERAY / "kueue.yaml") if d["kind"] == "LocalQueue"]
    assert job["metadata"]["labels"][QUEUE_LABEL] == queue["metadata"]["name"]
    assert job["metadata"]["namespace"] == queue["metadata"]["namespace"]
    assert job["spec"]["suspend"] is True and job["spec"]["shutdownAfterJobFinishes"] is True
    assert job["spec"]["ttlSecondsAfterFinished"] == 600
    [cluster_queue] = [d for d in load_yaml_documents(KUBERAY / "kueue.yaml") if d["kind"] == "ClusterQueue"]
    assert queue["spec"]["clusterQueue"] == cluster_queue["metadata"]["name"]
    covered = {r for group in cluster_queue["spec"]["resourceGroups"] for r in group["coveredResources"]}
    assert {"cpu", "memory", "nvidia.com/gpu"} <= covered


def _kuberay_documents() -> list[dict[str, Any]]:
    return [copy.deepcopy(doc) for path, _, doc in DOCUMENTS if path.parent == KUBERAY]


def test_rayjob_priority_names_a_valid_workload_priority_class(crds) -> None:
    """The priority-class label names a WorkloadPriorityClass of kueue.yaml, valid against Kueue's CRD."""
    job = _one("rayjob.yaml", "RayJob")
    priorities = {d["metadata"]["name"]: d for d in load_yaml_documents(KUBERAY / "kueue.yaml")
                  if d["kind"] == "WorkloadPriorityClass"}
    name = job["metadata"]["labels"][PRIORITY_LABEL]
    assert name in priorities, (name, sorted(priorities))
    assert manifest_errors(priorities[name], crds) == []
    assert "namespace" not in priorities[name]["metadata"]  # cluster-scoped, as the CRD says
    assert crds[("kueue.x-k8s.io", "WorkloadPriorityClass")]["spec"]["scope"] == "Cluster"
    assert kueue_stack_errors(_kuberay_documents()) == []


def test_a_higher_priority_sweep_preempts_the_rayjob_and_an_equal_one_does_not() -> None:
    """The ClusterQueue's policy lets a pending workload of higher priority evict the RayJob (which resumes),
    and only that: the RayJob's own class cannot evict another sweep of the same class."""
    [cluster_queue] = [d for d in load_yaml_documents(KUBERAY / "kueue.yaml") if d["kind"] == "ClusterQueue"]
    priorities = {d["metadata"]["name"]: d["value"] for d in load_yaml_documents(KUBERAY / "kueue.yaml")
                  if d["kind"] == "WorkloadPriorityClass"}
    ours = priorities[_one("rayjob.yaml", "RayJob")["metadata"]["labels"][PRIORITY_LABEL]]
    higher = [value for value in priorities.values() if value > ours]
    assert higher, f"no WorkloadPriorityClass above the RayJob's ({ours}) in kueue.yaml: {priorities}"
    assert cluster_queue["spec"]["preemption"]["withinClusterQueue"] == "LowerPriority"
    assert all(may_preempt(cluster_queue, pending=value, admitted=ours) for value in higher)
    assert not may_preempt(cluster_queue, pending=ours, admitted=ours, pending_is_older=True)
    assert not may_preempt(cluster_queue, pending=ours, admitted=max(higher))
    # Kueue's default (no preemption block) would never preempt: the block is what makes the RayJob preemptible.
    del cluster_queue["spec"]["preemption"]
    assert not may_preempt(cluster_queue, pending=max(higher), admitted=ours)


def test_rayjob_resumes_after_preemption(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """resume=auto in the entrypoint, the package reads it as "continue the saved sweep", and the saved sweep
    is this RayJob's own: its cluster.storage_path is under its own output prefix, not shared with others."""
    from sweep.config.validate import validate

    job = _one("rayjob.yaml", "RayJob")
    assert "resume=auto" in shlex.split(job["spec"]["entrypoint"])
    cfg = _composed(job["spec"]["entrypoint"], tmp_path)
    assert cfg.resume == "auto"
    monkeypatch.setenv("SWEEP_CACHE_DIR", str(tmp_path / "cache"))
    assert validate(cfg).resume is True
    assert cfg.cluster.storage_path.startswith(cfg.storage.output_prefix.rstrip("/") + "/")
    # The preempted cluster goes with its disks, so the state must be where a new cluster finds it.
    assert cfg.cluster.storage_path.startswith("s3://")
    assert job["spec"]["shutdownAfterJobFinishes"] is True


def test_both_clusters_use_token_authentication(crds) -> None:
    """authOptions.mode token on the RayJob's cluster and the standalone one (KubeRay >= 1.5.1 hands the token to
    every Ray container and the submitter; Ray 2.61 requires one), a field both CRDs define."""
    specs = {"RayCluster": _one("raycluster.yaml", "RayCluster")["spec"],
             "RayJob": _one("rayjob.yaml", "RayJob")["spec"]["rayClusterSpec"]}
    for kind, spec in specs.items():
        assert spec["authOptions"] == {"mode": "token"}, kind
        schema = next(v for v in crds[("ray.io", kind)]["spec"]["versions"] if v.get("storage"))
        spec_schema = schema["schema"]["openAPIV3Schema"]["properties"]["spec"]
        if kind == "RayJob":
            spec_schema = spec_schema["properties"]["rayClusterSpec"]
        assert "token" in spec_schema["properties"]["authOptions"]["properties"]["mode"]["enum"]
        env = {e["name"] for c in _ray_containers(spec) for e in c.get("env", [])}
        assert not env & {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN"}, "the operator sets them; our own would shadow its token"


def test_cluster_shape_head_without_gpu_workers_autoscale_from_zero() -> None:
    spec = _one("raycluster.yaml", "RayCluster")["spec"]
    assert spec["enableInTreeAutoscaling"] is True and spec["autoscalerOptions"]["idleTimeoutSeconds"] > 0
    assert spec["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"
    head = _ray_containers(spec)[0]
    assert {"cpu", "memory"} <= set(head["resources"]["requests"])
    assert {"cpu", "memory"} <= set(head["resources"]["limits"])
    [workers] = spec["workerGroupSpecs"]
    assert workers["groupName"] == "gpu-workers"
    assert (workers["minReplicas"], workers["replicas"], workers["maxReplicas"]) == (0, 0, 4)
    assert workers["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] in (1, "1")


def test_rayjob_and_raycluster_run_the_same_cluster() -> None:
    """Image, Ray version and environment agree (rayjob.yaml repeats raycluster.yaml: YAML cannot include)."""
    standalone = _one("raycluster.yaml", "RayCluster")["spec"]
    in_job = _one("rayjob.yaml", "RayJob")["spec"]["rayClusterSpec"]

    def facts(spec: dict[str, Any]) -> list[tuple]:
        return [(spec["rayVersion"], c["image"], c.get("envFrom"), c.get("env")) for c in _ray_containers(spec)]

    assert facts(in_job) == facts(standalone)
    assert standalone["rayVersion"] == installed_ray_version()


def test_every_ray_container_has_s3_credentials_and_its_own_node_cache() -> None:
    from sweep.storage.s3 import ENDPOINT_ENV
    from sweep.storage.staging import NODE_CACHE_ENV

    [secret] = load_yaml_documents(KUBERAY / "s3-secret.yaml")
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"} <= set(secret["stringData"])
    assert set(ENDPOINT_ENV) & set(secret["stringData"]), "the endpoint under a name the code reads"
    assert secret["stringData"]["AWS_ACCESS_KEY_ID"] == secret["stringData"]["AWS_SECRET_ACCESS_KEY"] == PLACEHOLDER
    for spec in (_one("raycluster.yaml", "RayCluster")["spec"],
                 _one("rayjob.yaml", "RayJob")["spec"]["rayClusterSpec"]):
        groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
        for group, container in zip(groups, _ray_containers(spec)):
            assert {"secretRef": {"name": secret["metadata"]["name"]}} in container["envFrom"]
            env = {e["name"]: e.get("value") for e in container["env"]}
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            volumes = {v["name"] for v in group["template"]["spec"]["volumes"]}
            assert mounts.get(env[NODE_CACHE_ENV]) in volumes, f"{NODE_CACHE_ENV} must be a mounted volume"


def test_containerfile_is_one_image_for_ray_and_the_server() -> None:
    text = (DEPLOY / "Containerfile").read_text()
    instructions = [line.split(None, 1) for line in text.splitlines() if line and not line.startswith(("#", " "))]
    assert "ENTRYPOINT" not in {word for word, *_ in instructions}, "KubeRay and KServe set the command themselves"
    ray_pins = re.findall(r"ray\[([a-z,]+)\]==([\w.]+)", text)
    assert len(ray_pins) == 1, ray_pins
    extras, pinned = ray_pins[0]
    assert pinned == installed_ray_version() and {"tune", "train", "default"} <= set(extras.split(","))
    copied = [args.split()[0] for word, args in instructions if word == "COPY"]
    assert {"sweep", "conf"} <= set(copied)
    assert not (DEPLOY / "kserve" / "Containerfile").exists(), "one image: deploy/Containerfile"
    [runtime] = load_yaml_documents(DEPLOY / "kserve" / "servingruntime.yaml")
    images = {c["image"] for c in _ray_containers(_one("raycluster.yaml", "RayCluster")["spec"])}
    images |= {c["image"] for c in runtime["spec"]["containers"]}
    assert images == {"registry.example.com/sweep:latest"}


def _composed(entrypoint: str, tmp_path: Path):
    """A RayJob's command, with `--cfg job`: Hydra composes and prints the config, the app does not run."""
    from omegaconf import OmegaConf

    argv = shlex.split(entrypoint)
    assert argv[:3] == ["python", "-m", "sweep"]
    # No S3 is contacted (the app never runs); no credentials of this machine reach the child anyway.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "ENDPOINT_URL"}
    env |= {"HOME": str(tmp_path), "SWEEP_CACHE_DIR": str(tmp_path / "cache"), "HYDRA_FULL_ERROR": "1"}
    done = subprocess.run([sys.executable, "-m", "sweep", *argv[3:], "--cfg", "job"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return OmegaConf.create(done.stdout)


def test_rayjob_entrypoint_composes_with_the_package_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sweep.config.validate import validate

    cfg = _composed(_one("rayjob.yaml", "RayJob")["spec"]["entrypoint"], tmp_path)
    assert (cfg.cluster.address, cfg.storage.kind, cfg.storage.bucket) == ("auto", "s3", "sweep-data")
    assert cfg.cluster.storage_path == "s3://sweep-results/glue-roberta-base/ray"
    assert cfg.storage.output_prefix == "s3://sweep-results/glue-roberta-base"
    monkeypatch.setenv("SWEEP_CACHE_DIR", str(tmp_path / "cache"))
    settings = validate(cfg)  # the package's own checks of the composed config pass too
    assert len(settings.tasks) == 9  # task=glue: the whole benchmark in one Tune run
    # The MLflow records: the head's sqlite store, which the driver uploads under storage.output_prefix.
    assert (cfg.tracking.kind, cfg.tracking.uri) == ("mlflow", "sqlite:///runs/mlflow.db")


def test_rayjob_tracking_server_alternative_is_valid_and_composes(tmp_path: Path, crds) -> None:
    """The override rayjob.yaml offers in a comment (a tracking server instead of the head's sqlite file),
    added to the entrypoint: the RayJob is still valid and the sweep's config composes with it."""
    commented = re.findall(r"^\s*#\s+(tracking\.uri=\S+)\s*$", (KUBERAY / "rayjob.yaml").read_text(), re.MULTILINE)
    assert commented == ["tracking.uri=http://mlflow.sweep.svc:5000"]
    job = _one("rayjob.yaml", "RayJob")
    job["spec"]["entrypoint"] += " " + commented[0]
    assert manifest_errors(job, crds, installed_ray_version()) == []
    cfg = _composed(job["spec"]["entrypoint"], tmp_path)
    assert (cfg.tracking.kind, cfg.tracking.uri) == ("mlflow", "http://mlflow.sweep.svc:5000")
    assert cfg.storage.output_prefix == "s3://sweep-results/glue-roberta-base"  # the rest unchanged
    readme = (KUBERAY / "README.md").read_text()
    assert commented[0] in readme and "s3://sweep-results/glue-roberta-base/mlflow/" in readme


# ---------------------------------------------------------------------------------------------
# The validator can fail: each broken manifest is refused, naming what is wrong.

def _rename(key: str, new: str) -> Callable[[dict], None]:
    return lambda doc: doc["spec"].__setitem__(new, doc["spec"].pop(key))


def _cluster(doc: dict) -> dict:
    return doc["spec"].get("rayClusterSpec", doc["spec"])


BROKEN = {
    "misspelled field": ("rayjob.yaml", "RayJob", _rename("shutdownAfterJobFinishes", "shutdownAfterJobFinish"),
                         "'shutdownAfterJobFinish' was unexpected"),
    "wrong enum value": ("raycluster.yaml", "RayCluster",
                         lambda d: d["spec"]["autoscalerOptions"].__setitem__("upscalingMode", "Fast"),
                         "spec.autoscalerOptions.upscalingMode: 'Fast' is not one of"),
    "int-or-string given a list": (
        "kueue.yaml", "ClusterQueue",
        lambda d: d["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0].__setitem__("nominalQuota", [40]),
        "spec.resourceGroups[0].flavors[0].resources[0].nominalQuota: [40] is not valid"),
    "quantity with a bad unit": (
        "raycluster.yaml", "RayCluster",
        lambda d: (d["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
                   .__setitem__("memory", "16GB")),
        "limits.memory: '16GB' does not match"),
    "required field missing": ("raycluster.yaml", "RayCluster",
                               lambda d: d["spec"]["workerGroupSpecs"][0].pop("groupName"),
                               "'groupName' is a required property"),
    "suspended without shutdown": ("rayjob.yaml", "RayJob",
                                   lambda d: d["spec"].__setitem__("shutdownAfterJobFinishes", False),
                                   "a suspended RayJob must set it to true"),
    "cluster spec and selector": ("rayjob.yaml", "RayJob",
                                  lambda d: d["spec"].__setitem__("clusterSelector", {"ray.io/cluster": "sweep"}),
                                  "exactly one of rayClusterSpec and clusterSelector"),
    "neither cluster spec nor selector": ("rayjob.yaml", "RayJob", lambda d: d["spec"].pop("rayClusterSpec"),
                                          "exactly one of rayClusterSpec and clusterSelector"),
    "queued but not suspended": ("rayjob.yaml", "RayJob", lambda d: d["spec"].__setitem__("suspend", False),
                                 "Kueue-queued RayJob should be created suspended"),
    "queued autoscaling, not elastic": (
        "rayjob.yaml", "RayJob", lambda d: d["metadata"]["annotations"].pop(ELASTIC_JOB_ANNOTATION),
        "enableInTreeAutoscaling: Kueue admits an autoscaling cluster only as an elastic job"),
    "replicas above max": ("rayjob.yaml", "RayJob",
                           lambda d: _cluster(d)["workerGroupSpecs"][0].__setitem__("replicas", 5),
                           "needs minReplicas <= replicas <= maxReplicas, got 0 <= 5 <= 4"),
    "ray resources set twice": ("raycluster.yaml", "RayCluster",
                                lambda d: d["spec"]["headGroupSpec"].__setitem__("resources", {"CPU": "4"}),
                                "spec.headGroupSpec: set Ray resources in rayStartParams or in resources, not both"),
    "another ray version": ("raycluster.yaml", "RayCluster", lambda d: d["spec"].__setitem__("rayVersion", "2.9.0"),
                            "spec.rayVersion: '2.9.0' is not the installed Ray"),
    "no name": ("kueue.yaml", "LocalQueue", lambda d: d["metadata"].pop("name"), "metadata.name: required"),
    "old API version": ("kueue.yaml", "LocalQueue", lambda d: d.__setitem__("apiVersion", "kueue.x-k8s.io/v1alpha1"),
                        "apiVersion: "),
    "priority class without value": ("kueue.yaml", "WorkloadPriorityClass/sweep-low", lambda d: d.pop("value"),
                                     "'value' is a required property"),
    "priority value not an integer": ("kueue.yaml", "WorkloadPriorityClass/sweep-low",
                                      lambda d: d.__setitem__("value", "high"),
                                      "value: 'high' is not of type 'integer'"),
    "priority class misplaced in spec": ("kueue.yaml", "WorkloadPriorityClass/sweep-low",
                                         lambda d: d.__setitem__("spec", {"value": d.pop("value")}),
                                         "'spec' was unexpected"),
    "unknown preemption policy": (
        "kueue.yaml", "ClusterQueue",
        lambda d: d["spec"]["preemption"].__setitem__("withinClusterQueue", "Always"),
        "spec.preemption.withinClusterQueue: 'Always' is not one of"),
    "borrowing preemption without reclaim": (
        "kueue.yaml", "ClusterQueue",
        lambda d: d["spec"]["preemption"].__setitem__("borrowWithinCohort", {"policy": "LowerPriority"}),
        "reclaimWithinCohort=Never and borrowWithinCohort.Policy!=Never"),
    "unknown auth mode": ("raycluster.yaml", "RayCluster", lambda d: d["spec"]["authOptions"].__setitem__("mode", "on"),
                          "spec.authOptions.mode: 'on' is not one of"),
    "token auth on an old ray": ("rayjob.yaml", "RayJob", lambda d: _cluster(d).__setitem__("rayVersion", "2.51.0"),
                                 "authOptions.mode: token needs rayVersion >= 2.52.0"),
}


@pytest.mark.parametrize("case", BROKEN, ids=list(BROKEN))
def test_validator_refuses_a_broken_manifest(case: str, crds) -> None:
    name, kind, break_it, expected = BROKEN[case]
    doc = _one(name, kind)
    assert manifest_errors(doc, crds, installed_ray_version()) == []
    break_it(doc)
    errors = manifest_errors(doc, crds, installed_ray_version())
    assert any(expected in e for e in errors), errors


STACK_BROKEN = {
    "priority class not defined": (lambda docs: _label(docs, "RayJob", PRIORITY_LABEL, "sweep-urgent"),
                                   "RayJob/glue-roberta-base: metadata.labels.kueue.x-k8s.io/priority-class: "
                                   "no WorkloadPriorityClass 'sweep-urgent'"),
    "queue not defined": (lambda docs: _label(docs, "RayJob", QUEUE_LABEL, "other-queue"),
                          "kueue.x-k8s.io/queue-name: no LocalQueue 'other-queue' in namespace 'sweep'"),
    "queue in another namespace": (
        lambda docs: next(d for d in docs if d["kind"] == "LocalQueue")["metadata"].__setitem__("namespace", "other"),
        "no LocalQueue 'sweep-queue' in namespace 'sweep'"),
    "cluster queue not defined": (
        lambda docs: next(d for d in docs if d["kind"] == "LocalQueue")["spec"].__setitem__("clusterQueue", "gone"),
        "LocalQueue/sweep-queue: spec.clusterQueue: no ClusterQueue 'gone'"),
}


def _label(docs: list[dict], kind: str, key: str, value: str) -> None:
    next(d for d in docs if d["kind"] == kind)["metadata"]["labels"][key] = value


@pytest.mark.parametrize("case", STACK_BROKEN, ids=list(STACK_BROKEN))
def test_kueue_stack_check_refuses_a_dangling_name(case: str) -> None:
    break_it, expected = STACK_BROKEN[case]
    docs = _kuberay_documents()
    assert kueue_stack_errors(docs) == []
    break_it(docs)
    errors = kueue_stack_errors(docs)
    assert any(expected in e for e in errors), errors


def test_secret_template_refuses_a_real_looking_key() -> None:
    [secret] = load_yaml_documents(KUBERAY / "s3-secret.yaml")
    secret["stringData"]["AWS_SECRET_ACCESS_KEY"] = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    assert manifest_errors(secret, {}) == [
        f"stringData.AWS_SECRET_ACCESS_KEY: must be the placeholder {PLACEHOLDER!r}, never a real value"]


def test_strict_schema_conversion() -> None:
    """The three rules on a small schema: unknown fields, int-or-string, preserved unknown fields."""
    import jsonschema

    schema = strict_json_schema({
        "type": "object",
        "properties": {
            "port": {"x-kubernetes-int-or-string": True},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                     "properties": {"a": {"type": "string"}}},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        },
    })
    ok = jsonschema.Draft7Validator(schema)
    assert ok.is_valid({"port": 8080}) and ok.is_valid({"port": "http"})
    assert not ok.is_valid({"port": [8080]}) and not ok.is_valid({"port": 80.5})
    assert ok.is_valid({"free": {"anything": 1}, "labels": {"any-key": "v"}})
    assert not ok.is_valid({"unknown": 1})
    assert not ok.is_valid({"labels": {"k": 1}})


def test_rayjob_declares_its_gpu_group_to_the_sweep_as_the_group_is() -> None:
    """The driver cannot read KubeRay's autoscaler (a sidecar): the entrypoint's cluster.node_types
    must say what the worker group really is, or the plan would wait for the wrong nodes."""
    import yaml as _yaml

    job = _one("rayjob.yaml", "RayJob")
    argv = shlex.split(job["spec"]["entrypoint"])
    declared = _yaml.safe_load(next(a for a in argv if a.startswith("cluster.node_types=")).split("=", 1)[1]
                               .replace(":", ": ").replace(",", ", "))
    groups = {g["groupName"]: g for g in job["spec"]["rayClusterSpec"]["workerGroupSpecs"]}
    for node_type in declared:
        group = groups[node_type["name"]]
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert node_type["max_workers"] == group["maxReplicas"]
        assert node_type["resources"] == {"CPU": int(limits["cpu"]), "GPU": int(limits["nvidia.com/gpu"])}
