"""Per-trial resources and concurrency, derived from the cluster's nodes (no Ray needed)."""

from __future__ import annotations

import pytest

from sweep.config.validate import validate
from sweep.errors import ConfigError, ResourceError
from sweep.plan.scale import AutoscalerView, NodeType
from sweep.plan.sizes import plan_trials, storage_path, trial_count
from tests.helpers.configs import demo_config


def settings(*overrides: str):
    return validate(demo_config(*overrides))


TWO_BY_TWO_GPU = [{"CPU": 8, "GPU": 2}, {"CPU": 8, "GPU": 2}]


def test_one_gpu_per_trial_packs_four_on_two_two_gpu_nodes():
    plan = plan_trials(settings("resources.gpus_per_trial=1"), TWO_BY_TWO_GPU)
    assert (plan.size.workers, plan.size.gpus_per_worker, plan.max_concurrent) == (1, 1.0, 4)


def test_half_gpu_packs_eight():
    assert plan_trials(settings("resources.gpus_per_trial=0.5"), TWO_BY_TWO_GPU).max_concurrent == 8


def test_two_gpus_is_ddp_with_two_workers_on_one_node():
    plan = plan_trials(settings("resources.gpus_per_trial=2"), TWO_BY_TWO_GPU)
    assert (plan.size.workers, plan.size.gpus_per_worker, plan.max_concurrent) == (2, 1.0, 2)


def test_impossible_request_is_an_error_naming_the_largest_node():
    with pytest.raises(ResourceError, match=r"one trial needs 3 worker\(s\) x \(1 CPU, 1 GPU\) on one node, "
                                            r"but the largest node has 8 CPU and 2 GPU"):
        plan_trials(settings("resources.gpus_per_trial=3"), TWO_BY_TWO_GPU)


def test_cpus_bound_concurrency_and_the_driver_holds_none():
    # 2 CPUs, 1 CPU per trial: two trials, never the deadlock of a driver CPU + a worker CPU each
    plan = plan_trials(settings("resources.gpus_per_trial=0", "resources.cpus_per_trial=1"), [{"CPU": 2}])
    assert plan.max_concurrent == 2 and plan.warning is None
    with pytest.raises(ResourceError, match="lower resources.gpus_per_trial / resources.cpus_per_trial"):
        plan_trials(settings("resources.gpus_per_trial=0", "resources.cpus_per_trial=4"), [{"CPU": 2}])


def test_no_gpu_in_the_cluster_falls_back_to_cpu_with_a_warning():
    plan = plan_trials(settings("resources.gpus_per_trial=1"), [{"CPU": 2}])
    assert plan.size.gpus_per_worker == 0 and plan.max_concurrent == 2
    assert "has no GPU: trials run on CPU" in plan.warning


def test_trial_count_is_tasks_seeds_grid_samples():
    s = settings("task=[WNLI,RTE]", "sweep.seeds=[1,2,3]", "+sweep.grid.lr=[1e-3,2e-3]", "sweep.num_samples=2")
    assert trial_count(s) == 2 * 3 * 2 * 2


def test_multi_node_without_shared_storage_says_what_to_set(tmp_path):
    with pytest.raises(ResourceError, match="cluster.storage_path: this Ray cluster has 3 nodes"):
        storage_path(settings().cluster, tmp_path, node_count=3)
    # a local folder on several nodes: only when the user says every node mounts it
    with pytest.raises(ResourceError, match=r"cluster.storage_path=.*: a folder on this machine, but this Ray cluster "
                                            r"has 3 nodes.*cluster.shared_storage=true"):
        storage_path(settings(f"cluster.storage_path={tmp_path}").cluster, tmp_path / "x", 3)
    shared = settings(f"cluster.storage_path={tmp_path}", "cluster.shared_storage=true")
    assert storage_path(shared.cluster, tmp_path / "x", 3) == str(tmp_path)
    assert storage_path(settings("cluster.storage_path=s3://b/p").cluster, tmp_path, 3) == "s3://b/p"
    assert storage_path(settings().cluster, tmp_path, 1) == str(tmp_path / "ray")


def test_a_cluster_that_can_grow_needs_storage_every_node_reaches(tmp_path):
    """A head alone whose autoscaler can launch workers (KubeRay from minReplicas 0) is many nodes."""
    grows = AutoscalerView(None, (NodeType("gpu-workers", {"CPU": 8, "GPU": 1}, 0, 4),), None, "test")
    with pytest.raises(ResourceError, match="this Ray cluster can launch nodes of type gpu-workers"):
        storage_path(settings().cluster, tmp_path, 1, grows)
    with pytest.raises(ResourceError, match="a folder on this machine"):
        storage_path(settings(f"cluster.storage_path={tmp_path}").cluster, tmp_path, 1, grows)
    declared = settings("+cluster.node_types=[{name:gpu,resources:{GPU:1},max_workers:2}]")
    with pytest.raises(ResourceError, match=r"can launch nodes of type gpu \(cluster.node_types\)"):
        storage_path(declared.cluster, tmp_path, 1)
    never = AutoscalerView(None, (NodeType("gpu-workers", {"GPU": 1}, 0, 0),), None, "test")  # max 0: it never launches
    assert storage_path(settings().cluster, tmp_path, 1, never) == str(tmp_path / "ray")


@pytest.mark.parametrize("override, expected", [
    ("+sweep.grid.learning_rate=[1]", "sweep.grid.learning_rate: is not a train option; tunable: lr,"),
    ("+sweep.grid.lr=[-1]", "sweep.grid.lr: value -1: train.lr: must be > 0"),
    ("+sweep.grid.lr=[]", "sweep.grid.lr: needs a non-empty list"),
    ("+sweep.search.lr={dist:normal}", "sweep.search.lr.dist: got 'normal', allowed: loguniform, uniform, choice"),
    ("+sweep.search.lr={dist:loguniform,low:0,high:1}",
     "sweep.search.lr: needs numbers low < high (both > 0 for loguniform)"),
    ("sweep.scheduler=hyperband", "sweep.scheduler: got 'hyperband', allowed: fifo, asha, seed_halving"),
    ("sweep.max_failures=-1", "sweep.max_failures: must be >= 0"),
    ("sweep.halving.at=1.5", "sweep.halving.at: must be a fraction of training in (0, 1)"),
    ("sweep.halving.at=0", "sweep.halving.at: must be a fraction of training in (0, 1)"),
    ("sweep.halving.keep=2.5",
     "sweep.halving.keep: must be a whole number of trials per task (>= 1) or a share in (0, 1)"),
    ("sweep.halving.keep=0", "sweep.halving.keep: must be a whole number"),
    ("sweep.scheduler=seed_halving resources.gpus_per_trial=2",
     "sweep.scheduler: seed_halving cannot pause the multi-GPU (DDP) trials of WNLI"),
])
def test_bad_sweep_options(override, expected):
    with pytest.raises(ConfigError) as e:
        settings(*override.split())
    assert str(e.value).startswith(expected), str(e.value)


def test_seed_halving_refuses_the_ddp_trials_an_auto_plan_chose():
    """validate cannot know what gpus_per_trial=auto becomes; the tuner asks the same check again
    with the plan's shares, before any trial."""
    from sweep.config.validate import check_halving_trials

    s = settings("sweep.scheduler=seed_halving", "resources.gpus_per_trial=auto")  # passes validate
    check_halving_trials(s, {"WNLI": 1.0})
    with pytest.raises(ConfigError, match=r"^sweep.scheduler: seed_halving cannot pause the multi-GPU \(DDP\) "
                                          r"trials of WNLI; give them 1 GPU"):
        check_halving_trials(s, {"WNLI": 2.0})
    check_halving_trials(settings("sweep.scheduler=asha", "resources.gpus_per_trial=auto"), {"WNLI": 2.0})


# ---- an autoscaling cluster: what it can launch counts, GPU trials never silently become CPU ----

def _view(*types, alive_counts=None):
    from sweep.plan.scale import AutoscalerView

    return AutoscalerView("v1", tuple(types), None, "test", dict(alive_counts or {}))


def _gpu_type(max_workers: int):
    from sweep.plan.scale import NodeType

    return NodeType("gpu_worker", {"CPU": 1, "GPU": 1}, 0, max_workers)


HEAD_ONLY = [{"CPU": 2}]


def test_gpu_trials_wait_for_the_gpu_nodes_the_autoscaler_can_launch():
    plan = plan_trials(settings("resources.gpus_per_trial=1", "cluster.address=auto"), HEAD_ONLY,
                       _view(_gpu_type(2)), wanted=4)
    assert (plan.size.gpus_per_worker, plan.max_concurrent, plan.warning) == (1.0, 2, None)
    assert plan.scale.to_launch == {"gpu_worker": 2}
    assert plan.waiting == "waiting for 2 GPU node(s) (type gpu_worker) from the autoscaler"


def test_nodes_already_up_count_against_the_group_maximum():
    plan = plan_trials(settings("resources.gpus_per_trial=1", "cluster.address=auto"),
                       [*HEAD_ONLY, {"CPU": 1, "GPU": 1}], _view(_gpu_type(2), alive_counts={"gpu_worker": 1}),
                       wanted=4)
    assert plan.max_concurrent == 2 and plan.scale.to_launch == {"gpu_worker": 1}


def test_a_joined_cluster_that_can_never_have_a_gpu_is_an_error_that_says_how_to_run_on_cpu():
    for view in (_view(_gpu_type(0)), None):
        with pytest.raises(ResourceError, match=r"has no GPU node and its autoscaler can launch none.*"
                                                r"resources\.gpus_per_trial=0"):
            plan_trials(settings("resources.gpus_per_trial=1", "cluster.address=auto"), HEAD_ONLY, view, wanted=4)


def test_cpu_on_purpose_on_a_joined_cluster_launches_nothing():
    plan = plan_trials(settings("resources.gpus_per_trial=0", "cluster.address=auto"), HEAD_ONLY,
                       _view(_gpu_type(2)), wanted=2)
    assert plan.size.gpus_per_worker == 0 and plan.max_concurrent == 2 + 2 and plan.waiting is None


def test_a_trial_no_node_type_can_hold_is_an_error_before_any_trial():
    with pytest.raises(ResourceError,
                       match=r"one trial needs 2 worker\(s\) x \(1 CPU, 1 GPU\).*no node type the autoscaler"):
        plan_trials(settings("resources.gpus_per_trial=2", "cluster.address=auto"), HEAD_ONLY, _view(_gpu_type(4)),
                    wanted=4)


def test_the_scale_timeout_must_be_positive():
    with pytest.raises(ConfigError, match="cluster.scale_timeout_s: must be > 0"):
        settings("cluster.scale_timeout_s=0")
