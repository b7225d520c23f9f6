"""Tune's trial generator, held shut while a DDP trial waits for its worker group.

A one-worker trial asks Tune for its GPU when Tune starts it, but a DDP trial's GPUs are asked by
its Train controller seconds later (Train V2 places the worker group itself). Without a gate the
trials dispatched after a DDP trial take its GPUs in those seconds (Ray spreads them over the
nodes), and the DDP trial then waits for a whole node to free; seen on a 2-node cluster: three
1-GPU trials on both nodes and the 2-GPU trial, first in the order, started last. So: after
handing Tune a DDP trial, hand out nothing more until that trial reports that its workers are up
(a ``trials.Report`` with ``workers_ready``, sent by its workers before their first batch) or ends.
"""

from __future__ import annotations

from typing import Any

from ray.tune.search.basic_variant import BasicVariantGenerator


class DdpFirst(BasicVariantGenerator):
    """The grid in its given order (``BasicVariantGenerator``), gated on DDP trials' worker groups."""

    def __init__(self, ddp_tasks: set[str], max_concurrent: int = 0):
        super().__init__(max_concurrent=max_concurrent)
        self.ddp_tasks = set(ddp_tasks)
        self.placing: set[str] = set()  # trial ids of DDP trials whose workers are not up yet

    def next_trial(self):
        if self.placing:
            return None
        trial = super().next_trial()
        if trial is not None and trial.config.get("trial", {}).get("task") in self.ddp_tasks:
            self.placing.add(trial.trial_id)
        return trial

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        self.placing.discard(trial_id)  # any report comes from running workers
        super().on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        self.placing.discard(trial_id)
        super().on_trial_complete(trial_id, result=result, error=error)
