"""What the end of a sweep is made of: an ``Outcome`` the steps fill in, in order, and one runner.

A required step's error ends the sweep as it is (its work is what the sweep is for); a best-effort one's
is one line, and the steps after it go on: the trials' work and the files written before it stay.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from sweep.failures import error_line
from sweep.results.chance import TrivialScore
from sweep.results.records import TaskSummary, TrialRecord


@dataclass
class Outcome:
    """The sweep's trials and what the steps made of them so far."""

    records: list[TrialRecord]
    out_dir: Path
    checkpoint_folders: list = field(default_factory=list)  # every trial's checkpoints (paths or URIs)
    best: dict[str, TrialRecord] = field(default_factory=dict)  # each task's best, once exported
    trivial: dict[str, TrivialScore] = field(default_factory=dict)
    summaries: list[TaskSummary] = field(default_factory=list)
    plot: Path | None = None
    soups: dict = field(default_factory=dict)  # sweep.soup: task -> its Soup (outputs/soup.py)
    # nothing a resume of the sweep would do again (every best model exported, registered and recorded)
    complete: bool = True


class Step:
    """One thing the end of a sweep does. ``required``: its failure is the sweep's; else one line."""

    name: ClassVar[str] = "step"
    required: ClassVar[bool] = True

    def wanted(self, outcome: Outcome) -> bool:
        """Whether this sweep asks for the step (a config option, something to work on)."""
        return True

    def run(self, outcome: Outcome) -> None:
        raise NotImplementedError

    def failed_line(self, error: BaseException, outcome: Outcome) -> str:
        """A best-effort step's line when it failed."""
        return f"{self.name}: not written ({error_line(error)})"


def run_steps(steps: Iterable[Step], outcome: Outcome) -> Outcome:
    """Each wanted step in order: a required one's error propagates, a best-effort one's is its line."""
    for step in steps:
        if not step.wanted(outcome):
            continue
        try:
            step.run(outcome)
        except Exception as e:
            if step.required:
                raise
            print(step.failed_line(e, outcome))
    return outcome
