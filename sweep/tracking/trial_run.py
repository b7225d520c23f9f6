"""A trial's side: ``TrialLogger``, one nested run under the sweep's parent, built from plain data in
whatever process runs the trial (a Ray worker), tagged with the node and device it ran on.
"""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sweep.errors import TrackingError
from sweep.secrets import scrub
from sweep.tracking.sender import Tracked
from sweep.tracking.spool import Record
from sweep.tracking.store import TAG_LIMIT, clean_key, clean_params, clean_tags

# --- one trial's nested run ----------------------------------------------------------------------


def _node_tag() -> str:
    # Inside a Ray worker the node's IP names the machine the way Ray's dashboard does.
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return ray.util.get_node_ip_address()
    return socket.gethostname()


def _device_tag() -> str:
    # Only ask torch if the trial already imported it: tracking must not pull torch in.
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return f"cuda:{torch.cuda.current_device()} ({torch.cuda.get_device_name()})"
    return "cpu" if torch is not None else "unknown"


class TrialLogger(Tracked):
    """A trial's side, built from plain data in whatever process runs the trial: one nested run.

    ``start`` resumes ``run_id`` if given, else the parent's child of the same run name if one
    exists (a retried trial, or a trial of a resumed sweep), else creates the run. With
    ``spool_dir`` no call raises because the store is down: it is kept and sent later.
    """

    def __init__(
        self,
        uri: str,
        experiment_id: str,
        parent_run_id: str,
        run_name: str,
        params: Mapping[str, Any],
        tags: Mapping[str, Any] | None = None,
        run_id: str | None = None,
        experiment_name: str | None = None,
        spool_dir: str | Path | None = None,
    ) -> None:
        super().__init__(uri, spool_dir)
        self.experiment_id = experiment_id
        self.experiment_name = experiment_name
        self.parent_run_id = parent_run_id
        self.run_name = run_name.replace('"', "_")  # so quote_filter can always quote it for the lookup
        self.params = dict(params)
        self.tags = dict(tags or {})
        self.run_id = run_id
        self._began = False

    def _run_tags(self) -> dict[str, str]:
        return clean_tags(
            {
                "mlflow.parentRunId": self.parent_run_id,
                "sweep.task": self.params.get("task"),
                "sweep.seed": self.params.get("seed"),
                "host": socket.gethostname(),
                "node": _node_tag(),
                "device": _device_tag(),
                **self.tags,
            }
        )

    def _record(self, op: str, **args: Any) -> Record:
        return {"v": 1, "uri": scrub(self.uri), "experiment_id": self.experiment_id, "experiment": self.experiment_name,
                "parent": self.parent_run_id, "run_name": self.run_name, "run_id": self.run_id, "op": op,
                "time": int(time.time() * 1000), **args}

    @property
    def began(self) -> bool:
        """``start`` was called (the run exists, or its creation waits in the spool)."""
        return self._began

    def _sent(self, record: Record, run_id: str) -> None:
        self.run_id = run_id

    def start(self) -> str | None:
        """Create or resume the trial's run, set its tags and log its params; return the run id
        (None while the store does not answer: the run is made once it does)."""
        self._use_spool(self.run_name)
        self._began = True
        self._emit(self._record("start", tags=self._run_tags(), params=clean_params(self.params)))
        return self.run_id

    def log_evaluation(self, step: int, metrics: Mapping[str, float]) -> None:
        """Each metric at ``step`` (the epoch, or the training step when evaluating within epochs)."""
        self._started()
        now = int(time.time() * 1000)
        self._emit(self._record("metrics", metrics=[[clean_key(k), float(v), now, step] for k, v in metrics.items()]))

    def end(self, status: str = "FINISHED", error: str | None = None, tags: Mapping[str, Any] | None = None) -> None:
        """Terminate the run; a failure keeps the (scrubbed) tail of its error as tag ``error``;
        ``tags`` are set first (an early stop's reason)."""
        self._started()
        # The tail of a traceback says what went wrong; keep that end when truncating.
        self._emit(self._record("end", status=status, error=scrub(error)[-TAG_LIMIT:] if error else None,
                                tags=clean_tags(tags) if tags else None), last=True)

    def _started(self) -> None:
        if not self._began:
            raise TrackingError("TrialLogger used before start()")
