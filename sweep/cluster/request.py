"""One standing autoscaler request per cluster, shared by every sweep running on it.

Ray keeps ONE ``request_resources`` per cluster (a KV key for autoscaler v1, one cluster resource
constraint for v2): a second sweep's call replaces the first's, and the first sweep's withdrawal
clears the second's. So no sweep calls ``request_resources`` itself. Each tells the cluster's
``RequestKeeper`` (a detached, zero-CPU actor pinned to the head node, found by name) what its
trials need; the keeper sets the autoscaler's request to the SUM of every sweep's bundles, one call
at a time (an actor runs its methods in order, so two sweeps cannot interleave a read-modify-write).

A sweep whose driver died without withdrawing (SIGKILL, a lost head connection) would pin nodes
forever: the keeper drops entries whose Ray job is dead, at each change and every ``PRUNE_EVERY_S``.
When the last sweep withdraws, the request is cleared and the keeper is killed.

``RequestBook`` is the plain bookkeeping, unit-tested without Ray.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Mapping, Sequence

KEEPER_NAME = "sweep-autoscaler-request"
KEEPER_NAMESPACE = "sweep"
PRUNE_EVERY_S = 30.0
HEAD_RESOURCE = "node:__internal_head__"  # every head node has it (ray/_private/ray_constants.py)


@dataclass(frozen=True)
class Entry:
    job_id: str  # the Ray job of the sweep's driver: the entry lives as long as that job
    bundles: tuple[dict[str, float], ...]


class RequestBook:
    """Each sweep's bundles, by sweep id; ``standing()`` is what the autoscaler is asked for."""

    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}

    def set(self, sweep_id: str, job_id: str, bundles: Iterable[Mapping[str, float]]) -> None:
        self._entries[sweep_id] = Entry(job_id, tuple(dict(b) for b in bundles))

    def drop(self, sweep_id: str) -> bool:
        return self._entries.pop(sweep_id, None) is not None

    def prune(self, live_jobs: set[str]) -> list[str]:
        """Drop the entries of jobs that are no longer alive; returns the dropped sweep ids."""
        dead = [s for s, e in self._entries.items() if e.job_id not in live_jobs]
        for sweep_id in dead:
            del self._entries[sweep_id]
        return dead

    def standing(self) -> list[dict[str, float]]:
        return [dict(b) for e in self._entries.values() for b in e.bundles]

    def sweeps(self) -> list[str]:
        return list(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


# ----------------------------------------------------------------------------------------------
# Ray-facing
# ----------------------------------------------------------------------------------------------

def _live_job_ids() -> set[str]:
    # ray.util.state.list_jobs needs the dashboard; the GCS job table is there on every cluster.
    from ray._private import state

    return {j["JobID"] for j in state.jobs() if not j.get("IsDead")}


def _request_resources(bundles: list[dict[str, float]]) -> None:
    from ray.autoscaler.sdk import request_resources

    request_resources(bundles=bundles)  # [] clears the request (v1: "[]" in the KV; v2: empty constraint)


class RequestKeeper:
    """The actor. ``apply``/``live_jobs`` are injectable for the unit tests."""

    def __init__(self, apply: Callable[[list], None] = _request_resources,
                 live_jobs: Callable[[], set[str]] = _live_job_ids, prune_every_s: float | None = PRUNE_EVERY_S):
        self._book = RequestBook()
        self._lock = threading.Lock()  # the pruning thread and the method calls
        self._apply = apply
        self._live_jobs = live_jobs
        if prune_every_s:
            threading.Thread(target=self._prune_loop, args=(prune_every_s,), daemon=True).start()

    def set(self, sweep_id: str, job_id: str, bundles: Sequence[Mapping[str, float]]) -> list[dict[str, float]]:
        with self._lock:
            self._book.set(sweep_id, job_id, bundles)
            self._book.prune(self._live_jobs() | {job_id})
            return self._push()

    def drop(self, sweep_id: str) -> int:
        """Withdraw one sweep's part; returns how many sweeps still hold a request."""
        with self._lock:
            self._book.drop(sweep_id)
            if self._book:
                self._book.prune(self._live_jobs())
            self._push()
            return len(self._book)

    def standing(self) -> list[dict[str, float]]:
        with self._lock:
            return self._book.standing()

    def sweeps(self) -> list[str]:
        with self._lock:
            return self._book.sweeps()

    def prune_dead(self) -> list[str]:
        with self._lock:
            dropped = self._book.prune(self._live_jobs())
            if dropped:
                self._push()
            return dropped

    def _push(self) -> list[dict[str, float]]:
        standing = self._book.standing()
        self._apply(standing)
        return standing

    def _prune_loop(self, every_s: float) -> None:
        stop = threading.Event()
        while not stop.wait(every_s):
            try:
                self.prune_dead()
            except Exception:  # noqa: BLE001 - a GCS hiccup: try again next round
                pass


def keeper():
    """The cluster's keeper, created on first use (detached: it outlives the sweep that made it)."""
    import ray

    return ray.remote(RequestKeeper).options(
        name=KEEPER_NAME, namespace=KEEPER_NAMESPACE, get_if_exists=True, lifetime="detached",
        num_cpus=0, resources={HEAD_RESOURCE: 0.001},  # on the head: a worker node may be scaled away
        max_concurrency=4,
    ).remote()


def _call(method: str, *args):
    """Call the keeper; a keeper killed by another sweep's last withdrawal is made anew, once."""
    import ray

    for attempt in (1, 2):
        try:
            return ray.get(getattr(keeper(), method).remote(*args))
        except ray.exceptions.RayActorError:
            if attempt == 2:
                raise


def ask(sweep_id: str, bundles: Sequence[Mapping[str, float]]) -> list[dict[str, float]]:
    """Add this sweep's bundles to the cluster's standing request; returns the whole request."""
    import ray

    job_id = ray.get_runtime_context().get_job_id()
    return _call("set", sweep_id, job_id, [dict(b) for b in bundles])


def withdraw(sweep_id: str) -> None:
    """Take this sweep's bundles out; the last sweep out clears the request and ends the keeper."""
    import ray

    if _call("drop", sweep_id) == 0:
        with contextlib.suppress(ValueError, ray.exceptions.RayActorError):
            ray.kill(ray.get_actor(KEEPER_NAME, namespace=KEEPER_NAMESPACE))


@contextlib.contextmanager
def request_trial_resources(sweep_id: str, bundles: Sequence[Mapping[str, float]]) -> Iterator[list[dict[str, float]]]:
    """Ask the autoscaler for ``bundles`` (on top of other sweeps' requests) for the block's duration;
    withdrawn on the way out, whatever happens (an exception, KeyboardInterrupt, GeneratorExit).
    Nothing is asked for an empty list."""
    asked = [dict(b) for b in bundles]
    if not asked:
        yield asked
        return
    ask(sweep_id, asked)
    try:
        yield asked
    finally:
        try:
            withdraw(sweep_id)
        except Exception:  # noqa: BLE001 - Ray already gone: the keeper drops a dead job's entry
            pass
