"""What an autoscaling Ray cluster can grow to, and asking it to grow (Ray 2.60).

Two halves:

* Plain Python (no Ray import): ``NodeType``, ``TrialNeeds``, ``plan_scale`` (how many trials fit
  now / at the cluster's maximum, which node types must be launched), ``NodeWait`` (the waiting
  text and ``ScaleTimeoutError``), the texts the progress line and the errors use. Unit-tested
  without a cluster.
* Ray-facing, imported lazily: ``read_autoscaler`` / ``launchable_node_types`` (the autoscaler's
  node types and max counts), ``alive_node_resources``, ``pending_status`` (what the autoscaler is
  launching / what is requested / infeasible, for the wait line and the timeout error),
  ``alive_counts`` and ``check_wait`` (``NodeWait`` on live data).

Where the node types come from in Ray 2.60 (checked in the installed source; there is no public
API that lists them):

1. The GCS cluster config: ``ray._private.state.state.get_cluster_config()``
   (ray/_private/state.py:983) reads ``autoscaler_pb2.ClusterConfig`` (``node_group_configs``:
   name, resources, min_count, max_count, -1 = unlimited) from the internal KV key
   ``__autoscaler_cluster_config`` in namespace ``__autoscaler``. Ray Data's autoscaler reads it the
   same way (ray/data/_internal/cluster_autoscaler/util.py:18). It is only there when an autoscaler
   reported it (``GcsClient.report_cluster_config``): NO autoscaler shipped in Ray 2.60 does (v1
   monitor and v2 monitor alike: measured None); newer Ray's v2 autoscaler does. Read first, so a
   newer cluster just works.
2. The autoscaling config file the autoscaler monitor runs with (``monitor.py
   --autoscaling-config=PATH``, ray/_private/services.py:2403; ``ray up`` puts it at
   ``~/ray_bootstrap_config.yaml``): ``available_node_types`` with ``resources``, ``min_workers``,
   ``max_workers`` (per-type default = the global ``max_workers``, as
   ray/autoscaler/_private/util.py:387 fills it). Found through the monitor process of THIS cluster
   (its ``--gcs-address`` must match), so only where the driver runs on the head node
   (``cluster.address=auto`` on the head, a Ray Job, the tests' AutoscalingCluster). A KubeRay
   autoscaler runs in a sidecar container: neither source is visible to the driver there in 2.60.
3. Nothing found → ``[]`` (plain local Ray: its monitor runs with the read-only provider and no
   config file; also an autoscaler whose config we cannot see).

Alive nodes per type: autoscaler v1 writes ``autoscaler_report.active_nodes`` (type → count) into
the KV key ``ray_constants.DEBUG_AUTOSCALING_STATUS`` every update
(ray/autoscaler/_private/monitor.py:451); v2 (and the GCS with any autoscaler) gives each node's
``ray_node_type_name`` in ``ray.autoscaler.v2.sdk.get_cluster_status`` (ray/autoscaler/v2/sdk.py:82),
from the ``RAY_NODE_TYPE_NAME`` the node was started with (KubeRay and the fake provider set it).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from sweep.errors import ResourceError

UNLIMITED = -1  # ClusterConfig's max_count for "no limit"
_EPS = 1e-9


# ----------------------------------------------------------------------------------------------
# plain part
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NodeType:
    """One node type the autoscaler can launch (a KubeRay worker group, a ``ray up`` node type)."""

    name: str
    resources: dict[str, float]  # per node, as the config declares them (CPU, GPU, custom)
    min_workers: int = 0
    max_workers: int = 0  # UNLIMITED (-1): no per-type limit

    @property
    def gpus(self) -> float:
        return float(self.resources.get("GPU", 0))

    def more(self, alive: int, wanted: int) -> int:
        """How many more of this type may be launched, ``alive`` being up already."""
        if self.max_workers == UNLIMITED:
            return max(wanted, 0)
        return max(self.max_workers - alive, 0)


@dataclass(frozen=True)
class TrialNeeds:
    """What one trial holds: ``workers`` Train workers, each ``cpus`` CPU and ``gpus`` GPU, all on one node
    (the plan's packing, as ``sweep.run.plan._fits``)."""

    workers: int
    cpus_per_worker: float
    gpus_per_worker: float = 0.0

    @property
    def bundle(self) -> dict[str, float]:
        """One trial as one resource bundle: what a node must hold for it."""
        b = {"CPU": self.cpus_per_worker * self.workers}
        if self.gpus_per_worker > 0:
            b["GPU"] = self.gpus_per_worker * self.workers
        return b


def trials_fit_on(resources: Mapping[str, float], needs: TrialNeeds) -> int:
    """How many whole trials fit on one node of these (total) resources."""
    fit = math.inf
    for key, amount in needs.bundle.items():
        if amount > 0:
            fit = min(fit, math.floor(float(resources.get(key, 0)) / amount + _EPS))
    return 0 if fit == math.inf else int(fit)


@dataclass(frozen=True)
class ScalePlan:
    fits_now: int  # trials the alive nodes hold at once
    fits_at_max: int  # ... with every launchable node up too (capped at `wanted` for unlimited types)
    wanted: int  # trials the sweep would like to run at once (its trial count)
    to_launch: dict[str, int] = field(default_factory=dict)  # node type -> nodes to ask for
    node_types: tuple[NodeType, ...] = ()

    @property
    def concurrency(self) -> int:
        return min(self.wanted, self.fits_at_max)

    @property
    def never_fits(self) -> bool:
        """No alive node and no launchable node type can hold one trial."""
        return self.fits_at_max == 0

    @property
    def waits(self) -> bool:
        return bool(self.to_launch)

    def waiting_text(self) -> str | None:
        return waiting_text(self.to_launch, self.node_types)


def plan_scale(alive: Sequence[Mapping[str, float]], node_types: Iterable[NodeType],
               alive_counts: Mapping[str, int], needs: TrialNeeds, wanted: int,
               max_total_workers: int | None = None) -> ScalePlan:
    """Trials that fit now, at the cluster's maximum, and the nodes to launch to run ``wanted`` at once.

    ``alive``: the alive nodes' total resources (``ray.nodes()[i]['Resources']``);
    ``alive_counts``: alive nodes per node type name; ``max_total_workers``: the cluster-wide cap on
    worker nodes (the config's global ``max_workers``), None for none. Launches go to the node type
    that holds the most trials per node first (then the smaller one; for CPU trials, types without GPU
    before any GPU type), as few nodes as reach ``wanted``.
    """
    types = tuple(node_types)
    fits_now = sum(trials_fit_on(n, needs) for n in alive)
    workers_alive = sum(alive_counts.get(t.name, 0) for t in types)
    room = None if max_total_workers is None else max(max_total_workers - workers_alive, 0)
    useful = [(trials_fit_on(t.resources, needs), t) for t in types]
    useful = [(f, t) for f, t in useful if f > 0]
    cpu_only = needs.gpus_per_worker <= 0  # CPU trials go to GPU-less types first: GPUs stay for GPU work
    useful.sort(key=lambda ft: (cpu_only and ft[1].gpus > 0, -ft[0], sum(ft[1].resources.values()), ft[1].name))

    def grow(target: int, every: bool = False) -> tuple[int, dict[str, int]]:
        """Trials added and nodes launched going for ``target`` more trials (``every``: all a limited
        type may add, whatever the target; an unlimited type still stops at the target)."""
        added, launches, left = 0, {}, room
        for per_node, t in useful:
            if left == 0:
                break
            short = math.ceil(max(target - added, 0) / per_node)
            more = t.more(alive_counts.get(t.name, 0), short)
            n = more if every and t.max_workers != UNLIMITED else min(short, more)
            if left is not None:
                n = min(n, left)
                left -= n
            if n > 0:
                launches[t.name] = n
                added += n * per_node
        return added, launches

    at_max_added, _ = grow(max(wanted - fits_now, 0), every=True)
    fits_at_max = fits_now + at_max_added
    _, to_launch = grow(max(min(wanted, fits_at_max) - fits_now, 0))
    return ScalePlan(fits_now, fits_at_max, wanted, to_launch, types)


def _node_word(t: NodeType | None) -> str:
    return "GPU node(s)" if t is not None and t.gpus > 0 else "node(s)"


def waiting_text(to_launch: Mapping[str, int], node_types: Iterable[NodeType]) -> str | None:
    """'waiting for 2 GPU node(s) (type gpu_worker) from the autoscaler' (None: nothing to wait for)."""
    by_name = {t.name: t for t in node_types}
    parts = [f"{n} {_node_word(by_name.get(name))} (type {name})" for name, n in to_launch.items() if n > 0]
    if not parts:
        return None
    return f"waiting for {' and '.join(parts)} from the autoscaler"


def format_bundle(bundle: Mapping[str, float]) -> str:
    """{GPU: 1, CPU: 1}: GPU first, then CPU, then the rest by name; numbers as %g."""
    order = sorted(bundle, key=lambda k: ({"GPU": 0, "CPU": 1}.get(k, 2), k))
    return "{" + ", ".join(f"{k}: {float(bundle[k]):g}" for k in order) + "}"


def format_pending(requested: Iterable[tuple[Mapping[str, float], int]]) -> str:
    """'2 x {GPU: 1, CPU: 1}' for each distinct bundle, joined with ', ' ('nothing' when empty)."""
    parts = [f"{count} x {format_bundle(bundle)}" for bundle, count in requested if count > 0]
    return ", ".join(parts) if parts else "nothing"


def timeout_text(type_names: Iterable[str], waited_s: float,
                 requested: Iterable[tuple[Mapping[str, float], int]]) -> str:
    """'no node of type gpu_worker arrived within 900 s; pending: 2 x {GPU: 1, CPU: 1}'."""
    names = " or ".join(sorted(set(type_names))) or "any launchable type"
    return (f"no node of type {names} arrived within {waited_s:g} s; pending: {format_pending(requested)}; "
            "check the autoscaler (ray status, its monitor log) or raise cluster.scale_timeout_s")


class ScaleTimeoutError(ResourceError):
    """The autoscaler brought none of the nodes the sweep waits for within cluster.scale_timeout_s."""


class NodeWait:
    """Waiting for the nodes a ``ScalePlan`` asked for: the progress line's text, and the timeout.

    Plain (the caller feeds it the alive counts per type and the pending request it polled), so a
    Tune callback can call ``check`` every step. The timeout is "no node arrived": once one of the
    awaited nodes is up, trials run on it and the rest is only waited for (the text says so).
    """

    def __init__(self, plan: ScalePlan, alive_counts: Mapping[str, int], timeout_s: float,
                 clock: Callable[[], float] = time.monotonic):
        self.node_types = plan.node_types
        self.start = {name: int(alive_counts.get(name, 0)) for name in plan.to_launch}
        self.target = {name: self.start[name] + n for name, n in plan.to_launch.items() if n > 0}
        self.timeout_s = float(timeout_s)
        self._clock = clock
        self.started_at = clock()

    def missing(self, alive_counts: Mapping[str, int]) -> dict[str, int]:
        return {name: want - int(alive_counts.get(name, 0)) for name, want in self.target.items()
                if int(alive_counts.get(name, 0)) < want}

    def arrived(self, alive_counts: Mapping[str, int]) -> int:
        return sum(max(min(int(alive_counts.get(n, 0)), want) - self.start[n], 0) for n, want in self.target.items())

    @property
    def waited_s(self) -> float:
        return self._clock() - self.started_at

    def check(self, alive_counts: Mapping[str, int],
              requested: Iterable[tuple[Mapping[str, float], int]] = ()) -> str | None:
        """None when every awaited node is up; else the waiting text. Raises ScaleTimeoutError when none
        arrived within the timeout (``requested``: the standing request, for the error text)."""
        missing = self.missing(alive_counts)
        if not missing:
            return None
        if self.arrived(alive_counts) == 0 and self.waited_s > self.timeout_s:
            raise ScaleTimeoutError(timeout_text(missing, self.timeout_s, requested))
        return waiting_text(missing, self.node_types)


def group_bundles(bundles: Iterable[Mapping[str, float]]) -> list[tuple[dict[str, float], int]]:
    """Equal bundles counted: [({GPU: 1, CPU: 1}, 2)] (order of first appearance)."""
    out: list[tuple[dict[str, float], int]] = []
    for b in bundles:
        b = {k: float(v) for k, v in b.items()}
        for i, (seen, n) in enumerate(out):
            if seen == b:
                out[i] = (seen, n + 1)
                break
        else:
            out.append((b, 1))
    return out


def trial_bundles(needs: TrialNeeds, trials: int) -> list[dict[str, float]]:
    """What to ask the autoscaler for: one bundle per concurrent trial (a whole trial on one node)."""
    return [dict(needs.bundle) for _ in range(max(trials, 0))]


def node_types_from_config(config: Mapping[str, Any]) -> tuple[list[NodeType], int | None]:
    """The worker node types of a ``ray up`` / ``--autoscaling-config`` cluster config, and its global
    ``max_workers`` (None when absent). The head type is left out unless it may also run as a worker
    (its ``max_workers`` > 0). Per-type defaults as Ray fills them (autoscaler/_private/util.py:387)."""
    global_max = config.get("max_workers")
    head = config.get("head_node_type")
    types = []
    for name, spec in (config.get("available_node_types") or {}).items():
        spec = spec or {}
        default_max = 0 if name == head else (global_max if global_max is not None else UNLIMITED)
        max_workers = int(spec.get("max_workers", default_max))
        if name == head and max_workers <= 0:
            continue
        resources = {k: float(v) for k, v in (spec.get("resources") or {}).items()}
        types.append(NodeType(name, resources, int(spec.get("min_workers", 0)), max_workers))
    return types, (int(global_max) if global_max is not None else None)


def counts_by_shape(alive: Sequence[Mapping[str, float]], node_types: Sequence[NodeType]) -> dict[str, int]:
    """Fallback when no autoscaler report names the alive nodes' types: a node counts for the first
    type whose declared CPU/GPU it has exactly."""
    counts: dict[str, int] = {}
    for node in alive:
        for t in node_types:
            keys = [k for k in ("CPU", "GPU") if k in t.resources] or list(t.resources)
            if keys and all(abs(float(node.get(k, 0)) - t.resources[k]) < _EPS for k in keys):
                counts[t.name] = counts.get(t.name, 0) + 1
                break
    return counts


# ----------------------------------------------------------------------------------------------
# Ray-facing part (imports Ray lazily)
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AutoscalerView:
    """What the driver could learn about the cluster's autoscaler."""

    version: str | None  # "v1", "v2", None (could not tell)
    node_types: tuple[NodeType, ...]  # launchable worker types; () when none / unknown
    max_total_workers: int | None
    source: str  # where node_types came from: "gcs-cluster-config", "<config path>", "none"
    alive_counts: dict[str, int] = field(default_factory=dict)

    @property
    def can_launch(self) -> bool:
        return any(t.max_workers != 0 for t in self.node_types)


def _gcs_address(gcs_address: str | None) -> str:
    if gcs_address:
        return gcs_address
    import ray

    return ray.get_runtime_context().gcs_address


def _client(gcs_address: str | None):
    from ray._raylet import GcsClient

    return GcsClient(address=_gcs_address(gcs_address))


def autoscaler_version(client) -> str | None:
    """'v2' when the GCS says autoscaler v2 runs (the key ray/autoscaler/v2/utils.py:1073 reads), 'v1' when
    the v1 monitor's status is in the KV, else None."""
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
    """The v1 monitor's last status (monitor.py:396-452): autoscaler_report + load_metrics_report."""
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


def alive_node_resources() -> list[dict[str, float]]:
    import ray

    return [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]


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
    # reply (ray/autoscaler/v2/sdk.py:82); the raw one also carries the infeasible constraints.
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
