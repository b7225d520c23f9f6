"""Each task's GPUs per trial and the dispatch order (sweep/plan/dispatch.py), on hand-computed cases."""

from __future__ import annotations

import pytest

from sweep.errors import ConfigError, ResourceError
from sweep.plan.costs import DataVolume
from sweep.plan.dispatch import ClusterGPUs, OnCpu, cluster_gpus, dispatch
from sweep.plan.makespan import TrialWork
from sweep.plan.scale import AutoscalerView, NodeType
from sweep.plan.sizes import plan_trials
from tests.helpers.configs import demo_settings

LONG, SHORT = 100.0, 10.0  # one-GPU seconds of an A trial and of a B trial


def ab_trials() -> list[TrialWork]:
    """Config order puts the short task first: B (2 seeds of 10 s), then A (1 seed of 100 s)."""
    return [TrialWork("WNLI", 1, SHORT), TrialWork("WNLI", 2, SHORT), TrialWork("RTE", 1, LONG)]


def settings(*overrides: str):
    return demo_settings("task=[WNLI,RTE]", *overrides)


def test_cluster_gpus_count_alive_nodes_and_what_the_autoscaler_may_launch():
    view = AutoscalerView("v2", (NodeType("gpu", {"CPU": 8, "GPU": 4}, 0, 3), NodeType("cpu", {"CPU": 8}, 0, 5)),
                          None, "test", {"gpu": 1})
    assert cluster_gpus([{"CPU": 2}, {"CPU": 8, "GPU": 4}], view) == ClusterGPUs(total=4 + 2 * 4, per_node=4)
    assert cluster_gpus([{"CPU": 2}]) == ClusterGPUs(0, 0)
    unlimited = AutoscalerView("v2", (NodeType("gpu", {"GPU": 1}, 0, -1),), None, "test", {})
    assert cluster_gpus([], unlimited, wanted=6) == ClusterGPUs(6, 1)


def test_longest_first_whatever_the_config_order():
    chosen = dispatch(settings("resources.gpus_per_trial=1"), ab_trials(), ClusterGPUs(2, 2))
    assert [(t.task, t.seed) for t in chosen.order] == [("RTE", 1), ("WNLI", 1), ("WNLI", 2)]
    # A on GPU 0 for 100 s, both B trials one after the other on GPU 1: makespan 100 s
    assert chosen.plan.makespan == pytest.approx(LONG)
    # the bound: to end before 100 s, A needs both GPUs (100 / 1.9 s, holding 2 x 100 / 1.9 GPU-s),
    # so no plan ends before (200 / 1.9 + 2 x 10) / 2 = 62.6 s (the loose bound says 60 s)
    assert chosen.plan.lower_bound == pytest.approx((2 * LONG / 1.9 + 2 * SHORT) / 2)


def test_auto_gives_the_long_task_both_gpus_when_that_finishes_sooner():
    """On 2 GPUs: A alone on 1 GPU ends at 100 s; A on 2 GPUs (DDP, 0.9 efficiency) ends at 100/1.9 =
    52.6 s, then the two B trials run side by side for 10 s: 62.6 s. auto picks the latter."""
    chosen = dispatch(settings("resources.gpus_per_trial=auto"), ab_trials(), ClusterGPUs(2, 2))
    assert chosen.gpus == {"RTE": 2.0, "WNLI": 1.0}
    assert chosen.plan.makespan == pytest.approx(LONG / 1.9 + SHORT)
    assert chosen.order[0].task == "RTE"
    assert any("RTE" in line and "x 2 GPU" in line for line in chosen.describe())


def test_a_task_of_its_own_size_keeps_it_under_auto():
    chosen = dispatch(settings("resources.gpus_per_trial=auto", "+resources.tasks.RTE.gpus_per_trial=1",
                               "+resources.tasks.WNLI.gpus_per_trial=0.5"), ab_trials(), ClusterGPUs(2, 2))
    assert chosen.gpus == {"RTE": 1.0, "WNLI": 0.5}
    # B trials at half a GPU take 20 s each, side by side on GPU 1, while A runs 100 s on GPU 0
    assert chosen.plan.makespan == pytest.approx(LONG)


def test_a_cpu_cluster_orders_but_predicts_no_makespan():
    chosen = dispatch(settings("resources.gpus_per_trial=auto"), ab_trials(), ClusterGPUs(0, 0))
    assert chosen.plan is None and chosen.gpus == {"RTE": 0.0, "WNLI": 0.0}
    assert [t.task for t in chosen.order] == ["RTE", "WNLI", "WNLI"]
    assert "no GPU in the cluster" in chosen.describe()[0]


def test_a_cpu_plan_says_cpu_and_how_many_at_once_and_never_a_gpu_figure():
    """The first user's plan said 'RTE 2 trials ~3s each on one GPU' on a machine without one, trials
    taking 111 s, and counted 2,490 rows with max_train_samples=500."""
    chosen = dispatch(settings(), ab_trials(), ClusterGPUs(0, 0))  # gpus_per_trial=1 on a CPU cluster
    sizes = {"RTE": DataVolume("RTE", 2490, 52.0, eval_rows=(277,)),
             "WNLI": DataVolume("WNLI", 635, 30.0, eval_rows=(71,))}
    train = settings("train.max_train_samples=500").train  # train=quick: 4 epochs, batch 16, eval 128 rows
    far = chosen.describe(sizes, 22_700_000, train, OnCpu(2, 1.0, None, "the trials run on the cluster's nodes"))
    text = "\n".join(far)
    assert "3 trials on CPU, 2 at once (1 CPU each)" in text and "no estimate on CPU: the trials run" in text
    assert "RTE 500 of 2,490 rows x 52 tokens, 4 evals x 128 rows" in text and "WNLI 500 of 635 rows" in text
    assert "GPU" not in text and "~" not in text  # no figure at all
    here = chosen.describe(sizes, 22_700_000, train, OnCpu(2, 1.0, 230.0, "training measured here: ..."))
    assert "GPU" not in "\n".join(here)
    assert here[-1] == "predicted makespan 3m50s (training measured here: ...)"
    assert any(line.startswith("RTE") and "each in training" in line for line in here)


def test_a_cpu_task_beside_gpu_ones_gets_no_gpu_figure():
    chosen = dispatch(settings("+resources.tasks.WNLI.gpus_per_trial=0"), ab_trials(), ClusterGPUs(2, 2))
    lines = chosen.describe()
    assert any(line.startswith("WNLI") and "on CPU (no estimate on CPU)" in line for line in lines)
    assert any(line.startswith("RTE") and "on one GPU" in line for line in lines)


def test_per_task_sizes_reach_the_trial_plan_with_their_key_in_errors():
    s = settings("+resources.tasks.RTE.gpus_per_trial=2", "+resources.tasks.RTE.cpus_per_trial=3")
    nodes = [{"CPU": 8, "GPU": 2}]
    rte, wnli = plan_trials(s, nodes, task="RTE"), plan_trials(s, nodes, task="WNLI")
    assert (rte.size.workers, rte.size.gpus_per_worker, rte.size.cpus_per_worker) == (2, 1.0, 3.0)
    assert (wnli.size.workers, wnli.size.gpus_per_worker, wnli.size.cpus_per_worker) == (1, 1.0, 1.0)
    with pytest.raises(ResourceError, match=r"RTE: 2 worker\(s\).*lower resources.tasks.RTE.gpus_per_trial"):
        plan_trials(s, [{"CPU": 8, "GPU": 1}], task="RTE")


@pytest.mark.parametrize("override, message", [
    ("+resources.tasks.RTEE.gpus_per_trial=2", "resources.tasks.RTEE: there is no task 'RTEE'"),
    ("resources.gpus_per_trial=lots", 'resources.gpus_per_trial: must be a number of GPUs or "auto"'),
    ("+resources.tasks.RTE.gpus_per_trial=1.5", "resources.tasks.RTE.gpus_per_trial: above 1 must be a whole number"),
    ("+resources.tasks.RTE.cpus_per_trial=0", "resources.tasks.RTE.cpus_per_trial: must be > 0"),
])
def test_bad_task_resources_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        settings(override)
