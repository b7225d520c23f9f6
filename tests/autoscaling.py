"""A real Ray autoscaler on this machine: ``ray.cluster_utils.AutoscalingCluster`` with the fake
node provider (each "node" is another raylet here; GPUs are fake, logical resources).

Ray's wheel lacks ``autoscaler/_private/fake_multi_node/example.yaml``, which
``AutoscalingCluster.__init__`` reads as its base config (ray/cluster_utils.py:61), so this module
builds the whole config itself (the keys of that example file, ray-project/ray) and hands it over.
``AutoscalingCluster.start()`` runs ``ray stop --force`` and ``ray start --head
--autoscaling-config=...`` as subprocesses (cluster_utils.py:90-131): the venv's ``bin/`` must be
on PATH. Starting or stopping it ends EVERY Ray process on the machine: callers hold
``flock /tmp/ray-machine.lock`` around the test run.

Used by tests/test_autoscale.py (building blocks) and the sweep's autoscaling tests.
"""

from __future__ import annotations

import contextlib
import copy
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

HEAD_TYPE = "ray.head.default"  # the fake provider's head node type (FAKE_HEAD_NODE_TYPE)
GPU_TYPE = "gpu_worker"
VENV_BIN = str(Path(sys.executable).parent)


def gpu_worker_type(max_workers: int = 2, min_workers: int = 0, cpus: int = 1, gpus: int = 1) -> dict:
    """One fake GPU worker node type: ``cpus`` CPU + ``gpus`` (logical) GPU per node."""
    return {
        "resources": {"CPU": cpus, "GPU": gpus},
        "node_config": {},
        "min_workers": min_workers,
        "max_workers": max_workers,
    }


def never_starting_gpu_worker_type(max_workers: int = 2) -> dict:
    """A GPU type the autoscaler tries to launch but whose node never joins: the fake provider starts
    the raylet with a 1 PB object store, which cannot come up (measured: launching 2 for 40 s+, no
    node). For the "no node arrived within cluster.scale_timeout_s" case; the plan still sees a
    1 CPU + 1 GPU type with max ``max_workers``."""
    node_type = gpu_worker_type(max_workers=max_workers)
    node_type["resources"]["object_store_memory"] = 10**15
    return node_type


def cluster_config(head: dict[str, float], worker_types: dict[str, dict], *, max_workers: int | None = None,
                   idle_timeout_minutes: float = 0.1, autoscaler_v2: bool = False) -> dict[str, Any]:
    """The full autoscaling config ``ray start --autoscaling-config`` gets (example.yaml + our types).

    ``idle_timeout_minutes`` 0.1 = 6 s: withdrawn GPU nodes go away quickly in tests.
    """
    types = copy.deepcopy(worker_types)
    types[HEAD_TYPE] = {"resources": dict(head), "node_config": {}, "max_workers": 0}
    config: dict[str, Any] = {
        "cluster_name": "fake_multinode",
        "max_workers": max_workers if max_workers is not None
        else sum(t.get("max_workers", 0) for t in worker_types.values()),
        "provider": {
            "type": "fake_multinode",
            "use_node_id_as_ip": True,
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
        },
        "available_node_types": types,
        "head_node_type": HEAD_TYPE,
        "auth": {},
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": idle_timeout_minutes,
        "docker": {},
        "initialization_commands": [],
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
        "file_mounts": {},
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
    }
    if autoscaler_v2:  # what AutoscalingCluster._generate_config adds for v2 (cluster_utils.py:78-80)
        from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_ID

        config["provider"]["launch_multiple"] = True
        config["provider"]["head_node_id"] = FAKE_HEAD_NODE_ID
    return config


def _ray_env() -> None:
    """``ray`` (the CLI) must be the venv's, for AutoscalingCluster's subprocesses."""
    path = os.environ.get("PATH", "")
    if VENV_BIN not in path.split(os.pathsep):
        os.environ["PATH"] = VENV_BIN + os.pathsep + path


def driver_auth() -> None:
    """Make THIS process speak the cluster's auth mode. ``ray start`` turns token auth on whenever
    ``~/.ray/auth_token`` exists (any earlier local ``ray.init()`` on the machine writes one), but a
    driver joining by an explicit address (``ray.init("host:port")``, a raw ``GcsClient``) does NOT
    auto-enable it (ray/_private/worker.py:1975: only address None/"auto" do), and fails with
    "InvalidAuthToken". Same rule Ray applies for "auto": token present and RAY_AUTH_MODE unset -> token.
    """
    from ray._private.authentication.authentication_token_setup import (
        maybe_enable_token_auth_if_token_available,
    )

    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def ray_stop() -> None:
    subprocess.run([str(Path(VENV_BIN) / "ray"), "stop", "--force"], check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _head_ready(client) -> bool:
    """The head's raylet is alive and the autoscaler has reported once (v1: its status in the KV;
    v2: its state in the GCS, autoscaler_state_version > 0)."""
    from ray._private import ray_constants
    from ray.core.generated.autoscaler_pb2 import GetClusterStatusReply

    if not any(n.state == 0 for n in client.get_all_node_info().values()):  # 0 = ALIVE
        return False
    if client.internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS.encode(), namespace=None):
        return True  # autoscaler v1 (monitor.py writes it every update)
    reply = GetClusterStatusReply()
    reply.ParseFromString(client.get_cluster_status())
    return reply.autoscaling_state.autoscaler_state_version > 0  # autoscaler v2


def _head_address(timeout_s: float) -> str:
    """The GCS address once the head's raylet is alive and the autoscaler has written its status."""
    from ray._private.services import find_gcs_addresses

    deadline = time.monotonic() + timeout_s
    address = None
    while time.monotonic() < deadline:
        found = find_gcs_addresses()
        if found:
            address = sorted(found)[0]
            break
        time.sleep(0.2)
    if address is None:
        raise TimeoutError(f"no Ray head came up within {timeout_s} s")
    from ray._raylet import GcsClient

    client = GcsClient(address=address)
    while time.monotonic() < deadline:
        try:
            if _head_ready(client):
                return address
        except Exception:  # noqa: BLE001 - the GCS is still starting
            pass
        time.sleep(0.3)
    raise TimeoutError(f"the Ray head at {address} did not report alive within {timeout_s} s")


@contextlib.contextmanager
def autoscaling_cluster(head: dict[str, float] | None = None, worker_types: dict[str, dict] | None = None, *,
                        idle_timeout_minutes: float = 0.1, autoscaler_v2: bool = False,
                        start_timeout_s: float = 120, **config_kwargs) -> Iterator[str]:
    """Start the fake autoscaling cluster, yield the head's GCS address, always shut it down.

    Default: head 1 CPU and no GPU (the sweep's driver side), one ``gpu_worker`` type of
    1 CPU + 1 fake GPU per node, 0..2 nodes. The caller connects with ``ray.init(address)``
    (and must ``ray.shutdown()`` before leaving the block).
    """
    from ray.cluster_utils import AutoscalingCluster

    _ray_env()
    head = dict(head if head is not None else {"CPU": 1, "GPU": 0})
    worker_types = worker_types if worker_types is not None else {GPU_TYPE: gpu_worker_type()}
    config = cluster_config(head, worker_types, idle_timeout_minutes=idle_timeout_minutes,
                            autoscaler_v2=autoscaler_v2)
    config.update(config_kwargs)
    # __init__ would read the missing example.yaml: build the object without it.
    cluster = AutoscalingCluster.__new__(AutoscalingCluster)
    cluster._head_resources = dict(head)  # start() pops CPU/GPU from it into --num-cpus/--num-gpus
    cluster._config = config
    cluster._autoscaler_v2 = autoscaler_v2
    try:
        cluster.start()
        driver_auth()
        yield _head_address(start_timeout_s)
    finally:
        try:
            import ray

            if ray.is_initialized():
                ray.shutdown()
        finally:
            try:
                cluster.shutdown()
            finally:
                ray_stop()
