"""One sweep from validated ``Settings``: preflight, run the trials, keep the best, report.

``run`` is the public entry point (``sweep.run``); ``sweep run`` (sweep/cli/run.py) calls it too.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from sweep.config.paths import absolute_store
from sweep.config.settings import Settings
from sweep.config.validate import validate
from sweep.results.outcome import failed_tasks, failure_lines
from sweep.results.records import (
    TaskSummary,
    TrialRecord,
    best_per_task,
    copy_model,
    export_best,
    format_early_stops,
    format_points,
    format_summary,
    summarize,
    write_results,
)
from sweep.storage.staging import check_sources

log = logging.getLogger(__name__)

RESULT_FILES = ("results.json", "results.csv", "summary.csv", "seed_scores.png", "expected_max.csv", "expected_max.png",
                "importance.csv", "glue_submission.zip")


def default_experiment(settings: Settings) -> str:
    """glue-<model>, or lm-<model> when every task is language modelling."""
    kinds = {spec.kind for spec in settings.tasks}
    return f"{'lm' if kinds == {'causal_lm'} else 'glue'}-{settings.model.name}"


def tracked_config(settings: Settings) -> dict[str, Any]:
    """What the parent run logs as params and config.yaml: the config as composed (as the user wrote it);
    settings made or changed by hand (no composed config) as they are."""
    if settings.composed:
        return settings.composed
    return {k: v for k, v in asdict(settings).items() if k != "composed"}


def start_tracking(settings: Settings, out_dir: Path | None = None, sources=None):
    """The parent MLflow run (or None with tracking=none); an unreachable store fails here, first.

    With ``out_dir``, calls the store does not answer later wait in ``out_dir/mlflow-unsent/`` and
    the parent's id is saved there: ``resume=true`` reopens that parent instead of making another.
    """
    if settings.tracking.kind != "mlflow":
        return None, None
    from sweep.tracking import SweepTracker, TrialTracking, check_reachable, saved_parent
    from sweep.tracking.spool import SPOOL_DIR

    if settings.resume and settings.storage.output_prefix and out_dir is not None:
        restore_records(settings, Path(out_dir))  # a new cluster's head: the records the last one copied
    uri = absolute_store(check_reachable(settings.tracking.uri, settings.tracking.required))
    experiment = settings.tracking.experiment or default_experiment(settings)
    spool_dir = Path(out_dir) / SPOOL_DIR if out_dir is not None else None
    tracker = SweepTracker(uri, experiment, spool_dir)
    reopen = saved_parent(Path(out_dir), uri, experiment) if out_dir is not None and settings.resume else None
    provenance = sources.provenance() if sources is not None else {}  # the commit shas trained on, as params
    parent = tracker.start({**tracked_config(settings), **({"sources": provenance} if provenance else {})},
                           reopen=reopen)
    if out_dir is not None:
        tracker.save(Path(out_dir))
    verb = "continuing MLflow run" if tracker.reopened else "MLflow run"
    print(f"tracking: {verb} {parent} in experiment {experiment!r} at {uri}")
    return tracker, TrialTracking(uri, tracker.experiment_id, parent, experiment, str(spool_dir) if spool_dir else None,
                                  provenance)


def restore_records(settings: Settings, out_dir: Path) -> None:
    """resume on a head without the sweep's records (a preempted RayJob's new cluster): take back the copy
    the sweep kept in storage.output_prefix (sweep/storage/mlflow_copies.py), before the store is opened."""
    from sweep.storage.mlflow_copies import destination, restore_store
    from sweep.storage.s3 import make_client

    client = make_client(settings.storage.endpoint, settings.storage.region)
    restored = restore_store(client, absolute_store(settings.tracking.uri), settings.storage.output_prefix, out_dir)
    if restored:
        print(f"resume: restored {restored} from {destination(settings.storage.output_prefix)}/")


def keep_records(settings: Settings, tracking_uri: str, out_dir: Path) -> None:
    """Stopped by a signal (SIGTERM: Kueue suspends the RayJob): the records' last copy, for the resumed
    sweep; one line either way, never an exception over the stop's own."""
    from sweep.failures import first_line
    from sweep.storage.mlflow_copies import copy_store, destination
    from sweep.storage.s3 import make_client

    dest = destination(settings.storage.output_prefix)
    try:
        copy_store(make_client(settings.storage.endpoint, settings.storage.region), tracking_uri, dest, out_dir)
        print(f"tracking: the records are copied to {dest}/ for the resumed sweep")
    except Exception as e:  # noqa: BLE001 - the stop goes on; the periodic copies are there
        print(f"warning: the records were not copied to {dest}/ ({first_line(e, scrubbed=True)})")


def register(settings: Settings, tracker, best: dict[str, TrialRecord], out_dir: Path,
             summaries: list | None = None) -> bool:
    """The best model per task into the registry as <model>-<task>; alias champion only on improvement,
    and never for a task whose best learned nothing (``summaries``: within noise of its trivial score).
    Whether every task's is registered (else a resume of the sweep registers it)."""
    from sweep.failures import error_line
    from sweep.secrets import scrub
    from sweep.tracking import register_best
    from sweep.tracking.spool import unreachable

    spec = {t.name: t for t in settings.tasks}
    unlearned = {s.task for s in summaries or () if s.learned is False}
    synthetic = settings.storage.synthetic and not settings.tracking.synthetic_champion
    every = True
    for task, record in best.items():
        if not record.run_id:
            print(f"registry: {task}: the best trial has no MLflow run; not registered")
            every = False
            continue
        try:
            result = register_best(tracker.uri, settings.model.name, spec[task], record.run_id,
                                   out_dir / "best" / task, record.score, learned=task not in unlearned,
                                   synthetic=synthetic)
        except Exception as e:  # the sweep's work is done: a registry that fails loses none of it
            why = ("does not answer" if unreachable(e)
                   else f"refused it ({scrub(error_line(e))})")
            print(f"registry: {task}: not registered: the MLflow store at {scrub(tracker.uri)} {why}; the best model "
                  f"stays in {out_dir / 'best' / task}; run the same command with resume=true to register it")
            every = False
            continue
        before = f"{result.previous_champion_score:.4f}" if result.previous_champion_score is not None else "none"
        if result.earlier:
            print(f"registry: {result.name} version {result.version}, registered by an earlier launch of this sweep "
                  f"({'champion' if result.promoted else 'not champion'}); not registered again")
            continue
        verdict = ("now champion" if result.promoted
                   else "not promoted: it learned nothing (within noise of the trivial score)" if task in unlearned
                   else "not promoted: trained on synthetic data (tracking.synthetic_champion=true allows it)"
                   if synthetic
                   else f"not promoted: the champion scores {before}, this {record.score:.4f}")
        print(f"registry: {result.name} version {result.version}, {verdict} (previous champion: {before})")
    return every


def sources_here(settings: Settings, sources):
    """The model and data folders on this machine: the driver's own, or (storage=s3) staged here first."""
    from sweep.storage.staging import ensure_local

    if sources is not None and sources.local is not None:
        return sources.local
    return ensure_local(settings, sources.pins if sources else None)


def model_writer(settings: Settings, sources, task: str):
    """How the best checkpoint of ``task`` becomes an export: copied (full fine-tuning), or its LoRA
    adapter merged into the base model (the base read on this machine; from S3, staged here first)."""
    if settings.train.method == "full":
        return copy_model
    from sweep.train.lora import export_merged

    spec = next(t for t in settings.tasks if t.name == task)
    base = sources_here(settings, sources).model_dir
    return lambda checkpoint, target: export_merged(checkpoint, base, spec, target)


def finish(settings: Settings, records: list[TrialRecord], out_dir: Path, checkpoint_folders: list[Path],
           tracker=None, sources=None) -> tuple[list, bool]:
    """Export the best model per task, write and print results, record them in MLflow.

    ``checkpoint_folders`` hold every trial's checkpoints; with keep_checkpoints=best they go once the end
    is done (``run_holding_the_lease``). ``sources``: what the driver's check found (``DriverSources``),
    where a LoRA export finds its base model and the trivial scores their eval labels. Returns the summaries
    and whether the end is complete: every best model exported, registered and recorded (else a resume of
    the sweep does the end again).
    """
    from sweep.results.records import format_unlearned
    from sweep.results.report import plot_seed_scores
    from sweep.train.trivial import trivial_scores

    metric = {spec.name: spec.metric for spec in settings.tasks}
    # seeds_per_point > 1: the best config (its seeds' aggregate) gives the best model, not the luckiest seed
    aggregate = settings.sweep.aggregate if settings.sweep.seeds_per_point > 1 else None
    best = best_per_task(records, settings.tasks, aggregate)
    provenance = sources.provenance() if sources is not None else {}
    for r in records:  # every row and export says what it was trained on
        r.sources = provenance
    complete = True  # nothing a resume of the sweep would do again (a model not exported, a registry that failed)
    for task, record in list(best.items()):
        exported = export_one(settings, record, out_dir, sources, metric[task])
        if exported is None:  # one line said why; the other tasks' models and every record are still kept
            del best[task]
            complete = False
    if settings.sweep.keep_checkpoints == "best" and checkpoint_folders:
        for r in records:  # pruned once the sweep's end is done (run_holding_the_lease)
            r.checkpoint = None
    trivial = trivial_scores(settings, sources, best)  # what a constant answer scores on the same eval rows
    for task, known in trivial.items():
        if known.unknown:
            print(f"trivial score {task}: unknown ({known.unknown}); whether it learned anything is not checked")
    summaries = summarize(records, settings.tasks, aggregate, trivial)
    write_results(out_dir, records, summaries)
    plot = plot_seed_scores(records, settings.tasks, out_dir / "seed_scores.png",
                            {task: known.score for task, known in trivial.items()})
    print(format_summary(summaries))
    if settings.storage.synthetic:
        print("data: SYNTHETIC (storage.synthetic_data=true): generated rows; these scores say nothing of the model")
    for summary in summaries:
        if summary.learned is False:
            print(format_unlearned(summary, settings.train, best[summary.task].hparams, registry=tracker is not None))
    if aggregate:
        print(format_points(records, settings.tasks, aggregate))
    from sweep.results.importance import report_importance

    for name, analysis in (("expected_max", report_expected_max), ("importance", report_importance)):
        try:
            analysis(records, settings, out_dir)
        except Exception as e:  # the models and results are written, the registry is next: one line, go on
            from sweep.failures import error_line

            print(f"{name}: not written ({error_line(e)})")
    if settings.sweep.predict_test and best:
        predict_test_sets(settings, best, out_dir, sources)
    stops = format_early_stops(records, summaries)
    if stops:
        print(stops)
    for line in failure_lines(records):  # each failed trial's reason, the same reason once
        print(line)
    print(f"results: {out_dir / 'results.csv'}  summary: {out_dir / 'summary.csv'}  plot: {plot}")
    if tracker is not None:
        complete = record_in_mlflow(settings, tracker, records, summaries, best, out_dir, plot) and complete
        from sweep.tracking.ui_urls import look_line

        print(look_line(tracker.uri, tracker.experiment_id, out_dir))  # runs: sweep ui out_dir=... (or the URL)
    return summaries, complete


def export_one(settings: Settings, record: TrialRecord, out_dir: Path, sources, metric: str) -> Path | None:
    """The best model of ``record.task`` into ``out_dir/best/<task>``; a checkpoint storage lost is one line
    (None), never a traceback after the trials' work (the records are written whatever happens here)."""
    from sweep.failures import error_line

    task = record.task
    if record.checkpoint_note:
        print(f"best {task}: seed {record.seed}: {record.checkpoint_note}")
    try:
        exported = export_best(record, out_dir / "best" / task, settings.model.name,
                               model_writer(settings, sources, task))
    except FileNotFoundError as e:  # pyarrow's for a folder gone from S3 too
        print(f"best {task}: not exported: the best trial's checkpoint (seed {record.seed}) is not in storage "
              f"({error_line(e)}); its scores are in results.csv. Run the sweep again to train it")
        return None
    print(f"best {task}: seed {record.seed}, {metric} {record.score:.4f} -> {exported}")
    return exported


def prune_checkpoints(folders: list) -> None:
    """keep_checkpoints=best: every trial's checkpoints go, once the sweep's end is done (the best models
    exported and uploaded, the ledger saying so): a driver killed before that resumes and exports them
    again from these."""
    from sweep.remote_files import remove_folder

    for folder in folders:
        remove_folder(folder)


def report_expected_max(records: list[TrialRecord], settings: Settings, out_dir: Path) -> None:
    """How many trials were enough (Dodge et al. 2019): expected_max.csv, expected_max.png, a line per task."""
    from sweep.files import write_text
    from sweep.results.expected_max import curves_csv, format_curve, sweep_curves
    from sweep.results.report import plot_expected_max

    curves = sweep_curves(records, settings.tasks)
    write_text(out_dir / "expected_max.csv", curves_csv(curves), key="out_dir")
    plot_expected_max(curves, settings.tasks, out_dir / "expected_max.png")
    for curve in curves:
        print(format_curve(f"{curve.task} [{curve.point}]" if curve.point else curve.task, curve.points))


def predict_test_sets(settings: Settings, best: dict[str, TrialRecord], out_dir: Path, sources) -> None:
    """sweep.predict_test: the best models' GLUE submission (glue_submission.zip), the data read on this
    machine (from S3, staged here first). The exported models stay whatever happens here."""
    from sweep.serving.glue_submission import write_submission

    data_dir = sources_here(settings, sources).data_dir
    try:
        result = write_submission(settings, {task: out_dir / "best" / task for task in best}, out_dir, data_dir)
    except Exception as e:  # the sweep's models and results are written: this step's failure is one line
        from sweep.failures import error_line

        print(f"glue submission: not written ({error_line(e)}); the best models are in {out_dir / 'best'}")
        return
    for line in result.lines():
        print(line)


def record_in_mlflow(settings: Settings, tracker, records: list[TrialRecord], summaries: list,
                     best: dict[str, TrialRecord], out_dir: Path, plot: Path | None) -> bool:
    """The end of the sweep in MLflow: what waits in the spool, the registry, the parent's results.

    The results and best models are written by now: a store that fails here loses none of them
    and does not fail the sweep; the line says what was not recorded and how to record it. Whether all was."""
    from sweep.failures import error_line
    from sweep.secrets import scrub
    from sweep.tracking import FINAL_WAIT_S

    complete = True
    try:
        tracker.flush_all(wait_s=FINAL_WAIT_S)  # what the trials' runs kept while the store was away, if it is back
        complete = register(settings, tracker, best, out_dir, summaries)
        tracker.finish(records, summaries, out_dir, plot, status="FAILED" if failed_tasks(summaries) else "FINISHED")
    except Exception as e:
        complete = False
        print(f"tracking: the sweep's results were not all recorded in MLflow at {scrub(tracker.uri)} "
              f"({scrub(error_line(e))}); they are in {out_dir}")
    try:
        unsent, path = tracker.close(out_dir)
    except Exception as e:
        print(f"tracking: could not keep the unsent MLflow calls ({scrub(error_line(e))}); "
              f"they stay in {out_dir}")
        return False
    if unsent:
        print(f"tracking: {unsent} MLflow calls could not be sent; replay them with: "
              f"python -m sweep replay {path}")
    return complete and not unsent


def upload_outputs(settings: Settings, out_dir: Path) -> None:
    """storage.output_prefix: each task's best model and the result files, for a serving runtime; and a
    sqlite MLflow store, under <prefix>/mlflow/ (its failure is one line, never the sweep's)."""
    from sweep.storage.mlflow_upload import upload_mlflow
    from sweep.storage.s3 import make_client, upload_tree

    prefix = settings.storage.output_prefix.rstrip("/")
    try:
        client = make_client(settings.storage.endpoint, settings.storage.region)
        keys = upload_tree(client, out_dir / "best", f"{prefix}/best")
        results = [out_dir / name for name in RESULT_FILES if (out_dir / name).is_file()]
        keys += upload_tree(client, out_dir, prefix, files=results)
        exported = (out_dir / "best").iterdir() if (out_dir / "best").is_dir() else ()  # none: a line said why
        for task in sorted(p.name for p in exported if p.is_dir()):
            print(f"uploaded: best {task} -> {prefix}/best/{task}/")
        print(f"uploaded: {len(keys)} files to {prefix}/")
    finally:  # the records too when the results could not go: the head's disk goes with the cluster
        if settings.tracking.kind == "mlflow" and settings.tracking.uri:
            upload_mlflow(absolute_store(settings.tracking.uri), prefix, settings.storage.endpoint,
                          settings.storage.region, out_dir=out_dir)


RUN_FOLDER = "outputs/%Y-%m-%d/%H-%M-%S"  # no out_dir: a new folder here, as Hydra's run folder for the command


def run_folder(settings: Settings, out_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where the sweep writes: ``out_dir``, else ``settings.out_dir``, else ``outputs/<date>/<time>``."""
    chosen = out_dir if out_dir is not None else settings.out_dir
    return Path(os.path.abspath(os.path.expanduser(chosen if chosen is not None else time.strftime(RUN_FOLDER))))


def run(settings: Settings | DictConfig, out_dir: str | os.PathLike[str] | None = None) -> list[TaskSummary]:
    """One sweep, as ``sweep run`` runs it: the out_dir lock, the sources and method checks, the MLflow
    parent, ONE Tune run, the best models, results and registry, the uploads. Returns each task's summary.

    ``settings``: ``sweep.load_settings(...)``'s (a composed config is validated first). ``out_dir``:
    where the results go (default: ``settings.out_dir``, else ``outputs/<date>/<time>`` here). A mistake
    found before any trial raises one of ``sweep.errors.USER_ERRORS``; trials that failed are in the
    summaries (``sweep.results.outcome.exit_code`` says what the command would exit with)."""
    if not isinstance(settings, Settings):  # a composed DictConfig: every config error before any data is read
        settings = validate(settings)
    out = run_folder(settings, out_dir)
    from sweep.lock import hold_out_dir

    with hold_out_dir(out):  # one sweep per out_dir (OutDirInUseError), before anything is written
        sources = check_sources(settings, out)
        check_method_and_tests(settings, sources)
        # one driver per sweep, on any cluster: the lease in its ledger, before the records are restored
        ledger = sweep_ledger(settings, out)
        lease = ledger.take_lease().keep()
        try:
            if settings.resume and ledger.ended_with(planned_identities(settings)):
                return ended_before(settings, ledger, out)
            return run_holding_the_lease(settings, out, sources)
        finally:
            lease.release()


def planned_identities(settings: Settings) -> list[str]:
    """Every trial's ledger identity for this command (task, seed, grid point, sample round)."""
    from sweep.ledger import identity_of
    from sweep.plan.costs import grid_points

    return [identity_of(spec.name, seed, point, r) for r in range(settings.sweep.num_samples)
            for spec in settings.tasks for seed in settings.sweep.seeds for point in grid_points(settings)]


def ended_before(settings: Settings, ledger, out: Path) -> list[TaskSummary]:
    """resume of a sweep whose end was done (a RayJob run again after it finished, a kill as it pruned its
    checkpoints): nothing is trained, exported or registered again; its summaries as it wrote them."""
    import json

    where = settings.storage.output_prefix or str(out)
    ended = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ledger.ended_at()))
    print(f"resume: this sweep ended at {ended} ({ledger.root}): every trial and its end are done, nothing runs "
          f"again; its results and best models are in {where}")
    results = out / "results.json"
    if not results.is_file():
        return []
    return [TaskSummary(**s) for s in json.loads(results.read_text()).get("summary", [])]


def sweep_ledger(settings: Settings, out_dir: Path):
    """The sweep's ledger (sweep/ledger.py) in its storage path: ``cluster.storage_path``, else out_dir/ray."""
    from sweep.ledger import Ledger

    return Ledger(settings.cluster.storage_path or str(out_dir / "ray"))


def run_holding_the_lease(settings: Settings, out: Path, sources) -> list[TaskSummary]:
    """The sweep from the MLflow parent on, its lease held."""
    tracker, tracking = start_tracking(settings, out, sources)  # an unreachable store before any trial
    from sweep.driver.tuner import run_tune

    try:
        records, checkpoint_folders = run_tune(settings, out, tracking, sources)
        summaries, complete = finish(settings, records, out, checkpoint_folders, tracker, sources)
        if settings.storage.output_prefix:
            upload_outputs(settings, out)
        if complete:  # a resume from here on has nothing to do; else it does the end again (from the checkpoints)
            sweep_ledger(settings, out).end()
            if settings.sweep.keep_checkpoints == "best":
                prune_checkpoints(checkpoint_folders)
        return summaries
    except BaseException as e:
        if tracker is not None and tracker.run_id is not None:
            # stopped by a signal (SweepStopped): KILLED, for resume=true to finish
            tracker.fail("KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED")  # never masks e
        if isinstance(e, KeyboardInterrupt) and tracker is not None and settings.storage.output_prefix:
            keep_records(settings, tracker.uri, out)  # a suspended RayJob's head goes next
        raise


def check_method_and_tests(settings: Settings, sources) -> None:
    """Before any trial: a LoRA target module the model lacks, QLoRA without a GPU, a malformed test file."""
    if settings.train.method != "full":
        from sweep.train.lora import check_method_runs_here, check_targets

        check_method_runs_here(settings.train, settings.cluster.address)
        if sources.local is not None:
            check_targets(sources.local.model_dir, settings.train, settings.model.name)
    if settings.sweep.predict_test and sources.local is not None:
        from sweep.serving.glue_submission import check_test_files

        check_test_files(settings.tasks, sources.local.data_dir)
