"""The CPUs a process may use (sweep/plan/cpus.py) and the server's threads (sweep/serving/cpu_budget.py): cgroup
quotas read from real files laid out as the kernel mounts them (v1 and v2, nested, unlimited), affinity from
the kernel, and the thread counts that follow. The servers' own use of it: tests/test_serve_continuous.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sweep.plan.cpus import cgroup_quota, usable_cpus
from sweep.serving.cpu_budget import DEFAULT_DECODING_THREADS, ServerWork, decoding_threads, server_threads


def _v1(folder: Path, quota: int, period: int = 100000) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (folder / "cpu.cfs_period_us").write_text(f"{period}\n")


def _v2(folder: Path, line: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cpu.max").write_text(line + "\n")


def test_cgroup_v2_quota_is_the_smallest_along_the_path(tmp_path: Path) -> None:
    _v2(tmp_path, "max 100000")
    _v2(tmp_path / "kubepods", "400000 100000")
    _v2(tmp_path / "kubepods" / "pod1", "150000 100000")  # the pod's limit: 1.5 CPUs
    _v2(tmp_path / "kubepods" / "pod1" / "ctr", "max 100000")
    assert cgroup_quota({"": "/kubepods/pod1/ctr"}, tmp_path) == 1.5
    assert cgroup_quota({"": "/"}, tmp_path) is None  # unlimited


def test_cgroup_v1_quota_of_the_cpu_controller(tmp_path: Path) -> None:
    _v1(tmp_path / "cpu,cpuacct", -1)
    _v1(tmp_path / "cpu,cpuacct" / "docker" / "abc", 50000, 100000)
    cgroups = {"cpu,cpuacct": "/docker/abc", "memory": "/docker/abc", "": "/"}
    assert cgroup_quota(cgroups, tmp_path) == 0.5
    assert cgroup_quota({"memory": "/docker/abc"}, tmp_path) is None  # no cpu controller: no quota known


def test_a_container_sees_its_own_cgroup_as_the_mount_root(tmp_path: Path) -> None:
    """Inside a container /proc names the host's path, which is not under the mount: the mount's own
    files (the container's cgroup) hold the limit."""
    _v2(tmp_path, "200000 100000")
    assert cgroup_quota({"": "/kubepods/burstable/pod9/ctr"}, tmp_path) == 2.0


def test_this_process_may_use_its_affinity_within_its_quota() -> None:
    assert usable_cpus() <= len(os.sched_getaffinity(0))
    assert usable_cpus() > 0


def test_threads_follow_the_usable_cpus() -> None:
    assert decoding_threads(None, 8.0) == DEFAULT_DECODING_THREADS
    assert decoding_threads(4, 8.0) == 4
    assert decoding_threads(4, 1.5) == 1  # asked for more than the CPUs: the extra threads would only wait
    assert decoding_threads(None, 0.5) == 1  # under one CPU: still one thread
    assert server_threads(None, ServerWork.CLASSIFIES, 3.0) == 3 and server_threads(8, ServerWork.CLASSIFIES, 3.0) == 3
    assert server_threads(4, ServerWork.TOKENIZES, 8.0) == 1  # a decoding process decodes; the server tokenizes
    assert server_threads(2, ServerWork.DECODES, 8.0) == 2


def test_an_unreadable_proc_entry_means_no_quota(tmp_path: Path) -> None:
    with pytest.raises(ProcessLookupError):
        usable_cpus(pid=2**22 + 12345, cgroup_root=tmp_path)  # no such process: the kernel says so
