"""Joining the cluster (or starting a local Ray) and what it holds now: the one place that lists alive nodes."""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any

from sweep.config.settings import ClusterConfig


def quiet_ray() -> None:
    """Keep the known deprecation and Train-V2 notices out of the user's terminal."""
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    for name in ("ray", "ray.tune", "ray.train", "ray.data"):
        logging.getLogger(name).setLevel(logging.ERROR)


def no_prestarted_workers() -> None:
    """A Ray started from this process (and the processes it starts) prestarts no workers for its first
    driver: Tune gives each trial actor a worker of its own, so those only imported Ray and sat idle, each
    spending CPU for nothing (docs/benchmarks.md: Behind the code's choices). A person's own setting wins."""
    os.environ.setdefault("RAY_prestart_worker_first_driver", "0")


def connect(cluster: ClusterConfig) -> bool:
    """Join the cluster named by cluster.address, or start a local Ray; True: this call started Ray."""
    import ray

    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"log_to_driver": cluster.verbose, "logging_level": logging.ERROR,
                              "configure_logging": True}
    if cluster.address:
        ray.init(address=cluster.address, **kwargs)
    else:
        no_prestarted_workers()
        ray.init(num_cpus=cluster.num_cpus, include_dashboard=False, **kwargs)
    return True


def beside_the_driver():
    """A scheduling strategy for an actor that lives as long as this driver (a progress relay, a rung
    board): on the driver's own node, which a lost or scaled-away worker node cannot take with it."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)


def alive_nodes() -> list[dict[str, Any]]:
    """Ray's record of every alive node (``NodeID``, ``Resources``, ...)."""
    import ray

    return [n for n in ray.nodes() if n.get("Alive")]


def only_the_drivers_node() -> bool:
    """The cluster is one node, the one this driver runs on (the local Ray a laptop starts)."""
    import ray

    nodes = alive_nodes()
    return len(nodes) == 1 and nodes[0]["NodeID"] == ray.get_runtime_context().get_node_id()


def alive_node_resources() -> list[dict[str, float]]:
    """The alive nodes' total resources (CPU, GPU, memory, ...), one dict per node."""
    return [dict(n["Resources"]) for n in alive_nodes()]
