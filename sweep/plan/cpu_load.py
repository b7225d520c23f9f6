"""How busy this machine's CPUs are with other work, measured while the probe times its steps, and how
much slower a trial's steps are when the sweep runs several at once beside that work.

The probe times one trial alone, in the driver; the sweep then runs ``at_once`` trials together, next to
whatever else the machine runs (a browser, an IDE, another job). Linux shares the CPUs between runnable
threads by weight, each thread using at most one CPU (``cpu_shares``: water-filling). The weight follows
the niceness: Ray starts its workers, so every trial, at niceness 15 (``RAY_worker_niceness``; Ray's
choice, so that workers yield to its own daemons and to the user's other programs), weight 36 against
1024 at 0. So beside other work a trial gets about what that work leaves, not an equal share: the
README's tour beside a process busy on one of 2 cores ran each trial's steps slower than equal shares
would have made them (docs/benchmarks.md: Behind the code's choices).

Others are counted from /proc/stat over the CPUs this process may run on, less this process's own CPU
time. Under a cgroup CPU quota (a pod's limit) the host's counters say nothing of the pod: others count
as none.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from sweep.plan.cpus import affinity, usable_cpus

PROC_STAT = Path("/proc/stat")
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system . . irq softirq steal (idle and iowait are not busy)
RAY_WORKER_NICENESS = 15  # Ray's default for worker processes (its RAY_worker_niceness setting)


def nice_weight(niceness: int) -> float:
    """The kernel's scheduling weight of a niceness (sched_prio_to_weight: 1024 at 0, /1.25 a step)."""
    return 1024 / 1.25 ** niceness


def trial_niceness() -> int:
    """The niceness Ray gives trial processes: its RAY_worker_niceness when set (as Ray reads it), else 15."""
    try:
        return int(os.environ.get("RAY_worker_niceness", RAY_WORKER_NICENESS))
    except ValueError:
        return RAY_WORKER_NICENESS


def cpu_shares(cpus: float, demands: list[tuple[float, float]]) -> list[float]:
    """The CPUs each group of threads gets: ``demands`` are (CPUs it would use, weight per CPU of it);
    shares in proportion to weight, none above its demand, what a capped group leaves going to the rest."""
    shares = [0.0] * len(demands)
    left, open_groups = cpus, [i for i, (demand, _) in enumerate(demands) if demand > 0]
    while open_groups and left > 1e-9:
        weight = sum(demands[i][0] * demands[i][1] for i in open_groups)
        capped = [i for i in open_groups if demands[i][0] - shares[i] <= left * demands[i][0] * demands[i][1] / weight]
        if not capped:  # nobody reaches its demand: the rest by weight
            for i in open_groups:
                shares[i] += left * demands[i][0] * demands[i][1] / weight
            return shares
        for i in capped:
            left -= demands[i][0] - shares[i]
            shares[i] = demands[i][0]
        open_groups = [i for i in open_groups if i not in capped]
    return shares


@dataclass(frozen=True)
class CpuLoad:
    cpus: float  # CPUs this process may use (affinity, quota)
    others: float  # of them, kept busy by other processes while measured

    def slowdown(self, at_once: int, threads: int, niceness: int = 0) -> float:
        """A trial's step time with ``at_once`` trials of ``threads`` threads at ``niceness`` running beside
        the other work, over its time measured alone in the driver (niceness 0); at least 1."""
        others = (self.others, nice_weight(0))
        alone = cpu_shares(self.cpus, [others, (threads, nice_weight(0))])[1] / threads
        trials = max(1, at_once) * threads
        together = cpu_shares(self.cpus, [others, (trials, nice_weight(niceness))])[1] / trials
        return max(1.0, alone / max(together, 1e-3))

    def describe(self, at_once: int, threads: int, niceness: int = 0) -> str:
        """'1.0 of 2 CPU(s) busy with other work, 2 trial(s) at once at niceness 15: steps x2.00'"""
        return (f"{self.others:.1f} of {self.cpus:g} CPU(s) busy with other work, {at_once} trial(s) at once at "
                f"niceness {niceness}: steps x{self.slowdown(at_once, threads, niceness):.2f}")


class CpuLoadMeter:
    """``with CpuLoadMeter() as meter: ...`` then ``meter.load``: the other processes' CPU over the block."""

    def __init__(self, stat: Path = PROC_STAT):
        self.stat = stat
        self.load = CpuLoad(usable_cpus(), 0.0)

    def __enter__(self) -> CpuLoadMeter:
        self._cpus = affinity()
        self._started = time.monotonic(), time.process_time(), busy_seconds(self.stat, self._cpus)
        return self

    def __exit__(self, *exc) -> None:
        busy = busy_seconds(self.stat, self._cpus)
        started, own_started, busy_started = self._started
        wall = time.monotonic() - started
        # no /proc/stat (macOS), or a quota (see above): others unknown, counted as none
        if wall <= 0 or busy is None or busy_started is None or self.load.cpus < len(self._cpus):
            return
        own = time.process_time() - own_started
        self.load = CpuLoad(self.load.cpus, min(self.load.cpus, max(0.0, (busy - busy_started - own) / wall)))


def busy_seconds(stat: Path, cpus: set[int]) -> float | None:
    """CPU-seconds the ``cpus`` have been busy since boot (/proc/stat's cpuN lines); None where unreadable."""
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return None
    ticks = 0
    for line in lines:
        name, _, fields = line.partition(" ")
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            values = fields.split()
            ticks += sum(int(values[i]) for i in BUSY_FIELDS if i < len(values))
    return ticks / os.sysconf("SC_CLK_TCK")
