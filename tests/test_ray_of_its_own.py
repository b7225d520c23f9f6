"""Two Ray tests side by side each have a Ray of their own (tests/conftest.py's ``ray_of_its_own``): a plain
``ray.init()`` beside a ``cluster_utils`` cluster (whose head writes /tmp/ray/ray_current_cluster) joins that
cluster unless RAY_ADDRESS says ``local``, which the fixture sets for every ``ray`` test that is not a
``ray_cluster`` one. That is what lets the ``cluster_utils`` tests run beside the local-Ray ones."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.ray]

GCS_OF_A_PLAIN_INIT = ("import ray; ray.init(include_dashboard=False, logging_level='ERROR'); "
                       "print(ray.get_runtime_context().gcs_address)")


def gcs_of_a_plain_init(env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", GCS_OF_A_PLAIN_INIT], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_a_plain_ray_init_beside_a_cluster_utils_cluster_starts_its_own_ray():
    from ray.cluster_utils import Cluster

    from tests.helpers.lanes import RAY_OF_ITS_OWN

    assert os.environ.get("RAY_ADDRESS") == RAY_OF_ITS_OWN  # the fixture's, in this `ray` test
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        without = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        assert gcs_of_a_plain_init(without) == cluster.address  # the hazard: it joins the cluster beside it
        assert gcs_of_a_plain_init(dict(os.environ)) != cluster.address  # with the fixture's: a Ray of its own
    finally:
        cluster.shutdown()
