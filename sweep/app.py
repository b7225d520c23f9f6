"""A sweep from a composed config: validate, stage, run the trials, keep the best, report."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from omegaconf import DictConfig

from sweep.config import Settings, validate
from sweep.data import check_task_data
from sweep.results import (
    TrialRecord, best_per_task, export_best, format_summary, summarize, write_results,
)
from sweep.staging import ensure_local

log = logging.getLogger(__name__)


def finish(settings: Settings, records: list[TrialRecord], out_dir: Path, checkpoint_root: Path | None) -> list:
    """Export the best model per task, prune the other checkpoints, write and print results.

    ``checkpoint_root`` holds every trial's checkpoints; with keep_checkpoints=best it goes once
    the best models are exported.
    """
    metric = {spec.name: spec.metric for spec in settings.tasks}
    for task, record in best_per_task(records, settings.tasks).items():
        exported = export_best(record, out_dir / "best" / task, settings.model.name)
        print(f"best {task}: seed {record.seed}, {metric[task]} {record.score:.4f} -> {exported}")
    if settings.sweep.keep_checkpoints == "best" and checkpoint_root is not None:
        shutil.rmtree(checkpoint_root, ignore_errors=True)
        for r in records:
            r.checkpoint = None
    summaries = summarize(records, settings.tasks)
    write_results(out_dir, records, summaries)
    print(format_summary(summaries))
    print(f"results: {out_dir / 'results.csv'}  summary: {out_dir / 'summary.csv'}")
    return summaries


def run(cfg: DictConfig, out_dir: Path) -> list:
    settings = validate(cfg)  # every config error before any data is read
    sources = ensure_local(settings)
    for spec in settings.tasks:  # every missing task folder or file before any trial starts
        check_task_data(spec, sources.data_dir)
    from sweep.tuner import run_tune

    records, checkpoint_root = run_tune(settings, Path(out_dir))
    return finish(settings, records, out_dir, checkpoint_root)
