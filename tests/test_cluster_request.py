"""One standing autoscaler request per cluster, the sum of every sweep's (sweep/cluster/request.py).

Ray keeps one ``request_resources`` per cluster, so two sweeps that each called it would replace and
clear each other's. The plain book and the keeper's logic are tested without Ray; the slow test runs
the real keeper actor on a local Ray and reads the request Ray stores (autoscaler v1's KV key).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from sweep.cluster import request as cluster_request
from sweep.cluster.request import RequestBook, RequestKeeper

GPU = {"CPU": 1.0, "GPU": 1.0}
CPU = {"CPU": 4.0}


def test_the_book_sums_every_sweeps_bundles_and_a_sweep_replaces_only_its_own():
    book = RequestBook()
    book.set("a", "job1", [GPU, GPU])
    book.set("b", "job2", [CPU])
    assert book.standing() == [GPU, GPU, CPU]
    book.set("a", "job1", [GPU])  # the same sweep asking again replaces its part
    assert book.standing() == [GPU, CPU]
    assert book.drop("a") and not book.drop("a")
    assert book.standing() == [CPU] and book.sweeps() == ["b"]


def test_the_book_prunes_sweeps_whose_job_is_dead():
    book = RequestBook()
    book.set("a", "job1", [GPU])
    book.set("b", "job2", [GPU])
    assert book.prune({"job2"}) == ["a"]
    assert book.standing() == [GPU] and len(book) == 1


class FakeCluster:
    """What the keeper talks to: the request it last set, and which jobs are alive."""

    def __init__(self):
        self.requests: list[list[dict]] = []
        self.live = {"job1", "job2"}

    @property
    def standing(self):
        return self.requests[-1]


def keeper(cluster: FakeCluster, prune_every_s=None) -> RequestKeeper:
    return RequestKeeper(apply=cluster.requests.append, live_jobs=lambda: set(cluster.live),
                         prune_every_s=prune_every_s)


def test_two_sweeps_never_replace_or_clear_each_others_request():
    cluster = FakeCluster()
    k = keeper(cluster)
    k.set("a", "job1", [GPU, GPU])
    k.set("b", "job2", [GPU, GPU])
    assert cluster.standing == [GPU] * 4  # Ray alone would hold only b's two
    assert k.drop("a") == 1
    assert cluster.standing == [GPU, GPU]  # a's withdrawal leaves b's part standing
    assert k.drop("b") == 0
    assert cluster.standing == []  # the last one out clears it


def test_a_dead_drivers_part_is_dropped_at_the_next_change_and_by_the_timer():
    cluster = FakeCluster()
    k = keeper(cluster)
    k.set("a", "job1", [GPU])
    cluster.live.discard("job1")  # driver SIGKILLed: never withdrew
    k.set("b", "job2", [CPU])
    assert cluster.standing == [CPU]

    cluster = FakeCluster()
    k = keeper(cluster, prune_every_s=0.05)
    k.set("a", "job1", [GPU])
    k.set("b", "job2", [CPU])
    cluster.live.discard("job2")
    deadline = time.monotonic() + 5
    while cluster.standing != [GPU] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cluster.standing == [GPU] and k.sweeps() == ["a"]


def test_the_sweeps_part_is_withdrawn_on_error_and_ctrl_c(monkeypatch):
    calls = []
    monkeypatch.setattr(cluster_request, "ask",
                        lambda sweep_id, bundles: calls.append(("ask", sweep_id, list(bundles))))
    monkeypatch.setattr(cluster_request, "withdraw", lambda sweep_id: calls.append(("withdraw", sweep_id)))
    for error in (RuntimeError("trial failed"), KeyboardInterrupt()):
        calls.clear()
        with pytest.raises(type(error)):
            with cluster_request.request_trial_resources("s1", [GPU, GPU]):
                raise error
        assert calls == [("ask", "s1", [GPU, GPU]), ("withdraw", "s1")]
    calls.clear()
    with cluster_request.request_trial_resources("s1", []):
        pass
    assert calls == []  # nothing asked, nothing to withdraw


# ---------------------------------------------------------------------------------------------
# the real keeper actor (one local Ray: autoscaler v1 keeps the request in a KV key)
# ---------------------------------------------------------------------------------------------

def _stored_request() -> list[dict]:
    from ray.autoscaler._private.constants import AUTOSCALER_RESOURCE_REQUEST_CHANNEL
    from ray.experimental.internal_kv import _internal_kv_get

    raw = _internal_kv_get(AUTOSCALER_RESOURCE_REQUEST_CHANNEL)
    return json.loads(raw) if raw else []


# A second driver (its own Ray job) asks for one GPU bundle and dies without withdrawing. It joins this test's
# Ray by its address: another test's local Ray may run beside it, and "auto" could join that one.
DYING_DRIVER = """
import os, ray
from sweep.cluster import request as cluster_request
ray.init(address=os.environ["SWEEP_TEST_RAY_ADDRESS"], logging_level="ERROR", log_to_driver=False)
cluster_request.ask("dead-sweep", [{"GPU": 1.0}])
os._exit(0)
"""


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_keeper_holds_the_sum_on_a_real_cluster_and_goes_when_the_last_sweep_leaves():
    import ray

    ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        with cluster_request.request_trial_resources("sweep-1", [GPU, GPU]):
            assert _stored_request() == [GPU, GPU]
            env = {**os.environ, "SWEEP_TEST_RAY_ADDRESS": ray.get_runtime_context().gcs_address}
            subprocess.run([sys.executable, "-c", DYING_DRIVER], check=True, timeout=120, env=env)
            assert _stored_request() == [GPU, GPU, {"GPU": 1.0}]  # the other driver's part added, not replacing
            with cluster_request.request_trial_resources("sweep-2", [CPU]):
                # the dead driver's part went at this change; both live sweeps' parts stand
                assert _stored_request() == [GPU, GPU, CPU]
            assert _stored_request() == [GPU, GPU]  # sweep-2's withdrawal left sweep-1's part
        assert _stored_request() == []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                ray.get_actor(cluster_request.KEEPER_NAME, namespace=cluster_request.KEEPER_NAMESPACE)
            except ValueError:
                break  # the last sweep out ended the keeper
            time.sleep(0.2)
        else:
            pytest.fail("the keeper is still alive after the last sweep withdrew")
    finally:
        ray.shutdown()


def test_a_ray_started_here_prestarts_no_idle_workers_unless_a_person_says(monkeypatch):
    from sweep.cluster.connect import no_prestarted_workers

    monkeypatch.delenv("RAY_prestart_worker_first_driver", raising=False)
    no_prestarted_workers()
    assert os.environ["RAY_prestart_worker_first_driver"] == "0"
    monkeypatch.setenv("RAY_prestart_worker_first_driver", "1")
    no_prestarted_workers()
    assert os.environ["RAY_prestart_worker_first_driver"] == "1"
