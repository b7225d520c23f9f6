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

from sweep.config.settings import Settings
from sweep.config.validate import validate
from sweep.results.records import TaskSummary
from sweep.storage.staging import check_sources

log = logging.getLogger(__name__)

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


RUN_FOLDER = "outputs/%Y-%m-%d/%H-%M-%S"  # no out_dir: a new folder here, as Hydra's run folder for the command


def run_folder(settings: Settings, out_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where the sweep writes: ``out_dir``, else ``settings.out_dir``, else ``outputs/<date>/<time>``."""
    chosen = out_dir if out_dir is not None else settings.out_dir
    return Path(os.path.abspath(os.path.expanduser(chosen if chosen is not None else time.strftime(RUN_FOLDER))))


def run(settings: Settings | DictConfig, out_dir: str | os.PathLike[str] | None = None, *, scheduler: Any = None,
        callbacks: tuple[Any, ...] | list[Any] = (), metrics: dict[str, Any] | None = None) -> list[TaskSummary]:
    """One sweep, as ``sweep run`` runs it: the out_dir lock, the sources and method checks, the MLflow
    parent, ONE Tune run, the best models, results and registry, the uploads. Returns each task's summary.

    ``settings``: ``sweep.load_settings(...)``'s (a composed config is validated first). ``out_dir``:
    where the results go (default: ``settings.out_dir``, else ``outputs/<date>/<time>`` here). A mistake
    found before any trial raises one of ``sweep.errors.USER_ERRORS``; trials that failed are in the
    summaries (``sweep.results.outcome.exit_code`` says what the command would exit with).

    The extension points (docs/api.md): ``scheduler``, a ``sweep.SchedulerPolicy``
    instance asked instead of the one ``sweep.scheduler`` names; ``callbacks``, ``ray.tune.Callback``
    instances run after the sweep's own; ``metrics``, ``{name: fn(predictions, labels) -> float}`` (a
    ``sweep.MetricFn`` each) computed in every trial beside the built-in ones, recorded like them and usable as
    a task's ``metric``. Checked here, before Ray starts (``ConfigError``)."""
    from sweep.driver.extensions import Extensions

    extensions = Extensions.of(scheduler, callbacks, metrics)
    if not isinstance(settings, Settings):  # a composed DictConfig: every config error before any data is read
        settings = validate(settings, extensions.metrics)
    extensions.check(settings)  # the user's metrics known now: a task's metric nobody computes is an error
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
            return run_holding_the_lease(settings, out, sources, ledger, extensions)
        finally:
            lease.release()


def planned_identities(settings: Settings) -> list[str]:
    """Every trial's ledger identity for this command (task, seed, grid point, sample round)."""
    from sweep.plan.costs import grid_points
    from sweep.results.ledger import identity_of

    return [identity_of(spec.name, seed, point, r) for r in range(settings.sweep.num_samples)
            for spec in settings.tasks for seed in settings.sweep.seeds for point in grid_points(settings.sweep)]


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
    """The sweep's ledger (sweep/results/ledger.py) in its storage path: ``cluster.storage_path``, else out_dir/ray."""
    from sweep.results.ledger import Ledger

    return Ledger(settings.cluster.storage_path or str(out_dir / "ray"))


def run_holding_the_lease(settings: Settings, out: Path, sources, ledger,
                          extensions: Any = None) -> list[TaskSummary]:  # driver.extensions.Extensions
    """The sweep from the MLflow parent on, its lease held in ``ledger``: the tracking session, ONE Tune run,
    the end's steps (sweep/outputs/end.py), which mark the end in that ledger."""
    from sweep.driver.tuner import run_tune
    from sweep.outputs.end import end_of_sweep
    from sweep.tracking.session import tracking_session

    session = tracking_session(settings.tracking, settings.storage, settings.model.name, settings.tasks, out,
                               settings.resume)
    session.open(tracked_config(settings), default_experiment(settings),  # an unreachable store before any trial
                 sources.provenance() if sources is not None else {})
    try:
        records, checkpoint_folders = run_tune(settings, out, session, sources, extensions)
        return end_of_sweep(settings, records, out, checkpoint_folders, session, sources, ledger).summaries
    except BaseException as e:
        # stopped by a signal (SweepStopped): KILLED, for resume=true to finish; never masks e
        session.fail(killed=isinstance(e, KeyboardInterrupt))
        raise


def check_method_and_tests(settings: Settings, sources) -> None:
    """Before any trial: a LoRA target module the model lacks, QLoRA without a GPU, a malformed test file."""
    if settings.train.method != "full":
        from sweep.train.lora import check_method_runs_here, check_targets

        check_method_runs_here(settings.train, settings.cluster.address)
        if sources.local is not None:
            check_targets(sources.local.model_dir, settings.train, settings.model.name)
    if settings.sweep.predict_test and sources.local is not None:
        from sweep.outputs.glue_submission import check_test_files

        check_test_files(settings.tasks, sources.local.data_dir)
