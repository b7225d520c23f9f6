"""The nodes' staging lines on the driver's terminal while the trials run (nodes that join late).

A Tune callback, so it lives here and not in sweep/cluster/stage_nodes.py: each node's staging task imports
that module, and Tune's import (~1 CPU-second) bought it nothing.
"""

from __future__ import annotations

from typing import Any

from ray.tune import Callback

from sweep.cluster.stage_nodes import RelayLines


class StagingLines(Callback):
    def __init__(self, relay) -> None:
        self.lines = RelayLines(relay)

    def on_step_end(self, iteration, trials, **info) -> None:
        self.lines()

    def on_experiment_end(self, trials, **info) -> None:
        self.lines(force=True)

    def __getstate__(self) -> dict[str, Any]:
        return {"lines": RelayLines(None)}  # Tune pickles its callbacks; the relay is this launch's
