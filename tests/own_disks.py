"""A real two-node Ray cluster whose worker node has its own disk: the head started with
``ray start --head`` (no GPU), the worker with ``ray start --address … --num-gpus=1`` inside its own
mount namespace (``unshare -m``), where a tmpfs lies over the driver's folder (out_dir, the sqlite
store, the cache, the driver's data). A file a trial writes there never reaches the driver; only
``shared`` (the cluster's storage path) is seen by both, as S3 or NFS would be on a real cluster.

Starting it ends every Ray process on the machine (``ray stop --force``): never beside another
Ray cluster test. Token authentication is off everywhere (``RAY_AUTH_MODE=disabled``,
docs/architecture.md §6).
"""

from __future__ import annotations

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

import pytest

START_TIMEOUT_S = 120.0
BIN = Path(sys.executable).parent  # the venv's ray, unshare-spawned shells see it first on PATH


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster_env(s3_endpoint: str | None = None) -> dict[str, str]:
    """Every process of the cluster and the driver: token auth off, and (with a moto endpoint) the
    S3 settings a real cluster's pods get from their secret (tests/s3_fixtures.py's fake keys)."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
    if s3_endpoint:
        from s3_fixtures import ACCESS_KEY, SECRET_KEY

        env.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_ENDPOINT_URL=s3_endpoint,
                   AWS_DEFAULT_REGION="us-east-1")
        env.pop("AWS_PROFILE", None)
    return env


def namespace_refused() -> str | None:
    """Why this machine cannot give a process its own mount namespace with a tmpfs (None: it can)."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", "mount -t tmpfs tmpfs /mnt"],
                          capture_output=True, text=True)
    return None if done.returncode == 0 else f"unshare -m refused: {done.stderr.strip()[:200]}"


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


def mount_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


@dataclass
class OwnDiskCluster:
    root: Path
    driver: Path  # hidden from every worker node (each has its own tmpfs over it)
    shared: Path  # seen by every node
    s3_endpoint: str | None = None  # a moto_server every node reaches (cluster.storage_path=s3://…)
    address: str = ""
    workers: dict[str, subprocess.Popen] = field(default_factory=dict)  # node id -> its `unshare … ray start`

    @property
    def env(self) -> dict[str, str]:
        return cluster_env(self.s3_endpoint)

    @property
    def worker_node(self) -> str:
        """The first worker node's id."""
        return next(iter(self.workers))

    def start(self, head_cpus: int = 1, workers: tuple[tuple[int, int], ...] = ((2, 1),),
              system_config: dict | None = None) -> OwnDiskCluster:
        """The head (no GPU, the driver's disk) and one worker node per (CPUs, GPUs), each on its own disk."""
        env = self.env
        subprocess.run(["ray", "stop", "--force"], env=env, capture_output=True)
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
        """Wait for the worker node, and prove its disk is its own: a file it writes in the driver's
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
        assert "written-on-the-worker" in found["seen_there"], found  # the worker sees its own tmpfs
        assert not (self.driver / "written-on-the-worker").exists()  # ... and the driver never sees its file
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
        subprocess.run(["ray", "stop", "--force"], env=self.env, capture_output=True)
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

    def sweep(self, *overrides: str, name: str, timeout: float = 480, log: Path | None = None):
        """``python -m sweep`` on the head's side, as a user runs it there: its outputs in the driver's
        folder. With ``log``: started in the background, its output in that file (a Popen)."""
        args = [sys.executable, "-m", "sweep", "experiment=demo", "cluster.address=auto", "resources.gpus_per_trial=1",
                f"storage.cache_dir={self.driver / 'cache'}", f"out_dir={self.driver / name}", *overrides]
        if log is not None:
            with log.open("w") as out:
                return subprocess.Popen(args, env=self.env, cwd=self.driver, stdout=out, stderr=subprocess.STDOUT,
                                        text=True)
        return subprocess.run(args, env=self.env, cwd=self.driver, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def own_disk_cluster(tmp_path_factory: pytest.TempPathFactory):
    """One cluster for a test module (starting it takes ~20 s)."""
    refused = namespace_refused()
    if refused:
        pytest.skip(f"a node with its own disk needs a mount namespace: {refused}")
    from s3_fixtures import start_moto

    root = tmp_path_factory.mktemp("own-disks")
    (root / "driver").mkdir()
    (root / "shared").mkdir()
    moto, server = start_moto(root / "moto.log")
    cluster = OwnDiskCluster(root, root / "driver", root / "shared", s3_endpoint=server.endpoint)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
        moto.terminate()
        moto.wait(timeout=10)
