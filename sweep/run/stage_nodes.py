"""Staging on every node at sweep start: one task pinned to each alive node, all in parallel.

``run_tune`` runs it before it plans (the plan reads the staged data) and before the first trial;
each trial still calls the same
``ensure_local`` (a no-op on a staged node), so a node that joins later stages on first use.
Each node also checks every task's data files (and an LM block size against the staged model), so
a missing file fails the sweep before any trial asks for a GPU. A long download's progress lines
reach the driver's terminal through a small actor (the workers' own output is not forwarded
unless ``cluster.verbose=true``).
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass

import ray
from ray.exceptions import RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from sweep.config import Settings

RELAY_EVERY_S = 2.0  # how often the driver prints the nodes' progress lines while it waits


@dataclass(frozen=True)
class NodeStaging:
    node_id: str
    host: str
    downloaded: int  # bytes fetched from S3 on this node by this staging
    seconds: float


@ray.remote(num_cpus=0)
class ProgressRelay:
    """Progress lines from the nodes' staging tasks, until the driver takes them."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def post(self, line: str) -> None:
        self.lines.append(line)

    def sync(self) -> None:
        """A caller's no-op: once it returns, every line that caller posted before is here."""

    def take(self) -> list[str]:
        lines, self.lines = self.lines, []
        return lines


def stage_this_node(settings: Settings, relay=None) -> NodeStaging:
    from sweep.storage.staging import check_tasks_here, ensure_local

    started = time.monotonic()
    node = ray.get_runtime_context().get_node_id()
    progress = (lambda line: relay.post.remote(f"node {node[:8]}: {line}")) if relay is not None else None
    sources = ensure_local(settings, progress)
    check_tasks_here(settings, sources)
    if relay is not None:
        ray.get(relay.sync.remote())  # our lines are in before the driver sees us done
    return NodeStaging(node, socket.gethostname(), sources.downloaded, time.monotonic() - started)


def stage_all_nodes(settings: Settings) -> list[NodeStaging]:
    """Stage on every alive node at once; the first node's error is raised as itself."""
    task = ray.remote(num_cpus=0, max_retries=0)(stage_this_node)
    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    pins = settings.pins
    if pins is not None:  # long downloads: say what is happening before the wait
        sources = [s for s in (pins.model, pins.data) if s is not None]
        what = ", ".join(f"{s.uri} ({s.size / 2**20:.1f} MiB)" for s in sources)
        print(f"staging: {what} on {len(nodes)} node(s)…", flush=True)
    relay = ProgressRelay.remote() if settings.storage.kind == "s3" else None  # only downloads have progress
    refs = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(settings, relay)
            for node in nodes]
    try:
        pending = refs
        while pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=RELAY_EVERY_S)
            for line in ray.get(relay.take.remote()) if relay is not None else []:
                print(f"staging: {line}", flush=True)
            ray.get(ready)  # a node that failed stops the wait at once
        results = ray.get(refs)
    except RayTaskError as e:  # the user needs the cause (a missing key, an unsafe archive), not Ray's wrapper
        raise e.cause from None
    finally:
        if relay is not None:
            ray.kill(relay)
    for r in results:
        moved = f"{r.downloaded / 2**20:.1f} MiB downloaded" if r.downloaded else "already staged"
        print(f"staging: node {r.node_id[:8]} ({r.host}): {moved} in {r.seconds:.1f} s")
    return results
