"""Expected validation performance: the expected best dev score of n trials drawn from the sweep's own
finished trials, for n = 1..N, with the spread of that best. A best-of-N number alone hides what the
budget bought: the curve says how many seeds were enough.

Two estimators, both over the N scores sorted ascending, v_1 <= ... <= v_N (lower-is-better scores are
negated first, so the best is the min), as weights w_i on v_i:

- ``unbiased`` (the default; Tang et al. 2020, "Showing Your Work Doesn't Always Work", the corrected
  MeanMax estimator of castorini/meanmax): the best of n trials drawn WITHOUT replacement from the N,
  w_i = C(i - 1, n - 1) / C(N, n), the share of the C(N, n) n-subsets whose best is v_i. It is the
  U-statistic of the max of n, so an unbiased estimate of E[best of n] for every n <= N: n = 1 gives the
  mean, n = N the best trial. Ties need nothing special: tied values are equal, whichever order sorts them.
- ``dodge`` (Dodge et al. 2019, "Show Your Work", §3): the best of n draws WITH replacement from the
  empirical distribution, w_i = (i / N)^n - ((i - 1) / N)^n. Kept for comparison: it is biased (low for
  n > 1, Tang et al. 2020), because a draw can repeat a trial, which a real n-trial experiment never does.

The sd is the spread of the best of one n-trial experiment under the same weights,
sqrt(sum w_i v_i^2 - mean^2): the band Dodge et al. draw. For ``unbiased`` it is exact for n trials drawn
without replacement from these N (so 0 at n = N: every N-subset is all of them); it is not the standard
error of the estimate (Tang et al. bootstrap the trials for that).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Estimator = Literal["unbiased", "dodge"]
LABELS: dict[str, str] = {  # the plot's words for each estimator
    "unbiased": "unbiased E[max] (Tang et al. 2020): n trials without replacement",
    "dodge": "E[max] of Dodge et al. 2019: n draws with replacement (biased)",
}
SHORT: dict[str, str] = {"unbiased": "unbiased E[max]", "dodge": "Dodge E[max]"}  # the printed line's


@dataclass(frozen=True)
class ExpectedMax:
    n: int  # trials drawn
    mean: float  # E[best of n]
    std: float  # the sd of the best of n (the module docstring: not the estimate's standard error)
    estimator: str = "unbiased"  # which weights gave mean and std: a key of LABELS


def _unbiased_weights(size: int, n: int) -> list[float]:
    """C(i - 1, n - 1) / C(N, n) for i = 1..N, by the ratio of neighbours rather than math.comb: the same
    numbers (tests/test_expected_max.py holds them to math.comb's) in O(N) floats, where math.comb's big
    integers made a curve of 500 trials take most of a second. From w_N = n / N down, w_(i-1) = w_i (i - n) /
    (i - 1): 0 from i = n - 1 down (fewer than n trials at or below v_i, never the best of n)."""
    weights = [0.0] * size
    weights[-1] = n / size
    for i in range(size, n, -1):
        weights[i - 2] = weights[i - 1] * (i - n) / (i - 1)
    return weights


def _dodge_weights(size: int, n: int) -> list[float]:
    return [(i / size) ** n - ((i - 1) / size) ** n for i in range(1, size + 1)]


WEIGHTS = {"unbiased": _unbiased_weights, "dodge": _dodge_weights}


def expected_max(scores: Sequence[float], higher_is_better: bool = True,
                 estimator: Estimator = "unbiased") -> list[ExpectedMax]:
    """E[best of n] and its sd for n = 1..len(scores) (lower-is-better scores: the best is the min)."""
    if estimator not in WEIGHTS:
        raise ValueError(f"estimator must be one of {sorted(WEIGHTS)}, not {estimator!r}")
    if not scores:
        return []
    sign = 1.0 if higher_is_better else -1.0  # negated, the min is the max: one code path for both modes
    values = sorted(sign * float(s) for s in scores)
    curve = []
    for n in range(1, len(values) + 1):
        weights = WEIGHTS[estimator](len(values), n)
        mean = sum(w * v for w, v in zip(weights, values))
        second = sum(w * v * v for w, v in zip(weights, values))
        std = math.sqrt(max(0.0, second - mean * mean))  # max(): rounding can dip a zero variance below 0
        curve.append(ExpectedMax(n, sign * mean, std, estimator))
    return curve


def trials_for_share(curve: Sequence[ExpectedMax], share: float = 0.9) -> int | None:
    """The fewest trials whose expected best reaches ``share`` of the gain from 1 to N trials (None: no gain)."""
    if len(curve) < 2:
        return None
    gain = curve[-1].mean - curve[0].mean
    if gain == 0:
        return None
    return next(p.n for p in curve if (p.mean - curve[0].mean) / gain >= share - 1e-12)


def format_curve(task: str, curve: Sequence[ExpectedMax]) -> str:
    """One line: 'RTE (unbiased E[max]): best of 1 0.6200 ± 0.0500, of 5 0.6800, of 10 0.6900 — 90% of the gain
    by 4 trials' (the estimator named: the two give different numbers for the same trials)."""
    if not curve:
        return f"{task}: no finished trials"
    shown = sorted({1, min(5, len(curve)), len(curve)})
    parts = [f"best of 1 {curve[0].mean:.4f} ± {curve[0].std:.4f}"]
    parts += [f"of {n} {curve[n - 1].mean:.4f}" for n in shown[1:]]
    enough = trials_for_share(curve)
    tail = f" — 90% of the gain by {enough} trials" if enough is not None else " — every trial scored the same"
    return f"{task} ({SHORT[curve[0].estimator]}): {', '.join(parts)}{tail}"


@dataclass(frozen=True)
class Curve:
    """One task's curve over its finished trials, or over one hyper-parameter point's trials."""

    task: str
    point: str  # "" for all the task's trials, else the point as "lr=0.001 lora.r=8"
    points: list[ExpectedMax]


def _point_name(hparams: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(hparams.items()))


def sweep_curves(records, specs, estimator: Estimator = "unbiased") -> list[Curve]:
    """Per task (and, when the sweep varied hyper-parameters, per point): the curve of its finished trials."""
    curves = []
    for spec in specs:
        done = [r for r in records if r.task == spec.name and r.ok]
        higher = spec.mode == "max"
        curves.append(Curve(spec.name, "", expected_max([r.score for r in done], higher, estimator)))
        points: dict[str, list[float]] = {}
        for r in done:
            points.setdefault(_point_name(r.hparams), []).append(r.score)
        if len(points) > 1:  # a point of one trial has no curve (a search's samples are each their own point)
            curves += [Curve(spec.name, name, expected_max(scores, higher, estimator))
                       for name, scores in sorted(points.items()) if len(scores) > 1]
    return curves


def curves_csv(curves: Sequence[Curve]) -> str:
    """One row per task, point and n; the estimator as the last column (a reader by position keeps working)."""
    lines = ["task,point,n,expected_max,std,estimator"]
    for c in curves:
        point = '"' + c.point.replace('"', '""') + '"' if c.point else ""
        lines += [f"{c.task},{point},{p.n},{p.mean:.6g},{p.std:.6g},{p.estimator}" for p in c.points]
    return "\n".join(lines) + "\n"
