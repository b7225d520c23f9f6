"""The ``own_disk_cluster`` fixture: a real two-node Ray cluster whose GPU worker node has its own disk
(``sweep.testing.local_cluster.OwnDiskCluster``: the head on the driver's disk with no GPU, the worker
inside ``unshare -m`` with a tmpfs over the driver's folder), every node reaching one ``moto_server``
with the fake keys, and ``sweep()``: ``python -m sweep`` on the head's side, as a user runs it there.

Starting it ends every Ray process on the machine (``ray stop --force``): never beside another
Ray cluster test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sweep.testing.local_cluster import OwnDiskCluster, namespace_refused
from sweep.testing.services import s3_environment, start_moto


class OwnDiskSweeps(OwnDiskCluster):
    """The cluster, and sweeps run from the driver's folder."""

    def sweep(self, *overrides: str, name: str, timeout: float = 480, log: Path | None = None):
        """``python -m sweep`` on the head's side, as a user runs it there: its outputs in the driver's
        folder. With ``log``: started in the background, its output in that file (a Popen)."""
        args = [sys.executable, "-m", "sweep", "experiment=demo", "cluster.address=auto", "resources.gpus_per_trial=1",
                f"storage.cache_dir={self.driver / 'cache'}", f"out_dir={self.driver / name}", *overrides]
        if log is not None:
            with log.open("w") as out:
                # its own session: tests.helpers.sweeps.kill_session ends it and nothing else
                return subprocess.Popen(args, env=self.env, cwd=self.driver, stdout=out, stderr=subprocess.STDOUT,
                                        text=True, start_new_session=True)
        return subprocess.run(args, env=self.env, cwd=self.driver, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def own_disk_cluster(tmp_path_factory: pytest.TempPathFactory, tiny_roberta_dir: Path):
    """One cluster for a test module (starting it takes ~20 s): a head, one worker node of 2 CPUs and
    1 (fake) GPU on its own disk; ``env["AWS_ENDPOINT_URL"]`` is the moto_server every node reaches, and
    ``hub`` a stand-in Hugging Face Hub (sweep/testing/hub_repos.py) every node reaches, each node's Hugging
    Face cache in the driver's folder (so the worker's is its own)."""
    from sweep.data.synthetic import write_synthetic_glue
    from sweep.testing.hub_repos import hub_with_sources

    refused = namespace_refused()
    if refused:
        pytest.skip(f"a node with its own disk needs a mount namespace: {refused}")
    root = tmp_path_factory.mktemp("own-disks")
    (root / "driver").mkdir()
    (root / "shared").mkdir()
    moto, server = start_moto(root / "moto.log")
    hub = hub_with_sources(tiny_roberta_dir, write_synthetic_glue(root / "hub-data", ["RTE"], n_train=64, n_dev=32))
    hub_env = {key: value for key, value in hub.env(root / "driver" / "hf-home").items()
               if key.startswith("HF_") and os.environ.get(key) != value}
    cluster = OwnDiskSweeps(root, root / "driver", root / "shared",
                            extra_env={**s3_environment(server.endpoint), **hub_env, "HF_TOKEN": None})
    cluster.hub = hub
    try:
        yield cluster.start()
    finally:
        cluster.stop()
        hub.stop()
        moto.terminate()
        moto.wait(timeout=10)
