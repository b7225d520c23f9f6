"""A picture of a sweep: every seed's score per task over a box plot, the best seed starred, the
trivial score (a constant answer's) as a dashed line.

Built on matplotlib's object API with the Agg canvas, never pyplot: no global backend or figure
state, so it is safe in a driver that also runs Ray and in headless CI.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from sweep.config.tasks import TaskSpec
from sweep.files import atomic_file
from sweep.results.expected_max import LABELS
from sweep.results.records import TrialRecord, best_per_task

JITTER = 0.12  # half-width of the horizontal scatter, so equal scores stay visible


def _draw_task(ax: Axes, spec: TaskSpec, records: list[TrialRecord], rng: np.random.Generator,
               trivial: float | None = None) -> None:
    mine = [r for r in records if r.task == spec.name]
    done = [r for r in mine if r.ok]
    failed = len(mine) - len(done)
    ax.set_title(f"{spec.name} (n={len(done)}" + (f", {failed} failed)" if failed else ")"))
    ax.set_ylabel(spec.metric + (" (lower is better)" if spec.mode == "min" else ""))
    ax.set_xticks([])
    ax.set_xlim(-0.6, 0.6)
    if not done:
        ax.set_yticks([])
        ax.text(0.5, 0.5, "no finished trials", transform=ax.transAxes, ha="center", va="center", color="gray")
        return
    scores = [r.score for r in done]
    # manage_ticks=False keeps the x axis bare; fliers off because every point is drawn below anyway.
    ax.boxplot([scores], positions=[0], widths=0.5, showfliers=False, manage_ticks=False)
    ax.margins(y=0.12)  # room for the "seed N" label above the top score
    xs = rng.uniform(-JITTER, JITTER, len(done))
    ax.scatter(xs, scores, s=25, alpha=0.7, zorder=3)
    best = best_per_task(done, [spec])[spec.name]
    x = xs[done.index(best)]
    ax.scatter([x], [best.score], marker="*", s=260, color="gold", edgecolors="black", zorder=4)
    ax.annotate(f"seed {best.seed}", (x, best.score), xytext=(8, 6), textcoords="offset points")
    if trivial is not None:
        _draw_trivial(ax, trivial)


def _draw_trivial(ax: Axes, trivial: float) -> None:
    """The score of a constant answer, dashed across the panel: seeds on it learned nothing."""
    ax.axhline(trivial, color="firebrick", linestyle="--", linewidth=1, zorder=2, label=f"trivial {trivial:.4f}")
    ax.legend(loc="lower right", fontsize="small", frameon=False)


def seed_scores_figure(records: list[TrialRecord], specs: list[TaskSpec],
                       trivial: Mapping[str, float | None] | None = None) -> Figure:
    """One panel per task: every seed's score, the best starred, and (``trivial``: task -> its trivial
    score) the score of a constant answer as a labelled dashed line."""
    fig = Figure(figsize=(3.2 * max(1, len(specs)), 4.2), layout="constrained")
    rng = np.random.default_rng(0)  # fixed jitter: the same results draw the same picture
    for ax, spec in zip(fig.subplots(1, max(1, len(specs)), squeeze=False)[0], specs):
        _draw_task(ax, spec, records, rng, (trivial or {}).get(spec.name))
    return fig


def plot_seed_scores(records: list[TrialRecord], specs: list[TaskSpec], path: Path,
                     trivial: Mapping[str, float | None] | None = None) -> Path:
    """Write seed_scores_figure as a PNG and return its path."""
    path = Path(path)
    fig = seed_scores_figure(records, specs, trivial)
    with atomic_file(path, "wb") as f:  # a reader never sees half a PNG
        fig.savefig(f, format="png", dpi=120)
    return path


def expected_max_figure(curves, specs: list[TaskSpec]) -> Figure:
    """Each task's expected best score against the number of trials, shaded ±1 sd of the best of n
    (``sweep.results.expected_max.sweep_curves``: the per-task curves, points left out); the figure's title
    names the estimator (the two give different numbers for the same trials)."""
    fig = Figure(figsize=(3.6 * max(1, len(specs)), 4.1), layout="constrained")
    estimators = sorted({p.estimator for c in curves for p in c.points}) or ["unbiased"]
    fig.suptitle(", ".join(LABELS[e] for e in estimators) + "\nband: ±1 sd of the best of n", fontsize=8)
    for ax, spec in zip(fig.subplots(1, max(1, len(specs)), squeeze=False)[0], specs):
        ax.set_title(spec.name)
        ax.set_xlabel("trials")
        ax.set_ylabel(f"expected best {spec.metric}")
        curve = next((c.points for c in curves if c.task == spec.name and not c.point), [])
        if not curve:
            ax.text(0.5, 0.5, "no finished trials", transform=ax.transAxes, ha="center", va="center", color="gray")
            continue
        n = np.array([p.n for p in curve])
        mean, std = np.array([p.mean for p in curve]), np.array([p.std for p in curve])
        ax.plot(n, mean, marker="o", ms=3)
        ax.fill_between(n, mean - std, mean + std, alpha=0.25)
        ax.set_xticks(n if len(n) <= 10 else np.linspace(1, n[-1], 10, dtype=int))
    return fig


def plot_expected_max(curves, specs: list[TaskSpec], path: Path) -> Path:
    """Write expected_max_figure as a PNG and return its path."""
    path = Path(path)
    fig = expected_max_figure(curves, specs)
    with atomic_file(path, "wb") as f:
        fig.savefig(f, format="png", dpi=120)
    return path
