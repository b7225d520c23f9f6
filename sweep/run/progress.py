"""What a person sees while a sweep runs: one line per change, not a wall of Ray log noise.

    [01:12] 4/10 done, 2 running, 4 pending, 0 failed | WNLI acc best 0.5634 (seed 39) | ETA 2m05s
"""

from __future__ import annotations

import time
from typing import Any

from ray.tune import Callback

from sweep.config import Settings
from sweep.results import rank_key


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}h{m % 60:02d}m" if m >= 60 else f"{m:02d}:{s:02d}"


class SweepProgress(Callback):
    def __init__(self, settings: Settings, total: int):
        self.total = total
        self.metric = {t.name: t.metric for t in settings.tasks}
        self.mode = {t.name: t.mode for t in settings.tasks}
        self.best: dict[str, tuple[float, int]] = {}  # task -> (metric value, seed)
        self.running: set[str] = set()
        self.done: dict[str, float] = {}  # trial id -> wall seconds
        self.failed = 0
        self.start = time.time()
        self.last_line = ""

    def _eta(self) -> str:
        if not self.done:
            return "?"
        remaining = self.total - len(self.done)
        parallel = max(len(self.running), 1)
        per_trial = sum(self.done.values()) / len(self.done)
        return _clock(per_trial * remaining / parallel)

    def _print(self) -> None:
        pending = self.total - len(self.done) - len(self.running)
        bests = " | ".join(
            f"{task} {self.metric[task]} best {value:.4f} (seed {seed})" for task, (value, seed) in sorted(self.best.items())
        )
        line = (f"{len(self.done)}/{self.total} done, {len(self.running)} running, {max(pending, 0)} pending, "
                f"{self.failed} failed" + (f" | {bests}" if bests else "") + f" | ETA {self._eta()}")
        if line != self.last_line:
            self.last_line = line
            print(f"[{_clock(time.time() - self.start)}] {line}", flush=True)

    def on_trial_start(self, iteration: int, trials: list, trial, **info: Any) -> None:
        self.running.add(trial.trial_id)
        self._print()

    def on_trial_result(self, iteration: int, trials: list, trial, result: dict, **info: Any) -> None:
        task = trial.config.get("task")
        value = result.get(f"eval/{self.metric.get(task)}")
        if task in self.metric and value is not None:
            old, seed = self.best.get(task), int(trial.config.get("seed"))
            # the same order as the final choice
            if old is None or rank_key(self.mode[task], value, seed) > rank_key(self.mode[task], *old):
                self.best[task] = (float(value), seed)
        self._print()

    def _finish(self, trial) -> None:
        self.running.discard(trial.trial_id)
        self.done[trial.trial_id] = time.time() - (trial.run_metadata.start_time or self.start)

    def on_trial_complete(self, iteration: int, trials: list, trial, **info: Any) -> None:
        self._finish(trial)
        self._print()

    def on_trial_error(self, iteration: int, trials: list, trial, **info: Any) -> None:
        self._finish(trial)
        self.failed += 1
        self._print()

    def close(self) -> None:
        print(f"[{_clock(time.time() - self.start)}] sweep finished", flush=True)
