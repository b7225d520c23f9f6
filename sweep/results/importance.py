"""Which hyper-parameter mattered: per task, the importance of each ``train.*`` key a grid or search
varied, by Optuna's fANOVA (Hutter et al. 2014) over the task's finished trials.

The finished trials go into an in-memory Optuna study (``study.add_trial``), each with the values of
the keys that varied and its score; ``optuna.importance`` does the rest. The importances of a task
sum to 1: they say which key explains the scores best, not how much of the spread the keys explain
at all (with seed noise only, the shares are close to equal).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.importance import FanovaImportanceEvaluator, get_param_importances
from optuna.trial import create_trial

from sweep.config.settings import SweepConfig
from sweep.config.tasks import TaskSpec
from sweep.files import write_text
from sweep.results.records import TrialRecord

METHOD = "fANOVA"
MIN_TRIALS = 4  # below this a forest of 2 or 3 scores says nothing a reader cannot see in results.csv
SEED = 0  # the forest's bootstraps: the same records give the same importances


@dataclass(frozen=True)
class Importance:
    """One task's importances, most important first (sums to 1), or why there are none."""

    task: str
    trials: int  # finished trials of the task
    importances: dict[str, float] = field(default_factory=dict)
    skipped: str = ""  # the reason when ``importances`` is empty


def varied_space(grid: Mapping[str, Any], search: Mapping[str, Any]) -> dict[str, BaseDistribution]:
    """The keys a sweep varied (``SweepConfig.grid`` / ``.search``, flattened) as Optuna distributions.

    A grid of numbers is a numeric range (the forest splits on order: 1e-5 < 2e-5 < 5e-5); other grids
    (strings, bools, None, mixed) and ``choice`` are categorical. A grid of one value varied nothing."""
    space: dict[str, BaseDistribution] = {}
    for key, values in grid.items():
        distinct = list(dict.fromkeys(values))
        if len(distinct) < 2:
            continue
        if all(isinstance(v, int) and not isinstance(v, bool) for v in distinct):
            space[key] = IntDistribution(min(distinct), max(distinct))
        elif all(isinstance(v, Real) and not isinstance(v, bool) for v in distinct):
            space[key] = FloatDistribution(float(min(distinct)), float(max(distinct)))
        else:
            space[key] = CategoricalDistribution(distinct)
    for key, spec in search.items():
        if spec["dist"] == "choice":
            space[key] = CategoricalDistribution(list(dict.fromkeys(spec["values"])))
        else:
            space[key] = FloatDistribution(float(spec["low"]), float(spec["high"]), log=spec["dist"] == "loguniform")
    return space


@contextmanager
def _quiet_optuna() -> Iterator[None]:
    """No 'A new study created in memory' line per task; the caller's verbosity comes back after."""
    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(before)


def _task_importance(spec: TaskSpec, records: Sequence[TrialRecord],
                     space: Mapping[str, BaseDistribution]) -> Importance:
    # The seed is not one of the keys: every sweep varies it, and the question is which train key
    # mattered. Trials that differ only in their seed are repeated points; their spread is the noise
    # the forest averages over.
    done = [r for r in records if r.task == spec.name and r.ok and math.isfinite(r.score)  # a NaN loss is no score
            and all(k in r.hparams for k in space)]
    varied = [k for k in space if len({repr(r.hparams[k]) for r in done}) > 1]
    if len(done) < MIN_TRIALS or not varied:
        where = " at one point" if done and not varied else ""
        return Importance(spec.name, len(done), skipped=f"needs at least {MIN_TRIALS} finished trials over 2+ "
                                                        f"values of a varied key; has {len(done)}{where}")
    if len({r.score for r in done}) == 1:
        # fANOVA finds no variance and get_param_importances would share 1 out equally: say so instead
        return Importance(spec.name, len(done), skipped=f"every one of its {len(done)} trials scored the same")
    # fANOVA rather than PED-ANOVA (Optuna's default): fANOVA splits the variance of the score over
    # the keys, across the whole grid, and works with a dozen trials; PED-ANOVA compares the top 10%
    # of trials with the rest and wants at least 5 trials in that top (50+ trials per task).
    study = optuna.create_study(direction="maximize" if spec.mode == "max" else "minimize")
    outside = 0
    for r in done:
        try:
            study.add_trial(create_trial(params={k: r.hparams[k] for k in varied},
                                         distributions={k: space[k] for k in varied}, value=float(r.score)))
        except ValueError:  # a value the configured space does not hold (records of an older config)
            outside += 1
    if len(done) - outside < MIN_TRIALS:
        return Importance(spec.name, len(done) - outside, skipped=f"needs at least {MIN_TRIALS} finished trials "
                          f"inside the sweep's space; {outside} of {len(done)} are outside it")
    found = get_param_importances(study, evaluator=FanovaImportanceEvaluator(seed=SEED), params=varied)
    return Importance(spec.name, len(done) - outside, {k: float(v) for k, v in found.items()})


def param_importances(records: Sequence[TrialRecord], tasks: Sequence[TaskSpec],
                      space: Mapping[str, BaseDistribution]) -> list[Importance]:
    """Per task, in ``tasks``' order: the importance of each key of ``space`` (``varied_space``) that
    varied among its finished trials (early-stopped ones count at the score they reached)."""
    if not space:
        return []
    with _quiet_optuna():
        return [_task_importance(spec, records, space) for spec in tasks]


def format_importance(result: Importance) -> str:
    """'importance RTE: lr 0.91, batch_size 0.09 (fANOVA over 12 trials)', or the line saying why not."""
    if not result.importances:
        return f"importance: {result.task}: {result.skipped}"
    keys = ", ".join(f"{k} {v:.2f}" for k, v in result.importances.items())
    return f"importance {result.task}: {keys} ({METHOD} over {result.trials} trials)"


def importance_csv(results: Sequence[Importance]) -> str:
    """task,param,importance,trials: a row per task and key, most important first."""
    text = io.StringIO(newline="")
    w = csv.writer(text, lineterminator="\n")
    w.writerow(["task", "param", "importance", "trials"])
    w.writerows([r.task, k, f"{v:.6g}", r.trials] for r in results for k, v in r.importances.items())
    return text.getvalue()


def report_importance(records: Sequence[TrialRecord], tasks: Sequence[TaskSpec], sweep: SweepConfig,
                      out_dir: Path) -> Path | None:
    """importance.csv in ``out_dir`` and a line per task when the sweep varied a ``train.*`` key (its
    ``sweep.grid`` / ``sweep.search``); None (and nothing printed) when it varied none."""
    space = varied_space(sweep.grid, sweep.search)
    if not space:
        return None
    results = param_importances(records, list(tasks), space)
    path = write_text(Path(out_dir) / "importance.csv", importance_csv(results), key="out_dir")
    for result in results:
        print(format_importance(result))
    return path

