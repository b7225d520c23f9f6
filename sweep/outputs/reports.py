"""What a sweep's end writes and prints about its trials: the trivial scores, the results files and the
summary, the analyses (expected max, importance), the GLUE submission, and the closing lines."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from sweep.config.settings import Settings, SweepConfig, TrainConfig
from sweep.config.tasks import TaskSpec
from sweep.failures import error_line
from sweep.outputs.steps import Outcome, Step
from sweep.results.chance import TrivialScore
from sweep.results.outcome import failure_lines
from sweep.results.records import (
    format_early_stops,
    format_points,
    format_summary,
    format_unlearned,
    summarize,
    write_results,
)


class TrivialScores(Step):
    """What a constant answer scores on each task's eval rows (a task whose labels cannot be read here is
    unknown: one line says why; whether it learned anything is then not checked)."""

    name = "trivial scores"

    def __init__(self, scores: Callable[[Sequence[str]], dict[str, TrivialScore]]) -> None:
        self.scores = scores

    def run(self, outcome: Outcome) -> None:
        outcome.trivial = self.scores(list(outcome.best))
        for task, known in outcome.trivial.items():
            if known.unknown:
                print(f"trivial score {task}: unknown ({known.unknown}); whether it learned anything is not checked")


class ResultsFiles(Step):
    """results.json, results.csv, summary.csv and the seed scores' plot; the summary printed."""

    name = "results"

    def __init__(self, tasks: Sequence[TaskSpec], aggregate: str | None, train: TrainConfig, synthetic: bool,
                 registry: bool) -> None:
        self.tasks, self.aggregate, self.train = list(tasks), aggregate, train
        self.synthetic, self.registry = synthetic, registry

    def run(self, outcome: Outcome) -> None:
        from sweep.results.report import plot_seed_scores

        outcome.summaries = summarize(outcome.records, self.tasks, self.aggregate, outcome.trivial)
        for summary in outcome.summaries:  # sweep.soup: each task's soup beside its seeds
            if (soup := outcome.soups.get(summary.task)) is not None:
                summary.soup_seeds, summary.soup_score = len(soup.seeds), soup.score
                summary.soup_report_score, summary.soup_wins = soup.report_score, soup.wins
        write_results(outcome.out_dir, outcome.records, outcome.summaries)
        outcome.plot = plot_seed_scores(outcome.records, self.tasks, outcome.out_dir / "seed_scores.png",
                                        {task: known.score for task, known in outcome.trivial.items()})
        print(format_summary(outcome.summaries))
        if self.synthetic:
            print("data: SYNTHETIC (storage.synthetic_data=true): generated rows; "
                  "these scores say nothing of the model")
        for summary in outcome.summaries:
            if summary.learned is False:
                hparams = outcome.best[summary.task].hparams
                print(format_unlearned(summary, self.train, hparams, registry=self.registry))
        if self.aggregate:
            print(format_points(outcome.records, self.tasks, self.aggregate))


class ExpectedMax(Step):
    """How many trials were enough: the expected best of n trials (unbiased, Tang et al. 2020), in
    expected_max.csv (with its estimator column), expected_max.png (its title names the estimator), a line per task."""

    name = "expected_max"
    required = False

    def __init__(self, tasks: Sequence[TaskSpec]) -> None:
        self.tasks = list(tasks)

    def run(self, outcome: Outcome) -> None:
        from sweep.files import write_text
        from sweep.results.expected_max import curves_csv, format_curve, sweep_curves
        from sweep.results.report import plot_expected_max

        curves = sweep_curves(outcome.records, self.tasks)
        write_text(outcome.out_dir / "expected_max.csv", curves_csv(curves), key="out_dir")
        plot_expected_max(curves, self.tasks, outcome.out_dir / "expected_max.png")
        for curve in curves:
            print(format_curve(f"{curve.task} [{curve.point}]" if curve.point else curve.task, curve.points))


class Importance(Step):
    """Which varied train key mattered, per task (fANOVA): importance.csv and a line per task."""

    name = "importance"
    required = False

    def __init__(self, tasks: Sequence[TaskSpec], sweep: SweepConfig) -> None:
        self.tasks, self.sweep = list(tasks), sweep  # what it varied: sweep.grid and sweep.search

    def run(self, outcome: Outcome) -> None:
        from sweep.results.importance import report_importance

        report_importance(outcome.records, self.tasks, self.sweep, outcome.out_dir)


class GlueSubmission(Step):
    """sweep.predict_test: the best models' GLUE submission (glue_submission.zip), the data read on this
    machine (``data_dir``: from S3, staged here first). The exported models stay whatever happens here."""

    name = "glue submission"
    required = False

    def __init__(self, settings: Settings, data_dir: Callable[[], Path]) -> None:
        self.settings, self.data_dir = settings, data_dir

    def wanted(self, outcome: Outcome) -> bool:
        return self.settings.sweep.predict_test and bool(outcome.best)

    def run(self, outcome: Outcome) -> None:
        from sweep.outputs.glue_submission import write_submission

        best_dirs = {task: outcome.out_dir / "best" / task for task in outcome.best}
        for line in write_submission(self.settings, best_dirs, outcome.out_dir, self.data_dir()).lines():
            print(line)

    def failed_line(self, error: BaseException, outcome: Outcome) -> str:
        return f"glue submission: not written ({error_line(error)}); the best models are in {outcome.out_dir / 'best'}"


class ClosingLines(Step):
    """The trials stopped early, each failed trial's reason (the same reason once), where the results are."""

    name = "closing lines"

    def run(self, outcome: Outcome) -> None:
        stops = format_early_stops(outcome.records, outcome.summaries)
        if stops:
            print(stops)
        for line in failure_lines(outcome.records):
            print(line)
        out = outcome.out_dir
        print(f"results: {out / 'results.csv'}  summary: {out / 'summary.csv'}  plot: {outcome.plot}")
