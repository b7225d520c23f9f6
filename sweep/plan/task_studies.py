"""sweep.search_alg=optuna: one Optuna study (TPE) per task, asked for each trial's search point and
told the trial's best score. Plain Python: ``schedulers/optuna_search.py`` is the thin Tune ``Searcher`` over it.

Scores of different tasks never meet (each task has its own study, as its own rungs). The state is
plain data (finished points with their scores, points still running), so a killed driver's search
goes on from its saved state: the studies are rebuilt from it, the running points re-asked as they were.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import TrialState, create_trial

from sweep.results.importance import varied_space


@dataclass
class StudiesState:
    """What a resumed driver needs: per task, the finished (params, score or None) and the running params."""

    finished: dict[str, list[tuple[dict[str, Any], float | None]]] = field(default_factory=dict)
    running: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    # the samplers as they are (their random state): a rebuilt one with the same seed would draw the
    # first points again (Optuna's advice for resuming a study: pickle its sampler)
    samplers: dict[str, Any] = field(default_factory=dict)


class TaskStudies:
    """A TPE study per task over ``search`` (``sweep.search``'s syntax); ``seed`` fixes its sampler."""

    def __init__(self, search: dict[str, Any], seed: int | None = None, budget: int = 40) -> None:
        self.space: dict[str, BaseDistribution] = varied_space({}, search)
        self.seed = seed
        # TPE samples at random for its first trials (10 by Optuna's default); a small budget per
        # task would spend all of it there: a quarter of the budget, 2 to 10
        self.startup = max(2, min(10, budget // 4))
        self.studies: dict[str, optuna.Study] = {}
        self.state = StudiesState()
        self.asked: dict[tuple[str, int], optuna.Trial] = {}

    def _study(self, task: str, sampler: optuna.samplers.BaseSampler | None = None) -> optuna.Study:
        if task not in self.studies:
            optuna.logging.set_verbosity(optuna.logging.WARNING)  # no line per study created
            # constant_liar: trials still running count as bad guesses, so concurrent asks spread out
            # each task its own seed from the sweep's: tasks explore apart, yet the same points again next time
            seed = None if self.seed is None else (self.seed + zlib.crc32(task.encode())) % 2**31
            sampler = sampler or optuna.samplers.TPESampler(seed=seed, constant_liar=True,
                                                            n_startup_trials=self.startup)
            self.studies[task] = optuna.create_study(direction="maximize", sampler=sampler)
            self.state.samplers[task] = sampler
        return self.studies[task]

    def ask(self, task: str, params: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        """A point for the next trial of ``task`` (its key in this study, the params); ``params``: re-ask
        a running point as it was (a resumed driver)."""
        study = self._study(task)
        if params is not None:
            study.enqueue_trial(params)
        trial = study.ask(self.space)
        self.asked[(task, trial.number)] = trial
        self.state.running.setdefault(task, {})[trial.number] = dict(trial.params)
        return trial.number, dict(trial.params)

    def tell(self, task: str, number: int, score: float | None) -> None:
        """The trial's best score (higher is better); None: it failed (TPE learns nothing from it)."""
        trial = self.asked.pop((task, number))
        params = self.state.running[task].pop(number)
        self.state.finished.setdefault(task, []).append((params, score))
        if score is None or score != score:
            self._study(task).tell(trial, state=TrialState.FAIL)
        else:
            self._study(task).tell(trial, float(score))

    def add_finished(self, task: str, params: dict[str, Any], score: float | None) -> None:
        """A point that ended elsewhere (a saved state, the ledger of a resumed sweep), told to the study."""
        ok = score is not None and score == score
        self._study(task).add_trial(create_trial(params=params, distributions=self.space, value=score if ok else None,
                                                 state=TrialState.COMPLETE if ok else TrialState.FAIL))
        self.state.finished.setdefault(task, []).append((params, score))

    def finished(self, task: str) -> int:
        return len(self.state.finished.get(task, []))

    @classmethod
    def restored(cls, search: dict[str, Any], seed: int | None, budget: int,
                 state: StudiesState) -> tuple[TaskStudies, dict]:
        """Studies rebuilt from ``state``: the finished points told, the running ones re-asked as they
        were. Returns them and ``{(task, old number): new number}`` for the running points."""
        studies = cls(search, seed, budget)
        for task, sampler in state.samplers.items():
            studies._study(task, sampler)
        for task, points in state.finished.items():
            for params, score in points:
                studies.add_finished(task, params, score)
        renumbered = {}
        for task, running in state.running.items():
            for old, params in running.items():
                renumbered[(task, old)] = studies.ask(task, params)[0]
        return studies, renumbered
