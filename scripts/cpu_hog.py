"""A busy process beside a benchmark, as on a shared laptop or a pod's node: a Python loop on one CPU
holding memory it has written (resident, not just reserved). Bounded: it ends after ``max_s`` seconds,
or with the process that started it.

    from scripts.cpu_hog import hog_command, wait_until_ready
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

HOG = """
import os, sys, time
cpu, mb, max_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
os.sched_setaffinity(0, {cpu})
held = bytearray(mb * 2**20)
for i in range(0, len(held), 4096):  # write every page: resident memory, not just reserved
    held[i] = 1
print("ready", flush=True)
parent, end, x = os.getppid(), time.monotonic() + max_s, 0
while time.monotonic() < end and os.getppid() == parent:  # bounded: ends by itself, and with its parent
    for _ in range(200_000):
        x += 1
"""


def hog_command(mb: int, max_s: float) -> list[str]:
    """The hog on the last CPU this process may use."""
    return [sys.executable, "-c", HOG, str(max(os.sched_getaffinity(0))), str(mb), str(max_s)]


def wait_until_ready(proc: subprocess.Popen, log: Path, timeout_s: float = 60) -> None:
    """Back once the hog holds its memory and spins; its log's tail in the error when it does not."""
    deadline = time.monotonic() + timeout_s
    while "ready" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the CPU hog did not start: {log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.1)
