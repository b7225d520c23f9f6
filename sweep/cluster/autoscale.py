"""What an autoscaling Ray cluster can launch and is launching, read from the live cluster (Ray 2.60).

The plain half (node types, how many trials fit, the node wait and its texts) is ``sweep/plan/scale.py``;
here: ``read_autoscaler`` / ``launchable_node_types`` (the autoscaler's node types and max counts),
``alive_node_resources``, ``pending_status`` (what the autoscaler is launching / what is requested /
infeasible, for the wait line and the timeout error), ``alive_counts`` and ``check_wait`` (``NodeWait``
on live data).

Where the node types come from in Ray 2.60 (checked in the installed source; there is no public
API that lists them):

1. The GCS cluster config: ``ray._private.state.state.get_cluster_config()``
   (``GlobalState.get_cluster_config`` in ray/_private/state.py) reads ``autoscaler_pb2.ClusterConfig``
   (``node_group_configs``: name, resources, min_count, max_count, -1 = unlimited) from the internal KV
   key ``__autoscaler_cluster_config`` in namespace ``__autoscaler``. Ray Data's autoscaler reads it the
   same way (``is_autoscaling_enabled`` in ray/data/_internal/cluster_autoscaler/util.py). It is only
   there when an autoscaler reported it (``GcsClient.report_cluster_config``): NO autoscaler shipped in
   Ray 2.60 does (v1 monitor and v2 monitor alike: measured None); newer Ray's v2 autoscaler does. Read
   first, so a newer cluster just works.
2. The autoscaling config file the autoscaler monitor runs with (``monitor.py
   --autoscaling-config=PATH``, ``start_monitor`` in ray/_private/services.py; ``ray up`` puts it at
   ``~/ray_bootstrap_config.yaml``): ``available_node_types`` with ``resources``, ``min_workers``,
   ``max_workers`` (per-type default = the global ``max_workers``, as
   ``fill_node_type_min_max_workers`` in ray/autoscaler/_private/util.py fills it). Found through the
   monitor process of THIS cluster (its ``--gcs-address`` must match), so only where the driver runs on the head node
   (``cluster.address=auto`` on the head, a Ray Job, the tests' AutoscalingCluster). A KubeRay
   autoscaler runs in a sidecar container: neither source is visible to the driver there in 2.60.
3. Nothing found → ``[]`` (plain local Ray: its monitor runs with the read-only provider and no
   config file; also an autoscaler whose config we cannot see).

Alive nodes per type: autoscaler v1 writes ``autoscaler_report.active_nodes`` (type → count) into
the KV key ``ray_constants.DEBUG_AUTOSCALING_STATUS`` every update
(``Monitor._run`` in ray/autoscaler/_private/monitor.py); v2 (and the GCS with any autoscaler) gives each node's
``ray_node_type_name`` in ``ray.autoscaler.v2.sdk.get_cluster_status`` (ray/autoscaler/v2/sdk.py),
from the ``RAY_NODE_TYPE_NAME`` the node was started with (KubeRay and the fake provider set it).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, Sequence

from sweep.cluster.connect import alive_node_resources
from sweep.plan.scale import AutoscalerView, NodeType, NodeWait, counts_by_shape, node_types_from_config


def _gcs_address(gcs_address: str | None) -> str:
    if gcs_address:
        return gcs_address
    import ray

    return ray.get_runtime_context().gcs_address


def _client(gcs_address: str | None):
    from ray._raylet import GcsClient

    return GcsClient(address=_gcs_address(gcs_address))


def autoscaler_version(client) -> str | None:
    """'v2' when the GCS says autoscaler v2 runs (the key Ray 2.60's ``is_autoscaler_v2`` in
    ray/autoscaler/v2/utils.py reads), 'v1' when the v1 monitor's status is in the KV, else None."""
    import ray._raylet as raylet
    from ray._private import ray_constants

    v2 = client.internal_kv_get(raylet.GCS_AUTOSCALER_V2_ENABLED_KEY.encode(),
                                namespace=raylet.GCS_AUTOSCALER_STATE_NAMESPACE.encode())
    if v2 == b"1":
        return "v2"
    if client.internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS.encode(), namespace=None):
        return "v1"
    return None


def v1_status(client) -> dict | None:
    """The v1 monitor's last status (Ray 2.60's ``Monitor._run``, ray/autoscaler/_private/monitor.py):
    autoscaler_report + load_metrics_report."""
    from ray._private import ray_constants

    raw = client.internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS.encode(), namespace=None)
    return json.loads(raw) if raw else None


def _types_from_gcs(client) -> list[NodeType] | None:
    """ClusterConfig.node_group_configs, as ray._private.state.state.get_cluster_config() reads it."""
    import ray._raylet as raylet
    from ray.core.generated import autoscaler_pb2

    raw = client.internal_kv_get(raylet.GCS_AUTOSCALER_CLUSTER_CONFIG_KEY.encode(),
                                 namespace=raylet.GCS_AUTOSCALER_STATE_NAMESPACE.encode())
    if not raw:
        return None
    config = autoscaler_pb2.ClusterConfig.FromString(raw)
    return [NodeType(g.name, {k: float(v) for k, v in g.resources.items()}, int(g.min_count), int(g.max_count))
            for g in config.node_group_configs if g.resources]


def _cmdlines() -> Iterator[list[str]]:
    try:
        import psutil
    except ImportError:  # Linux without psutil: /proc
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        yield [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
                except OSError:
                    continue
        return
    for proc in psutil.process_iter(["cmdline"]):
        try:
            yield proc.info["cmdline"] or []
        except (psutil.Error, OSError):
            continue


def monitor_config_path(gcs_address: str) -> str | None:
    """The ``--autoscaling-config`` of the autoscaler monitor (v1 or v2) serving THIS cluster, when it runs
    on this machine; else ``~/ray_bootstrap_config.yaml`` when present (``ray up``'s head)."""
    for argv in _cmdlines():
        if not any(a.endswith(("autoscaler/_private/monitor.py", "autoscaler/v2/monitor.py")) for a in argv):
            continue
        args = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
        if args.get("gcs-address") == gcs_address and args.get("autoscaling-config"):
            return os.path.expanduser(args["autoscaling-config"])
    bootstrap = os.path.expanduser("~/ray_bootstrap_config.yaml")
    return bootstrap if os.path.isfile(bootstrap) else None


def read_config_file(path: str) -> dict:
    import yaml  # Ray depends on PyYAML; the file is YAML or JSON (a subset)

    with open(path) as f:
        return yaml.safe_load(f) or {}


def _alive_counts(client, gcs_address: str, version: str | None, types: Sequence[NodeType]) -> dict[str, int]:
    """Alive nodes per type: the larger of two lower bounds, the GCS's per-node type names (live; only
    nodes started with RAY_NODE_TYPE_NAME: KubeRay, the fake provider) and the v1 monitor's
    ``active_nodes`` (lags ray.nodes() by an update or two); by shape when neither names any."""
    names = {t.name for t in types}
    counts: dict[str, int] = {}
    try:
        from ray.autoscaler.v2.sdk import get_cluster_status

        status = get_cluster_status(gcs_address)
        for node in [*status.active_nodes, *status.idle_nodes]:
            if node.ray_node_type_name in names:
                counts[node.ray_node_type_name] = counts.get(node.ray_node_type_name, 0) + 1
    except Exception:  # noqa: BLE001 - an older GCS: the other sources
        pass
    if version == "v1":
        report = (v1_status(client) or {}).get("autoscaler_report") or {}
        for name, n in (report.get("active_nodes") or {}).items():
            if name in names:
                counts[name] = max(counts.get(name, 0), int(n))
    return counts or counts_by_shape(alive_node_resources(), types)


def read_autoscaler(gcs_address: str | None = None, config_path: str | None = None) -> AutoscalerView:
    """What a connected driver can learn about the autoscaler (see the module docstring for the order)."""
    address = _gcs_address(gcs_address)
    client = _client(address)
    version = autoscaler_version(client)
    types = _types_from_gcs(client)
    source, max_total = "gcs-cluster-config", None
    if types is None:
        path = config_path or monitor_config_path(address)
        if path and os.path.isfile(path):
            types, max_total = node_types_from_config(read_config_file(path))
            source = path
        else:
            types, source = [], "none"
    counts = _alive_counts(client, address, version, types) if types else {}
    return AutoscalerView(version, tuple(types), max_total, source, counts)


def declared_view(view: AutoscalerView, declared: Sequence[Mapping[str, Any]]) -> AutoscalerView:
    """The node types a user declared (``cluster.node_types``: ``[{name, resources, max_workers}]``)
    where the driver cannot read the autoscaler's own (KubeRay runs it in a sidecar container).
    Alive nodes are counted by their CPU/GPU shape."""
    types, _ = node_types_from_config({"available_node_types": {d["name"]: {k: v for k, v in d.items() if k != "name"}
                                                                for d in declared}})
    return AutoscalerView(view.version, tuple(types), None, "cluster.node_types",
                          counts_by_shape(alive_node_resources(), types))


def launchable_node_types(gcs_address: str | None = None, config_path: str | None = None) -> list[NodeType]:
    """The autoscaler's worker node types with their min/max counts; [] without an autoscaler."""
    return list(read_autoscaler(gcs_address, config_path).node_types)


@dataclass(frozen=True)
class Pending:
    """What the autoscaler is doing about our request (for the wait line and the timeout error)."""

    launching: dict[str, int]  # node type -> nodes requested from the provider, not yet a Ray node
    starting: dict[str, int]  # node type -> nodes launched, Ray not yet up on them
    requested: list[tuple[dict[str, float], int]]  # the standing resource request, grouped
    failed: dict[str, int] = field(default_factory=dict)  # node type -> failed launches (v2)
    infeasible: list[tuple[dict[str, float], int]] = field(default_factory=list)  # no type can hold (v2)

    @property
    def nodes_on_the_way(self) -> int:
        return sum(self.launching.values()) + sum(self.starting.values())


def _count(pairs: Iterable[tuple[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, n in pairs:
        out[name] = out.get(name, 0) + int(n)
    return out


def pending_status(gcs_address: str | None = None) -> Pending:
    """Pending node launches and the standing resource request, from the autoscaler's own report."""
    address = _gcs_address(gcs_address)
    client = _client(address)
    version = autoscaler_version(client)
    if version == "v1":
        status = v1_status(client) or {}
        report = status.get("autoscaler_report") or {}
        demand = (status.get("load_metrics_report") or {}).get("request_demand") or []
        return Pending(
            launching={k: int(v) for k, v in (report.get("pending_launches") or {}).items()},
            starting=_count((entry[-2], 1) for entry in report.get("pending_nodes") or []),  # [ip, type, status]
            requested=[({k: float(v) for k, v in b.items()}, int(n)) for b, n in demand],
        )
    # v2 (the GCS answers for v1 too, but then holds no launches): get_cluster_status parses the same
    # reply (Ray 2.60's ``get_cluster_status``, ray/autoscaler/v2/sdk.py); the raw one also carries the
    # infeasible constraints.
    from ray.autoscaler.v2.schema import Stats
    from ray.autoscaler.v2.utils import ClusterStatusParser
    from ray.core.generated.autoscaler_pb2 import GetClusterStatusReply

    reply = GetClusterStatusReply()
    reply.ParseFromString(client.get_cluster_status())
    status = ClusterStatusParser.from_get_cluster_status_reply(reply, stats=Stats())
    requested: list[tuple[dict[str, float], int]] = []
    for demand in status.resource_demands.cluster_constraint_demand:
        for by_count in demand.bundles_by_count:
            requested.append(({k: float(v) for k, v in by_count.bundle.items()}, int(by_count.count)))
    infeasible = [({k: float(v) for k, v in r.request.resources_bundle.items()}, int(r.count))
                  for c in reply.autoscaling_state.infeasible_cluster_resource_constraints
                  for r in c.resource_requests]
    return Pending(
        launching=_count((r.ray_node_type_name, r.count) for r in status.pending_launches),
        starting=_count((n.ray_node_type_name, 1) for n in status.pending_nodes),
        requested=requested,
        failed=_count((r.ray_node_type_name, r.count) for r in status.failed_launches),
        infeasible=infeasible,
    )


def alive_counts(node_types: Sequence[NodeType], gcs_address: str | None = None) -> dict[str, int]:
    """Alive nodes per node type now (see ``_alive_counts``)."""
    address = _gcs_address(gcs_address)
    client = _client(address)
    return _alive_counts(client, address, autoscaler_version(client), node_types)


def check_wait(wait: NodeWait, gcs_address: str | None = None) -> str | None:
    """``wait.check`` on what the cluster says now: None (all up), the waiting text, or ScaleTimeoutError
    naming the node type(s) and the standing request."""
    address = _gcs_address(gcs_address)
    counts = alive_counts(wait.node_types, address)
    if not wait.missing(counts):
        return None
    return wait.check(counts, pending_status(address).requested)


