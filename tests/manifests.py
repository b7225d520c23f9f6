"""Offline checks of the Kubernetes manifests in deploy/ (no cluster needed).

Two layers, because a plain schema check is not what the API server and the operators enforce:
1. the CRD's OpenAPI v3 schema, made strict the way the API server is (unknown fields refused);
2. the operators' own admission rules that no schema states (KubeRay's and Kueue's webhooks).
Every check returns readable strings, "path: message", and an empty list when all is well.
"""

from __future__ import annotations

import re
from importlib.metadata import version as installed_version
from pathlib import Path
from typing import Any

import jsonschema
import yaml

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
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
        if group.get("resources") and {"num-cpus", "num-gpus", "memory", "resources"} & set(group.get("rayStartParams") or {}):
            errors.append(f"{at}.{where}: set Ray resources in rayStartParams or in resources, not both (KubeRay)")
    for i, group in enumerate(spec.get("workerGroupSpecs") or []):
        # Defaults as in the CRD; the autoscaler starts `replicas` pods and moves between min and max.
        low, replicas, high = group.get("minReplicas", 0), group.get("replicas", 0), group.get("maxReplicas", 2**31 - 1)
        if not low <= replicas <= high:
            errors.append(f"{at}.workerGroupSpecs[{i}]: needs minReplicas <= replicas <= maxReplicas, "
                          f"got {low} <= {replicas} <= {high}")
        if kueue_managed and group.get("groupName") == "head":
            errors.append(f"{at}.workerGroupSpecs[{i}].groupName: 'head' is reserved by Kueue for the head group")
    if kueue_managed and spec.get("enableInTreeAutoscaling") and not elastic:
        errors.append(f"{at}.enableInTreeAutoscaling: Kueue admits an autoscaling cluster only as an elastic job "
                      f"(metadata.annotations {ELASTIC_JOB_ANNOTATION}: \"true\")")
    return errors


def operator_rule_errors(doc: dict[str, Any], ray_version: str | None = None) -> list[str]:
    """KubeRay's and Kueue's admission rules for RayJob and RayCluster (others: none)."""
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
            errors.append("spec.suspend: a Kueue-queued RayJob should be created suspended: Kueue unsuspends it on admission")
        if ("rayClusterSpec" in spec) == bool(spec.get("clusterSelector")):
            errors.append("spec: exactly one of rayClusterSpec and clusterSelector must be set (KubeRay, Kueue)")
        if spec.get("suspend") and spec.get("clusterSelector"):
            errors.append("spec.suspend: a RayJob on an existing cluster (clusterSelector) cannot be suspended (KubeRay)")
        if "rayClusterSpec" in spec:
            errors += ray_cluster_spec_errors(spec["rayClusterSpec"], "spec.rayClusterSpec", ray_version, kueue_managed, elastic)
    elif doc.get("kind") == "RayCluster":
        errors += ray_cluster_spec_errors(spec, "spec", ray_version, kueue_managed, elastic)
    return errors


# ---------------------------------------------------------------------------------------------
# Core v1 objects (Secret, ServiceAccount): no CRD here, so a minimal check.

def core_object_errors(doc: dict[str, Any]) -> list[str]:
    """kind, apiVersion v1, metadata.name; a Secret holds placeholders only, never real keys."""
    errors = []
    if doc.get("apiVersion") != "v1" or not doc.get("kind"):
        errors.append(f"apiVersion/kind: expected a core v1 object, got {doc.get('apiVersion')} {doc.get('kind')}")
    if not (doc.get("metadata") or {}).get("name"):
        errors.append("metadata.name: required")
    if doc.get("kind") == "Secret":
        if doc.get("data"):  # base64 values cannot be checked by eye: templates use stringData
            errors.append("data: a committed Secret template uses stringData with placeholders")
        for key, value in (doc.get("stringData") or {}).items():
            if CREDENTIAL_KEY.search(key) and value != PLACEHOLDER:
                errors.append(f"stringData.{key}: must be the placeholder {PLACEHOLDER!r}, never a real value")
    return errors


def manifest_errors(doc: dict[str, Any], crds: dict[tuple[str, str], dict[str, Any]],
                    ray_version: str | None = None) -> list[str]:
    """Everything this module checks about one manifest document."""
    if "/" not in doc.get("apiVersion", ""):
        return core_object_errors(doc)
    return schema_errors(doc, crds) + operator_rule_errors(doc, ray_version)

