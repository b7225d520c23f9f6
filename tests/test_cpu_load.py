"""The other work on this CPU and what it does to the trials' steps (sweep/plan/cpu_load.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from sweep.plan.cpu_load import CpuLoad, CpuLoadMeter, cpu_shares, nice_weight, trial_niceness


def test_cpus_are_shared_by_weight_and_no_thread_gets_more_than_a_cpu():
    assert cpu_shares(2, [(1, 1024), (2, 1024)]) == pytest.approx([2 / 3, 4 / 3])  # 3 equal threads on 2 CPUs
    assert cpu_shares(2, [(1, 1024), (2, nice_weight(15))]) == pytest.approx([1, 1])  # niced: what is left
    assert cpu_shares(4, [(1, 1024), (2, 1024)]) == pytest.approx([1, 2])  # room for all: each its demand
    assert cpu_shares(1, [(3, 1024), (1, 1024)]) == pytest.approx([0.75, 0.25])
    assert cpu_shares(2, [(0, 1024), (1, 1024)]) == pytest.approx([0, 1])
    assert nice_weight(0) == 1024 and nice_weight(15) == pytest.approx(36, rel=0.03)  # the kernel's table


def test_trials_at_once_beside_other_work_are_slower_than_the_probe_alone():
    """The README's tour beside a process busy on one of 2 CPUs: the trials' steps took 2.2x the probe's."""
    busy = CpuLoad(cpus=2, others=1.0)
    assert busy.slowdown(2, 1, niceness=15) == pytest.approx(2.0)  # 2 niced trials on the one CPU left
    assert busy.slowdown(2, 1, niceness=0) == pytest.approx(1.5)  # equal shares: 3 threads on 2 CPUs
    assert busy.slowdown(1, 1, niceness=15) == pytest.approx(1.0)  # one trial: a CPU of its own, as probed
    assert CpuLoad(cpus=2, others=0.0).slowdown(2, 1, 15) == pytest.approx(1.0)  # quiet: a CPU each
    assert CpuLoad(cpus=2, others=0.0).slowdown(4, 1, 15) == pytest.approx(2.0)  # more trials than CPUs
    assert CpuLoad(cpus=16, others=0.5).slowdown(4, 4, 15) == pytest.approx(1.0, abs=0.05)
    assert "1.0 of 2 CPU(s) busy with other work, 2 trial(s) at once at niceness 15: steps x2.00" == \
        busy.describe(2, 1, 15)


def test_the_trials_niceness_is_rays_unless_set(monkeypatch):
    monkeypatch.delenv("RAY_worker_niceness", raising=False)
    assert trial_niceness() == 15
    monkeypatch.setenv("RAY_worker_niceness", "0")
    assert trial_niceness() == 0
    monkeypatch.setenv("RAY_worker_niceness", "high")
    assert trial_niceness() == 15


def test_the_meter_counts_the_cpus_this_process_may_use_less_its_own_time(tmp_path):
    """/proc/stat's cpuN lines: user nice system idle iowait irq softirq steal; only busy ticks count."""
    hz = os.sysconf("SC_CLK_TCK")
    cpus = sorted(os.sched_getaffinity(0))
    stat = tmp_path / "stat"

    def write(busy_ticks: int) -> None:
        lines = ["cpu  1 1 1 1 1 1 1 1 0 0"]  # the total line is not a CPU's
        lines += [f"cpu{c} {busy_ticks} 0 0 {10**6} {10**6} 0 0 0 0 0" for c in cpus]
        lines += [f"cpu{max(cpus) + 1} {10**9} 0 0 0 0 0 0 0 0 0"]  # a CPU this process may not use
        stat.write_text("\n".join(lines) + "\nintr 5\n")

    write(0)
    with CpuLoadMeter(stat) as meter:
        started = time.monotonic()
        time.sleep(0.5)
        wall = time.monotonic() - started
        write(round(0.5 * hz * wall))  # every usable CPU half busy over the block
    assert meter.load.cpus <= len(cpus)
    if meter.load.cpus == len(cpus):  # a cgroup quota below the CPUs: others unknown, none (the docstring)
        assert meter.load.others == pytest.approx(0.5 * len(cpus), abs=0.15)


def test_a_process_busy_beside_the_meter_is_counted():
    """A real busy loop: at least one CPU is busy all along (the meter's own block sleeps)."""
    hog = subprocess.Popen([sys.executable, "-c", "import time\nend = time.monotonic() + 30\n"
                            "while time.monotonic() < end: pass"])
    try:
        time.sleep(0.3)
        with CpuLoadMeter() as meter:
            time.sleep(1.5)
    finally:
        hog.kill()
        hog.wait()
    if meter.load.cpus < len(os.sched_getaffinity(0)):
        pytest.skip("a cgroup CPU quota: the host's counters are not this container's")
    assert 0.9 <= meter.load.others <= meter.load.cpus


def test_without_proc_stat_or_affinity_the_meter_counts_no_other_work(tmp_path, monkeypatch):
    """macOS has neither /proc/stat nor sched_getaffinity: the plan still times, as if the CPU were its own."""
    with CpuLoadMeter(tmp_path / "no-proc-stat") as meter:
        time.sleep(0.05)
    assert meter.load.others == 0
    monkeypatch.delattr(os, "sched_getaffinity")
    with CpuLoadMeter() as meter:
        time.sleep(0.05)
    assert 0 < meter.load.cpus <= os.cpu_count()
