"""The sweep's own ledger of its trials: what a resumed sweep goes by, whatever was killed when.

Tune's snapshot of a sweep is three files uploaded one after another by a background sync, every few
seconds: a kill lands between them, or between a trial's end and the next snapshot, as often as not
(docs/architecture.md §7). The ledger is the sweep's own record, one entry per trial *identity* —
(task, seed, grid point, sample round), the same in every launch of the same command, unlike Tune's
trial ids — written by the driver at every change of the trial's state, each entry one file replaced
whole (a rename after an fsync on a folder, one PUT on S3), so a kill at any instant leaves every entry
as it was before or after that change, never torn:

    <storage>/ledger/sweep.json           the sweep: its identities, when it began
    <storage>/ledger/trials/<identity>.json
    <storage>/ledger/lease.json           the driver running it: host, pid, heartbeat

``<storage>`` is the sweep's storage path (``cluster.storage_path``, else ``out_dir/ray``), beside Tune's
state and the trials' histories: a new cluster given the same storage finds it. A resumed sweep computes
what is left from the entries (driver/resume.py): a finished or failed trial is kept as it is, a
checkpointed one goes on from its checkpoint, any other starts.

Plain Python and pyarrow (no Ray): the Tune callback that writes it is hooks/ledger_entries.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from sweep.errors import OutDirInUseError
from sweep.remote_files import JsonFolder

FOLDER = "ledger"
State = Literal["planned", "running", "checkpointed", "finished", "failed"]
ENDED: tuple[State, ...] = ("finished", "failed")
LEASE_TTL_S = 30.0  # a lease whose heartbeat has not moved for this long is a dead driver's
HEARTBEAT_S = 5.0


def identity_of(task: str, seed: int, grid: dict[str, Any], sample_round: int) -> str:
    """A trial's name in the ledger: the same for the same command in every launch (readable, then a hash
    of the grid point, which may hold any characters)."""
    point = hashlib.sha1(json.dumps(grid or {}, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return f"{task}-seed{seed}-{point}-r{sample_round}"


@dataclass
class TrialEntry:
    """One trial identity's record."""

    identity: str
    task: str
    seed: int
    grid: dict[str, Any] = field(default_factory=dict)
    sample_round: int = 0
    state: State = "planned"
    trial_id: str | None = None  # the id it reports with (its history, Train run and MLflow run), kept across launches
    hparams: dict[str, Any] = field(default_factory=dict)  # what it trains with (a search's draw, kept)
    folders: list[str] = field(default_factory=list)  # the Tune trial folders it ran in (its checkpoints)
    checkpoint: str | None = None  # its newest checkpoint Tune registered (a URI or a path)
    step: int | None = None  # that checkpoint's step
    error: str | None = None
    attempts: int = 0  # launches and retries that started it
    updated: float = 0.0

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrialEntry:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


@dataclass(frozen=True)
class LeaseHolder:
    owner: str
    host: str
    pid: int
    started: float
    heartbeat: float

    def line(self) -> str:
        return f"pid {self.pid} on {self.host}, started {time.strftime('%H:%M:%S', time.localtime(self.started))}"


class Ledger:
    """The ledger under ``<storage>/ledger`` (a folder or a URI)."""

    def __init__(self, storage_root: str) -> None:
        root = str(storage_root).rstrip("/")
        self.root = f"{root}/{FOLDER}"
        self.files = JsonFolder(self.root)
        self.trials = JsonFolder(f"{self.root}/trials")

    def __reduce__(self):
        return (Ledger, (self.root.rsplit("/", 1)[0],))

    # --- the sweep ---------------------------------------------------------------------------------

    def begun(self) -> bool:
        """Whether a launch of this sweep wrote its ledger (a resume goes by it)."""
        return self.files.read("sweep") is not None

    def begin(self, identities: list[str]) -> None:
        """A new sweep: entries of an earlier sweep in this storage go, then the sweep's own record."""
        for name in self.trials.names():
            self.trials.delete(name)
        self.files.write("sweep", {"identities": identities, "began": time.time()})

    def end(self) -> None:
        """The sweep's end is done (best models exported and uploaded, records written)."""
        saved = self.files.read("sweep") or {}
        self.files.write("sweep", {**saved, "ended": time.time()})

    def ended_at(self) -> float | None:
        return (self.files.read("sweep") or {}).get("ended")

    def ended_with(self, identities: list[str]) -> bool:
        """Whether the sweep's end is done and it covered every one of ``identities`` (a command that plans
        more trials than the sweep ran is not done)."""
        saved = self.files.read("sweep") or {}
        return bool(saved.get("ended")) and set(identities) <= set(saved.get("identities") or [])

    def extend(self, identities: list[str]) -> None:
        """A resumed launch records the identities its command plans (a config may have grown)."""
        saved = self.files.read("sweep") or {}
        known = list(saved.get("identities") or [])
        added = [i for i in identities if i not in known]
        if added:  # a sweep that grew is not ended any more
            self.files.write("sweep", {**{k: v for k, v in saved.items() if k != "ended"}, "identities": known + added})

    # --- the trials --------------------------------------------------------------------------------

    def entries(self) -> dict[str, TrialEntry]:
        found = {}
        for name in self.trials.names():
            data = self.trials.read(name)
            if data:
                found[name] = TrialEntry.from_json(data)
        return found

    def entry(self, identity: str) -> TrialEntry | None:
        data = self.trials.read(identity)
        return TrialEntry.from_json(data) if data else None

    def put(self, entry: TrialEntry) -> TrialEntry:
        entry = replace(entry, updated=time.time())
        self.trials.write(entry.identity, asdict(entry))
        return entry

    # --- the lease ---------------------------------------------------------------------------------

    def holder(self) -> LeaseHolder | None:
        data = self.files.read("lease")
        return LeaseHolder(**data) if data else None

    def take_lease(self, wait_s: float = LEASE_TTL_S, poll_s: float = 1.0, say=print) -> Lease:
        """The sweep's lease for this driver. A lease another driver renews is refused in one line
        (``OutDirInUseError``); a dead driver's (its pid gone on this host, or its heartbeat still for
        ``wait_s``) is taken over."""
        held = self.holder()
        if held is not None and not _gone(held):
            say(f"resume: the sweep's lease is held by the driver {held.line()}; waiting up to {wait_s:.0f} s "
                "for its heartbeat")
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                time.sleep(poll_s)
                now = self.holder()
                if now is None or _gone(now):
                    break
                if now.heartbeat != held.heartbeat or now.owner != held.owner:
                    raise OutDirInUseError(
                        f"another driver is running this sweep ({now.line()}; its heartbeat in {self.root}/lease.json "
                        f"moved {max(time.time() - now.heartbeat, 0):.0f} s ago): stop it first, or give this one "
                        "another cluster.storage_path")
        lease = Lease(self.files)
        lease.beat()
        return lease


def _gone(held: LeaseHolder) -> bool:
    """A holder that cannot be alive: its heartbeat is older than the TTL, or it ran on this host and its
    process is no more."""
    if time.time() - held.heartbeat > LEASE_TTL_S:
        return True
    if held.host != socket.gethostname():
        return False
    try:
        os.kill(held.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class Lease:
    """This driver's hold on the sweep: a heartbeat written every few seconds until ``release``."""

    def __init__(self, files: JsonFolder) -> None:
        self.files = files
        self.owner = uuid.uuid4().hex
        self.started = time.time()
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None

    def beat(self) -> None:
        self.files.write("lease", asdict(LeaseHolder(self.owner, socket.gethostname(), os.getpid(), self.started,
                                                     time.time())))

    def keep(self) -> Lease:
        """Renew the heartbeat on a thread until ``release``."""
        def renew() -> None:
            while not self.stopping.wait(HEARTBEAT_S):
                try:
                    self.beat()
                except Exception:  # noqa: BLE001 - storage away for a moment: the next beat tries again
                    pass

        self.thread = threading.Thread(target=renew, name="sweep-lease", daemon=True)
        self.thread.start()
        return self

    def release(self) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(HEARTBEAT_S + 5)
        try:
            data = self.files.read("lease")
            if data and data.get("owner") == self.owner:
                self.files.delete("lease")
        except Exception:  # noqa: BLE001 - a lease left behind expires on its own
            pass


@dataclass(frozen=True)
class LeftToRun:
    """What a resumed launch runs and keeps, from the ledger: each planned trial with what Tune's config
    carries for it (``extras``: its identity, and what it goes on from), and the ended entries kept."""

    points: list[dict[str, Any]]
    extras: list[dict[str, Any]]
    kept: dict[str, TrialEntry]  # ended in an earlier launch: not run again
    continued: int  # go on from a checkpoint
    restarted: int  # started before, no checkpoint: from the beginning

    @property
    def running(self) -> int:
        return len(self.points)


def left_to_run(points: list[dict[str, Any]], identities: list[str], rounds: list[int],
                entries: dict[str, TrialEntry]) -> LeftToRun:
    """The planned trials (``points`` with their ``identities`` and sample ``rounds``, in the dispatch order)
    minus those the ledger says ended; a started trial keeps its id, hparams and newest checkpoint."""
    run_points, extras, kept = [], [], {}
    continued = restarted = 0
    for point, identity, sample_round in zip(points, identities, rounds):
        entry = entries.get(identity)
        if entry is not None and entry.ended:
            kept[identity] = entry
            continue
        run_points.append(point)
        extra: dict[str, Any] = {"identity": identity, "sample_round": sample_round}
        if entry is not None and entry.trial_id:
            extra["continues"] = {"trial_id": entry.trial_id, "hparams": entry.hparams,
                                  "checkpoint": entry.checkpoint, "folders": entry.folders}
            if entry.checkpoint:
                continued += 1
            else:
                restarted += 1
        extras.append(extra)
    return LeftToRun(run_points, extras, kept, continued, restarted)


def resuming_line(storage_root: str, left: LeftToRun) -> str:
    """The one line a resumed sweep starts with: what its ledger holds and what each trial will do."""
    finished = sum(e.state == "finished" for e in left.kept.values())
    failed = sum(e.state == "failed" for e in left.kept.values())
    fresh = left.running - left.continued - left.restarted
    parts = [f"{finished} finished (not run again)", f"{left.continued} go on from their checkpoints"]
    if left.restarted:
        parts.append(f"{left.restarted} start again (no checkpoint yet)")
    if fresh:
        parts.append(f"{fresh} not started yet")
    if failed:
        parts.append(f"{failed} failed (kept as they are)")
    total = len(left.kept) + left.running
    return f"resume: continuing the sweep in {storage_root} from its ledger: of its {total} trials " + ", ".join(parts)
