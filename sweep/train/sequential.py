"""The trials of a sweep run one after another in this process, with no Ray.

The baseline the Ray sweep is measured against, and the way to debug one trial in a debugger.
"""

from __future__ import annotations

import logging
import platform
import shutil
import time
from pathlib import Path

from sweep.config.settings import Settings
from sweep.results.records import TrialRecord
from sweep.storage.staging import LocalSources, cache_root
from sweep.train.loop import finetune

log = logging.getLogger(__name__)


def run_sequential(settings: Settings, sources: LocalSources, out_dir: Path) -> list[TrialRecord]:
    records = []
    for spec in settings.tasks:
        for seed in settings.sweep.seeds:
            ckpt = Path(out_dir) / "checkpoints" / spec.name / f"seed_{seed}"
            t0 = time.perf_counter()
            try:
                result = finetune(
                    spec, sources.model_dir, sources.data_dir, settings.train, seed,
                    out_dir=ckpt, cache_dir=cache_root(settings.storage),
                )
            except Exception as e:  # one failing trial must not lose the others
                log.exception("%s seed %d failed", spec.name, seed)
                shutil.rmtree(ckpt, ignore_errors=True)
                records.append(TrialRecord(task=spec.name, seed=seed, status="ERROR", error=repr(e),
                                           wall_seconds=time.perf_counter() - t0, node=platform.node()))
                continue
            best, last = result.best, result.epochs[-1]
            records.append(TrialRecord(
                task=spec.name, seed=seed, metrics=best.metrics, score=best.metrics[spec.metric],
                # result.epochs holds every evaluation (mid-epoch too): count the completed epochs
                best_epoch=result.best_epoch, epochs_done=last.epoch if last.end_of_epoch else last.epoch - 1,
                wall_seconds=time.perf_counter() - t0, node=platform.node(),
                checkpoint=str(result.checkpoint_dir), trial_id=f"{spec.name}-{seed}",
            ))
    return records
