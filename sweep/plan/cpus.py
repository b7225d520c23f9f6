"""The CPUs a process may use, as the kernel enforces them (not the host's core count):

- affinity: ``os.sched_getaffinity``, the cores the scheduler lets this process run on;
- quota: cgroup v2's ``cpu.max`` or v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, the CPU time per
  period, for this process's cgroup and each one above it (the smallest wins).

The server sizes its threads from them (``sweep.serving.cpu_budget``), the plan the trials' share of the
CPU (``sweep.plan.cpu_load``).
"""

from __future__ import annotations

import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def affinity(pid: int = 0) -> set[int]:
    """The CPUs the scheduler lets process ``pid`` (0: this one) run on; every CPU where the OS cannot say
    (macOS has no sched_getaffinity)."""
    if hasattr(os, "sched_getaffinity"):
        return os.sched_getaffinity(pid)
    return set(range(os.cpu_count() or 1))


def usable_cpus(pid: int = 0, cgroup_root: Path = CGROUP_ROOT) -> float:
    """The CPUs process ``pid`` (0: this one) may use: its affinity, capped by its cgroup's quota."""
    cpus = float(len(affinity(pid)))
    quota = cgroup_quota(proc_cgroups(pid), cgroup_root)
    return min(cpus, quota) if quota is not None else cpus


def cgroup_quota(cgroups: dict[str, str], root: Path) -> float | None:
    """The CPU quota, in CPUs, of the cgroups ``cgroups`` (``/proc/PID/cgroup``'s controllers -> path) under
    ``root``, the smallest along each path up to the root; None when nothing limits it."""
    found: list[float] = []
    if "" in cgroups:  # cgroup v2: one hierarchy, cpu.max = "QUOTA PERIOD" or "max PERIOD"
        found += _along(root, cgroups[""], "cpu.max", _v2_quota)
    for controllers, path in cgroups.items():
        if "cpu" in controllers.split(","):  # cgroup v1: the cpu controller's own mount
            for mount in (root / controllers, root / "cpu", root / "cpu,cpuacct"):
                if mount.is_dir():
                    found += _along(mount, path, "cpu.cfs_quota_us", _v1_quota)
                    break
    return min(found) if found else None


def _along(mount: Path, path: str, name: str, read) -> list[float]:
    """The quotas in ``name`` from the cgroup at ``path`` up to ``mount`` (inside a container the mount is
    often the container's own cgroup: its path in /proc is the host's and not under the mount)."""
    quotas = []
    folder = mount / path.strip("/")
    while True:
        if (folder / name).is_file():
            quota = read(folder)
            if quota is not None:
                quotas.append(quota)
        if folder == mount:
            return quotas
        folder = folder.parent if mount in folder.parents else mount


def _v2_quota(folder: Path) -> float | None:
    quota, _, period = (folder / "cpu.max").read_text().strip().partition(" ")
    if quota == "max":
        return None
    return int(quota) / int(period or 100000)


def _v1_quota(folder: Path) -> float | None:
    quota = int((folder / "cpu.cfs_quota_us").read_text())
    if quota <= 0:  # -1: no limit
        return None
    return quota / int((folder / "cpu.cfs_period_us").read_text())


def proc_cgroups(pid: int) -> dict[str, str]:
    """``/proc/PID/cgroup`` as controllers -> path ("" for cgroup v2's unified hierarchy)."""
    try:
        lines = Path(f"/proc/{pid or 'self'}/cgroup").read_text().splitlines()
    except OSError:  # not Linux, or the process is gone: no quota known
        return {}
    cgroups = {}
    for line in lines:
        _, controllers, path = line.split(":", 2)
        cgroups[controllers] = path
    return cgroups
