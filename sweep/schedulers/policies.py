"""Each ``sweep.scheduler`` and ``sweep.search_alg`` as one small object, built once from the config by
``policies_for``: the one place that maps their names to what they do. The tuner, the trial, the hooks
and the rungs boards ask the object (does it pause trials, what does it mutate, does it halve seeds,
which rungs board, which Tune scheduler or searcher) and never compare a name.

Plain Python at import: Ray only inside the methods that build Tune's objects. The Ray-side classes
stay where they are (``seed_halving.py``, ``pbt.py``, ``optuna_search.py``, ``gate.py``) and the plain
ones in ``sweep/plan/`` (the rungs boards): a policy constructs them.

Validation (``sweep/config/validate.py``) is a layer below and cannot ask a policy: the few facts its
checks need by name (``PAUSING``, ``LEARNING``) have their one home there, and the policies here take
their answers from them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from sweep.config.settings import HalvingConfig, Settings, SweepConfig
from sweep.config.validate import LEARNING, PAUSING
from sweep.errors import ConfigError
from sweep.plan.rung_boards import AshaRungs, SeedHalving, trials_per_task

Board = tuple[type, dict[str, Any]]  # a rungs board's class and its keyword arguments


class SchedulerPolicy:
    """What a ``sweep.scheduler`` means for the rest of the sweep; the answers of one that does nothing
    beyond running every trial to its end.

    Public (``sweep.SchedulerPolicy``): a subclass's instance passed as ``sweep.run(settings, scheduler=...)``
    is asked instead of the one ``sweep.scheduler`` names, on the driver and (pickled) in every trial.
    """

    # pauses trials (their slot lent, resumed later from their checkpoint): Tune's searcher gets no
    # concurrency limit, the progress line counts the paused, DDP trials are refused (validate)
    pauses_trials: ClassVar[bool] = False
    # every checkpoint kept until the sweep ends (else the best and the latest)
    keeps_every_checkpoint: ClassVar[bool] = False

    def __init__(self, sweep: SweepConfig) -> None:
        self.sweep = sweep

    @property
    def mutations(self) -> dict[str, Any]:
        """The train keys it changes in the middle of a trial, each with its range; {}: none."""
        return {}

    @property
    def halving(self) -> HalvingConfig | None:
        """Seed halving's rung (``at``) and what it keeps; None: this sweep does not halve seeds."""
        return None

    def rung_board(self, settings: Settings, total: int) -> Board | None:
        """The rungs board the trials ask after each evaluation (``total``: the sweep's trials); None: none."""
        return None

    def tune_scheduler(self, rungs_board: str | None) -> Any:
        """Tune's scheduler (``rungs_board``: the board actor's name); None: Tune's default FIFO."""
        return None


class FifoPolicy(SchedulerPolicy):
    """sweep.scheduler=fifo: every trial runs to its end."""


class AshaPolicy(SchedulerPolicy):
    """sweep.scheduler=asha: rungs at epoch ends, per task, on a board the trials ask (no Tune scheduler)."""

    def rung_board(self, settings: Settings, total: int) -> Board:
        max_t = max([settings.train.epochs, *self.sweep.grid.get("epochs", [])])  # the longest trial's epochs
        return AshaRungs, {"max_t": max_t}


class SeedHalvingPolicy(SchedulerPolicy):
    """sweep.scheduler=seed_halving: one decision per task at fraction ``at`` of training; a trial that gets
    there first is paused (its slot lent) until its task is decided."""

    pauses_trials = "seed_halving" in PAUSING

    @property
    def halving(self) -> HalvingConfig:
        return self.sweep.halving

    def rung_board(self, settings: Settings, total: int) -> Board:
        halving = self.sweep.halving
        return SeedHalving, {"trials_per_task": trials_per_task(settings, total),
                             "keep": halving.keep, "at": halving.at}

    def tune_scheduler(self, rungs_board: str | None) -> Any:
        from sweep.schedulers.seed_halving import SeedHalvingScheduler

        return SeedHalvingScheduler(rungs_board, self.sweep.halving.at)


class PbtPolicy(SchedulerPolicy):
    """sweep.scheduler=pbt: one population per task (and grid point) whose bottom trials clone the top ones'
    checkpoints with mutated values (a pause, then a restart from the donor's checkpoint)."""

    pauses_trials = "pbt" in PAUSING
    # an exploit clones a top trial's checkpoint of its last perturbation, which may no longer be its
    # best or latest
    keeps_every_checkpoint = True

    @property
    def mutations(self) -> dict[str, Any]:
        return self.sweep.pbt.mutations

    def tune_scheduler(self, rungs_board: str | None) -> Any:
        from sweep.schedulers.pbt import TaskPbt

        return TaskPbt(self.sweep.pbt)


class SearcherPolicy:
    """What a ``sweep.search_alg`` means: the values each trial point (task, seed, grid point) runs with.
    Every searcher hands out the grid's points, in the dispatch order."""

    # learns from the scores: needs a search space, may give one point to several seeds, and cannot
    # draw PBT's first population (PBT searches by itself)
    learns_from_scores: ClassVar[bool] = False

    def __init__(self, sweep: SweepConfig) -> None:
        self.sweep = sweep

    def space(self, scheduler: SchedulerPolicy) -> dict[str, Any]:
        """The dimensions (``sweep.search`` syntax) each trial's ``hparams`` are drawn from."""
        raise NotImplementedError

    def tune_searcher(self, trials: list[dict[str, Any]], ddp_tasks: set[str], scheduler: SchedulerPolicy) -> Any:
        """Tune's searcher over ``trials`` (their points, in order); ``ddp_tasks`` gate the order."""
        raise NotImplementedError


class RandomSearchPolicy(SearcherPolicy):
    """sweep.search_alg=random: each trial's values drawn on their own (``gate.RandomSearch``)."""

    def space(self, scheduler: SchedulerPolicy) -> dict[str, Any]:
        # PBT's first population draws each mutated key from its mutation range, unless the search has it
        return {**scheduler.mutations, **self.sweep.search}

    def tune_searcher(self, trials: list[dict[str, Any]], ddp_tasks: set[str], scheduler: SchedulerPolicy) -> Any:
        from sweep.schedulers.gate import RandomSearch

        return RandomSearch(trials, ddp_tasks, self.space(scheduler), self.sweep.search_seed)


class OptunaSearchPolicy(SearcherPolicy):
    """sweep.search_alg=optuna: a TPE study per task and grid point asked for each point
    (``optuna_search.TaskOptunaSearch``)."""

    learns_from_scores = "optuna" in LEARNING

    def space(self, scheduler: SchedulerPolicy) -> dict[str, Any]:
        return dict(self.sweep.search)

    def tune_searcher(self, trials: list[dict[str, Any]], ddp_tasks: set[str], scheduler: SchedulerPolicy) -> Any:
        from sweep.schedulers.optuna_search import TaskOptunaSearch

        sweep = self.sweep
        return TaskOptunaSearch(trials, self.space(scheduler), sweep.search_seed, ddp_tasks, sweep.seeds_per_point,
                                sweep.aggregate)


@dataclass(frozen=True)
class SweepPolicies:
    scheduler: SchedulerPolicy
    searcher: SearcherPolicy


# The only place that reads the names (validate's CHOICES lists the same ones: a test holds them equal).
SCHEDULERS: dict[str, type[SchedulerPolicy]] = {
    "fifo": FifoPolicy, "asha": AshaPolicy, "seed_halving": SeedHalvingPolicy, "pbt": PbtPolicy,
}
SEARCHERS: dict[str, type[SearcherPolicy]] = {"random": RandomSearchPolicy, "optuna": OptunaSearchPolicy}


def policies_for(sweep: SweepConfig, own: SchedulerPolicy | None = None) -> SweepPolicies:
    """The sweep's scheduler and searcher policies, from its (validated) config; ``own``: the user's scheduler
    policy (``sweep.run(scheduler=...)``), used instead of the one ``sweep.scheduler`` names."""
    searcher = _chosen(SEARCHERS, "sweep.search_alg", sweep.search_alg)
    if own is not None:
        return SweepPolicies(scheduler=own, searcher=searcher(sweep))
    scheduler = _chosen(SCHEDULERS, "sweep.scheduler", sweep.scheduler)
    return SweepPolicies(scheduler=scheduler(sweep), searcher=searcher(sweep))


def _chosen(table: Mapping[str, type], key: str, name: str) -> type:
    # validate refuses an unknown name first; this only meets one in a SweepConfig built by hand
    if name not in table:
        raise ConfigError(f"{key}: got {name!r}, allowed: {', '.join(table)}")
    return table[name]
