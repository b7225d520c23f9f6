"""What an autoscaling Ray cluster can grow to, in plain Python (no Ray import): ``NodeType``,
``TrialResources``, ``plan_scale`` (how many trials fit now / at the cluster's maximum, which node types
must be launched), ``NodeWait`` (the waiting text and ``ScaleTimeoutError``), ``AutoscalerView`` and
the texts the progress line and the errors use. ``sweep/cluster/autoscale.py`` fills these from a live
cluster.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

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
class TrialResources:
    """What one trial holds: ``workers`` Train workers (DDP when > 1), each ``cpus_per_worker`` CPU and
    ``gpus_per_worker`` GPU, all on one node. Chosen once per task by ``sizes.plan_trials``; the
    autoscaler request, Tune's resource request and the trial itself all read this one value."""

    workers: int
    cpus_per_worker: float
    gpus_per_worker: float = 0.0

    @property
    def in_trial_process(self) -> bool:
        """One worker: the loop runs in the Tune trial's own (reused) process, Train's local mode."""
        return self.workers == 1

    @property
    def process_resources(self) -> dict[str, float]:
        """What the Tune trial's own process asks for. One worker: the trial's CPU/GPU, since the loop
        runs there. DDP: nothing (its Train workers hold the resources); Ray refuses an empty request,
        so 1 MiB of logical memory, and the 2-CPU deadlock of docs/architecture.md §6 cannot happen."""
        if self.in_trial_process:
            return {"CPU": self.cpus_per_worker, "GPU": self.gpus_per_worker}
        return {"CPU": 0, "memory": 2**20}

    @property
    def bundle(self) -> dict[str, float]:
        """One trial as one resource bundle: what a node must hold for it."""
        b = {"CPU": self.cpus_per_worker * self.workers}
        if self.gpus_per_worker > 0:
            b["GPU"] = self.gpus_per_worker * self.workers
        return b


def trials_fit_on(resources: Mapping[str, float], needs: TrialResources) -> int:
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
               alive_counts: Mapping[str, int], needs: TrialResources, wanted: int,
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
                 requested: Iterable[tuple[Mapping[str, float], int]],
                 asked: Iterable[Mapping[str, float]] = ()) -> str:
    """'no node of type gpu_worker arrived within 900 s; pending: 2 x {GPU: 1, CPU: 1}'.

    ``requested``: the standing request as the autoscaler reports it. Its report lags the request (the
    monitor publishes it on its own beat), so when it shows nothing yet the sweep's own ``asked``
    bundles are named instead, and said to be only that."""
    names = " or ".join(sorted(set(type_names))) or "any launchable type"
    pending = format_pending(requested)
    if pending == "nothing" and group_bundles(asked):
        pending = f"{format_pending(group_bundles(asked))} (as this sweep asked; the autoscaler reports none yet)"
    return (f"no node of type {names} arrived within {waited_s:g} s; pending: {pending}; "
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
                 clock: Callable[[], float] = time.monotonic, asked: Iterable[Mapping[str, float]] = ()):
        self.node_types = plan.node_types
        self.asked = [dict(b) for b in asked]  # the bundles this sweep asked the autoscaler for
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
            raise ScaleTimeoutError(timeout_text(missing, self.timeout_s, requested, self.asked))
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


def trial_bundles(needs: TrialResources, trials: int) -> list[dict[str, float]]:
    """What to ask the autoscaler for: one bundle per concurrent trial (a whole trial on one node)."""
    return [dict(needs.bundle) for _ in range(max(trials, 0))]


def node_types_from_config(config: Mapping[str, Any]) -> tuple[list[NodeType], int | None]:
    """The worker node types of a ``ray up`` / ``--autoscaling-config`` cluster config, and its global
    ``max_workers`` (None when absent). The head type is left out unless it may also run as a worker
    (its ``max_workers`` > 0). Per-type defaults as Ray fills them
    (Ray 2.60's ``fill_node_type_min_max_workers``, ray/autoscaler/_private/util.py)."""
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



