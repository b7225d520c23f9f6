"""Planning a sweep's trials (task x seed) over a GPU cluster so its makespan nears its lower bound.

Plain Python (no Ray import): the Ray code calls ``make_plan`` with predicted one-GPU durations
and turns the plan's shares and dispatch order into trial resources; the bench replays durations.

Models, stated once and used by the planner, the simulator and ``scripts/bench_schedule.py``:

* Cost: one trial on one GPU takes ``rows x mean_tokens x epochs x model_params x c`` seconds,
  ``c`` in seconds per token·parameter (``CostModel``; running trials refine ``c``).
* DDP speed-up (``Speedup``): on ``g`` whole GPUs of one node (g = 1, 2, 4, 8) a trial of
  one-GPU time ``t1`` takes ``t1 / (1 + eff * (g - 1))``, ``eff`` = 0.9 by default, 0 < eff <= 1.
  On a fraction ``s < 1`` of one GPU it takes ``t1 / s``: packing small trials gains nothing
  per trial here (no free lunch is claimed), it only lets more of them run at once.
* Lower bound (``lower_bound``): no plan finishes before
  ``max(sum(t1) / total_gpus, max over trials of t1 at its largest allowed g)``.
  Work: a trial on g GPUs holds ``g * t1 / (1 + eff (g-1)) >= t1`` GPU-seconds (eff <= 1), on a
  fraction s it holds ``s * t1 / s = t1``; the cluster supplies ``total_gpus`` GPU-seconds per
  second, so the trials' work needs at least ``sum(t1) / total_gpus``. Span: a trial cannot end
  sooner than its duration at the most GPUs it may use, however early it starts.
* The plan is judged against ``tight_lower_bound``, never below ``lower_bound`` and still a bound
  no plan beats: to end by M a trial needs the fewest GPUs that make it that short, and at eff < 1
  those GPUs hold more than t1 GPU-seconds, so the work term grows with every trial DDP must speed
  up (proof in its docstring). At eff = 1, or when no trial needs DDP, the two bounds agree.
* Dispatch (``simulate``): greedy list scheduling as Ray Tune does it. Whenever trials end (and at
  time 0) the pending trials are tried in dispatch order and every one that fits starts at once,
  also past one that does not fit (backfill: Tune tries each pending trial, not only the first).
  A whole-GPU trial needs g wholly free GPUs on ONE node (it takes the node with the fewest free
  GPUs that still fit: keeps whole nodes for big trials); a fraction packs onto one GPU whose
  used share stays <= 1 (the fullest GPU that fits). Shares are counted in units of 1/10,000 GPU,
  Ray's own granularity, so packing is exact.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

# --- cost model --------------------------------------------------------------------------------

# run_glue's published SST-2 time (3 epochs on one GPU) is 1,566 s. SST-2 has 67,349 training rows
# of ~13 tokens on average, and roberta-base has 125M parameters:
#   67,349 x 13 x 3 = 2.63e6 tokens; x 125e6 params = 3.28e14 token·params; 1,566 s / 3.28e14 = 4.77e-12.
# Plausible: training costs ~6 FLOP per token·param, so that is ~1.3 TFLOP/s of real tokens, or
# ~12 TFLOP/s of the ~10x padded tokens run_glue computes at max_seq_length=128 on a V100.
SST2_SECONDS, SST2_ROWS, SST2_MEAN_TOKENS, SST2_EPOCHS, ROBERTA_BASE_PARAMS = 1566.0, 67_349, 13.0, 3, 125e6
DEFAULT_SECONDS_PER_TOKEN_PARAM = SST2_SECONDS / (SST2_ROWS * SST2_MEAN_TOKENS * SST2_EPOCHS * ROBERTA_BASE_PARAMS)


@dataclass
class CostModel:
    """One trial's seconds on one whole GPU from the size of its work."""

    seconds_per_token_param: float = DEFAULT_SECONDS_PER_TOKEN_PARAM
    observations: int = 0  # measurements folded in by refine()

    def seconds(self, rows: int, mean_tokens: float, epochs: float, model_params: float) -> float:
        return rows * mean_tokens * epochs * model_params * self.seconds_per_token_param

    def refine(self, measured_tokens_per_s: float, model_params: float) -> float:
        """Fold in one running trial's throughput (real tokens/s on one whole GPU); returns the new constant.

        The constant becomes the running mean of the measured ones: the default is only a prior
        from published numbers, so the first measurement replaces it rather than being averaged with it.
        """
        if measured_tokens_per_s <= 0 or model_params <= 0:
            raise ValueError(f"refine: tokens/s and params must be > 0, got {measured_tokens_per_s}, {model_params}")
        measured = 1.0 / (measured_tokens_per_s * model_params)
        self.observations += 1
        if self.observations == 1:
            self.seconds_per_token_param = measured
        else:
            self.seconds_per_token_param += (measured - self.seconds_per_token_param) / self.observations
        return self.seconds_per_token_param


UNITS = 10_000  # Ray counts GPU shares in 1/10,000ths: packing fractions is exact integer arithmetic


# --- trials and the DDP model ------------------------------------------------------------------


@dataclass(frozen=True)
class TrialWork:
    task: str
    seed: int
    gpu_seconds: float  # predicted duration on ONE whole GPU
    point: int = 0  # which grid point of the sweep (0 without a grid)

    def __post_init__(self) -> None:
        if not self.gpu_seconds > 0:
            raise ValueError(f"trial {self.task} seed {self.seed}: gpu_seconds must be > 0, got {self.gpu_seconds}")


@dataclass(frozen=True)
class Speedup:
    """Duration on a share of GPUs: ``t1 / (1 + eff (g-1))`` on g whole GPUs, ``t1 / s`` on a fraction s."""

    efficiency: float = 0.9

    def __post_init__(self) -> None:
        # eff > 1 would be super-linear and void the lower bound's work argument
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"DDP efficiency must be in (0, 1], got {self.efficiency}")

    def seconds(self, one_gpu_seconds: float, share: float) -> float:
        check_share(share)
        if share < 1:
            return one_gpu_seconds / share
        return one_gpu_seconds / (1 + self.efficiency * (share - 1))


DEFAULT_SPEEDUP = Speedup()


def check_share(share: float) -> None:
    """A share is a fraction of one GPU (1/UNITS <= s < 1) or a whole number of GPUs: Ray accepts nothing else."""
    if not (1 / UNITS <= share < 1 or (share >= 1 and float(share).is_integer())):
        raise ValueError(f"a trial's GPU share must be in [{1 / UNITS:g}, 1) or a whole number >= 1, got {share}")


def share_of(shares: Mapping[str, float], task: str) -> float:
    if task not in shares:
        raise ValueError(f"no GPU share for task {task!r} (shares given for: {', '.join(shares) or 'none'})")
    return shares[task]


def order_longest_first(trials: Iterable[TrialWork], shares: Mapping[str, float] | None = None,
                        speedup: Speedup = DEFAULT_SPEEDUP) -> list[TrialWork]:
    """Longest predicted duration at the trial's share first (no shares: 1 GPU each); ties: lower
    seed, then task, then grid point."""
    def key(t: TrialWork) -> tuple[float, int, str, int]:
        share = share_of(shares, t.task) if shares is not None else 1.0
        return (-speedup.seconds(t.gpu_seconds, share), t.seed, t.task, t.point)

    return sorted(trials, key=key)


# --- the simulator -----------------------------------------------------------------------------

Order = Literal["longest_first", "given"]
ORDERS = ("longest_first", "given")


@dataclass(frozen=True)
class Slot:
    trial: TrialWork
    share: float
    node: int
    gpus: tuple[int, ...]  # GPU indices on the node
    start: float
    end: float


def node_sizes(total_gpus: int, gpus_per_node: int) -> list[int]:
    """Full nodes of gpus_per_node, then one smaller node for the rest (12 GPUs by 8: [8, 4])."""
    if total_gpus < 1 or gpus_per_node < 1:
        raise ValueError(f"need total_gpus >= 1 and gpus_per_node >= 1, got {total_gpus}, {gpus_per_node}")
    full, rest = divmod(total_gpus, gpus_per_node)
    return [gpus_per_node] * full + ([rest] if rest else [])


@dataclass
class Cluster:
    """Free capacity of each GPU, per node, in 1/UNITS of a GPU."""

    free: list[list[int]]
    whole_free: list[int] = field(init=False)  # per node: GPUs with nothing on them

    def __post_init__(self) -> None:
        self.whole_free = [sum(1 for f in node if f == UNITS) for node in self.free]

    @classmethod
    def of(cls, sizes: Sequence[int]) -> Cluster:
        return cls([[UNITS] * n for n in sizes])

    def place(self, share: float) -> tuple[int, tuple[int, ...]] | None:
        """Take the share (best fit, see the module docstring); None when it fits on no node now."""
        if share >= 1:
            g = int(share)
            fits = [(free, i) for i, free in enumerate(self.whole_free) if free >= g]
            if not fits:
                return None
            node = min(fits)[1]
            gpus = tuple(j for j, f in enumerate(self.free[node]) if f == UNITS)[:g]
            for j in gpus:
                self.free[node][j] = 0
            self.whole_free[node] -= g
            return node, gpus
        need = round(share * UNITS)
        fits = [(f, i, j) for i, node_free in enumerate(self.free) for j, f in enumerate(node_free) if f >= need]
        if not fits:
            return None
        f, node, gpu = min(fits)
        if f == UNITS:
            self.whole_free[node] -= 1
        self.free[node][gpu] = f - need
        return node, (gpu,)

    def release(self, share: float, node: int, gpus: tuple[int, ...]) -> None:
        give = UNITS if share >= 1 else round(share * UNITS)
        for j in gpus:
            self.free[node][j] += give
            if self.free[node][j] == UNITS:
                self.whole_free[node] += 1


def check_fits(shares: Mapping[str, float], tasks: Iterable[str], sizes: Sequence[int]) -> None:
    for task in set(tasks):
        share = share_of(shares, task)
        check_share(share)
        if share > max(sizes):
            raise ValueError(f"task {task}: {share:g} GPUs per trial, but the largest node has {max(sizes)}")


def timeline(trials: Sequence[TrialWork], shares: Mapping[str, float], total_gpus: int, gpus_per_node: int = 8,
             order: Order = "longest_first", speedup: Speedup = DEFAULT_SPEEDUP) -> list[Slot]:
    """Every trial's node, GPUs, start and end under greedy dispatch with backfill (module docstring)."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    sizes = node_sizes(total_gpus, gpus_per_node)
    check_fits(shares, (t.task for t in trials), sizes)
    pending = order_longest_first(trials, shares, speedup) if order == "longest_first" else list(trials)
    cluster = Cluster.of(sizes)
    running: list[tuple[float, int, Slot]] = []  # heap by end time, then start sequence
    done: list[Slot] = []
    now, seq = 0.0, 0
    while pending or running:
        pending, started = _start_what_fits(pending, shares, cluster, now, speedup)
        for p in started:
            heapq.heappush(running, (p.end, seq, p))
            seq += 1
        if not running:  # unreachable after check_fits (an idle cluster fits any trial), but never spin
            raise RuntimeError(f"no pending trial fits an idle cluster: {pending[0]}")
        now = running[0][0]
        while running and running[0][0] == now:  # all trials ending at this instant free their GPUs together
            p = heapq.heappop(running)[2]
            cluster.release(p.share, p.node, p.gpus)
            done.append(p)
    return done


def _start_what_fits(pending: list[TrialWork], shares: Mapping[str, float], cluster: Cluster, now: float,
                     speedup: Speedup) -> tuple[list[TrialWork], list[Slot]]:
    """Try pending trials in order; start each that fits now. Returns (still pending, started)."""
    waiting, started = [], []
    smallest_failed = math.inf  # the cluster only fills during a pass: a share that failed once fails again
    for t in pending:
        share = shares[t.task]
        spot = cluster.place(share) if share < smallest_failed else None
        if spot is None:
            smallest_failed = min(smallest_failed, share)
            waiting.append(t)
            continue
        end = now + speedup.seconds(t.gpu_seconds, share)
        started.append(Slot(t, share, spot[0], spot[1], now, end))
    return waiting, started


def simulate(trials: Sequence[TrialWork], shares: Mapping[str, float], total_gpus: int, gpus_per_node: int = 8,
             order: Order = "longest_first", speedup: Speedup = DEFAULT_SPEEDUP) -> float:
    """The makespan (seconds) of dispatching the trials as ``timeline`` does; 0 for no trials."""
    return max((p.end for p in timeline(trials, shares, total_gpus, gpus_per_node, order, speedup)), default=0.0)


# --- bound and share search --------------------------------------------------------------------


def lower_bound(trials: Sequence[TrialWork], total_gpus: int, max_gpus_per_trial: int,
                speedup: Speedup = DEFAULT_SPEEDUP) -> float:
    """No plan's makespan is lower (proof in the module docstring): max(work / GPUs, longest trial at its best g)."""
    if not trials:
        return 0.0
    g = max(1, min(max_gpus_per_trial, total_gpus))
    work = sum(t.gpu_seconds for t in trials) / total_gpus
    span = max(speedup.seconds(t.gpu_seconds, g) for t in trials)
    return max(work, span)


def tight_lower_bound(trials: Sequence[TrialWork], total_gpus: int, max_gpus_per_trial: int,
                      speedup: Speedup = DEFAULT_SPEEDUP) -> float:
    """A bound at least ``lower_bound``'s: the smallest M >= the span with M >= least_work(M) / total_gpus.

    In a plan of makespan M every trial runs in <= M, so on at least the fewest GPUs g that allow
    that, holding >= g t1 / (1 + eff (g-1)) GPU-seconds (growing with g as eff <= 1): the work the
    trials hold is at least least_work(M), and the cluster supplies total_gpus * M. least_work only
    changes where some trial's duration at some g equals M, so scanning those points finds the M.
    """
    if not trials:
        return 0.0
    top = max(1, min(max_gpus_per_trial, total_gpus))
    span = max(speedup.seconds(t.gpu_seconds, top) for t in trials)
    points = sorted({d for t in trials for g in range(1, top + 1) if (d := speedup.seconds(t.gpu_seconds, g)) >= span})
    for lo, hi in zip(points, [*points[1:], math.inf]):  # least_work is constant on [lo, hi)
        bound = max(lo, _least_work(trials, lo, top, speedup) / total_gpus)
        if bound < hi:
            return bound
    raise AssertionError("unreachable: the last interval is unbounded")


def _least_work(trials: Sequence[TrialWork], makespan: float, top: int, speedup: Speedup) -> float:
    work = 0.0
    for t in trials:
        g = next(g for g in range(1, top + 1) if speedup.seconds(t.gpu_seconds, g) <= makespan)
        work += g * speedup.seconds(t.gpu_seconds, g)
    return work


def allowed_choices(choices: Iterable[int], total_gpus: int, gpus_per_node: int) -> tuple[int, ...]:
    biggest = max(node_sizes(total_gpus, gpus_per_node))
    allowed = tuple(sorted({c for c in choices if 1 <= c <= biggest}))
    if not allowed:
        raise ValueError(f"no share in {tuple(choices)} fits a node of {biggest} GPUs")
    return allowed


def auto_shares(trials: Sequence[TrialWork], total_gpus: int, gpus_per_node: int = 8,
                choices: Iterable[int] = (1, 2, 4, 8), speedup: Speedup = DEFAULT_SPEEDUP) -> dict[str, int]:
    """Whole GPUs per trial, per task, that make the simulated longest-first makespan smallest.

    Steepest descent: each round tries every other choice for every task and keeps the single
    change that lowers the makespan most, until none does. A change must win by more than rounding
    (1e-9 relative), so a tie keeps the fewer GPUs. It runs from two starts and keeps the better end:
    1 GPU everywhere, and each task at the fewest GPUs that bring its longest trial under the lower
    bound. One start alone gets stuck: on 64 GPUs the first stops at 0.78 of the bound, the second at 0.91.
    """
    allowed = allowed_choices(choices, total_gpus, gpus_per_node)
    starts = [{task: allowed[0] for task in _tasks(trials)}, _span_start(trials, total_gpus, allowed, speedup)]
    ends = [_descend(trials, start, allowed, total_gpus, gpus_per_node, speedup) for start in starts]
    return min(ends, key=lambda end: end[1])[0]  # min() keeps the first start on a tie


def _tasks(trials: Iterable[TrialWork]) -> list[str]:
    return list(dict.fromkeys(t.task for t in trials))


def _span_start(trials: Sequence[TrialWork], total_gpus: int, allowed: tuple[int, ...],
                speedup: Speedup) -> dict[str, int]:
    """Each task at the fewest GPUs that bring its longest trial under the lower bound (else the most)."""
    bound = lower_bound(trials, total_gpus, allowed[-1], speedup)
    start = {}
    for task in _tasks(trials):
        longest = max(t.gpu_seconds for t in trials if t.task == task)
        start[task] = next((g for g in allowed if speedup.seconds(longest, g) <= bound), allowed[-1])
    return start


def _descend(trials: Sequence[TrialWork], shares: dict[str, int], allowed: tuple[int, ...], total_gpus: int,
             gpus_per_node: int, speedup: Speedup) -> tuple[dict[str, int], float]:
    best = simulate(trials, shares, total_gpus, gpus_per_node, "longest_first", speedup)
    while True:
        step = _best_step(trials, shares, best, allowed, total_gpus, gpus_per_node, speedup)
        if step is None:
            return shares, best
        shares, best = step


def _best_step(trials: Sequence[TrialWork], shares: dict[str, int], current: float, allowed: tuple[int, ...],
               total_gpus: int, gpus_per_node: int, speedup: Speedup) -> tuple[dict[str, int], float] | None:
    best: tuple[dict[str, int], float] | None = None
    for task in shares:
        for g in allowed:
            if g == shares[task]:
                continue
            trial_shares = {**shares, task: g}
            makespan = simulate(trials, trial_shares, total_gpus, gpus_per_node, "longest_first", speedup)
            if makespan < (best[1] if best else current) * (1 - 1e-9):
                best = (trial_shares, makespan)
    return best


# --- the plan the Ray code runs ----------------------------------------------------------------


@dataclass(frozen=True)
class TaskShare:
    task: str
    trials: int
    gpus: float  # each trial's share
    seconds: float  # predicted duration of one trial at that share (mean over the task's trials)


@dataclass(frozen=True)
class MakespanPlan:
    tasks: tuple[TaskShare, ...]
    shares: dict[str, float]
    order: tuple[TrialWork, ...]  # dispatch order: submit the trials to Tune in this order
    makespan: float  # predicted, by simulate()
    lower_bound: float
    total_gpus: int
    gpus_per_node: int

    @property
    def efficiency(self) -> float:
        """lower bound / predicted makespan: 1.0 is as good as any plan can be."""
        return self.lower_bound / self.makespan if self.makespan else 1.0

    def describe(self) -> list[str]:
        """The lines to print before trials start."""
        width = max((len(t.task) for t in self.tasks), default=0)
        sizes = node_sizes(self.total_gpus, self.gpus_per_node)
        lines = [f"{len(self.order)} trials on {self.total_gpus} GPUs ({len(sizes)} node(s), "
                 f"up to {max(sizes)} GPUs each), longest first"]
        for t in self.tasks:
            lines.append(f"{t.task:<{width}}  {t.trials} trials x {t.gpus:g} GPU  ~{format_duration(t.seconds)} each")
        lines.append(f"predicted makespan {format_duration(self.makespan)} "
                     f"(lower bound {format_duration(self.lower_bound)}, {self.efficiency:.2f})")
        return lines


def format_duration(seconds: float) -> str:
    """1h22m, 23m, 1m23s, 45s: to the second below 10 minutes (a CPU demo's whole sweep), else to the minute."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 600:
        return f"{s // 60}m{s % 60:02d}s"
    minutes = round(seconds / 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m"


def make_plan(trials: Sequence[TrialWork], total_gpus: int, gpus_per_node: int = 8,
              shares: Mapping[str, float] | float | Literal["auto"] = "auto",
              speedup: Speedup = DEFAULT_SPEEDUP, choices: Iterable[int] = (1, 2, 4, 8)) -> MakespanPlan:
    """The plan for a sweep: shares per task ("auto": ``auto_shares``; a number: the same for every
    task; a mapping: as given), longest-first dispatch order, predicted makespan and lower bound.

    The lower bound (``tight_lower_bound``) lets a trial use a whole node, whatever shares were
    chosen: it is the bound of the problem, so a fixed-share plan far below 1.0 says other shares
    could do better.
    """
    tasks = _tasks(trials)
    if shares == "auto":
        chosen: dict[str, float] = dict(auto_shares(trials, total_gpus, gpus_per_node, choices, speedup))
    elif isinstance(shares, (int, float)):
        chosen = {task: float(shares) for task in tasks}
    else:
        chosen = {task: share_of(shares, task) for task in tasks}
    order = order_longest_first(trials, chosen, speedup)
    makespan = simulate(order, chosen, total_gpus, gpus_per_node, "given", speedup)
    bound = tight_lower_bound(trials, total_gpus, max(node_sizes(total_gpus, gpus_per_node)), speedup)
    in_order = list(dict.fromkeys(t.task for t in order))  # the plan lists tasks as they are dispatched
    return MakespanPlan(_task_plans(trials, in_order, chosen, speedup), chosen, tuple(order), makespan, bound,
                total_gpus, gpus_per_node)


def _task_plans(trials: Sequence[TrialWork], tasks: list[str], shares: Mapping[str, float],
                speedup: Speedup) -> tuple[TaskShare, ...]:
    plans = []
    for task in tasks:
        mine = [t for t in trials if t.task == task]
        mean = sum(speedup.seconds(t.gpu_seconds, shares[task]) for t in mine) / len(mine)
        plans.append(TaskShare(task, len(mine), shares[task], mean))
    return tuple(plans)
