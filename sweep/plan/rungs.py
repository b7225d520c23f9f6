"""Which seeds of a task go on: a ranking without ties, and the two rung rules.

Fine-tuning on small GLUE tasks fails for a share of seeds: the run stays at the score of a model
that predicts the majority class (Dodge et al. 2020; Mosbach et al. 2021). Such a run ties with
the other failed seeds, and a median rule that keeps ties keeps all of them. Here a rung ranks the
trials of one task by the task's metric, then by eval loss (lower first), then by seed (lower
first), so no two trials tie; and a trial no better than the trivial score, while another trial
of its task is above it, is degenerate and stops whatever its rank.

Plain Python: the rungs board (``sweep.plan.rung_boards``), the benchmark and unit tests call it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DEGENERATE = "degenerate"
BELOW_CUT = "below median"
TOLERANCE = 1e-9  # a score this close to the trivial score counts as equal to it


@dataclass(frozen=True)
class RungEntry:
    """One trial's evaluation at a rung."""

    trial_id: str
    seed: int
    score: float  # the selection score: higher is better
    eval_loss: float | None = None
    trivial: float | None = None  # the task's trivial selection score (None: unknown)

    def sort_key(self) -> tuple[float, float, int, str]:
        """Best first: higher score, lower eval loss, lower seed (then the id, so never equal)."""
        loss = self.eval_loss if self.eval_loss is not None and math.isfinite(self.eval_loss) else math.inf
        return (-self.score, loss, self.seed, self.trial_id)

    def at_trivial(self) -> bool:
        return self.trivial is not None and self.score <= self.trivial + TOLERANCE


def past_rung(progress: float, at: float) -> bool:
    """An evaluation at ``progress`` (step / planned steps) is at or past seed halving's fraction ``at``."""
    return progress >= at - TOLERANCE


def ranked(entries: list[RungEntry]) -> list[RungEntry]:
    """The trials of one task at one rung, best first, no ties."""
    return sorted(entries, key=RungEntry.sort_key)


def degenerate(entry: RungEntry, entries: list[RungEntry]) -> RungEntry | None:
    """The trial above the trivial score that makes ``entry`` degenerate, or None."""
    if not entry.at_trivial():
        return None
    learners = [e for e in entries if e.trivial is not None and e.score > e.trivial + TOLERANCE]
    return ranked(learners)[0] if learners else None


@dataclass(frozen=True)
class Verdict:
    go_on: bool
    reason: str = ""  # why it stops: DEGENERATE or BELOW_CUT
    detail: str = ""  # the line a person reads in the summary and MLflow

    @property
    def stop_text(self) -> str:
        return f"{self.reason}: {self.detail}" if self.detail else self.reason


GO_ON = Verdict(True)


def _degenerate_verdict(entry: RungEntry, better: RungEntry, where: str) -> Verdict:
    return Verdict(False, DEGENERATE, f"score {entry.score:.4f} at the trivial {entry.trivial:.4f} {where} "
                                      f"while seed {better.seed} has {better.score:.4f}")


def asha_verdict(entry: RungEntry, recorded: list[RungEntry], reduction_factor: float, where: str) -> Verdict:
    """ASHA at one rung: go on if in the top 1/reduction_factor of the trials recorded there so far
    (``recorded`` holds ``entry``), by the tie-free ranking; a degenerate trial stops."""
    better = degenerate(entry, recorded)
    if better is not None:
        return _degenerate_verdict(entry, better, where)
    order = ranked(recorded)
    position = order.index(entry)
    keep = max(1, math.ceil(len(order) / reduction_factor))
    if position < keep:
        return GO_ON
    return Verdict(False, BELOW_CUT, f"ranked {position + 1} of {len(order)} {where}, ASHA keeps the best {keep}")


def keep_count(keep: float, trials: int) -> int:
    """sweep.halving.keep: a whole number is a count of trials, a number in (0, 1) a share of them."""
    if keep >= 1:
        return min(int(keep), trials)
    return max(1, math.ceil(keep * trials))


def halving_verdicts(entries: list[RungEntry], keep: int, where: str) -> dict[str, Verdict]:
    """Seed halving's one decision for a task, once every trial has reached the rung: the degenerate
    stop, then the best ``keep`` of the rest go on."""
    verdicts: dict[str, Verdict] = {}
    survivors = []
    for entry in ranked(entries):
        better = degenerate(entry, entries)
        if better is not None:
            verdicts[entry.trial_id] = _degenerate_verdict(entry, better, where)
        else:
            survivors.append(entry)
    for position, entry in enumerate(survivors):
        verdicts[entry.trial_id] = GO_ON if position < keep else Verdict(
            False, BELOW_CUT, f"ranked {position + 1} of {len(entries)} {where}, seed halving keeps the best {keep}")
    return verdicts
