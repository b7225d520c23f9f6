"""The end of a sweep: its steps in order, each built from the sections of the settings it reads.

the best per task -> seed soups (sweep.soup) -> export the best -> trivial scores -> results files -> expected max ->
importance -> GLUE submission -> closing lines -> MLflow (registry, parent) -> uploads -> the ledger's end and the
checkpoints pruned.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from sweep.config.settings import Settings
from sweep.data.selection import selection_of
from sweep.outputs.export import ExportBest, PickBest, model_writer
from sweep.outputs.publish import MarkEnded, RecordInTracking, UploadOutputs
from sweep.outputs.reports import ClosingLines, ExpectedMax, GlueSubmission, Importance, ResultsFiles, TrivialScores
from sweep.outputs.soup import SeedSoup
from sweep.outputs.steps import Outcome, Step, run_steps
from sweep.results.records import TrialRecord


def end_of_sweep(settings: Settings, records: list[TrialRecord], out_dir: Path, checkpoint_folders: list,
                 session, sources=None, ledger=None) -> Outcome:
    """Every step of the end over the sweep's ``records``. ``session``: the tracking session (NoTracking:
    none); ``sources``: what the driver's check found (``DriverSources``: where a LoRA export finds its base
    model, the trivial scores and the GLUE submission their data); ``ledger``: the sweep's (None: nothing is
    marked ended or pruned). ``Outcome.complete`` says whether a resume would have nothing left to do."""
    outcome = Outcome(records=records, out_dir=Path(out_dir), checkpoint_folders=list(checkpoint_folders))
    return run_steps(sweep_steps(settings, session, sources, ledger), outcome)


def sweep_steps(settings: Settings, session, sources=None, ledger=None) -> list[Step]:
    """The steps of this sweep's end, in their order."""
    from sweep.outputs.trivial import trivial_scores

    here = cache(lambda: sources_here(settings, sources))  # staged on this machine at most once, if needed
    aggregate = settings.sweep.aggregate if settings.sweep.seeds_per_point > 1 else None
    keep_best = settings.sweep.keep_checkpoints == "best"
    storage = settings.storage
    writer = model_writer(settings.train.method, settings.tasks, lambda: here().model_dir)
    steps: list[Step] = [PickBest(settings.tasks, aggregate, sources.provenance() if sources is not None else {})]
    if settings.sweep.soup:  # before ExportBest lets go of the trials' checkpoints (keep_checkpoints=best)
        steps.append(SeedSoup(settings.tasks, writer, lambda: here().data_dir, settings.train,
                              selection_of(settings.sweep), settings.model.name))
    steps += [
        ExportBest(settings.tasks, settings.model.name, writer, keep_best),
        TrivialScores(lambda tasks: trivial_scores(settings.tasks, settings.train.max_eval_samples, storage,
                                                   sources, tasks)),
        ResultsFiles(settings.tasks, aggregate, settings.train, storage.synthetic, registry=session.enabled),
        ExpectedMax(settings.tasks),
        Importance(settings.tasks, settings.sweep),
        GlueSubmission(settings, lambda: here().data_dir),
        ClosingLines(),
        RecordInTracking(session),
        UploadOutputs(storage.output_prefix, storage.endpoint, storage.region, session),
    ]
    if ledger is not None:
        steps.append(MarkEnded(ledger, prune=keep_best))
    return steps


def sources_here(settings: Settings, sources):
    """The model and data folders on this machine: the driver's own, or (storage=s3) staged here first."""
    from sweep.storage.staging import ensure_local

    if sources is not None and sources.local is not None:
        return sources.local
    return ensure_local(settings, sources.pins if sources else None)
