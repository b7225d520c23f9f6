"""What a sweep produced: one record per trial, the best trial per task, seed statistics, files.

Plain Python over plain records, so the same code serves the Ray Tune sweep and the sequential
baseline, and unit tests need no cluster.
"""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
import statistics
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sweep.config.settings import TrainConfig
from sweep.config.tasks import TaskSpec
from sweep.disk import folder_size, writing
from sweep.files import atomic_folder, write_json, write_text
from sweep.remote_files import fetch_folder, is_remote
from sweep.results.chance import TrivialScore, learned, noise_margin
from sweep.results.export_layout import MADE_BY
from sweep.results.intervals import ALPHA, Paired, compare_paired, mean_interval, seeds_to_reject
from sweep.results.trial_reports import TRAINING_STATE


@dataclass
class TrialRecord:
    task: str
    seed: int
    hparams: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)  # the best epoch's eval metrics
    score: float | None = None  # the task's metric at the best epoch (None: the trial failed)
    # sweep.selection: metrics and score above are the selection split's; these the report split's, taken at
    # the same best evaluation (the number to quote); empty / None without a selection split
    report_metrics: dict[str, float] = field(default_factory=dict)
    report_score: float | None = None
    best_epoch: int | None = None
    best_step: int | None = None  # the training step of the best evaluation (it may fall inside an epoch)
    epochs_done: int = 0  # whole epochs trained
    steps_done: int = 0  # optimizer steps trained: the compute the trial spent
    steps_total: int = 0  # the steps it would have trained to the end
    stopped: str = ""  # why the rungs stopped it early (degenerate / below median …); "" if not
    stopped_at_step: int | None = None
    wall_seconds: float = 0.0
    loop_seconds: float = 0.0  # inside the training loop (train + eval): wall minus this is overhead
    startup_seconds: float = 0.0  # trial start -> first batch: processes, imports, model and data loading
    gpus: float = 0.0  # GPUs the trial held, for GPU-hours
    node: str = ""
    status: str = "TERMINATED"  # TERMINATED | ERROR
    error: str | None = None
    checkpoint: str | None = None  # folder of the best checkpoint (None once pruned)
    checkpoint_note: str = ""  # the best checkpoint was gone from storage: which one is exported instead
    trial_id: str = ""
    run_id: str = ""  # the trial's MLflow run (tracking=mlflow)
    pid: int | None = None  # the process that ran the loop: a reused process runs trial after trial
    started_at: float = 0.0  # unix time the trial began (its process start, for a process's first trial)
    # sweep.scheduler=pbt: the values it trained with, from which step, and the trial it cloned (trials.pbt_schedule)
    schedule: list[dict[str, Any]] = field(default_factory=list)
    # where the base model and the data came from (the Hub's commit shas, S3's ETags, synthetic): DriverSources
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "TERMINATED" and self.score is not None


@dataclass
class TaskSummary:
    task: str
    metric: str
    mode: str
    n: int
    failed: int
    mean: float
    std: float
    median: float
    min: float
    max: float
    best_seed: int | None
    best_score: float | None
    gpu_hours: float
    stopped: int = 0  # trials stopped early by the rungs
    steps: int = 0  # optimizer steps trained, all trials
    steps_full: int = 0  # the steps every trial would have trained to the end
    trivial_score: float | None = None  # what a constant answer scores on the eval rows (None: not known)
    eval_rows: int = 0  # the eval rows the trials were scored on (what the noise is measured on)
    noise: float | None = None  # how far from the trivial score chance lands (results/chance.noise_margin)
    learned: bool | None = None  # the best beats the trivial score by more than the noise (None: not known)
    # the mean's 95% bootstrap interval over the finished trials' scores (None: under 2 scores; results/intervals.py)
    ci_low: float | None = None
    ci_high: float | None = None
    # with 2 or more points (grid/search): the best point against the runner-up, paired by their shared seeds
    best_point: str | None = None  # the points' labels: "batch_size=16, lr=2e-05"
    runner_up: str | None = None
    paired_seeds: int = 0  # the seeds both ran (under 2: not compared)
    difference: float | None = None  # mean per-seed difference, > 0: the best is better in the task's mode
    difference_low: float | None = None  # its 95% paired-bootstrap interval
    difference_high: float | None = None
    p_value: float | None = None  # the sign-flip test's, two-sided
    distinguishable: bool | None = None  # the best beats the runner-up beyond noise (p < 0.05); None: not compared
    # sweep.selection: the scores above are the selection split's (what picked the best); the report split's,
    # which no decision read: the best trial's (the number to quote) and the mean over the finished trials
    best_report_score: float | None = None
    report_mean: float | None = None
    # sweep.soup: the best point's seeds averaged into one model (outputs/soup.py), scored on both splits; it is
    # the task's model for the registry only if it beats the best seed on the selection split (soup_wins)
    soup_seeds: int = 0
    soup_score: float | None = None
    soup_report_score: float | None = None
    soup_wins: bool | None = None


def rank_key(mode: str, score: float, seed: int) -> tuple[float, int]:
    """The order of trials of one task, best last: a better score (by the task's mode), then the lower seed."""
    return (score if mode == "max" else -score, -seed)


AGGREGATES: dict[str, Callable[[list[float]], float]] = {"mean": statistics.fmean, "median": statistics.median}


def points_of(done: list[TrialRecord]) -> dict[str, list[TrialRecord]]:
    """Finished trials by their hyper-parameter point (one key per distinct hparams)."""
    points: dict[str, list[TrialRecord]] = {}
    for r in done:
        points.setdefault(json.dumps(r.hparams, sort_keys=True, default=str), []).append(r)
    return points


def ranked_points(done: list[TrialRecord], spec: TaskSpec, aggregate: str) -> list[list[TrialRecord]]:
    """A task's points, best first, by the aggregate of their seeds' scores (ties: the point with the lower seed)."""
    combine = AGGREGATES[aggregate]
    return sorted(points_of(done).values(), reverse=True,
                  key=lambda rs: rank_key(spec.mode, combine([r.score for r in rs]), min(r.seed for r in rs)))


def best_per_task(records: list[TrialRecord], specs: list[TaskSpec],
                  aggregate: str | None = None) -> dict[str, TrialRecord]:
    """The best finished trial of each task by its metric and mode; ties go to the lower seed. With
    ``aggregate`` (sweep.seeds_per_point > 1: configs scored over seeds) the best trial of the point whose
    seeds aggregate best: the best config's best checkpoint, not the luckiest seed of any config."""
    best: dict[str, TrialRecord] = {}
    for spec in specs:
        done = [r for r in records if r.task == spec.name and r.ok]
        if done and aggregate:
            done = ranked_points(done, spec, aggregate)[0]
        if done:
            best[spec.name] = max(done, key=lambda r: rank_key(spec.mode, r.score, r.seed))
    return best


def point_label(hparams: Mapping[str, Any]) -> str:
    """A point as people read it: 'batch_size=16, lr=2e-05' ('no search keys' when nothing varied)."""
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in sorted(hparams.items())) or "no search keys"


def format_points(records: list[TrialRecord], specs: list[TaskSpec], aggregate: str, top: int = 3) -> str:
    """Per task, its best points by the aggregate of their seeds, with the spread: what the search ranked."""
    lines = []
    for spec in specs:
        done = [r for r in records if r.task == spec.name and r.ok]
        if not done:
            continue
        shown = []
        for rs in ranked_points(done, spec, aggregate)[:top]:
            scores = [r.score for r in rs]
            spread = statistics.stdev(scores) if len(scores) > 1 else 0.0
            shown.append(f"{point_label(rs[0].hparams)}: {AGGREGATES[aggregate](scores):.4f} ± {spread:.4f} "
                         f"({len(scores)} seeds)")
        lines.append(f"points {spec.name} by the {aggregate} of their seeds: " + "; ".join(shown))
    return "\n".join(lines)


def summarize(records: list[TrialRecord], specs: list[TaskSpec], aggregate: str | None = None,
              trivial: Mapping[str, TrivialScore] | None = None) -> list[TaskSummary]:
    """Per task: the seeds' statistics, the best trial and, with ``trivial`` (task -> its trivial score on
    the eval rows, ``sweep.outputs.trivial``), whether that best learned anything."""
    best = best_per_task(records, specs, aggregate)
    out = []
    for spec in specs:
        mine = [r for r in records if r.task == spec.name]
        scores = [r.score for r in mine if r.ok]
        nan = math.nan
        out.append(
            TaskSummary(
                task=spec.name,
                metric=spec.metric,
                mode=spec.mode,
                n=len(scores),
                failed=len(mine) - len(scores),
                mean=statistics.fmean(scores) if scores else nan,
                std=statistics.stdev(scores) if len(scores) > 1 else 0.0 if scores else nan,
                median=statistics.median(scores) if scores else nan,
                min=min(scores) if scores else nan,
                max=max(scores) if scores else nan,
                best_seed=best[spec.name].seed if spec.name in best else None,
                best_score=best[spec.name].score if spec.name in best else None,
                gpu_hours=sum(r.gpus * r.wall_seconds for r in mine) / 3600,
                stopped=sum(bool(r.stopped) for r in mine),
                steps=sum(r.steps_done for r in mine),
                steps_full=sum(r.steps_total for r in mine),
            )
        )
        _report_scores(out[-1], [r for r in mine if r.ok], best.get(spec.name))
        _judge(out[-1], (trivial or {}).get(spec.name))
        if interval := mean_interval(scores):
            out[-1].ci_low, out[-1].ci_high = interval
        _compare_points(out[-1], [r for r in mine if r.ok], spec, aggregate or "mean")
    return out


def _compare_points(summary: TaskSummary, done: list[TrialRecord], spec: TaskSpec, aggregate: str) -> None:
    """The best point against the runner-up (ranked as the sweep ranks them), paired by their shared seeds;
    left unset with fewer than 2 points."""
    points = ranked_points(done, spec, aggregate)
    if len(points) < 2:
        return
    best, runner = points[0], points[1]
    paired = compare_paired(_by_seed(best), _by_seed(runner), spec.mode)
    summary.best_point, summary.runner_up = point_label(best[0].hparams), point_label(runner[0].hparams)
    _fill_paired(summary, paired)


def _by_seed(point: list[TrialRecord]) -> dict[int, float]:
    """seed -> the point's score on it (the mean where a seed ran more than once: num_samples rounds)."""
    scores: dict[int, list[float]] = {}
    for r in point:
        scores.setdefault(r.seed, []).append(r.score)
    return {seed: statistics.fmean(s) for seed, s in scores.items()}


def _fill_paired(summary: TaskSummary, paired: Paired) -> None:
    summary.paired_seeds, summary.difference, summary.p_value = paired.seeds, paired.difference, paired.p_value
    summary.difference_low, summary.difference_high = paired.low, paired.high
    summary.distinguishable = paired.distinguishable


def _report_scores(summary: TaskSummary, done: list[TrialRecord], best: TrialRecord | None) -> None:
    """sweep.selection: the best trial's report score and the report split's mean (unset without one)."""
    reported = [r.report_score for r in done if r.report_score is not None]
    summary.report_mean = statistics.fmean(reported) if reported else None
    summary.best_report_score = best.report_score if best is not None else None


def _judge(summary: TaskSummary, trivial: TrivialScore | None) -> None:
    """The summary's trivial score, noise and verdict (left unset when either side is not known): the best
    trial's score on the eval rows the trivial score is of (its report score with a selection split)."""
    if trivial is None or trivial.score is None:
        return
    summary.trivial_score, summary.eval_rows = trivial.score, trivial.rows
    summary.noise = noise_margin(summary.metric, trivial.score, trivial.rows)
    judged = summary.best_report_score if summary.best_report_score is not None else summary.best_score
    if judged is not None:
        summary.learned = learned(judged, trivial.score, summary.noise, summary.mode)


def _flat_row(r: TrialRecord) -> dict[str, Any]:
    row = {k: v for k, v in asdict(r).items()
           if k not in ("hparams", "metrics", "report_metrics", "schedule", "sources")}
    if r.schedule:  # one cell: "lr=1e-05 from 0; lr=1.2e-05 from 40 (cloned t_00002)"
        row["schedule"] = format_schedule(r.schedule)
    row.update({f"hp.{k}": v for k, v in sorted(r.hparams.items())})
    row.update({f"metric.{k}": v for k, v in sorted(r.metrics.items())})  # the split decisions were made on
    row.update({f"report.{k}": v for k, v in sorted(r.report_metrics.items())})  # sweep.selection: the quoted one
    row.update({f"source.{k}": v for k, v in sorted(r.sources.items())})
    return row


def format_schedule(schedule: list[dict[str, Any]]) -> str:
    def one(part: dict[str, Any]) -> str:
        values = ", ".join(f"{k}={v:.3g}" for k, v in sorted(part["values"].items()))
        return f"{values} from step {part['from_step']}" + (f" (cloned {part['donor']})" if part.get("donor") else "")

    return "; ".join(one(part) for part in schedule)


def _csv_text(rows: list[dict[str, Any]]) -> str:
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    text = io.StringIO(newline="")
    w = csv.DictWriter(text, fieldnames=columns)
    w.writeheader()
    w.writerows(rows)
    return text.getvalue()


def write_results(out_dir: Path, records: list[TrialRecord], summaries: list[TaskSummary]) -> None:
    """results.json, results.csv (one row per trial) and summary.csv (one row per task).

    Each is written whole or not at all (write_text); a full disk is one DiskFullError line."""
    out_dir = Path(out_dir)
    payload = {"trials": [asdict(r) for r in records], "summary": [asdict(s) for s in summaries]}
    write_json(out_dir / "results.json", payload, key="out_dir", indent=2, default=str)
    write_text(out_dir / "results.csv", _csv_text([_flat_row(r) for r in records]), key="out_dir")
    write_text(out_dir / "summary.csv", _csv_text([asdict(s) for s in summaries]), key="out_dir")


def load_records(path: Path) -> list[TrialRecord]:
    data = json.loads(Path(path).read_text())
    return [TrialRecord(**t) for t in data["trials"]]


# Writes a checkpoint folder's model into an export folder (checkpoint, target): a copy, or LoRA's merge.
WriteModel = Callable[[Path, Path], None]


def copy_model(checkpoint: Path, target: Path) -> None:
    """The checkpoint's files without the training state (optimizer and scheduler: resume only)."""
    shutil.copytree(checkpoint, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns(TRAINING_STATE))


def export_best(record: TrialRecord, target: Path, model_name: str, write: WriteModel = copy_model) -> Path:
    """Write the best checkpoint's model to ``target`` (a save_pretrained folder) with how it was made."""
    if not record.checkpoint or not (is_remote(record.checkpoint) or Path(record.checkpoint).is_dir()):
        raise FileNotFoundError(f"best trial of {record.task} (seed {record.seed}) has no checkpoint folder")
    target = Path(target)
    if is_remote(record.checkpoint):  # cluster.storage_path=s3://…: the checkpoint comes here first
        with tempfile.TemporaryDirectory(prefix=".fetch-", dir=_made(target.parent)) as tmp:
            fetched = fetch_folder(record.checkpoint, Path(tmp) / "checkpoint")
            return _export_folder(record, fetched, target, model_name, write)
    return _export_folder(record, Path(record.checkpoint), target, model_name, write)


def _made(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _export_folder(record: TrialRecord, checkpoint: Path, target: Path, model_name: str, write: WriteModel) -> Path:
    made_by = {
        "task": record.task,
        "seed": record.seed,
        "model": model_name,
        "hparams": record.hparams,
        "score": record.score,
        "metrics": record.metrics,
        "best_epoch": record.best_epoch,
        "trial_id": record.trial_id,
        "sources": record.sources,  # the base model's and the data's commit shas (or ETags, or synthetic)
    }
    needed = folder_size(checkpoint)
    with writing(f"the best model of {record.task}", target.parent, needed, key="out_dir"), \
            atomic_folder(target) as tmp:  # a full disk leaves the previous export (or none), never half of one
        write(checkpoint, tmp)
        (tmp / MADE_BY).write_text(json.dumps(made_by, indent=2, default=str))  # inside the atomic folder
    return target


def format_early_stops(records: list[TrialRecord], summaries: list[TaskSummary]) -> str:
    """Which trials the rungs stopped, when and why, and the compute each task spent against
    running every trial to the end ("" when nothing was stopped)."""
    stopped = sorted((r for r in records if r.stopped), key=lambda r: (r.task, r.seed))
    if not stopped:
        return ""
    lines = ["stopped early:"]
    for r in stopped:
        where = f"step {r.stopped_at_step} of {r.steps_total}" if r.stopped_at_step is not None else "?"
        lines.append(f"  {r.task} seed {r.seed} at {where}: {r.stopped}")
    for s in summaries:
        if s.steps_full:
            lines.append(f"compute {s.task}: {s.steps} of {s.steps_full} steps ({s.steps / s.steps_full:.0%} of "
                         f"running every trial to the end); best seed {s.best_seed}")
    return "\n".join(lines)


# What to change when a task learned nothing, with the train key that changes it.
TRY_NEXT = (("more rows", "max_train_samples"), ("more epochs", "epochs"), ("another lr", "lr"))


def format_unlearned(s: TaskSummary, train: TrainConfig, hparams: Mapping[str, Any], registry: bool) -> str:
    """The one warning line of a task whose best is within noise of its trivial score: the numbers, what
    becomes of its model (``registry``: it is registered) and what to try (the values the best trial
    trained with: its ``hparams`` over ``train``)."""
    fate = ("not promoted to champion (registered as a version without the alias)" if registry
            else "its model is exported all the same")
    judged = s.best_report_score if s.best_report_score is not None else s.best_score  # as _judge judged it
    return (f"warning: {s.task} learned nothing: best {s.metric} {judged:.4f} is within noise (±{s.noise:.4f} on "
            f"{s.eval_rows} eval rows) of the trivial {s.trivial_score:.4f} a constant answer scores; {fate}; "
            f"try {_tries(train, hparams)}")


def _tries(train: TrainConfig, hparams: Mapping[str, Any]) -> str:
    """'more rows than train.max_train_samples=256, more epochs than train.epochs=4 or another lr than
    train.lr=0.005': the values it trained with, so that no one reads them as the advice; no 'more rows' when
    every training row was used already (max_train_samples null)."""
    values = {key: hparams.get(key, getattr(train, key)) for _, key in TRY_NEXT}
    tries = [f"{what} than train.{key}={values[key]:g}" for what, key in TRY_NEXT if values[key] is not None]
    return ", ".join(tries[:-1]) + f" or {tries[-1]}" if len(tries) > 1 else "".join(tries)


def format_summary(summaries: list[TaskSummary]) -> str:
    """A fixed-width table: per task n, mean ± std with the mean's 95% interval, median, min, max, best seed and
    score; then, per task with several points, whether its best point beats the runner-up beyond noise."""
    width = max([8, *(len(s.task) for s in summaries)])  # wikitext-2-raw is longer than any GLUE name
    head = (f"{'task':<{width}} {'metric':<11} {'n':>3} {'mean ± std':>17} {'95% CI of mean':>18} {'median':>8} "
            f"{'min':>8} {'max':>8} {'best seed':>9} {'best':>8} {'GPU-h':>7}")
    lines = [head, "-" * len(head)]
    for s in summaries:
        notes = f" ({s.failed} failed)" if s.failed else ""
        if s.learned is False:
            notes += f" (within noise of the trivial {s.trivial_score:.4f})"
        best = f"{s.best_score:8.4f}" if s.best_score is not None else f"{'-':>8}"
        if s.best_report_score is not None:  # sweep.selection: picked on the selection split, quoted on report
            notes += f" (best on the report split: {s.best_report_score:.4f})"
        if s.soup_score is not None:
            on_report = f", {s.soup_report_score:.4f} on the report split" if s.soup_report_score is not None else ""
            notes += f" (soup of {s.soup_seeds} seeds: {s.soup_score:.4f}{on_report}{', wins' if s.soup_wins else ''})"
        ci = f"[{s.ci_low:.4f}, {s.ci_high:.4f}]" if s.ci_low is not None and s.ci_high is not None else "-"
        lines.append(
            f"{s.task:<{width}} {s.metric:<11} {s.n:>3} {s.mean:8.4f} ± {s.std:6.4f} {ci:>18} {s.median:8.4f} "
            f"{s.min:8.4f} {s.max:8.4f} {s.best_seed if s.best_seed is not None else '-':>9} {best} "
            f"{s.gpu_hours:7.3f}{notes}"
        )
    lines += [format_verdict(s) for s in summaries if s.runner_up is not None]
    return "\n".join(lines)


def format_verdict(s: TaskSummary) -> str:
    """One line: the best point beats the runner-up (named the winner), is within noise of it, or was not
    compared (under 2 shared seeds). The test and alpha: results/intervals.py."""
    pair = f"the best point {s.best_point} and the runner-up {s.runner_up}"
    if s.p_value is None or s.difference is None:
        return f"{s.task}: {pair} share {s.paired_seeds} seed(s): not compared (pairing needs 2 shared seeds)"
    over = f"paired over {s.paired_seeds} seeds, p={s.p_value:.2g}"
    if s.distinguishable:
        return (f"{s.task}: best point {s.best_point} beats the runner-up {s.runner_up} by {s.difference:.4f} "
                f"[95% CI {s.difference_low:.4f}, {s.difference_high:.4f}] ({over})")
    if s.p_value < ALPHA:  # the shared seeds favour the runner-up: the ranking (aggregate, other seeds) disagrees
        return (f"{s.task}: on their shared seeds the runner-up {s.runner_up} beats the best point {s.best_point} "
                f"by {-s.difference:.4f} ({over}): no point is distinguishable as the best")
    few = seeds_to_reject()
    hint = f"; {s.paired_seeds} seeds cannot reach p<{ALPHA:g}, {few} can" if s.paired_seeds < few else ""
    return f"{s.task}: {pair} are within noise ({over}): no point is distinguishable{hint}"
