"""Offline checks of the Kubernetes manifests in deploy/ (no cluster needed).

Two layers, because a plain schema check is not what the API server and the operators enforce:
1. the CRD's OpenAPI v3 schema, made strict the way the API server is (unknown fields refused);
2. the operators' own admission rules that no schema states (KubeRay's and Kueue's webhooks, and what
   KServe's controller does with a ServingRuntime and an InferenceService, checked with the model
   server's own option parser).
Every check returns readable strings, "path: message", and an empty list when all is well.
"""

from __future__ import annotations

import ipaddress
import re
from importlib.metadata import version as installed_version
from pathlib import Path
from typing import Any

import jsonschema
import yaml

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"  # names a WorkloadPriorityClass (Kueue's WorkloadPriorityClassLabel)
RAY_AUTH_MIN_VERSION = (2, 52, 0)  # KubeRay refuses authOptions.mode token on an older rayVersion
ELASTIC_JOB_ANNOTATION = "kueue.x-k8s.io/elastic-job"
PLACEHOLDER = "REPLACE_ME"
# Secret keys whose values must never be committed: only the placeholder may stand there.
CREDENTIAL_KEY = re.compile(r"SECRET|ACCESS_KEY|TOKEN|PASSWORD", re.IGNORECASE)
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")  # KubeRay's rule for RayCluster/RayJob names
# The CRDs are ~90k lines of YAML: libyaml reads them in ~2 s, the pure-Python loader in ~16 s.
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def installed_ray_version() -> str:
    """The venv's Ray, read from its metadata (importing ray would cost seconds)."""
    return installed_version("ray")


# ---------------------------------------------------------------------------------------------
# Layer 1: the CRD schemas.

def load_yaml_documents(path: Path) -> list[dict[str, Any]]:
    """Every non-empty document of a (multi-document) YAML file."""
    return [doc for doc in yaml.load_all(path.read_text(), Loader=YAML_LOADER) if doc]


def load_crds(crd_dir: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """The CRDs in a folder, by (API group, kind)."""
    crds = {}
    for path in sorted(crd_dir.glob("*.yaml")):
        for crd in load_yaml_documents(path):
            if crd.get("kind") == "CustomResourceDefinition":
                crds[(crd["spec"]["group"], crd["spec"]["names"]["kind"])] = crd
    return crds


def storage_version(crd: dict[str, Any]) -> str:
    """The version the API server stores: the current one, and the one manifests should use."""
    return next(v["name"] for v in crd["spec"]["versions"] if v.get("served") and v.get("storage"))


def openapi_schema(crd: dict[str, Any], version: str) -> dict[str, Any]:
    """The openAPIV3Schema of one served version; a version the server does not serve is an error."""
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            if not v.get("served"):
                raise ValueError(f"{crd['metadata']['name']}: version {version} is not served")
            return v["schema"]["openAPIV3Schema"]
    served = [v["name"] for v in crd["spec"]["versions"] if v.get("served")]
    raise ValueError(f"{crd['metadata']['name']}: no version {version} (served: {served})")


def strict_json_schema(node: dict[str, Any]) -> dict[str, Any]:
    """A JSON schema from a structural OpenAPI schema, as strict as the API server.

    - an object schema with ``properties`` refuses other fields (the server prunes or rejects them),
      unless it says ``additionalProperties`` itself or ``x-kubernetes-preserve-unknown-fields: true``;
    - ``x-kubernetes-int-or-string: true`` accepts an integer or a string, nothing else;
    - ``nullable: true`` (OpenAPI 3.0) also accepts null;
    - other ``x-kubernetes-*`` keys (list types, map types, CEL rules) are dropped: not JSON schema.
    """
    out = {k: v for k, v in node.items() if not k.startswith("x-kubernetes-") and k not in ("description", "nullable")}
    # Recurse only where a keyword holds schemas (never into enum, default or example values).
    if "properties" in node:
        out["properties"] = {name: strict_json_schema(s) for name, s in node["properties"].items()}
        if "additionalProperties" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    for key in ("items", "additionalProperties", "not"):
        if isinstance(node.get(key), dict):
            out[key] = strict_json_schema(node[key])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in node:
            out[key] = [strict_json_schema(s) for s in node[key]]
    if node.get("x-kubernetes-int-or-string") and "type" not in node and "anyOf" not in node:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and isinstance(node.get("type"), str):
        out["type"] = [node["type"], "null"]
    return out


def _path(parts: Any) -> str:
    """A JSON path as people write it: spec.workerGroupSpecs[0].template."""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(document)"


_VALIDATORS: dict[tuple[str, str, str], Any] = {}  # (group, kind, version) -> validator


def schema_errors(doc: dict[str, Any], crds: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    """The document checked against its CRD's schema (for the apiVersion it names)."""
    group, _, version = doc.get("apiVersion", "").rpartition("/")
    kind = doc.get("kind", "")
    crd = crds.get((group, kind))
    if crd is None:
        return [f"apiVersion/kind: no CRD for {doc.get('apiVersion')} {kind}"]
    key = (group, kind, version)
    if key not in _VALIDATORS:  # converting a 25k-line CRD takes a moment: once per run
        try:
            schema = strict_json_schema(openapi_schema(crd, version))
        except ValueError as e:
            return [f"apiVersion: {e}"]
        _VALIDATORS[key] = jsonschema.Draft7Validator(schema)
    errors = sorted(_VALIDATORS[key].iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))
    found = [f"{_path(e.absolute_path)}: {e.message}" for e in errors]
    if not (doc.get("metadata") or {}).get("name"):  # CRDs type metadata as a bare object
        found.append("metadata.name: required")
    return found


# ---------------------------------------------------------------------------------------------
# Layer 2: the operators' rules (KubeRay's validation.go, Kueue's RayJob/RayCluster webhooks).

def ray_cluster_spec_errors(spec: dict[str, Any], at: str, ray_version: str | None,
                            kueue_managed: bool = False, elastic: bool = False) -> list[str]:
    """Rules on a RayCluster spec, wherever it sits (a RayCluster, or a RayJob's rayClusterSpec)."""
    errors = []
    if ray_version is not None and spec.get("rayVersion") != ray_version:
        errors.append(f"{at}.rayVersion: {spec.get('rayVersion')!r} is not the installed Ray {ray_version!r}")
    groups = [("headGroupSpec", spec.get("headGroupSpec") or {})]
    groups += [(f"workerGroupSpecs[{i}]", g) for i, g in enumerate(spec.get("workerGroupSpecs") or [])]
    for where, group in groups:
        # KubeRay: a group's Ray resources come from rayStartParams or from `resources`, not both.
        ray_params = set(group.get("rayStartParams") or {})
        if group.get("resources") and {"num-cpus", "num-gpus", "memory", "resources"} & ray_params:
            errors.append(f"{at}.{where}: set Ray resources in rayStartParams or in resources, not both (KubeRay)")
    for i, group in enumerate(spec.get("workerGroupSpecs") or []):
        # Defaults as in the CRD; the autoscaler starts `replicas` pods and moves between min and max.
        low, replicas, high = group.get("minReplicas", 0), group.get("replicas", 0), group.get("maxReplicas", 2**31 - 1)
        if not low <= replicas <= high:
            errors.append(f"{at}.workerGroupSpecs[{i}]: needs minReplicas <= replicas <= maxReplicas, "
                          f"got {low} <= {replicas} <= {high}")
        if kueue_managed and group.get("groupName") == "head":
            errors.append(f"{at}.workerGroupSpecs[{i}].groupName: 'head' is reserved by Kueue for the head group")
    token_auth = (spec.get("authOptions") or {}).get("mode") == "token"
    if token_auth and _version(spec.get("rayVersion")) < RAY_AUTH_MIN_VERSION:
        errors.append(f"{at}.authOptions.mode: token needs rayVersion >= "
                      f"{'.'.join(map(str, RAY_AUTH_MIN_VERSION))}, got {spec.get('rayVersion')!r} (KubeRay)")
    if kueue_managed and spec.get("enableInTreeAutoscaling") and not elastic:
        errors.append(f"{at}.enableInTreeAutoscaling: Kueue admits an autoscaling cluster only as an elastic job "
                      f"(metadata.annotations {ELASTIC_JOB_ANNOTATION}: \"true\")")
    return errors


def _version(text: Any) -> tuple[int, ...]:
    """'2.60.0' -> (2, 60, 0); anything unparsable sorts first (KubeRay refuses it too)."""
    match = re.match(r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?", str(text or ""))
    return tuple(int(part or 0) for part in match.groups()) if match else (-1,)


def cluster_queue_errors(cluster_queue: dict[str, Any]) -> list[str]:
    """The ClusterQueue CRD's CEL rule on preemption (a schema check does not run CEL)."""
    preemption = (cluster_queue.get("spec") or {}).get("preemption") or {}
    borrow = (preemption.get("borrowWithinCohort") or {}).get("policy", "Never")
    if preemption.get("reclaimWithinCohort", "Never") == "Never" and borrow != "Never":
        return ["spec.preemption: reclaimWithinCohort=Never and borrowWithinCohort.Policy!=Never (Kueue's CRD rule)"]
    return []


def operator_rule_errors(doc: dict[str, Any], ray_version: str | None = None) -> list[str]:
    """KubeRay's and Kueue's admission rules for RayJob, RayCluster and ClusterQueue (others: none)."""
    meta = doc.get("metadata") or {}
    spec = doc.get("spec") or {}
    kueue_managed = QUEUE_LABEL in (meta.get("labels") or {})
    elastic = (meta.get("annotations") or {}).get(ELASTIC_JOB_ANNOTATION) == "true"
    errors = []
    if doc.get("kind") in ("RayJob", "RayCluster") and not DNS1035_LABEL.match(meta.get("name") or ""):
        errors.append(f"metadata.name: {meta.get('name')!r} is not a DNS-1035 label (KubeRay)")
    if doc.get("kind") == "RayJob":
        finishes = spec.get("shutdownAfterJobFinishes", False)
        if spec.get("suspend") and not finishes:
            errors.append("spec.shutdownAfterJobFinishes: a suspended RayJob must set it to true (KubeRay)")
        if kueue_managed and not finishes:
            errors.append("spec.shutdownAfterJobFinishes: a Kueue-queued RayJob must delete its cluster "
                          "when it finishes, or it holds the quota (Kueue)")
        if kueue_managed and not spec.get("suspend"):
            errors.append("spec.suspend: a Kueue-queued RayJob should be created suspended: "
                          "Kueue unsuspends it on admission")
        if ("rayClusterSpec" in spec) == bool(spec.get("clusterSelector")):
            errors.append("spec: exactly one of rayClusterSpec and clusterSelector must be set (KubeRay, Kueue)")
        if spec.get("suspend") and spec.get("clusterSelector"):
            errors.append("spec.suspend: a RayJob on an existing cluster (clusterSelector) cannot be suspended "
                          "(KubeRay)")
        if "rayClusterSpec" in spec:
            errors += ray_cluster_spec_errors(spec["rayClusterSpec"], "spec.rayClusterSpec", ray_version,
                                              kueue_managed, elastic)
    elif doc.get("kind") == "RayCluster":
        errors += ray_cluster_spec_errors(spec, "spec", ray_version, kueue_managed, elastic)
    elif doc.get("kind") == "ClusterQueue":
        errors += cluster_queue_errors(doc)
    return errors


# ---------------------------------------------------------------------------------------------
# Kueue across documents: what a job's labels name must exist, and what preemption the queue allows.

def kueue_stack_errors(docs: list[dict[str, Any]]) -> list[str]:
    """Each queued job's LocalQueue (in its namespace), that queue's ClusterQueue, and its
    WorkloadPriorityClass exist among the documents ("Kind/name: path: message")."""
    local_queues = {((d.get("metadata") or {}).get("name"), (d.get("metadata") or {}).get("namespace")): d
                    for d in docs if d.get("kind") == "LocalQueue"}
    cluster_queues = _named(docs, "ClusterQueue")
    priorities = _named(docs, "WorkloadPriorityClass")
    errors = []
    for queue in local_queues.values():
        target = (queue.get("spec") or {}).get("clusterQueue")
        if target not in cluster_queues:
            errors.append(f"LocalQueue/{queue['metadata'].get('name')}: spec.clusterQueue: no ClusterQueue {target!r}")
    for doc in docs:
        meta = doc.get("metadata") or {}
        labels = meta.get("labels") or {}
        where = f"{doc.get('kind')}/{meta.get('name')}: metadata.labels"
        if QUEUE_LABEL in labels and (labels[QUEUE_LABEL], meta.get("namespace")) not in local_queues:
            errors.append(f"{where}.{QUEUE_LABEL}: no LocalQueue {labels[QUEUE_LABEL]!r} in namespace "
                          f"{meta.get('namespace')!r}")
        if PRIORITY_LABEL in labels and labels[PRIORITY_LABEL] not in priorities:
            errors.append(f"{where}.{PRIORITY_LABEL}: no WorkloadPriorityClass {labels[PRIORITY_LABEL]!r} "
                          f"(have {sorted(priorities)})")
    return errors


def may_preempt(cluster_queue: dict[str, Any], pending: int, admitted: int, pending_is_older: bool = False) -> bool:
    """Whether, in one ClusterQueue short of quota, a pending workload of priority ``pending`` may evict an
    admitted one of priority ``admitted`` (Kueue's withinClusterQueue policies; the default is Never)."""
    policy = ((cluster_queue.get("spec") or {}).get("preemption") or {}).get("withinClusterQueue", "Never")
    if policy == "LowerPriority":
        return admitted < pending
    if policy == "LowerOrNewerEqualPriority":
        return admitted < pending or (admitted == pending and pending_is_older)
    return False


# ---------------------------------------------------------------------------------------------
# Core v1 objects (Secret, ServiceAccount): no CRD here, so a minimal check.

# The top-level fields of the core kinds deploy/ uses: anything else the API server refuses.
CORE_FIELDS = {
    "Secret": {"apiVersion", "kind", "metadata", "type", "data", "stringData", "immutable"},
    "ServiceAccount": {"apiVersion", "kind", "metadata", "secrets", "imagePullSecrets", "automountServiceAccountToken"},
}


def metadata_errors(doc: dict[str, Any]) -> list[str]:
    """Labels and annotations are maps of strings (CRDs type metadata as a bare object, so no schema
    says it): an unquoted 0, true or 8080 in YAML is refused by the API server."""
    meta = doc.get("metadata") or {}
    return [f"metadata.{field}.{key}: {value!r} is not a string (quote it)"
            for field in ("labels", "annotations")
            for key, value in (meta.get(field) or {}).items() if not isinstance(value, str)]


def core_object_errors(doc: dict[str, Any]) -> list[str]:
    """kind, apiVersion v1, metadata.name, known fields; a Secret holds placeholders only, never real keys."""
    errors = []
    if doc.get("apiVersion") != "v1" or not doc.get("kind"):
        errors.append(f"apiVersion/kind: expected a core v1 object, got {doc.get('apiVersion')} {doc.get('kind')}")
    if not (doc.get("metadata") or {}).get("name"):
        errors.append("metadata.name: required")
    known = CORE_FIELDS.get(doc.get("kind"))
    if known is not None:
        errors += [f"{field}: not a field of {doc['kind']}" for field in sorted(set(doc) - known)]
    if doc.get("kind") == "Secret":
        if doc.get("data"):  # base64 values cannot be checked by eye: templates use stringData
            errors.append("data: a committed Secret template uses stringData with placeholders")
        for key, value in (doc.get("stringData") or {}).items():
            if CREDENTIAL_KEY.search(key) and value != PLACEHOLDER:
                errors.append(f"stringData.{key}: must be the placeholder {PLACEHOLDER!r}, never a real value")
    return errors


def manifest_errors(doc: dict[str, Any], crds: dict[tuple[str, str], dict[str, Any]],
                    ray_version: str | None = None) -> list[str]:
    """Everything this module checks about one manifest document (across documents: kserve_stack_errors)."""
    if "/" not in doc.get("apiVersion", ""):
        return core_object_errors(doc) + metadata_errors(doc)
    errors = schema_errors(doc, crds) + metadata_errors(doc) + operator_rule_errors(doc, ray_version)
    if doc.get("kind") == "ServingRuntime":
        errors += serving_runtime_errors(doc)
    return errors



# ---------------------------------------------------------------------------------------------
# KServe: what its controller does with a ServingRuntime and an InferenceService (no schema says it),
# and the model server's own option parser. The rules read the same documents a cluster would get.

KSERVE_CONTAINER = "kserve-container"  # the runtime container KServe merges the predictor's model spec into
MODEL_MOUNT = "/mnt/models"  # where KServe's storage initializer puts storageUri
SERVER_COMMAND = ["python", "-m", "sweep", "serve"]
HEALTH_PATHS = {"readinessProbe": "/v2/health/ready", "livenessProbe": "/v2/health/live"}
PROMETHEUS_PORT = "prometheus.kserve.io/port"
PROMETHEUS_PATH = "prometheus.kserve.io/path"
DEPLOYMENT_MODE = "serving.kserve.io/deploymentMode"
RAW_MODES = ("RawDeployment", "Standard")  # "Standard" is the newer name of RawDeployment
S3_ENDPOINT = "serving.kserve.io/s3-endpoint"
S3_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")  # KServe's default credential key names
DEFAULT_PROTOCOL = "v1"  # what KServe assumes when an InferenceService's model names no protocolVersion


def is_grpc_port(port: dict[str, Any]) -> bool:
    """KServe's isGrpcPort: a container port whose name holds "grpc" or "h2c" gets appProtocol h2c."""
    name = port.get("name") or ""
    return "grpc" in name or "h2c" in name


def fill_runtime_template(args: list[str], isvc_meta: dict[str, Any]) -> list[str]:
    """A runtime's arguments as KServe renders them for one InferenceService ({{.Name}}, {{.Namespace}})."""
    name, namespace = isvc_meta.get("name") or "", isvc_meta.get("namespace") or ""
    return [a.replace("{{.Name}}", name).replace("{{.Namespace}}", namespace) for a in args]


def server_options(args: list[str]) -> dict[str, Any]:
    """The model server's own parse of its key=value arguments (raises its UsageError)."""
    from sweep.cli.key_values import parse_key_values
    from sweep.cli.serve import OPTIONS

    return parse_key_values(args, OPTIONS)


def kserve_container(runtime: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """(its path, the container) of the runtime's kserve-container, or (path, None) when it has none."""
    for i, container in enumerate((runtime.get("spec") or {}).get("containers") or []):
        if container.get("name") == KSERVE_CONTAINER:
            return f"spec.containers[{i}]", container
    return "spec.containers", None


def runtime_command_errors(container: dict[str, Any], at: str, isvc_meta: dict[str, Any],
                           extra_args: list[str] = ()) -> tuple[list[str], dict[str, Any] | None]:
    """The container runs `python -m sweep serve`, its arguments (then ``extra_args``, as KServe appends
    an InferenceService's model.args) parse with the server's options, and model= is the storage mount."""
    from sweep.cli.key_values import UsageError

    argv = [*(container.get("command") or []), *(container.get("args") or [])]
    if argv[:len(SERVER_COMMAND)] != SERVER_COMMAND:
        return [f"{at}.command: {argv[:len(SERVER_COMMAND)]} does not run the model server {SERVER_COMMAND}"], None
    args = fill_runtime_template(argv[len(SERVER_COMMAND):], isvc_meta) + list(extra_args)
    try:
        options = server_options(args)
    except UsageError as e:
        return [f"{at}.args: python -m sweep serve refuses them: {e}"], None
    if options["model"] != MODEL_MOUNT:
        return [f"{at}.args: model={options['model']} is not {MODEL_MOUNT}, where KServe puts storageUri"], options
    if _loopback(options["host"]):
        return [f"{at}.args: host={options['host']} is the pod's loopback: the kubelet's probes and the Service "
                "reach its IP (host=0.0.0.0)"], options
    return [], options


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name
        return host == "localhost"


def runtime_port_errors(container: dict[str, Any], at: str, options: dict[str, Any]) -> list[str]:
    """The declared container ports are the ports the server listens on: HTTP first (KServe's raw Service
    maps its port 80 to the first port), the gRPC port named as KServe and Knative recognise it."""
    ports = container.get("ports") or []
    if not ports:
        return [f"{at}.ports: none declared; KServe's Service would send port 80 to 8080 whatever port= says"]
    errors = []
    http, grpc = ports[0], [p for p in ports if is_grpc_port(p)]
    if is_grpc_port(http):
        errors.append(f"{at}.ports[0]: {http.get('name')!r} is the gRPC port; KServe maps the Service's port 80 "
                      f"to the first port, which must be HTTP")
    elif http.get("containerPort") != options["port"]:
        errors.append(f"{at}.ports[0].containerPort: {http.get('containerPort')} "
                      f"but the server listens on port={options['port']}")
    grpc_on = options.get("grpc", True) and "grpc_port" in options
    if grpc and not grpc_on:
        why = "grpc=false" if "grpc_port" in options else "the server has no grpc_port option"
        errors.append(f"{at}.ports: a gRPC port {grpc[0].get('containerPort')} is declared but {why}")
    elif grpc_on and [p.get("containerPort") for p in grpc] != [options["grpc_port"]]:
        errors.append(f"{at}.ports: the gRPC ports {[p.get('containerPort') for p in grpc]} are not the server's "
                      f"grpc_port={options['grpc_port']} (one port named h2c)")
    return errors


def runtime_probe_errors(container: dict[str, Any], at: str) -> list[str]:
    """Readiness and liveness ask the v2 health endpoints on the HTTP port (its number or its name)."""
    http = ((container.get("ports") or [{}])[0])
    errors = []
    for probe, path in HEALTH_PATHS.items():
        get = (container.get(probe) or {}).get("httpGet")
        if not get:
            errors.append(f"{at}.{probe}: needs httpGet {path}")
        elif get.get("path") != path:
            errors.append(f"{at}.{probe}.httpGet.path: {get.get('path')!r}, not {path!r}")
        elif get.get("port") not in (http.get("containerPort"), http.get("name")):
            errors.append(f"{at}.{probe}.httpGet.port: {get.get('port')!r} "
                          f"is not the HTTP port {http.get('containerPort')}")
    return errors


def runtime_protocol_errors(runtime: dict[str, Any], container: dict[str, Any]) -> list[str]:
    """protocolVersions says what the container serves: v2 always, grpc-v2 exactly when a gRPC port is declared;
    the Prometheus annotations point at the HTTP port's /metrics."""
    spec = runtime.get("spec") or {}
    versions = spec.get("protocolVersions") or []
    has_grpc = any(is_grpc_port(p) for p in container.get("ports") or [])
    errors = []
    if "v2" not in versions:
        errors.append(f"spec.protocolVersions: {versions} lacks v2 (the server speaks the Open Inference Protocol v2)")
    if has_grpc != ("grpc-v2" in versions):
        errors.append(f"spec.protocolVersions: {versions}: grpc-v2 must be listed exactly when a gRPC port is declared")
    http = (container.get("ports") or [{}])[0]
    annotations = spec.get("annotations") or {}
    if annotations.get(PROMETHEUS_PORT) != str(http.get("containerPort")):
        errors.append(f"spec.annotations.{PROMETHEUS_PORT}: {annotations.get(PROMETHEUS_PORT)!r} is not the HTTP port "
                      f"{http.get('containerPort')}")
    if annotations.get(PROMETHEUS_PATH) != "/metrics":
        errors.append(f"spec.annotations.{PROMETHEUS_PATH}: {annotations.get(PROMETHEUS_PATH)!r}, not '/metrics'")
    if not spec.get("supportedModelFormats"):
        errors.append("spec.supportedModelFormats: none; no InferenceService could select this runtime")
    return errors


def serving_runtime_errors(runtime: dict[str, Any], isvc_meta: dict[str, Any] | None = None,
                           extra_args: list[str] = ()) -> list[str]:
    """Every rule on a ServingRuntime that runs the model server."""
    at, container = kserve_container(runtime)
    if container is None:
        return [f"{at}: no container named {KSERVE_CONTAINER!r} (KServe refuses the runtime)"]
    errors, options = runtime_command_errors(container, at, isvc_meta or {"name": "model"}, extra_args)
    if options is not None:
        errors += runtime_port_errors(container, at, options)
    return errors + runtime_probe_errors(container, at) + runtime_protocol_errors(runtime, container)


def _named(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {(d.get("metadata") or {}).get("name"): d for d in docs if d.get("kind") == kind}


def selected_runtime(isvc: dict[str, Any],
                     runtimes: dict[str, dict[str, Any]]) -> tuple[dict[str, Any] | None, list[str]]:
    """The runtime KServe would pick for the InferenceService's model, or why there is none:
    the named runtime must support the model format and protocol; without a name, an autoSelect one."""
    model = ((isvc.get("spec") or {}).get("predictor") or {}).get("model") or {}
    fmt = model.get("modelFormat") or {}
    protocol = model.get("protocolVersion") or DEFAULT_PROTOCOL
    at = "spec.predictor.model"

    def supports(rt: dict[str, Any], auto: bool) -> bool:
        spec = rt.get("spec") or {}
        return (not spec.get("disabled") and not spec.get("multiModel")
                and any(f.get("name") == fmt.get("name") and (not auto or f.get("autoSelect"))
                        and (not fmt.get("version") or f.get("version") == fmt.get("version"))
                        for f in spec.get("supportedModelFormats") or []))

    name = model.get("runtime")
    if name is not None:
        runtime = runtimes.get(name)
        if runtime is None:
            return None, [f"{at}.runtime: no ServingRuntime {name!r} (have {sorted(runtimes)})"]
        if not supports(runtime, auto=False):
            formats = [f.get("name") for f in (runtime.get("spec") or {}).get("supportedModelFormats") or []]
            return None, [f"{at}.modelFormat: {fmt.get('name')!r} is not a format ServingRuntime {name!r} "
                          f"supports ({formats})"]
    else:
        candidates = [rt for rt in runtimes.values() if supports(rt, auto=True)]
        if not candidates:
            return None, [f"{at}.modelFormat: no ServingRuntime auto-selects {fmt.get('name')!r}"]
        runtime = candidates[0]
    versions = (runtime.get("spec") or {}).get("protocolVersions") or [DEFAULT_PROTOCOL]
    if protocol not in versions:
        return None, [f"{at}.protocolVersion: {protocol!r} (KServe's default when unset is {DEFAULT_PROTOCOL!r}) "
                      f"is not one the runtime speaks ({versions})"]
    return runtime, []


def _merged_ports(runtime_ports: list[dict[str, Any]], model_ports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """KServe's strategic merge of the model's ports into the runtime's (merge key containerPort)."""
    merged = [dict(p) for p in runtime_ports]
    for port in model_ports:
        same = next((p for p in merged if p.get("containerPort") == port.get("containerPort")), None)
        if same is None:
            merged.append(dict(port))
        else:
            same.update(port)
    return merged


def inference_service_errors(isvc: dict[str, Any], docs: list[dict[str, Any]]) -> list[str]:
    """An InferenceService against the runtimes, service accounts and secrets beside it."""
    meta = isvc.get("metadata") or {}
    predictor = (isvc.get("spec") or {}).get("predictor") or {}
    model = predictor.get("model") or {}
    runtime, errors = selected_runtime(isvc, _named(docs, "ServingRuntime"))
    if runtime is not None:
        # The container KServe runs: the runtime's, with the model's args appended and its ports merged.
        _, container = kserve_container(runtime)
        if container is not None:
            container = {**container, "ports": _merged_ports(container.get("ports") or [], model.get("ports") or [])}
            containers = [container if c.get("name") == KSERVE_CONTAINER else c for c in runtime["spec"]["containers"]]
            merged = {**runtime, "spec": {**runtime["spec"], "containers": containers}}
            own = serving_runtime_errors(runtime, meta)  # the runtime's own faults are reported on the runtime
            errors += [f"as run for this InferenceService: {e}"
                       for e in serving_runtime_errors(merged, meta, model.get("args") or []) if e not in own]
            mode = (meta.get("annotations") or {}).get(DEPLOYMENT_MODE, "Serverless")
            if len(container["ports"]) > 1 and mode not in RAW_MODES:
                errors.append(f"metadata.annotations.{DEPLOYMENT_MODE}: {mode!r} (Knative) serves one container port; "
                              f"the runtime declares {len(container['ports'])}: use RawDeployment")
        if meta.get("namespace") != (runtime.get("metadata") or {}).get("namespace"):
            errors.append("metadata.namespace: not the ServingRuntime's namespace")
    errors += storage_credential_errors(isvc, docs)
    return errors


def storage_credential_errors(isvc: dict[str, Any], docs: list[dict[str, Any]]) -> list[str]:
    """An s3:// storageUri: the predictor's service account exists and lists a secret with KServe's S3
    endpoint annotation and key names (the storage initializer's credentials)."""
    predictor = (isvc.get("spec") or {}).get("predictor") or {}
    uri = (predictor.get("model") or {}).get("storageUri") or ""
    if not uri:
        return ["spec.predictor.model.storageUri: required (the storage initializer fills /mnt/models from it)"]
    if not uri.startswith("s3://"):
        return []
    name = predictor.get("serviceAccountName")
    account = _named(docs, "ServiceAccount").get(name)
    if account is None:
        return [f"spec.predictor.serviceAccountName: no ServiceAccount {name!r} beside it, "
                f"so no S3 credentials for {uri}"]
    secrets = _named(docs, "Secret")
    listed = [s.get("name") for s in account.get("secrets") or []]
    usable = [secrets[n] for n in listed if n in secrets]
    if not usable:
        return [f"ServiceAccount {name!r}.secrets: {listed} names no Secret beside it"]
    errors = []
    for secret in usable:
        where = f"Secret {secret['metadata']['name']!r}"
        if S3_ENDPOINT not in (secret["metadata"].get("annotations") or {}):
            errors.append(f"{where}: no {S3_ENDPOINT} annotation (KServe reads the endpoint there)")
        missing = [k for k in S3_KEYS if k not in {**(secret.get("data") or {}), **(secret.get("stringData") or {})}]
        if missing:
            errors.append(f"{where}: lacks {missing} (the key names KServe's storage initializer reads)")
    return errors


def kserve_stack_errors(docs: list[dict[str, Any]]) -> list[str]:
    """Every InferenceService of a folder against the rest of it ("InferenceService/name: path: message")."""
    errors = []
    for isvc in (d for d in docs if d.get("kind") == "InferenceService"):
        name = (isvc.get("metadata") or {}).get("name")
        errors += [f"InferenceService/{name}: {e}" for e in inference_service_errors(isvc, docs)]
    return errors
