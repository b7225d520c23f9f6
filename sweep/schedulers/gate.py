"""Tune's searchers of the sweep: its trial points in the dispatch order, held while a DDP trial waits
for its worker group, and saved as a position rather than a copy of every trial.

The gate: a one-worker trial asks Tune for its GPU when Tune starts it, but a DDP trial's GPUs are
asked by its Train controller seconds later (Train V2 places the worker group itself). Without a gate
the trials dispatched after a DDP trial take its GPUs in those seconds (Ray spreads them over the
nodes), and the DDP trial then waits for a whole node to free; seen on a 2-node cluster: three 1-GPU
trials on both nodes and the 2-GPU trial, first in the order, started last. So: after handing Tune a
DDP trial, hand out nothing more until that trial reports that its workers are up (a
``trials.Report`` with ``workers_ready``, sent by its workers before their first batch) or ends.

The state: Tune saves the searcher with every experiment snapshot (every few seconds). Tune's own
``BasicVariantGenerator`` over a grid of the trial points saves all of them each time, so a sweep of
n trials spent O(n) per snapshot (seconds of a 400-trial run's driver:
docs/benchmarks.md: Behind the code's choices). Here the points are fixed by
the config (a resumed driver rebuilds them from the pickled Tuner) and the state is where the
searcher is: O(1) for random search.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
from ray.tune.search import Searcher

from sweep.schedulers.search_space import search_domain


class OrderedTrials(Searcher):
    """The trial points in their given order, one Tune trial each, gated on DDP trials' worker groups.
    A subclass says which ``hparams`` a point runs with (``config_of``) and what else it saves."""

    UNSAVED = ("trials", "extras", "placing")  # rebuilt from the config / empty after a restart

    def __init__(self, trials: list[dict[str, Any]], ddp_tasks: set[str]) -> None:
        # no metric: Tune would then demand it in every result, and a DDP trial's first report
        # (its workers are up) has none; the sweep ranks trials itself (results/records.py)
        super().__init__()
        self.trials = list(trials)
        # what each trial's config carries beside its point (``carry``): its ledger identity, and on a
        # resumed launch what it goes on from
        self.extras: list[dict[str, Any]] = [{} for _ in self.trials]
        self.position = 0  # the next point to hand out
        self.ddp_tasks = set(ddp_tasks)
        self.placing: set[str] = set()  # trial ids of DDP trials whose workers are not up yet

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True  # the space is the sweep's, given at construction; Tune's param_space is empty

    def config_of(self, trial_id: str, point: dict[str, Any]) -> dict[str, Any]:
        """The Tune config of the trial at ``point``: ``{"trial": point, "hparams": {...}}``."""
        raise NotImplementedError

    def config_known(self, trial_id: str, point: dict[str, Any], hparams: dict[str, Any]) -> dict[str, Any]:
        """The config of a trial an earlier launch started with ``hparams`` (the ledger's): it goes on
        with them."""
        return {"trial": point, "hparams": dict(hparams)}

    def carry(self, extras: list[dict[str, Any]]) -> None:
        """Each trial's ``extras`` (one per point, in order) go into its config: ``identity`` (the ledger's
        name for it), ``sample_round``, and ``continues`` (an earlier launch's trial it goes on as)."""
        if len(extras) != len(self.trials):
            raise ValueError(f"{len(extras)} extras for {len(self.trials)} trials")
        self.extras = [dict(extra) for extra in extras]

    def learn_from(self, ended: list[tuple[dict[str, Any], dict[str, Any], float | None]]) -> None:
        """Trials an earlier launch ended, as (point, hparams, best score or None): a searcher that learns
        from scores is told them (a resumed launch's searcher is re-seeded from the ledger, not restored)."""

    def suggest(self, trial_id: str):
        if self.placing:
            return None
        if self.position >= len(self.trials):
            return Searcher.FINISHED
        point, extra = self.trials[self.position], self.extras[self.position]
        known = (extra.get("continues") or {}).get("hparams")
        config = self.config_of(trial_id, point) if known is None else self.config_known(trial_id, point, known)
        config.update(extra)
        self.position += 1
        if point["task"] in self.ddp_tasks:
            self.placing.add(trial_id)
        return config

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        self.placing.discard(trial_id)  # any report comes from running workers

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        self.placing.discard(trial_id)

    def saved_state(self) -> dict[str, Any]:
        return {"position": self.position, "count": len(self.trials)}

    def restore_state(self, state: dict[str, Any]) -> None:
        if state["count"] != len(self.trials):  # the Tuner pickled with the sweep rebuilt the same points
            raise RuntimeError(f"the saved search covered {state['count']} trials, this sweep has {len(self.trials)}")
        self.position = state["position"]
        self.placing = set()

    def resume_after(self, handed_out: int) -> None:
        """Go on after the ``handed_out`` trials that Tune's restored experiment state holds.

        Tune uploads its snapshot (the trials, this searcher, its wrappers) file by file: a driver
        killed mid-upload leaves a searcher newer or older than the trial list. Each suggestion is one
        trial, in order, so the trial list says where the search is; a point handed out after the
        trial list was saved is handed out again (seen: a sweep resumed without one of its trials)."""
        self.position = min(handed_out, len(self.trials))

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.saved_state(), f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            self.restore_state(pickle.load(f))


class RandomSearch(OrderedTrials):
    """sweep.search_alg=random: each point's ``hparams`` drawn from ``space`` (``sweep.search`` syntax)
    on its own. The draw of the i-th point depends on (seed, i) only: ``sweep.search_seed`` repeats a
    sweep's points, and a resumed driver draws what the killed one would have."""

    def __init__(self, trials: list[dict[str, Any]], ddp_tasks: set[str], space: dict[str, Any],
                 seed: int | None) -> None:
        super().__init__(trials, ddp_tasks)
        self.space = {key: search_domain(spec) for key, spec in space.items()}
        # no seed given: a fresh one, kept in the saved state (the resumed sweep goes on with it)
        self.seed = int(seed) if seed is not None else int(np.random.SeedSequence().entropy % 2**63)

    def config_of(self, trial_id: str, point: dict[str, Any]) -> dict[str, Any]:
        rng = np.random.default_rng([self.seed, self.position])
        return {"trial": point, "hparams": {key: _plain(domain.sample(random_state=rng))
                                            for key, domain in self.space.items()}}

    def saved_state(self) -> dict[str, Any]:
        return {**super().saved_state(), "seed": self.seed}

    def restore_state(self, state: dict[str, Any]) -> None:
        super().restore_state(state)
        self.seed = state["seed"]


def _plain(value: Any) -> Any:
    """A numpy scalar as Python's (Tune's config goes into JSON and MLflow params)."""
    return value.item() if isinstance(value, np.generic) else value
