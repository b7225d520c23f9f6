"""The driver's side of a sweep: one parent run (``SweepTracker``), what trials need to log under it
(``TrialTracking``), the parent a resumed sweep reopens (``saved_parent``), and the per-task summary
metrics logged at the end.
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sweep.errors import TrackingError
from sweep.failures import first_line
from sweep.files import write_json
from sweep.results.records import TaskSummary, TrialRecord
from sweep.secrets import scrub
from sweep.tracking.sender import Tracked
from sweep.tracking.spool import UNSENT_FILE, Record, Spool, merge, read_records, spool_files, unreachable
from sweep.tracking.store import (
    clean_key,
    clean_tags,
    ensure_experiment,
    flatten_config,
    log_params,
    redact,
    set_tags,
    with_retries,
)

log = logging.getLogger(__name__)

PARENT_FILE = "mlflow-parent.json"  # in out_dir: the parent run a resumed sweep reopens
FLUSH_POLL_S = 2.0
FINAL_WAIT_S = 20.0  # at the end of a sweep, how long a store that does not answer is waited for


# --- the sweep's parent run ----------------------------------------------------------------------


def _git_commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _sweep_tags(config: Mapping[str, Any]) -> dict[str, Any]:
    """Tasks, model and seeds of a resolved config (``asdict(Settings)`` or a Hydra container), and the tasks'
    metric keys (``sweep.metrics``: the runs table's columns ``sweep ui`` shows, sweep/tracking/ui_app.py)."""
    tasks = config.get("tasks", config.get("task")) or []
    specs = list(tasks.items()) if isinstance(tasks, Mapping) else [
        (t.get("name"), t) if isinstance(t, Mapping) else (t, {}) for t in tasks]
    metrics = [clean_key(str(spec["metric"])) for _, spec in specs if isinstance(spec, Mapping) and spec.get("metric")]
    return {
        "sweep.tasks": ",".join(str(name) for name, _ in specs) or None,
        "sweep.model": (config.get("model") or {}).get("name"),
        "sweep.seeds": ",".join(map(str, (config.get("sweep") or {}).get("seeds") or [])) or None,
        "sweep.metrics": ",".join(dict.fromkeys(metrics)) or None,
    }


def sweep_run_name(tags: Mapping[str, Any], started: float | None = None) -> str:
    """The parent run's name in MLflow's runs table: '<start> · <tasks> x <n> seeds · <model>'. The start
    (month-day and time to the second) comes first and is short: the table cuts a parent's name after
    about 18 characters, and the sweeps of one experiment (its model) often differ in nothing else."""
    seeds = len(str(tags.get("sweep.seeds") or "").split(",")) if tags.get("sweep.seeds") else 0
    when = time.strftime("%m-%d %H:%M:%S", time.localtime(started))
    tasks = str(tags.get("sweep.tasks") or "?").replace(",", "+")
    return f"{when} · {tasks} x {seeds} seed{'s' if seeds != 1 else ''} · {tags.get('sweep.model') or '?'}"


@dataclass(frozen=True)
class TrialTracking:
    """What a trial needs to log its nested run, as plain data (it travels to Ray workers)."""

    uri: str
    experiment_id: str
    parent_run_id: str
    experiment_name: str | None = None  # finds the experiment again in another server (replay)
    spool_dir: str | None = None  # where calls the store did not take wait (None: they raise)
    sources: dict[str, str] = field(default_factory=dict)  # every trial run's sources.* params (commit shas)


def saved_parent(out_dir: Path, uri: str, experiment: str) -> str | None:
    """The parent run id a sweep in ``out_dir`` saved for this store and experiment (resume), else None."""
    path = Path(out_dir) / PARENT_FILE
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    same = saved.get("uri") == scrub(uri) and saved.get("experiment") == experiment
    return saved.get("run_id") if same else None


class SweepTracker(Tracked):
    """The driver's side: one parent run for the whole sweep, its config, its results and summary.

    With ``spool_dir`` the calls after ``start`` never stop the sweep: what the store does not take
    is kept there (one file per run), sent once it answers again, and left for ``replay`` if not.
    """

    def __init__(self, uri: str, experiment_name: str, spool_dir: str | Path | None = None) -> None:
        super().__init__(uri, spool_dir)
        self.experiment_name = experiment_name
        self.experiment_id: str | None = None
        self.run_id: str | None = None
        self.run_name: str | None = None
        self.reopened = False

    def start(self, settings: Mapping[str, Any], tags: Mapping[str, Any] | None = None, run_name: str | None = None,
              reopen: str | None = None) -> str:
        """Create the parent run (or reopen run ``reopen``: a resumed sweep), log the config as
        params and ``config.yaml``; return the run id. The store must answer here."""
        self.experiment_id = ensure_experiment(self.client, self.experiment_name, self.uri)
        config = redact(settings)
        command = " ".join(sys.argv)
        run_tags = clean_tags({
            **_sweep_tags(config),
            "mlflow.source.git.commit": _git_commit(),
            "sweep.command": command,
            # the run's description on its page: how to run it again, and where its files are
            "mlflow.note.content": f"`{command}`\n\nout_dir: {config.get('out_dir') or '(none)'}",
            **(tags or {}),
        })
        run = self.sender._lookup(self.client.get_run, reopen) if reopen else None
        self.reopened = run is not None and run.info.experiment_id == self.experiment_id
        if self.reopened:
            with_retries(self.client.update_run, run.info.run_id, status="RUNNING")
            set_tags(self.client, run.info.run_id, run_tags)
            logged: Mapping[str, str] = run.data.params  # params are write-once: the first launch's stay
        else:
            run = with_retries(self.client.create_run, self.experiment_id,
                               run_name=run_name or sweep_run_name(run_tags), tags=run_tags)
            logged = {}
        self.run_id, self.run_name = run.info.run_id, run.info.run_name
        log_params(self.client, self.run_id, {k: v for k, v in flatten_config(config).items() if k not in logged})
        with_retries(self.client.log_text, self.run_id, yaml.safe_dump(config, sort_keys=False), "config.yaml")
        self._use_spool(f"parent-{self.run_id}")
        return self.run_id

    def save(self, out_dir: Path) -> Path:
        """The parent's identity in ``out_dir``: a resumed sweep (resume=true) reopens this run."""
        payload = {"run_id": self._started(), "experiment_id": self.experiment_id,
                   "experiment": self.experiment_name, "uri": scrub(self.uri)}
        return write_json(Path(out_dir) / PARENT_FILE, payload, indent=1)

    def _record(self, op: str, **args: Any) -> Record:
        return {"v": 1, "uri": scrub(self.uri), "experiment_id": self.experiment_id, "experiment": self.experiment_name,
                "parent": None, "run_name": self.run_name, "run_id": self._started(), "op": op,
                "time": int(time.time() * 1000), **args}

    def finish(
        self,
        records: list[TrialRecord],
        summaries: list[TaskSummary],
        out_dir: Path,
        plot: Path | None = None,
        status: str = "FINISHED",
    ) -> None:
        """Log the result files, the plot and per-task summary metrics, then end the parent run."""
        self._started()
        for name in ("results.csv", "results.json", "summary.csv", "expected_max.csv", "importance.csv"):
            path = Path(out_dir) / name
            if path.is_file():  # text artifacts are scrubbed too: results.json holds error messages
                self._emit(self._record("text", text=scrub(path.read_text()), artifact_file=name))
        for binary in (plot, Path(out_dir) / "expected_max.png", Path(out_dir) / "glue_submission.zip"):
            if binary is not None and Path(binary).is_file():
                self._emit(self._record("artifact", path=str(Path(binary).resolve())))
        now = int(time.time() * 1000)
        metrics = [[k, v, now, 0] for k, v in _summary_metrics(records, summaries).items()]
        self._emit(self._record("metrics", metrics=metrics))
        self._emit(self._record("end", status=status), last=True)

    def fail(self, status: str = "FAILED") -> None:
        """End the parent (FAILED, or KILLED) on the way out of a sweep that raised: never raises itself."""
        if self.run_id is None:
            return
        try:
            self._emit(self._record("end", status=status), last=True)
        except Exception as e:  # the sweep's own error is the one to show
            log.warning("tracking: could not mark MLflow run %s %s (%s)", self.run_id, status, scrub(str(e))[:200])

    def flush_all(self, wait_s: float = 0.0) -> int:
        """Send what every run of the sweep kept (the trials' and the parent's), waiting up to
        ``wait_s`` for a store that does not answer; the count of calls still unsent."""
        if self.spool_dir is None:
            return 0
        deadline = time.monotonic() + wait_s
        while True:
            left = 0
            for path in spool_files(self.spool_dir):
                left += self._flush_file(path)
                if left:
                    break  # the store went away: the other files wait for the next try
            if not left or time.monotonic() >= deadline:
                break
            time.sleep(FLUSH_POLL_S)
        if left:  # count every file's records for the user's line
            left = sum(len(read_records(p)) for p in spool_files(self.spool_dir))
        self._backlog = self.spool is not None and self.spool.path.exists()
        return left

    def _flush_file(self, path: Path) -> int:
        pending = read_records(path)
        spool = Spool(path)
        for i, record in enumerate(pending):
            try:
                self.sender.send(record)
            except Exception as e:
                if unreachable(e):
                    spool.keep(pending[i:])
                    return len(pending) - i
                log.warning("tracking: the MLflow store refused a kept call of %s (%s); dropped",
                            path.name, first_line(e, 300, scrubbed=True))
        spool.keep([])
        return 0

    def close(self, out_dir: Path) -> tuple[int, Path | None]:
        """A last try to send what waits; what is still left moves to ``out_dir/mlflow-unsent.jsonl``:
        (count, that file), or (0, None) when everything arrived."""
        if self.spool_dir is None or self.flush_all() == 0:
            return 0, None
        path = Path(out_dir) / UNSENT_FILE
        merge(self.spool_dir, path)
        return len(read_records(path)), path

    def _started(self) -> str:
        if self.run_id is None:
            raise TrackingError("SweepTracker used before start")
        return self.run_id


def _summary_metrics(records: list[TrialRecord], summaries: list[TaskSummary]) -> dict[str, float]:
    metrics = {"trials.finished": float(sum(r.ok for r in records)),
               "trials.failed": float(sum(not r.ok for r in records))}
    for s in summaries:
        learned = float(s.learned) if s.learned is not None else None  # 1: beat the trivial score by more than noise
        # 1: the best point beats the runner-up beyond noise (paired by seed); absent where not compared
        distinguishable = float(s.distinguishable) if s.distinguishable is not None else None
        for name, value in (("mean", s.mean), ("std", s.std), ("best", s.best_score), ("stopped", s.stopped),
                            ("steps", s.steps), ("steps_full", s.steps_full), ("trivial", s.trivial_score),
                            ("learned", learned), ("ci_low", s.ci_low), ("ci_high", s.ci_high),
                            ("p_value_runner_up", s.p_value), ("distinguishable", distinguishable),
                            # sweep.selection: the report split's (best: selected on the selection split)
                            ("report_best", s.best_report_score), ("report_mean", s.report_mean),
                            # sweep.soup: the soup's scores on both splits; 1: it beat the best seed on selection
                            ("soup", s.soup_score), ("soup_report", s.soup_report_score),
                            ("soup_wins", float(s.soup_wins) if s.soup_wins is not None else None)):
            if value is not None and math.isfinite(value):  # a task with no finished trial has no stats
                metrics[clean_key(f"{s.task}.{name}")] = float(value)
    return metrics
