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

from sweep.config.settings import AUTO, Settings, TrainConfig
from sweep.plan.costs import DataVolume, evaluated_rows, evaluations, trained_rows
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
class OnCpu:
    """Where the trials run when they use no GPU: how many at once, each one's CPUs, and the estimate."""

    at_once: int
    cpus: float
    makespan: float | None  # predicted (sweep.plan.eta), None: no estimate on this CPU
    note: str  # what the estimate rests on ("measured here: ..."), or why there is none


@dataclass(frozen=True)
class Dispatch:
    order: tuple[TrialWork, ...]  # give Tune the trials in this order
    gpus: dict[str, float]  # per task: GPUs per trial to ask for (before plan_trials' no-GPU fallback)
    plan: MakespanPlan | None  # the predicted makespan (None: see why_no_plan)
    why_no_plan: str = ""

    def describe(self, sizes: Mapping[str, DataVolume] | None = None, params: int | None = None,
                 train: TrainConfig | None = None, cpu: OnCpu | None = None) -> list[str]:
        """What to print before trials start: what the trials train, the plan per task and the predicted
        makespan; ``cpu``: every trial runs on CPU (never a GPU figure then)."""
        lines = [cost_line(sizes, params, train)] if sizes else []
        if cpu is not None:
            return lines + self._describe_cpu(cpu)
        if self.plan is not None:
            return lines + self.plan.describe()
        lines.append(f"{len(self.order)} trials, longest first (no makespan predicted: {self.why_no_plan})")
        counts = self._counts()
        width = max(map(len, counts), default=0)
        for task, n in counts.items():
            if self.gpus.get(task, 1.0) <= 0:  # a CPU task beside GPU ones: nobody measured this CPU
                lines.append(f"{task:<{width}}  {n} trials  on CPU (no estimate on CPU)")
                continue
            one = next(t.gpu_seconds for t in self.order if t.task == task)
            lines.append(f"{task:<{width}}  {n} trials  ~{format_duration(one)} each on one GPU")
        return lines

    def _counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for t in self.order:
            counts[t.task] = counts.get(t.task, 0) + 1
        return counts

    def _describe_cpu(self, cpu: OnCpu) -> list[str]:
        lines = [f"{len(self.order)} trials on CPU, {cpu.at_once} at once ({cpu.cpus:g} CPU each), longest first"]
        counts = self._counts()
        width = max(map(len, counts), default=0)
        for task, n in counts.items():
            mine = [t.gpu_seconds for t in self.order if t.task == task]
            each = f"  ~{format_duration(sum(mine) / len(mine))} each in training" if cpu.makespan is not None else ""
            lines.append(f"{task:<{width}}  {n} trials{each}")
        if cpu.makespan is None:
            return lines + [f"no estimate on CPU: {cpu.note}"]
        return lines + [f"predicted makespan {format_duration(cpu.makespan)} ({cpu.note})"]


def cost_line(sizes: Mapping[str, DataVolume], params: int | None, train: TrainConfig | None) -> str:
    """'RTE 500 of 2,490 rows x 52 tokens, 4 evals x 128 rows, …; 4 epoch(s), full; model 22.7M parameters':
    what one trial trains and evaluates (the sweep's own train config; a grid may change it per point)."""
    def one(s: DataVolume) -> str:
        if s.error:
            return f"{s.task} unread ({s.error}), costed as the others' mean"
        if train is None:
            return f"{s.task} {s.rows:,} rows x {s.mean_tokens:.0f} tokens"
        rows = trained_rows(s, train)
        text = f"{s.task} {rows:,}{f' of {s.rows:,}' if rows < s.rows else ''} rows x {s.mean_tokens:.0f} tokens"
        evaluated = evaluated_rows(s, train)
        return text + (f", {evaluations(rows, train)} evals x {evaluated:,} rows" if evaluated else "")

    recipe = f"; {train.epochs} epoch(s), {train.method}" if train is not None else ""
    model = f"; model {params / 1e6:.1f}M parameters" if params else ""
    return "cost of what the trials train: " + ", ".join(one(s) for s in sizes.values()) + recipe + model


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
