"""The sweep's remaining time (the progress line's ETA and the plan's predicted makespan on CPU).

A trial's wall time is its start-up, its training loop and its end. The loop's duration is predicted per
trial (``sweep.plan.costs``: ``TrialWork.gpu_seconds``, taken at the trial's GPU share, or in one CPU
trial slot where the probe measured it). The start-up is a new trial process's (``cold``: a Ray worker
importing torch, transformers and Ray Train) for the first trials, a reused process's (``warm``:
the next model and data) for the rest (Tune reuses trial processes); and Tune's own setup comes
before the first trial (``launch``). Those are priors, measured on this project's 2-core VM. The end
(``finish``) is the time from the loop's last report to the trial's end in the driver: the checkpoint that
report saves, the trial's MLflow run closed, its process freed, Tune's bookkeeping; on CPU the plan sets
it from a checkpoint's save timed by the probe (``sweep.plan.probe.end_seconds``), elsewhere a prior.

What the running sweep shows replaces the priors, as real tools do after the first trials:
* the loops' scale: observed loop seconds / predicted ones, summed over the trials that reported
  (a trial at progress p after L seconds of loop implies L / p; a resumed one says nothing);
* the cold and warm start-ups: the mean of those seen (a trial's first loop start - its start;
  cold when its process ran no earlier trial);
* the end: the mean of those seen (a trial's end in the driver - its report at the loop's end);
* a running trial that reported ends when its own pace says (a resumed one: its rest at the
  predicted pace).
The trials left are then dispatched as Tune does: on CPU trial slots, greedily in dispatch order
(a heap of slots, exact for equal slots); on GPU shares, the work left over the GPUs, never less
than the longest running trial's rest.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from sweep.plan.makespan import DEFAULT_SPEEDUP, Speedup, TrialWork

# Priors, the rounded medians of sweeps on CPU on this project's 2-core VM: the tuner's start to the first
# trial's start; the driver's trial start to the loop's start in a new process (Ray started that process
# earlier, importing torch, transformers and Ray Train); the same in a reused process
# (docs/benchmarks.md: Behind the code's choices).
LAUNCH_S, COLD_START_S, WARM_START_S = 5.0, 5.0, 0.5
# A trial's wall time outside its loop after the loop starts: a checkpoint saved at each evaluation, then
# its end: seconds for MiniLM's checkpoints, a fraction of one for the demo's tiny model
# (docs/benchmarks.md: Behind the code's choices). On CPU the probe times a save (sweep.plan.probe.end_seconds:
# END_S plus the saves); FINISH_S stands for it where nothing was measured (trials on GPUs).
FINISH_S, END_S = 3.0, 0.2
LOOP_DONE = 0.999  # a report at this share of the steps is the loop's last
SIMULATE_AT_MOST = 512  # trials left past this: the work over the slots (the last wave's tail is small then)


@dataclass(frozen=True)
class Overheads:
    """Seconds outside the training loops (priors until the sweep shows its own)."""

    launch: float = LAUNCH_S
    cold: float = COLD_START_S
    warm: float = WARM_START_S
    # the loop's last report -> the trial's end; before any trial ends it also stands for the checkpoints
    # saved at the earlier evaluations, which the plan's loop leaves out (a running trial's pace has them)
    finish: float = FINISH_S


@dataclass
class _Running:
    key: Hashable
    started: float  # the driver's clock
    cold: bool  # a new process (guessed from the start order until a report names its pid)
    loop_started: float | None = None
    end: float | None = None  # its loop's end at its own pace (from its reports)
    loop_ended: float | None = None  # its report at the loop's last step (then only its end is left)
    resumed_at: tuple[float, float] | None = None  # a resumed trial's last (report time, progress)


class Forecast:
    """The sweep's remaining seconds from each trial's predicted loop, rescaled as trials report.

    ``trials`` and ``keys`` pair up, in dispatch order (a key repeats for Tune's search samples).
    ``shares``: each task's GPUs per trial, None where the trials run on CPU; ``capacity``: the
    cluster's GPUs, or the CPU trials at once; ``concurrency``: trials at once (the first ones start
    cold). ``known``: the predictions mean seconds here (GPU prior, or measured on this CPU); else
    (a CPU nobody measured) ``remaining`` is None until a trial shows its pace.
    """

    def __init__(self, trials: Sequence[TrialWork], keys: Sequence[Hashable], shares: Mapping[str, float] | None,
                 capacity: int, concurrency: int, known: bool, overheads: Overheads = Overheads(),
                 speedup: Speedup = DEFAULT_SPEEDUP):
        self.on_slots = shares is None
        self.capacity, self.concurrency = max(1, capacity), max(1, concurrency)
        self.known, self.overheads = known, overheads
        self.order = list(keys)
        self.loop: dict[Hashable, float] = {}  # key -> predicted loop seconds at its share
        self.share: dict[Hashable, float] = {}  # key -> GPUs it holds (1: a CPU slot)
        for key, t in zip(keys, trials):
            share = 1.0 if shares is None else (shares.get(t.task, 1.0) or 1.0)
            self.loop[key], self.share[key] = speedup.seconds(t.gpu_seconds, share), share
        self.started_keys: dict[Hashable, int] = {}  # key -> its copies started
        self.ever_started: set[str] = set()
        self.running: dict[str, _Running] = {}
        self.pids: set[int] = set()  # trial processes seen
        # the work of the trials not yet started, kept as they start (not summed per progress line)
        self.pending = len(self.order)
        self.pending_loop = sum(self.loop[k] * self.share[k] for k in self.order)
        self.pending_share = sum(self.share[k] for k in self.order)
        self.observed: dict[str, tuple[float, float]] = {}  # trial id -> (implied loop, predicted loop)
        self.observed_sum = [0.0, 0.0]
        self.startups: dict[bool, list[float]] = {True: [], False: []}  # cold? -> seen start-ups
        self.finishes: list[float] = []  # seen ends: a trial's end - its loop's last report

    # --- what the sweep shows ---------------------------------------------------------------------

    def start(self, trial_id: str, key: Hashable, now: float) -> None:
        first = trial_id not in self.ever_started
        if first:
            self.ever_started.add(trial_id)
            self._taken(key)
        self.running[trial_id] = _Running(key, now, cold=first and len(self.ever_started) <= self.concurrency)

    def ended_before(self, key: Hashable) -> None:
        """A trial an earlier launch ended (a resumed sweep's ledger): no longer pending, nothing learnt."""
        self._taken(key)

    def _taken(self, key: Hashable) -> None:
        if key in self.loop:
            self.started_keys[key] = self.started_keys.get(key, 0) + 1
            self.pending -= 1
            self.pending_loop -= self.loop[key] * self.share[key]
            self.pending_share -= self.share[key]

    def report(self, trial_id: str, progress: float | None, loop_started: float | None, reported_at: float | None,
               pid: int | None = None, resumed: bool = False) -> None:
        """An evaluation: ``progress`` of the trial's steps done, its loop's start and the report's time."""
        run = self.running.get(trial_id)
        if run is None or loop_started is None:
            return
        if run.loop_started is None:  # its first report: how long it took to start
            if pid is not None:
                run.cold = pid not in self.pids
                self.pids.add(pid)
            self.startups[run.cold].append(max(0.0, loop_started - run.started))
            run.loop_started = loop_started
        if not progress or progress <= 0 or reported_at is None or run.key not in self.loop:
            return
        if progress >= LOOP_DONE:
            run.loop_ended = reported_at
        if resumed:  # its loop began mid-way: the rest of it at the predicted pace, and nothing learnt
            run.resumed_at = (reported_at, min(progress, 1.0))
            return
        implied = max(0.0, reported_at - loop_started) / min(progress, 1.0)
        run.end = loop_started + implied
        self._observe(trial_id, implied, self.loop[run.key])

    def finish(self, trial_id: str, now: float | None = None) -> None:
        """The trial ended (at ``now``, the driver's clock): from its loop's last report, that is its end."""
        run = self.running.pop(trial_id, None)
        if run is not None and run.loop_ended is not None and now is not None:
            self.finishes.append(max(0.0, now - run.loop_ended))

    def _observe(self, trial_id: str, implied: float, predicted: float) -> None:
        old = self.observed.get(trial_id, (0.0, 0.0))
        self.observed[trial_id] = (implied, predicted)
        self.observed_sum[0] += implied - old[0]
        self.observed_sum[1] += predicted - old[1]

    # --- the estimate -----------------------------------------------------------------------------

    @property
    def scale(self) -> float:
        """Observed loop seconds over predicted ones (1: nothing observed yet)."""
        observed, predicted = self.observed_sum
        return observed / predicted if predicted > 0 and observed > 0 else 1.0

    def startup(self, cold: bool) -> float:
        seen = self.startups[cold]
        if seen:
            return sum(seen) / len(seen)
        return self.overheads.cold if cold else self.overheads.warm

    def ending(self) -> float:
        """Seconds from a trial's loop end to its end: the mean of those seen, else the prior."""
        return sum(self.finishes) / len(self.finishes) if self.finishes else self.overheads.finish

    def remaining(self, now: float) -> float | None:
        """Seconds until the last trial ends; None: a CPU no one measured, and no trial's pace seen yet."""
        if not self.known and not self.observed:
            return None
        rests = [self._rest(run, now) for run in self.running.values()]
        launch = self.overheads.launch if not self.ever_started else 0.0
        if self.on_slots and self.pending <= SIMULATE_AT_MOST:
            return launch + self._on_slots(rests)
        return launch + self._over_capacity(rests)

    def _rest(self, run: _Running, now: float) -> float:
        """A running trial's seconds left: its loop's rest (none once past its predicted end), then its end."""
        if run.loop_ended is not None:
            return max(0.0, run.loop_ended + self.ending() - now)
        return self._loop_rest(run, now) + self.ending()

    def _loop_rest(self, run: _Running, now: float) -> float:
        if run.end is not None:
            return max(0.0, run.end - now)
        loop = self.loop.get(run.key, 0.0) * self.scale
        if run.resumed_at is not None:
            reported_at, progress = run.resumed_at
            return max(0.0, reported_at + (1 - progress) * loop - now)
        begins = run.loop_started if run.loop_started is not None else run.started + self.startup(run.cold)
        return max(0.0, begins + loop - now)

    def _pending(self) -> list[tuple[Hashable, float]]:
        """The trials not started, in dispatch order, with their predicted wall seconds."""
        seen: dict[Hashable, int] = {}
        left, started, scale, ending = [], len(self.ever_started), self.scale, self.ending()
        for key in self.order:
            seen[key] = seen.get(key, 0) + 1
            if seen[key] > self.started_keys.get(key, 0):
                cold = started + len(left) < self.concurrency
                left.append((key, self.startup(cold) + self.loop[key] * scale + ending))
        return left

    def _on_slots(self, rests: list[float]) -> float:
        """Greedy dispatch on equal slots: each pending trial takes the slot that frees first."""
        slots = sorted(rests) + [0.0] * max(0, self.capacity - len(rests))
        heapq.heapify(slots)
        for _, seconds in self._pending():
            heapq.heappush(slots, heapq.heappop(slots) + seconds)
        return max(slots, default=0.0)

    def _over_capacity(self, rests: list[float]) -> float:
        """The work left (seconds x share) over the capacity, never less than a running trial's rest."""
        running = sum(rest * self.share.get(run.key, 1.0) for rest, run in zip(rests, self.running.values()))
        cold = max(0, min(self.pending, self.concurrency - len(self.ever_started)))  # first wave not started
        starts = self.startup(False) * self.pending_share + (self.startup(True) - self.startup(False)) * cold
        work = running + self.pending_loop * self.scale + starts + self.ending() * self.pending_share
        return max(work / self.capacity, max(rests, default=0.0))
