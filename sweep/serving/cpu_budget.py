"""How many CPUs the server may use, the thread settings that follow from it, and what keeps a busy
server's processes from pausing (OpenMP's waits, the garbage collector's scans of the start's objects).

torch sizes its thread pool from the host's cores. In a pod with a CPU limit (a cgroup quota) or a process
pinned to a few cores (its affinity) that is more threads than CPUs: they spin and wait on each other, and
on a busy 2-core machine the decoding process delivered a fraction of ``transformers serve``'s tokens/s
(issue [22]; docs/benchmarks.md: Behind the code's choices). So the server counts what it may use, as the kernel
enforces it (``sweep.plan.cpus``).

OpenMP's threads also busy-wait after each parallel region (a spin of ~200k iterations in GNU OpenMP) unless
told to sleep: on a shared CPU that spin is time taken from the server and the other pods.
"""

from __future__ import annotations

import math
import os
from enum import Enum

from sweep.plan.cpus import usable_cpus

# Intra-op threads of a decoding step: measured best on CPU (scripts/bench_serve_vs_transformers.py); a
# step of a small model is too short to split over more threads than this without their waits costing more.
DEFAULT_DECODING_THREADS = 1
# Read by the OpenMP runtime when it loads (with torch): a process must have it before it imports torch.
QUIET_OPENMP = {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "0", "KMP_BLOCKTIME": "0"}


def decoding_threads(requested: int | None, usable: float) -> int:
    """Intra-op threads for a process that decodes: ``requested`` (the ``threads=`` option) when given,
    else the measured best; never more than the whole CPUs it may use (threads past those only wait)."""
    return _within(requested or DEFAULT_DECODING_THREADS, usable)


def _within(threads: int, usable: float) -> int:
    return max(1, min(threads, math.floor(usable)))


class ServerWork(Enum):
    """What the server process's own torch does, which sizes its pool (``server_threads``)."""

    CLASSIFIES = "classifies"  # batched forward passes of a classifier: every usable CPU helps
    DECODES = "decodes"  # generation in this process (the micro-batcher): as a decoding process
    TOKENIZES = "tokenizes"  # a decoding process generates: this one tokenizes and streams, one thread


def server_threads(requested: int | None, work: ServerWork, usable: float) -> int:
    """Intra-op threads of the server process for its ``work`` (``threads=`` is the decoding's, when a
    decoding process does it)."""
    if work == ServerWork.TOKENIZES:
        return 1
    if work == ServerWork.DECODES:
        return decoding_threads(requested, usable)
    return _within(requested or math.floor(usable), usable)


def set_server_threads(requested: int | None, work: ServerWork) -> None:
    import torch

    torch.set_num_threads(server_threads(requested, work, usable_cpus()))


def quiet_openmp_environment() -> None:
    """Let OpenMP's idle threads sleep (for this process's children; a process that has loaded torch
    already read it). A user's own setting stays."""
    for key, value in QUIET_OPENMP.items():
        os.environ.setdefault(key, value)


def freeze_startup_objects() -> None:
    """Keep the objects of the start (torch, transformers, KServe: millions) out of every later garbage
    collection: a full collection that scans them stalled every stream of the server, the slowest of its
    times to first token (docs/benchmarks.md: Behind the code's choices)."""
    import gc

    gc.collect()
    gc.freeze()
