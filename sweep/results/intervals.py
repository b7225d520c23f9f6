"""How sure the summary's numbers are: a 95% interval of the mean over seeds, and two points compared paired
by the seeds they share (issue 54).

Plain numbers in, plain numbers out (scipy for the resampling), so the same scores always give the same
interval: the resampling's seed is fixed (``RESAMPLING_SEED``).

- the interval: a bootstrap of the mean, BCa; percentile where BCa cannot be computed (2 scores: the
  jackknife's acceleration needs 3; or BCa comes out NaN). All-equal scores: the zero-width interval
  (there is nothing to resample). Fewer than 2 scores: no interval.
- the comparison: the per-seed differences (best minus runner-up, turned so that > 0 favours the best in the
  task's mode) tested by a two-sided sign-flip permutation test on their mean (exact, every sign pattern,
  up to 13 seeds; 9999 random flips above), alpha 0.05, with the paired-bootstrap interval of the mean
  difference. With n seeds the smallest p a sign-flip test can give is 2/2^n: 5 seeds cannot reach 0.05.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
ALPHA = 0.05  # a difference whose sign-flip p is at least this is within noise
RESAMPLING_SEED = 0  # the bootstrap's and the random flips' seed: the same scores, the same numbers
RESAMPLES = 9999  # scipy enumerates every sign pattern instead while 2^n <= this (n <= 13 seeds)

Interval = tuple[float, float]


def mean_interval(scores: Sequence[float]) -> Interval | None:
    """The 95% bootstrap interval of the mean of ``scores``; None with fewer than 2."""
    values = np.sort(np.asarray(scores, dtype=float))  # sorted: the records' order does not move the interval
    if len(values) < 2:
        return None
    if np.all(values == values[0]):  # scipy warns and answers NaN: no spread, the interval is the value
        return float(values[0]), float(values[0])
    # BCa's acceleration comes from the jackknife: with 2 scores it is no estimate, percentile is the honest one
    interval = _bootstrap(values, "BCa") if len(values) >= 3 else None
    return interval or _bootstrap(values, "percentile")


def _bootstrap(values: np.ndarray, method: str) -> Interval | None:
    """scipy's bootstrap interval of the mean by ``method`` (None where it is degenerate: NaN)."""
    with warnings.catch_warnings():  # a degenerate resample's warning: the NaN below says the same
        warnings.simplefilter("ignore")
        ci = stats.bootstrap((values,), np.mean, method=method, confidence_level=CONFIDENCE,
                             n_resamples=RESAMPLES, random_state=RESAMPLING_SEED).confidence_interval
    low, high = float(ci.low), float(ci.high)
    return (low, high) if math.isfinite(low) and math.isfinite(high) else None


@dataclass(frozen=True)
class Paired:
    """Two points compared over their shared seeds: the mean difference (> 0: the first is better in the
    task's mode), its 95% interval, the sign-flip test's two-sided p and the seeds it was paired over."""

    seeds: int
    difference: float | None = None
    low: float | None = None
    high: float | None = None
    p_value: float | None = None

    @property
    def distinguishable(self) -> bool | None:
        """The first beats the second beyond noise (None: not compared, under 2 shared seeds)."""
        if self.p_value is None or self.difference is None:
            return None
        return self.p_value < ALPHA and self.difference > 0



def seeds_to_reject() -> int:
    """The fewest paired seeds whose sign-flip test can reach p < alpha (its smallest p is 2/2^n): 6."""
    return next(n for n in range(2, 64) if 2 / 2 ** n < ALPHA)


def compare_paired(first: dict[int, float], second: dict[int, float], mode: str) -> Paired:
    """``first`` against ``second`` (seed -> score) over the seeds both have; mode min: lower is better."""
    shared = sorted(set(first) & set(second))
    if len(shared) < 2:  # one difference has no spread to test against
        return Paired(seeds=len(shared))
    sign = 1.0 if mode == "max" else -1.0
    diffs = np.array([sign * (first[s] - second[s]) for s in shared])
    interval = mean_interval(diffs.tolist())
    assert interval is not None  # 2 or more differences
    return Paired(seeds=len(shared), difference=float(diffs.mean()), low=interval[0], high=interval[1],
                  p_value=sign_flip_p(diffs))


def sign_flip_p(diffs: np.ndarray) -> float:
    """Two-sided p of the mean of paired differences under random signs (the two points exchangeable)."""
    if not np.any(diffs):  # every flip gives 0, as observed: nothing tells the points apart
        return 1.0
    result = stats.permutation_test((diffs,), np.mean, permutation_type="samples", alternative="two-sided",
                                    n_resamples=RESAMPLES, random_state=RESAMPLING_SEED)
    return float(min(1.0, result.pvalue))
