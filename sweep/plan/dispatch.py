"""The sweep's dispatch: each task's GPUs per trial and the order its trials go to Tune.

Plain Python over what Ray reports (the alive nodes, the autoscaler's launchable types) and each
trial's predicted one-GPU seconds (``sweep.plan.costs``); ``sweep.plan.makespan`` does the planning and
``tuner.py`` turns the result into Tune's param space and resource requests. Tune starts pending
trials in the order it generated them, trying each one that fits (backfill), which is the greedy
dispatch ``sweep.plan.makespan.simulate`` predicts: longest first, so the long tasks do not start last.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sweep.config.settings import AUTO, Settings
from sweep.plan.costs import TaskSize
from sweep.plan.makespan import MakespanPlan, TrialWork, auto_shares, format_duration, make_plan, order_longest_first
from sweep.plan.scale import AutoscalerView


@dataclass(frozen=True)
class ClusterGPUs:
    total: int  # whole GPUs the sweep can use: alive nodes + what the autoscaler may still launch
    per_node: int  # the most GPUs on one node (a DDP trial's ceiling)


def cluster_gpus(nodes: Sequence[Mapping[str, float]], autoscaler: AutoscalerView | None = None,
                 wanted: int = 1) -> ClusterGPUs:
    """GPUs of the alive nodes plus the launchable GPU nodes (up to their max counts; an unlimited
    type counts ``wanted`` more nodes: one per trial is as many as a sweep can use)."""
    alive = [int(n.get("GPU", 0)) for n in nodes]
    total, per_node = sum(alive), max(alive, default=0)
    if autoscaler is not None:
        for t in autoscaler.node_types:
            if t.gpus >= 1 and t.max_workers != 0:
                total += int(t.gpus) * t.more(autoscaler.alive_counts.get(t.name, 0), wanted)
                per_node = max(per_node, int(t.gpus))
    return ClusterGPUs(total, per_node)


@dataclass(frozen=True)
class Dispatch:
    order: tuple[TrialWork, ...]  # give Tune the trials in this order
    gpus: dict[str, float]  # per task: GPUs per trial to ask for (before plan_trials' no-GPU fallback)
    plan: MakespanPlan | None  # the predicted makespan (None: see why_no_plan)
    why_no_plan: str = ""

    def describe(self, sizes: Mapping[str, TaskSize] | None = None, params: int | None = None) -> list[str]:
        """What to print before trials start: the plan per task and the predicted makespan."""
        lines = []
        if sizes:
            model = f"; model {params / 1e6:.1f}M parameters" if params else ""
            lines.append("cost from the staged data: " + ", ".join(
                f"{s.task} {s.rows:,} rows x {s.mean_tokens:.0f} tokens" if not s.error
                else f"{s.task} unread ({s.error}), costed as the others' mean" for s in sizes.values()) + model)
        if self.plan is not None:
            return lines + self.plan.describe()
        counts: dict[str, int] = {}
        for t in self.order:
            counts[t.task] = counts.get(t.task, 0) + 1
        lines.append(f"{len(self.order)} trials, longest first (no makespan predicted: {self.why_no_plan})")
        width = max(map(len, counts), default=0)
        for task, n in counts.items():
            one = next(t.gpu_seconds for t in self.order if t.task == task)
            lines.append(f"{task:<{width}}  {n} trials  ~{format_duration(one)} each on one GPU")
        return lines


def dispatch(settings: Settings, trials: Sequence[TrialWork], cluster: ClusterGPUs) -> Dispatch:
    """Each task's share (its own ``resources.tasks.<T>.gpus_per_trial``, else the sweep's; "auto":
    the shares that make the predicted makespan smallest) and the longest-first order."""
    asked = {spec.name: settings.resources.gpus_for(spec.name) for spec in settings.tasks}
    auto = [task for task, value in asked.items() if value == AUTO]
    if cluster.total < 1:  # a CPU cluster: "auto" means no GPU; a number > 0 gets plan_trials' warning
        gpus = {task: 0.0 if value == AUTO else float(value) for task, value in asked.items()}
        return Dispatch(tuple(order_longest_first(trials)), gpus, None, "no GPU in the cluster")
    gpus = {task: float(value) for task, value in asked.items() if value != AUTO}
    if auto:
        chosen = auto_shares(trials, cluster.total, cluster.per_node)
        gpus.update({task: float(chosen[task]) for task in auto})
    if any(share <= 0 or share > cluster.per_node for share in gpus.values()):
        # CPU-only trials on purpose, or a share no node holds (plan_trials names it as an error)
        return Dispatch(tuple(order_longest_first(trials)), gpus, None, "a task runs on CPU or fits no node")
    plan = make_plan(trials, cluster.total, cluster.per_node, gpus)
    return Dispatch(plan.order, gpus, plan)
