"""Expected validation performance (Dodge et al. 2019, "Show Your Work", §3): the expected best dev
score of n trials drawn from the sweep's own trials, for n = 1..N, with its standard deviation.

With the N scores sorted, v_1 <= ... <= v_N, and their empirical distribution P(V <= v_i) = i / N, the
best of n draws (with replacement) is v_i with probability (i / N)^n - ((i - 1) / N)^n; the mean and
the spread follow from those weights. A best-of-N number alone hides what the budget bought: the
curve says how many seeds were enough.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ExpectedMax:
    n: int  # trials drawn
    mean: float  # E[best of n]
    std: float  # its standard deviation


def expected_max(scores: Sequence[float], higher_is_better: bool = True) -> list[ExpectedMax]:
    """E[best of n] and its sd for n = 1..len(scores) (lower-is-better scores: the best is the min)."""
    if not scores:
        return []
    sign = 1.0 if higher_is_better else -1.0
    values = sorted(sign * float(s) for s in scores)
    size = len(values)
    curve = []
    for n in range(1, size + 1):
        weights = [(i / size) ** n - ((i - 1) / size) ** n for i in range(1, size + 1)]
        mean = sum(w * v for w, v in zip(weights, values))
        second = sum(w * v * v for w, v in zip(weights, values))
        curve.append(ExpectedMax(n, sign * mean, math.sqrt(max(0.0, second - mean * mean))))
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
    """One line: 'RTE: best of 1 0.6200 ± 0.0500, of 5 0.6800, of 10 0.6900 — 90% of the gain by 4 trials'."""
    if not curve:
        return f"{task}: no finished trials"
    shown = sorted({1, min(5, len(curve)), len(curve)})
    parts = [f"best of 1 {curve[0].mean:.4f} ± {curve[0].std:.4f}"]
    parts += [f"of {n} {curve[n - 1].mean:.4f}" for n in shown[1:]]
    enough = trials_for_share(curve)
    tail = f" — 90% of the gain by {enough} trials" if enough is not None else " — every trial scored the same"
    return f"{task}: {', '.join(parts)}{tail}"


@dataclass(frozen=True)
class Curve:
    """One task's curve over its finished trials, or over one hyper-parameter point's trials."""

    task: str
    point: str  # "" for all the task's trials, else the point as "lr=0.001 lora.r=8"
    points: list[ExpectedMax]


def _point_name(hparams: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(hparams.items()))


def sweep_curves(records, specs) -> list[Curve]:
    """Per task (and, when the sweep varied hyper-parameters, per point): the curve of its finished trials."""
    curves = []
    for spec in specs:
        done = [r for r in records if r.task == spec.name and r.ok]
        higher = spec.mode == "max"
        curves.append(Curve(spec.name, "", expected_max([r.score for r in done], higher)))
        points: dict[str, list[float]] = {}
        for r in done:
            points.setdefault(_point_name(r.hparams), []).append(r.score)
        if len(points) > 1:  # a point of one trial has no curve (a search's samples are each their own point)
            curves += [Curve(spec.name, name, expected_max(scores, higher))
                       for name, scores in sorted(points.items()) if len(scores) > 1]
    return curves


def curves_csv(curves: Sequence[Curve]) -> str:
    lines = ["task,point,n,expected_max,std"]
    for c in curves:
        point = '"' + c.point.replace('"', '""') + '"' if c.point else ""
        lines += [f"{c.task},{point},{p.n},{p.mean:.6g},{p.std:.6g}" for p in c.points]
    return "\n".join(lines) + "\n"
