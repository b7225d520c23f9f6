"""Did a task learn anything? Its best score against the trivial score, within the noise of its eval rows.

The trivial score is what a model that ignores its input scores on the rows the trials were scored
on (``sweep.train.metrics.trivial_metrics``, read from the eval labels by ``sweep.outputs.trivial``).
A best score within noise of it is no evidence of learning: the summary says so, the plot draws the
line, and the registry does not promote such a model to champion.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Metrics that are a correlation in [-1, 1] (0 for any constant answer); the others are shares in [0, 1].
CORRELATIONS = ("mcc", "corr", "pearson", "spearmanr")


@dataclass(frozen=True)
class TrivialScore:
    """A task's trivial score on its eval split and that split's rows (score None: none is known)."""

    score: float | None
    rows: int = 0
    unknown: str = ""  # why the eval labels could not be read here ("" when read, or for causal LM)


def noise_margin(metric: str, trivial: float, rows: int) -> float:
    """Two standard errors of ``metric`` on ``rows`` eval rows, at the trivial score: how far from it a
    model that learned nothing lands by chance on so few rows.

    A share (accuracy, F1, their mean) is treated as a binomial proportion: sqrt(p(1-p)/n) at p = the
    trivial score (exact for accuracy; F1 and acc_and_f1 are near enough for a warning). A
    correlation (MCC, Pearson, Spearman) of unrelated answers has a standard error of about 1/sqrt(n).
    Never below one row's worth (1/n): a difference of one answer is noise whatever the formula says.
    """
    if rows < 1:
        return math.inf
    if metric in CORRELATIONS:
        error = 1 / math.sqrt(rows)
    else:
        p = min(max(trivial, 0.0), 1.0)
        error = math.sqrt(p * (1 - p) / rows)
    return max(2 * error, 1 / rows)


def learned(best: float, trivial: float, margin: float, mode: str) -> bool:
    """Whether ``best`` beats the trivial score by more than ``margin`` (noise_margin) in the task's direction."""
    gain = best - trivial if mode == "max" else trivial - best
    return gain > margin
