"""sweep.soup=true: per task, the seeds of the best point averaged into one model (sweep/train/soup_weights.py),
exported to out_dir/soup/<task>, scored on the selection and report splits as a trial is, and set beside the
best seed: it is the task's model for the registry only where it beats the best seed on the selection split."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweep.config.settings import TrainConfig, with_hparams
from sweep.config.tasks import TaskSpec
from sweep.data.selection import Selection
from sweep.failures import error_line
from sweep.files import atomic_folder
from sweep.outputs.steps import Outcome, Step
from sweep.remote_files import fetch_folder, is_remote
from sweep.results.export_layout import MADE_BY
from sweep.results.records import TrialRecord, WriteModel

SOUP_FOLDER = "soup"  # out_dir/soup/<task>: beside out_dir/best/<task>


@dataclass
class Soup:
    """One task's soup: which seeds, where its model is, its scores as a trial's are named."""

    task: str
    seeds: list[int]
    hparams: dict[str, Any]
    folder: Path
    metrics: dict[str, float] = field(default_factory=dict)  # the selection split's (the eval split's without one)
    score: float | None = None
    report_metrics: dict[str, float] = field(default_factory=dict)
    report_score: float | None = None
    wins: bool = False  # beats the best seed on the selection split: the task's model for the registry
    run_id: str = ""  # its MLflow run (tracking=mlflow)


def soup_members(records: Sequence[TrialRecord], best: TrialRecord) -> list[TrialRecord]:
    """The finished trials of the best trial's point (its task, its hyper-parameters) that kept a checkpoint,
    by seed."""
    return sorted((r for r in records if r.task == best.task and r.ok and r.hparams == best.hparams
                   and r.checkpoint), key=lambda r: r.seed)


def beats(score: float | None, than: float | None, mode: str) -> bool:
    """Strictly better in the task's mode (a tie keeps the single seed: the simpler model)."""
    if score is None or than is None:
        return False
    return score > than if mode == "max" else score < than


class SeedSoup(Step):
    """Each task's soup, after the best seeds are exported; a task whose soup cannot be made is one line."""

    name = "soup"
    required = False

    def __init__(self, tasks: Sequence[TaskSpec], writer: Callable[[str], WriteModel], data_dir: Callable[[], Path],
                 train: TrainConfig, selection: Selection, model_name: str) -> None:
        self.specs = {spec.name: spec for spec in tasks}
        self.writer, self.data_dir, self.train, self.selection = writer, data_dir, train, selection
        self.model_name = model_name

    def wanted(self, outcome: Outcome) -> bool:
        return bool(outcome.best)

    def run(self, outcome: Outcome) -> None:
        for task, best in outcome.best.items():
            members = soup_members(outcome.records, best)
            if len(members) < 2:
                print(f"soup {task}: not made: {len(members)} of the best point's seeds kept a checkpoint, "
                      "and a soup averages 2 or more")
                continue
            try:
                soup = self.make(members, outcome.out_dir / SOUP_FOLDER / task)
                self.score(soup, best)
            except Exception as e:  # noqa: BLE001 - the other tasks' soups and the sweep's results go on
                print(f"soup {task}: not made ({error_line(e)}); the best seed stays the task's model")
                continue
            outcome.soups[task] = soup
            print(self.line(soup, best))

    def make(self, members: list[TrialRecord], target: Path) -> Soup:
        """The members' mean checkpoint, exported as the best seed's is (copied, or its adapter merged)."""
        from sweep.train.soup_weights import write_soup

        first = members[0]
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".soup-", dir=target.parent) as tmp:
            folders = [_here(r.checkpoint, Path(tmp) / f"seed-{r.seed}") for r in members]
            write_soup(folders, Path(tmp) / "checkpoint")
            with atomic_folder(target) as out:  # a failure leaves the last soup (or none), never half of one
                self.writer(first.task)(Path(tmp) / "checkpoint", out)
                (out / MADE_BY).write_text(json.dumps({
                    "task": first.task, "soup_of_seeds": [r.seed for r in members], "model": self.model_name,
                    "hparams": first.hparams, "trial_ids": [r.trial_id for r in members],
                    "sources": first.sources}, indent=2, default=str))
        return Soup(first.task, [r.seed for r in members], dict(first.hparams), target)

    def score(self, soup: Soup, best: TrialRecord) -> None:
        """The soup on the trials' rows: the selection split's score decides, the report split's is quoted."""
        from sweep.train.loop import evaluate_model

        spec = self.specs[soup.task]
        soup.metrics, soup.report_metrics = evaluate_model(
            soup.folder, spec, self.data_dir(), with_hparams(self.train, soup.hparams), self.selection)
        soup.score = soup.metrics.get(spec.metric)
        soup.report_score = soup.report_metrics.get(spec.metric)
        soup.wins = beats(soup.score, best.score, spec.mode)

    def line(self, soup: Soup, best: TrialRecord) -> str:
        metric = self.specs[soup.task].metric

        def both(score: float | None, report: float | None) -> str:
            return f"{score:.4f}" + (f" ({report:.4f} on the report split)" if report is not None else "")

        verdict = ("it beats the best seed on the selection split: the task's model for the registry" if soup.wins
                   else "the best seed stays the task's model (it is no better on the selection split)")
        return (f"soup {soup.task}: the mean of seeds {', '.join(map(str, soup.seeds))} of the best point: {metric} "
                f"{both(soup.score, soup.report_score)}; best seed {best.seed}: {both(best.score, best.report_score)}"
                f"; {verdict} -> {soup.folder}")


def _here(checkpoint: str, dest: Path) -> Path:
    """A checkpoint folder on this machine (cluster.storage_path=s3://…: fetched into ``dest``)."""
    return fetch_folder(checkpoint, dest) if is_remote(checkpoint) else Path(checkpoint)
