"""``sweep run <overrides>`` (also ``sweep <overrides>`` and ``python -m sweep <overrides>``): the sweep, Hydra's app.

``sweep run --help`` is Hydra's help: every config group and option. Nothing heavy is imported before
the config is validated: ``--help`` and every one-line error reach the user without torch,
transformers or Ray being loaded. A mistake in the overrides (an unknown key or group option, a bad
value) is found before Hydra makes its run folder (sweep.config.command_line), so it is one line,
exit 2, and nothing is written. ``HYDRA_FULL_ERROR=1`` (Hydra's debugging switch) skips that check
and gives Hydra's own full report.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from sweep.config.load import plain_experiment, quoted


def run_sweep(cfg: DictConfig) -> None:
    """The composed config -> validated Settings -> one sweep through the public ``sweep.run`` (sweep/app.py),
    its mistakes and its stop as one line each."""
    from sweep.app import run
    from sweep.config.validate import validate
    from sweep.errors import USER_ERRORS, SweepFailed, SweepStopped
    from sweep.results.outcome import exit_code, verdict_line

    out_dir = Path(cfg.out_dir or HydraConfig.get().runtime.output_dir).resolve()
    try:
        summaries = run(validate(cfg), out_dir)  # every config error before any data is read
    except SweepFailed as e:  # Tune's own failure after trials ran: one line, how to go on
        from sweep.driver.stop import resume_command

        print(f"error: {e}; the finished trials are kept: resume with: "
              f"{resume_command(HydraConfig.get().overrides.task, str(out_dir))}", file=sys.stderr)
        sys.exit(1)
    except USER_ERRORS as e:
        if not cfg.out_dir or out_dir in MADE_HERE:  # refused before any work: no run folder left behind
            remove_if_only_hydra(out_dir)
        user_error(e)
    except SweepStopped as e:  # SIGTERM/SIGINT: trials stopped, state saved; one line says how to finish
        from sweep.driver.stop import stopped_line

        print(stopped_line(e, HydraConfig.get().overrides.task, str(out_dir)), file=sys.stderr)
        sys.exit(e.exit_code)
    verdict = verdict_line(summaries)
    if verdict:  # a task with no result: the command fails, after every result was kept
        print(verdict, file=sys.stderr)
        if HydraConfig.get().mode != RunMode.MULTIRUN:  # -m: the next sweeps still run; Hydra's exit is 0
            sys.exit(exit_code(summaries))


# Hydra names the job after its task function's module, last part: "__main__", as when this function
# was sweep/__main__.py's (the run folder's log file __main__.log, the first line of --help).
run_sweep.__module__ = "sweep.__main__"
# What a run folder holds before the sweep writes anything: Hydra's record and log, the out_dir lock.
MADE_HERE: set[Path] = set()  # the out_dir this command made (a folder the user made stays)
HYDRA_FILES = {".hydra", f"{run_sweep.__module__.rsplit('.', 1)[-1]}.log", ".sweep.lock", ".sweep.lock.owner"}
hydra_main = hydra.main(config_path="pkg://sweep.conf", config_name="config", version_base="1.3")(run_sweep)


def remove_if_only_hydra(folder: Path) -> None:
    """Remove ``folder`` when it holds nothing but what Hydra and the out_dir lock put there (a sweep
    refused before any work), and the ``outputs/<date>/`` parents it leaves empty."""
    if not folder.is_dir() or any(p.name not in HYDRA_FILES for p in folder.iterdir()):
        return
    import shutil

    logging.shutdown()  # Hydra's log file handler lets go of <job>.log
    shutil.rmtree(folder, ignore_errors=True)
    for parent in list(folder.parents)[:2]:  # outputs/<date>/<time>: the date, then outputs/
        if parent.name and not any(parent.iterdir()) and parent != Path.cwd():
            parent.rmdir()


def user_error(e: Exception) -> NoReturn:
    """A user's mistake: one clear line, no traceback."""
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


def check_files(settings) -> None:
    """What the sweep reads from disk (data, the model, every task's splits) and QLoRA's GPU: one line
    each, seconds before Hydra's run folder or any import of torch (QLoRA's check imports it)."""
    from sweep.storage.staging import check_local_files

    check_local_files(settings)
    if settings.train.method == "qlora":
        from sweep.train.lora import check_method_runs_here

        check_method_runs_here(settings.train, settings.cluster.address)


def multirun(args: Sequence[str]) -> bool:
    return "-m" in args or "--multirun" in args


def run_folder_overrides(out_dir: str) -> list[str]:
    """With ``out_dir=`` set, Hydra's job runs there (its log beside the results, no ``.hydra/`` record over a
    running sweep's) instead of making ``outputs/<date>/<time>``; an out_dir that cannot be made is one line."""
    from sweep.errors import ConfigError, OutDirInUseError
    from sweep.lock import check_free

    folder = Path(out_dir)
    try:
        check_free(folder)  # another sweep's out_dir: refused before Hydra's log lands in it
    except OutDirInUseError as e:
        user_error(e)
    try:
        if not folder.is_dir():
            folder.mkdir(parents=True)
            MADE_HERE.add(folder.resolve())
    except OSError as e:
        user_error(ConfigError(f"out_dir={out_dir}: cannot be made ({e.strerror}); choose a folder you can write"))
    return [f"hydra.run.dir={quoted(out_dir)}", "hydra.output_subdir=null"]  # quoted: spaces, = or , in a path


def main(argv: Sequence[str] | None = None) -> None:
    """The sweep on ``argv`` (default: ``sys.argv[1:]``): Hydra's command line, overrides and flags."""
    from sweep.config.command_line import check_command_line
    from sweep.errors import USER_ERRORS

    args = plain_experiment(sys.argv[1:] if argv is None else argv)
    if os.environ.get("HYDRA_FULL_ERROR") != "1":  # Hydra's debugging switch: its own full report
        try:
            jobs = check_command_line(args)
            for settings in jobs:  # the files it reads, before Hydra makes a run folder
                check_files(settings)
        except USER_ERRORS as e:
            user_error(e)
        if len(jobs) == 1 and jobs[0].out_dir and not multirun(args):
            args += run_folder_overrides(jobs[0].out_dir)
    sys.argv = [sys.argv[0], *args]  # hydra.main reads sys.argv; argv[0] names the program in its usage line
    hydra_main()
