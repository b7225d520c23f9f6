"""What the driver decides before the first trial, as one ``SweepPlan``: the cluster it sees, where
trials write, every node staged, each task's GPUs and trial size, the dispatch order, how many at
once, the ETA. The arithmetic is plain Python in ``sweep/plan/``; this module feeds it what Ray
reports and prints the plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sweep.cluster.connect import alive_node_resources, beside_the_driver, only_the_drivers_node
from sweep.cluster.stage_nodes import ProgressRelay, Staging, ship_sources, stage_all_nodes
from sweep.config.settings import AUTO, ClusterConfig, Settings, SweepConfig, TrainConfig, with_hparams
from sweep.config.validate import check_halving_trials
from sweep.failures import first_line
from sweep.plan.costs import DataVolume, evaluations, grid_points, measure_sizes, sweep_trials, trained_rows
from sweep.plan.dispatch import ClusterGPUs, Dispatch, OnCpu, cluster_gpus, dispatch
from sweep.plan.eta import COLD_START_S, FINISH_S, WARM_START_S, Forecast, Overheads
from sweep.plan.probe import Probe, cpu_note, end_seconds, probe_step_cost, probe_task, why_no_probe
from sweep.plan.scale import AutoscalerView, TrialResources
from sweep.plan.sizes import (
    SweepStorage,
    TaskPlacement,
    many_nodes,
    plan_trials,
    storage_path,
    sweep_storage,
    trial_count,
)
from sweep.results.trial_reports import point_of, trial_key
from sweep.storage.hub import snapshot_folder
from sweep.storage.staging import DriverSources, cache_root


@dataclass(frozen=True)
class SweepPlan:
    total: int  # trials in the sweep
    nodes: list[dict[str, float]]  # the alive nodes' resources when the sweep started
    autoscaler: AutoscalerView | None  # None: a local Ray, or no autoscaler the driver can read
    storage: SweepStorage  # where the trials write what the driver reads back
    tasks: dict[str, TaskPlacement]  # each task's trials on this cluster
    dispatch: Dispatch  # each task's GPUs per trial and the order Tune gets the trials in
    concurrency: int  # trials at once
    forecast: Forecast  # the progress line's ETA
    staging: Staging  # what a trial on a node that joined later needs to stage there

    @property
    def sizes(self) -> dict[str, TrialResources]:
        return {task: p.size for task, p in self.tasks.items()}

    @property
    def first(self) -> TaskPlacement:
        """The plan of the first trials Tune starts: their size drives the wait for launched nodes."""
        return self.tasks[self.dispatch.order[0].task]

    @property
    def asked(self) -> list[dict[str, float]]:
        """What to ask the autoscaler for up front: every concurrent trial's bundle ([] without one)."""
        if self.autoscaler is None or not self.autoscaler.can_launch:
            return []
        return [self.tasks[t.task].size.bundle for t in self.dispatch.order[:self.concurrency]]


def plan_sweep(settings: Settings, sources: DriverSources, out_dir: Path) -> SweepPlan:
    """Plan the sweep on the connected cluster; every error a person can fix comes before any trial."""
    nodes, total = alive_node_resources(), trial_count(settings)
    autoscaler = _autoscaler(settings.cluster)
    # where trials write what this driver reads back: a place every node reaches, before any staging
    storage = sweep_storage(storage_path(settings.cluster, out_dir, len(nodes), autoscaler))
    fixed = {spec.name: plan_trials(settings, nodes, autoscaler, wanted=total, task=spec.name)
             for spec in settings.tasks if settings.resources.gpus_for(spec.name) != AUTO}  # no node holds one: now
    here = autoscaler is None and only_the_drivers_node()  # no other node, and none can join: stage it here
    several = many_nodes(len(nodes), autoscaler, settings.cluster.node_types)
    staging = Staging(
        pins=sources.pins,
        # storage=local on nodes with their own disks: the driver's folders travel through Ray to those that lack them
        shipments=ship_sources(settings) if several else {},
        hub=sources.hub,  # each node fetches the driver's pins; one that cannot reach the Hub asks the driver
        driver_node=beside_the_driver().node_id if several and settings.storage.ship_to_nodes else None,
        driver_snapshots={pin.uri: str(snapshot_folder(pin)) for pin in sources.hub.all()},
        # the nodes' staging lines, at the start and from nodes that join later; beside the driver, which outlives them
        relay=None if here else ProgressRelay.options(scheduling_strategy=beside_the_driver()).remote(),
    )
    staged = stage_all_nodes(settings, staging, here)  # every node, before the plan reads sizes
    sizes, params = _staged_sizes(settings, sources, staged)
    cluster = cluster_gpus(nodes, autoscaler, total)
    on_cpu = cluster.total < 1 or all(settings.resources.gpus_for(spec.name) == 0 for spec in settings.tasks)
    probe, why_not = _probe(settings, sources, sizes, on_cpu, len(nodes))
    chosen = dispatch(settings, sweep_trials(settings, sizes, params, step=probe.step if probe else None), cluster)
    tasks = {task: fixed.get(task) or plan_trials(settings, nodes, autoscaler, wanted=total, task=task,
                                                  gpus_per_trial=share)
             for task, share in chosen.gpus.items()}
    check_halving_trials(settings, chosen.gpus)  # "auto" as the plan chose it
    concurrency = min(max(p.max_concurrent for p in tasks.values()), total)
    if probe is not None:  # the trials at once share this CPU, beside its other work: their cost at that share
        chosen = dispatch(settings, sweep_trials(settings, sizes, params, step=probe.step_at(concurrency)), cluster)
    # checkpoints a trial saves: its end, on the plan line and in the ETA
    saves = _saves(settings.sweep, settings.train, sizes, chosen)
    forecast = _forecast(settings.sweep, chosen, cluster, concurrency, on_cpu, probe, saves)
    plan = SweepPlan(total, nodes, autoscaler, storage, tasks, chosen, concurrency, forecast, staging)
    cpu = None
    if on_cpu:
        cpus = max(p.size.cpus_per_worker for p in tasks.values())
        makespan = forecast.remaining(0.0) if probe is not None else None
        cpu = OnCpu(concurrency, cpus, makespan, cpu_note(probe, why_not, concurrency, saves))
    print_plan(settings, plan, chosen.describe(sizes, params, settings.train, cpu))
    return plan


def _autoscaler(cluster: ClusterConfig) -> AutoscalerView | None:
    """Only a cluster the sweep joined can have an autoscaler; the local Ray it starts itself has none."""
    from sweep.cluster.autoscale import declared_view, read_autoscaler

    if not cluster.address:
        return None
    autoscaler = read_autoscaler()
    if not autoscaler.node_types and cluster.node_types:
        autoscaler = declared_view(autoscaler, cluster.node_types)
    return autoscaler


def _staged_sizes(settings: Settings, sources: DriverSources, staged):
    """Each task's size and the model's parameters, read where the sources are staged: here for local
    storage (the driver's own folders); for S3 on the first node that staged them (the driver
    downloads nothing)."""
    if sources.local is not None:
        return measure_sizes(settings, sources.local)
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    first = staged[0]
    on_node = NodeAffinitySchedulingStrategy(first.node_id, soft=False)
    return ray.get(ray.remote(num_cpus=0)(measure_sizes).options(scheduling_strategy=on_node)
                   .remote(settings, first.sources))


def _probe(settings: Settings, sources: DriverSources, sizes: dict[str, DataVolume], on_cpu: bool,
           nodes: int) -> tuple[Probe | None, str]:
    """A few real training steps on this machine, where every trial runs on CPU here; else why not."""
    why = why_no_probe(on_cpu, bool(settings.cluster.address), nodes, sources.local is not None)
    if why:
        return None, why
    task = probe_task(sizes, settings.train)
    spec = next(spec for spec in settings.tasks if spec.name == task)
    threads = max(1, int(settings.resources.cpus_for(task)))  # Ray sets a trial's OMP_NUM_THREADS to its CPUs
    try:
        return probe_step_cost(spec, sources.local.model_dir, sources.local.data_dir, settings.train, threads,
                               cache_root(settings.storage)), ""
    except Exception as e:  # noqa: BLE001 -- a plan's estimate is no reason to stop the sweep; its trials say it
        return None, f"the timing probe failed ({first_line(e)})"


def _saves(sweep: SweepConfig, train: TrainConfig, sizes: dict[str, DataVolume], chosen: Dispatch) -> float:
    """Checkpoints a trial saves, on average over the sweep's trials: one per evaluation (a grid point may
    change the epochs or the rows)."""
    points = grid_points(sweep)
    counts = []
    for t in chosen.order:
        point_train = with_hparams(train, points[t.point])
        counts.append(evaluations(trained_rows(sizes[t.task], point_train), point_train))
    return sum(counts) / len(counts) if counts else 0.0


def _forecast(sweep: SweepConfig, chosen: Dispatch, cluster: ClusterGPUs, concurrency: int, on_cpu: bool,
              probe: Probe | None, saves: float) -> Forecast:
    """The progress line's ETA: every trial's predicted loop (Tune repeats the grid per search sample);
    on CPU in trial slots, known only where the probe measured this machine, the trial processes'
    start-ups and ends as slow as their steps on this CPU's share (the same niced processes do all three)."""
    points = grid_points(sweep)
    every = list(chosen.order) * sweep.num_samples
    keys = [trial_key({"trial": point_of(t.task, t.seed, points[t.point])}) for t in every]
    if on_cpu:
        slower = probe.slowdown(concurrency) if probe else 1.0
        end = end_seconds(probe, saves, concurrency) if probe else FINISH_S
        outside = Overheads(cold=COLD_START_S * slower, warm=WARM_START_S * slower, finish=end)
        return Forecast(every, keys, None, concurrency, concurrency, known=probe is not None, overheads=outside)
    return Forecast(every, keys, chosen.gpus, cluster.total, concurrency, known=True)


def print_plan(settings: Settings, plan: SweepPlan, describe: list[str]) -> None:
    for warning in dict.fromkeys(p.warning for p in plan.tasks.values() if p.warning):
        print(f"warning: {warning}")
    if settings.sweep.selection == "none":
        print("warning: sweep.selection=none: the best checkpoint and trial are picked on the rows their score is "
              "reported on, so that score is biased upward (the best of many noisy scores); "
              "sweep.selection=train picks them on held-out training rows instead")
    else:
        print(f"selection: every decision on {_selection_rows(settings.sweep)}; the task's eval splits only report "
              "the chosen trial's score")
    for line in describe:
        print(f"plan: {line}")
    scale = plan.first.scale
    grows = f" (+ up to {scale.fits_at_max - scale.fits_now} trial(s) on launched nodes)" if scale else ""
    synthetic = " on SYNTHETIC data" if settings.storage.synthetic else ""  # never mistaken for a result
    print(f"sweep: {plan.total} trials ({len(settings.tasks)} task(s) x {len(settings.sweep.seeds)} seed(s)"
          f"{' x grid' if settings.sweep.grid else ''}){synthetic}"
          f", up to {plan.concurrency} at once on {len(plan.nodes)} node(s)"
          f"{grows}; " + _describe_sizes(plan.tasks))


def _selection_rows(sweep) -> str:
    if sweep.selection == "train":
        return (f"{sweep.selection_fraction:g} of the training rows (at most the dev split's rows, "
                f"seed {sweep.selection_seed})")
    if sweep.selection == "dev_half":
        return f"half of the primary eval split (seed {sweep.selection_seed}; the other half reports)"
    return f"the eval split {sweep.selection!r}"


def _describe_sizes(plans: dict[str, TaskPlacement]) -> str:
    """'1 worker(s) x (1 CPU, 0 GPU) each', or per task when the tasks differ."""
    def size(p: TaskPlacement) -> str:
        return f"{p.size.workers} worker(s) x ({p.size.cpus_per_worker:g} CPU, {p.size.gpus_per_worker:g} GPU)"

    sizes = {task: size(p) for task, p in plans.items()}
    if len(set(sizes.values())) == 1:
        return f"{next(iter(sizes.values()))} each"
    return "per trial: " + ", ".join(f"{task} {text}" for task, text in sizes.items())
