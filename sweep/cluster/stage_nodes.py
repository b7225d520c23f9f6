"""Staging on every node: at sweep start one task pinned to each alive node, all in parallel (the driver
itself, when its node is the only one and none can join); later by the first trial on a node that joined
mid-sweep (an autoscaled GPU node).

``sweep_plan.plan_sweep`` runs it before it plans (the plan reads the staged data) and before the
first trial; each trial stages through the same ``stage_here`` (a no-op on a staged node), with
the ``Staging`` value the driver made once: the pins of its preflight, its shipped folders, the
relay. Each node also checks every task's data files (and an LM block size against the staged
model), so a missing file fails the sweep before any trial asks for a GPU. With ``storage=local``
the folders the config names on the driver's machine reach the nodes that do not see them through
Ray's object store
(``sweep.storage.shipping``). Progress lines (downloads, shipped folders, a late node's staging)
reach the driver's terminal through a small actor that lives as long as the sweep (the workers'
own output is not forwarded unless ``cluster.verbose=true``).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import ray
from ray.exceptions import RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from sweep.cluster.connect import alive_nodes, beside_the_driver
from sweep.config.settings import Settings
from sweep.storage.hub_sources import HubPins
from sweep.storage.staging import LocalSources, SourcePins

RELAY_EVERY_S = 2.0  # how often the driver prints the nodes' progress lines while it waits
Shipments = dict[str, tuple[str, Any]]  # config key -> (the folder on the driver, its ObjectRef)


@dataclass(frozen=True)
class Staging:
    """What a node needs to stage the sweep's sources, made once by the driver and passed down."""

    pins: SourcePins | None = None  # storage=s3: the object versions the driver's preflight pinned
    shipments: Shipments | None = None  # storage=local: the driver's folders, for nodes that lack them
    relay: Any = None  # the ProgressRelay actor: the nodes' lines reach the driver's terminal
    hub: HubPins | None = None  # storage=local: the Hub's commits the driver pinned, fetched once per node
    driver_node: str | None = None  # several nodes, ship_to_nodes: a node without the Hub takes the driver's copy
    driver_snapshots: dict[str, str] | None = None  # each Hub pin's uri -> the folder the driver fetched it into


@dataclass(frozen=True)
class NodeStaging:
    node_id: str
    host: str
    downloaded: int  # bytes fetched from S3 on this node by this staging
    seconds: float
    received: int = 0  # bytes of the driver's own folders shipped to this node through Ray
    sources: LocalSources | None = None  # the folders on that node

    def line(self) -> str:
        moved = [f"{n / 2**20:.1f} MiB {how}" for n, how in ((self.downloaded, "downloaded"),
                                                             (self.received, "received from the driver")) if n]
        return f"node {self.node_id[:8]} ({self.host}): {', '.join(moved) or 'already staged'} in {self.seconds:.1f} s"


@ray.remote(num_cpus=0)
class ProgressRelay:
    """Progress lines from the nodes' staging (at the start, and by trials on nodes that join
    later), until the driver takes them."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def post(self, line: str) -> None:
        self.lines.append(line)

    def sync(self) -> None:
        """A caller's no-op: once it returns, every line that caller posted before is here."""

    def take(self) -> list[str]:
        lines, self.lines = self.lines, []
        return lines


def ship_sources(settings: Settings) -> Shipments:
    """On the driver: each folder the config names on this machine, packed once into Ray's object
    store, for the nodes that do not see it (storage.ship_to_nodes=false: none)."""
    from sweep.storage.shipping import driver_folders, pack

    if not settings.storage.ship_to_nodes:
        return {}
    shipments: Shipments = {}
    for key, origin in driver_folders(settings).items():
        started = time.monotonic()
        blob = pack(origin)
        shipments[key] = (origin, ray.put(blob))
        print(f"staging: {key}={origin} ({len(blob) / 2**20:.1f} MiB) packed in {time.monotonic() - started:.1f} s, "
              "for the nodes that do not see it", flush=True)
    return shipments


def receive_sources(settings: Settings, shipments: Shipments | None, where: str,
                    progress: Callable[[str], None] | None = None) -> int:
    """On a node: unpack the driver's folders it lacks into its cache (once); the bytes received.
    A folder it lacks that was not shipped is the one line naming this node."""
    from sweep.storage.shipping import missing_here, unpack
    from sweep.storage.staging import GiB, cache_root, missing_folder_error

    cache = cache_root(settings.storage)
    missing = missing_here(settings, cache)
    unshipped = {key: origin for key, origin in missing.items() if key not in (shipments or {})}
    if unshipped:
        raise missing_folder_error(unshipped, where)
    received = 0
    for key, origin in missing.items():
        blob = ray.get(shipments[key][1])
        unpack(blob, cache, origin, int(settings.storage.max_unpack_gb * GiB))
        received += len(blob)
        if progress is not None:
            progress(f"{key}: {len(blob) / 2**20:.1f} MiB received from the driver")
    return received


def this_node() -> tuple[str, str]:
    """(node id, 'node abcd1234 (ip, host)'): how the lines name the node that runs this code."""
    node = ray.get_runtime_context().get_node_id()
    return node, f"node {node[:8]} ({ray.util.get_node_ip_address()}, {socket.gethostname()})"


def stage_here(settings: Settings, staging: Staging, say: Callable[[str], None] | None = None) -> NodeStaging:
    """This node's sources (shipped, downloaded or already here) and what that took; progress
    lines go to ``say`` (the driver staging its own node) or to the driver through the relay."""
    from sweep.storage.staging import ensure_local

    started = time.monotonic()
    node, where = this_node()
    relay = staging.relay
    say = say or (relay.post.remote if relay is not None else None)
    progress = (lambda line: say(f"node {node[:8]}: {line}")) if say is not None else None
    received = receive_sources(settings, staging.shipments, where, progress)
    other = staging.driver_node not in (None, node)  # the driver's own node has nothing more to give
    fallback = _driver_copy(settings, staging, progress) if other else None
    sources = ensure_local(settings, staging.pins, progress, staging.hub, fallback)
    return NodeStaging(node, socket.gethostname(), sources.downloaded, time.monotonic() - started, received, sources)


def _pack_pin(pin, snapshot: str | None):
    from sweep.storage.hub import pack_pin

    return pack_pin(pin, snapshot)


def _driver_copy(settings: Settings, staging: Staging, progress: Callable[[str], None] | None):
    """A Hub pin this node cannot fetch (no network, no token), taken from the driver's cache through Ray's
    object store instead (storage.ship_to_nodes): the node's cache then holds it as if fetched."""
    from sweep.storage.hub import unpack_pin
    from sweep.storage.staging import GiB

    def take(pin, why) -> None:
        pack = ray.remote(num_cpus=0, max_retries=0)(_pack_pin)
        on_the_drivers_node = NodeAffinitySchedulingStrategy(staging.driver_node, soft=False)
        blob = ray.get(pack.options(scheduling_strategy=on_the_drivers_node)
                       .remote(pin, (staging.driver_snapshots or {}).get(pin.uri)))
        unpack_pin(blob, pin, int(settings.storage.max_unpack_gb * GiB))
        if progress is not None:
            progress(f"{pin.uri}: {len(blob) / 2**20:.1f} MiB received from the driver (this node could not fetch it)")

    return take


def stage_this_node(settings: Settings, staging: Staging, say: Callable[[str], None] | None = None) -> NodeStaging:
    from sweep.storage.staging import check_tasks_here

    staged = stage_here(settings, staging, say)
    check_tasks_here(settings, staged.sources)
    if staging.relay is not None:
        ray.get(staging.relay.sync.remote())  # our lines are in before the driver sees us done
    return staged


def stage_for_trial(settings: Settings, staging: Staging | None) -> LocalSources:
    """A trial's sources: a no-op on a node staged at the start; on a node that joined later (an
    autoscaled GPU node) the staging happens here, and the driver's terminal shows it."""
    staging = staging or Staging()
    staged = stage_here(settings, staging)
    if staging.relay is not None and (staged.downloaded or staged.received):
        staging.relay.post.remote(staged.line())
    return staged.sources


class RelayLines:
    """Prints the lines the nodes posted, at most every RELAY_EVERY_S (a Tune callback's step hook)."""

    def __init__(self, relay) -> None:
        self.relay, self.last = relay, 0.0

    def __call__(self, force: bool = False) -> None:
        if self.relay is None or (not force and time.monotonic() - self.last < RELAY_EVERY_S):
            return
        self.last = time.monotonic()
        for line in ray.get(self.relay.take.remote()):
            print(f"staging: {line}", flush=True)


def stage_all_nodes(settings: Settings, staging: Staging | None = None, here: bool = False) -> list[NodeStaging]:
    """Stage on every alive node at once; the first node's error is raised as itself. Without a
    relay in ``staging`` (a script, a test) one lives for this call. ``here``: the driver's node is the
    only one and none can join (a laptop's local Ray): this process stages it, its lines printed as they
    come; no task, no relay (each a Ray worker process started, ~3 CPU-seconds of a sweep's start)."""
    nodes = [n["NodeID"] for n in alive_nodes()]
    staging = staging or Staging()
    pins = staging.pins
    if pins is not None:  # long downloads: say what is happening before the wait
        sources = [s for s in (pins.model, pins.data) if s is not None]
        what = ", ".join(f"{s.uri} ({s.size / 2**20:.1f} MiB)" for s in sources)
        print(f"staging: {what} on {len(nodes)} node(s)…", flush=True)
    if here:
        staged = stage_this_node(settings, staging, say=lambda line: print(f"staging: {line}", flush=True))
        print(f"staging: {staged.line()}")
        return [staged]
    task = ray.remote(num_cpus=0, max_retries=0)(stage_this_node)
    own_relay = staging.relay is None  # the sweep passes the relay that outlives this (nodes that join later)
    relay = ProgressRelay.options(scheduling_strategy=beside_the_driver()).remote() if own_relay else staging.relay
    staging = replace(staging, relay=relay)
    refs = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
        settings, staging) for node in nodes]
    lines = RelayLines(relay)
    try:
        pending = refs
        while pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=RELAY_EVERY_S)
            lines(force=True)
            ray.get(ready)  # a node that failed stops the wait at once
        results = ray.get(refs)
    except RayTaskError as e:  # the user needs the cause (a missing key, an unsafe archive), not Ray's wrapper
        raise e.cause from None
    finally:
        if own_relay:
            ray.kill(relay)
    for r in results:
        print(f"staging: {r.line()}")
    return results
