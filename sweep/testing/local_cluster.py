"""Multi-node Ray clusters on one machine, for the tests and the scripts (chaos.py, bench_autoscale.py).

Two kinds, both real Ray processes:

- ``OwnDiskCluster``: a head started with ``ray start --head`` (no GPU) and worker nodes that each
  run ``ray start --address …`` inside their own mount namespace (``unshare -m``), where a tmpfs
  lies over the driver's folder (out_dir, the sqlite store, the cache, the driver's data). A file a
  trial writes there never reaches the driver; only ``shared`` (the cluster's storage path) is seen
  by both, as S3 or NFS would be on a real cluster. Token authentication is off in every process
  (``RAY_AUTH_MODE=disabled``, docs/architecture.md §6).
- ``autoscaling_cluster``: a real Ray autoscaler, ``ray.cluster_utils.AutoscalingCluster`` with the
  fake node provider (each "node" is another raylet here; GPUs are fake, logical resources).
  Ray's wheel lacks ``autoscaler/_private/fake_multi_node/example.yaml``, which
  ``AutoscalingCluster.__init__`` reads as its base config (Ray 2.60's ``_generate_config``, ray/cluster_utils.py), so
  ``cluster_config`` builds the whole config itself (the keys of that example file, ray-project/ray).
  ``AutoscalingCluster.start()`` runs ``ray stop --force`` and ``ray start --head
  --autoscaling-config=...`` as subprocesses (ray/cluster_utils.py): the venv's ``bin/`` must be
  on PATH (done here).

Starting or stopping either ends EVERY Ray process on the machine (``ray stop --force``): never
beside another Ray cluster. Ray is imported inside the functions only: importing this module is cheap.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

VENV_BIN = Path(sys.executable).parent  # the venv's ray: subprocesses (and unshare-spawned shells) see it first
START_TIMEOUT_S = 120.0


def free_port() -> int:
    """A TCP port of 127.0.0.1 nothing listens on right now (for a head, a server, a stand-in service)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_stop(env: dict[str, str] | None = None) -> None:
    """``ray stop --force`` with the venv's ray: every Ray process on the machine ends."""
    subprocess.run([str(VENV_BIN / "ray"), "stop", "--force"], check=False, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# ---------------------------------------------------------------- nodes with their own disks


def namespace_refused() -> str | None:
    """Why this machine cannot give a process its own mount namespace with a tmpfs (None: it can)."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", "mount -t tmpfs tmpfs /mnt"],
                          capture_output=True, text=True)
    return None if done.returncode == 0 else f"unshare -m refused: {done.stderr.strip()[:200]}"


def mount_namespace(pid: int) -> str | None:
    """Process ``pid``'s mount namespace (None: gone); a worker node's processes share one of their own."""
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


_PROBE = """
import json, os, sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
worker = next(n for n in ray.nodes() if n["Alive"] and n["Resources"].get(sys.argv[3], 0) > 0)
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as On
def write(folder):
    open(os.path.join(folder, "written-on-the-worker"), "w").write("x")
    return sorted(os.listdir(folder))
there = On(worker["NodeID"], soft=False)
seen = ray.get(ray.remote(num_cpus=0)(write).options(scheduling_strategy=there).remote(sys.argv[2]))
print(json.dumps({"worker": worker["NodeID"], "seen_there": seen}))
"""


@dataclass
class OwnDiskCluster:
    """A head on this machine's disk and worker nodes on their own (see the module's docstring)."""

    root: Path  # the nodes' logs
    driver: Path  # hidden from every worker node (each has its own tmpfs over it)
    shared: Path  # seen by every node
    # on top of this process's environment, for every node and the driver (e.g. an S3 endpoint and its
    # keys); a value None removes that variable
    extra_env: dict[str, str | None] = field(default_factory=dict)
    address: str = ""
    workers: dict[str, subprocess.Popen] = field(default_factory=dict)  # node id -> its `unshare … ray start`

    @property
    def env(self) -> dict[str, str]:
        """Every process of the cluster and the driver: token auth off, the venv's bin/ first on PATH."""
        env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}"}
        for key, value in self.extra_env.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    @property
    def worker_node(self) -> str:
        """The first worker node's id."""
        return next(iter(self.workers))

    def start(self, head_cpus: int = 1, workers: tuple[tuple[int, int], ...] = ((2, 1),),
              system_config: dict | None = None) -> OwnDiskCluster:
        """The head (no GPU, the driver's disk) and one worker node per (CPUs, GPUs), each on its own disk."""
        env = self.env
        ray_stop(env)
        port = free_port()
        self.address = f"127.0.0.1:{port}"
        extra = [f"--system-config={json.dumps(system_config)}"] if system_config else []
        subprocess.run(["ray", "start", "--head", f"--port={port}", f"--num-cpus={head_cpus}", "--num-gpus=0",
                        "--include-dashboard=false", "--disable-usage-stats", *extra], env=env, check=True,
                       capture_output=True)
        for cpus, gpus in workers:
            self.add_worker(cpus, gpus)
        return self

    def add_worker(self, cpus: int = 1, gpus: int = 0, env: dict[str, str] | None = None) -> str:
        """A worker node in its own mount namespace, a tmpfs over the driver's folder; its node id once it joined."""
        tag = f"own_disk_{len(self.workers)}_{time.monotonic_ns()}"  # finds this node among the others
        hide = f"mount -t tmpfs tmpfs {self.driver}"
        join = (f"exec ray start --address={self.address} --num-cpus={cpus} --num-gpus={gpus} "
                f"--resources='{json.dumps({tag: 1})}' --disable-usage-stats --block")
        log = (self.root / f"{tag}.log").open("w")
        proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", f"{hide} && {join}"],
                                env={**self.env, **(env or {})}, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        node = self._probe(tag, proc)
        self.workers[node] = proc
        return node

    def _probe(self, tag: str, proc: subprocess.Popen) -> str:
        """Wait for the worker node, and check its disk is its own: a file it writes in the driver's
        folder is there for it and not here."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            done = subprocess.run([sys.executable, "-c", _PROBE, self.address, str(self.driver), tag], env=self.env,
                                  capture_output=True, text=True, timeout=120)
            found = (json.loads(done.stdout.strip().splitlines()[-1])
                     if done.returncode == 0 and done.stdout.strip() else None)
            if found is not None:
                break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"worker node did not join: {done.stderr[-2000:]}\n"
                                   f"{(self.root / f'{tag}.log').read_text()[-2000:]}")
            time.sleep(2)
        if "written-on-the-worker" not in found["seen_there"] or (self.driver / "written-on-the-worker").exists():
            raise RuntimeError(f"worker node {found['worker'][:8]} shares the driver's disk at {self.driver}: "
                               f"it sees {found['seen_there']}")
        return found["worker"]

    def kill_node_of(self, pid: int) -> bool:
        """The worker node that runs process ``pid`` dies at once (raylet, workers, everything in its
        mount namespace), as a lost machine; False when ``pid`` runs on the head or is gone."""
        namespace = mount_namespace(pid)
        if namespace is None or namespace == mount_namespace(os.getpid()):
            return False
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and mount_namespace(int(entry.name)) == namespace:
                try:
                    os.kill(int(entry.name), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        return True

    def stop(self) -> None:
        ray_stop(self.env)
        for proc in self.workers.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def remove_worker(self, node: str) -> None:
        """Worker node ``node`` leaves the cluster at once (every process on its disk ends)."""
        proc = self.workers.pop(node)
        proc.terminate()  # `ray start --block` ends its raylet, which tells the head it leaves
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill_node_of(proc.pid)
            proc.wait()
        deadline = time.monotonic() + START_TIMEOUT_S
        while node in self.alive_nodes():
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {node[:8]} still alive {START_TIMEOUT_S:.0f} s after it was stopped")
            time.sleep(1)

    def alive_nodes(self) -> list[str]:
        code = ("import json, sys, ray; ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False); "
                "print(json.dumps([n['NodeID'] for n in ray.nodes() if n['Alive']]))")
        done = subprocess.run([sys.executable, "-c", code, self.address], env=self.env, capture_output=True, text=True,
                              timeout=120, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- the fake-provider autoscaling cluster

HEAD_TYPE = "ray.head.default"  # the fake provider's head node type (FAKE_HEAD_NODE_TYPE)
GPU_TYPE = "gpu_worker"


def gpu_worker_type(max_workers: int = 2, min_workers: int = 0, cpus: int = 1, gpus: int = 1) -> dict:
    """One fake GPU worker node type: ``cpus`` CPU + ``gpus`` (logical) GPU per node."""
    return {
        "resources": {"CPU": cpus, "GPU": gpus},
        "node_config": {},
        "min_workers": min_workers,
        "max_workers": max_workers,
    }


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
    if autoscaler_v2:  # what AutoscalingCluster._generate_config adds for v2 (Ray 2.60, ray/cluster_utils.py)
        from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_ID

        config["provider"]["launch_multiple"] = True
        config["provider"]["head_node_id"] = FAKE_HEAD_NODE_ID
    return config


def _ray_on_path() -> None:
    """``ray`` (the CLI) must be the venv's, for AutoscalingCluster's subprocesses."""
    path = os.environ.get("PATH", "")
    if str(VENV_BIN) not in path.split(os.pathsep):
        os.environ["PATH"] = str(VENV_BIN) + os.pathsep + path


def driver_auth() -> None:
    """Make THIS process speak the cluster's auth mode. ``ray start`` turns token auth on whenever
    ``~/.ray/auth_token`` exists (any earlier local ``ray.init()`` on the machine writes one), but a
    driver joining by an explicit address (``ray.init("host:port")``, a raw ``GcsClient``) does NOT
    auto-enable it (Ray 2.60's ``ray.init``, ray/_private/worker.py: only address None/"auto" do), and fails with
    "InvalidAuthToken". Same rule Ray applies for "auto": token present and RAY_AUTH_MODE unset -> token.
    """
    from ray._private.authentication.authentication_token_setup import (
        maybe_enable_token_auth_if_token_available,
    )

    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


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

    _ray_on_path()
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
