"""Running sweeps in the tests: ``python -m sweep`` as a process, a local Ray, and the GCS's actor
table (which processes held trials)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TRAIN_WORKER = "RayTrainWorker"  # a DDP trial's workers


def sweep_killed_after(done: int, *args: str, cwd: Path, cache: Path) -> int:
    """``python -m sweep ARGS`` killed (driver, its local Ray, every process of its session: SIGKILL, as
    a lost machine) once its progress line says ``done`` trials have finished; how many had. A sweep that
    ends before that fails the test with its output's tail (what it printed is the only trace of why)."""
    env = {**os.environ, "SWEEP_CACHE_DIR": str(cache), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "sweep", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    finished, printed = 0, []
    try:
        for line in proc.stdout:
            printed.append(line)
            if " done, " in line:
                finished = int(line.split("]", 1)[1].split("/")[0])
                if finished >= done:
                    return finished
        code = proc.wait(timeout=60)  # its output closed: it ended by itself
    finally:
        kill_session(proc)
    raise AssertionError(f"the sweep ended (exit {code}) with {finished} trial(s) done, before it could be killed "
                         f"after {done}; its output's end:\n{''.join(printed[-40:])}")


def sweep_cmd(*args: str, cwd: Path, cache: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m sweep ARGS`` as a person types it, in ``cwd``, with its own cache; offline."""
    env = {**os.environ, "SWEEP_CACHE_DIR": str(cache), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "sweep", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def local_ray():
    """A local Ray of 2 CPUs for one test."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def actors(class_name: str, alive_only: bool = True) -> list[dict]:
    """The actors of ``class_name`` in the GCS's actor table (the public state API needs the dashboard,
    which tests don't start): alive ones only, or every one this Ray has had."""
    from ray._private import state

    return [a for a in state.actors().values()
            if a["ActorClassName"] == class_name and (a["State"] == "ALIVE" or not alive_only)]


def kill_session(proc: subprocess.Popen) -> None:
    """SIGKILL the driver and every process of its session (the local Ray it started)."""
    import psutil

    try:
        sid = os.getsid(proc.pid)
    except ProcessLookupError:  # the driver has ended: its session (started with start_new_session) is its pid
        sid = proc.pid
    victims = [p for p in psutil.process_iter() if _sid(p) == sid]
    for p in victims:
        p.kill()
    psutil.wait_procs(victims, timeout=30)


def _sid(p) -> int | None:
    try:
        return os.getsid(p.pid)
    except (ProcessLookupError, PermissionError):
        return None
