"""Fault injection: a whole sweep killed at random instants, several times in a row, each time on a new
cluster, then checked that every trial ended exactly once. Shared by tests/test_random_kills.py and
scripts/random_kills.py.

The KubeRay shape on this machine (as tests/test_preemption.py): a head on the driver's disk and one worker
node of 2 CPUs and 1 fake GPU on its own disk (``OwnDiskCluster``), S3 from ``moto_server`` for
``cluster.storage_path`` (Tune's state, the checkpoints, the trials' histories, the ledger) and
``storage.output_prefix`` (the MLflow records' copies). A kill deletes the whole RayCluster: every process of
the driver and of Ray gets SIGKILL and the head's folder is wiped (the worker's tmpfs goes with its
namespace); S3 is kept. Then a new cluster starts and the same command runs again, as KubeRay runs the
RayJob's entrypoint on re-admission.

Kill instants (``KILL_KINDS``), each drawn by the caller's seeded ``random.Random``: ``random``, uniform in
[1 s, max_s] after the command started; ``checkpoint-upload`` and ``state-upload``, the first request of such
an upload in moto's log after an instant drawn the same way (moto logs a request once it answered it; pyarrow
uploads each file in several: a kill may fall between a multipart upload's start, its part and its
completion), so the instants spread over the whole run and still fall right on an upload. ``after_histories``
holds a kill back until the run has written that many history files (a slow start-up cannot push every kill
before the first trial's work). The harness polls every 50 ms; the kill ends the driver's session and the
worker node's at once (no trial writes after the instant), then ``ray stop --force``, then the wipe.

    rounds = KillRounds(root, seeds=(1, 2, 3, 4), epochs=3, n_train=64)
    try:
        rounds.start()
        for kind in ("state-upload", "checkpoint-upload"):
            rounds.round(kind, rng, max_s=90)
        rounds.finish(timeout=600)
        violations = rounds.verify()  # [] = every trial ended exactly once
    finally:
        rounds.close()

Starting or stopping the cluster ends EVERY Ray process on the machine (``ray stop --force``).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sweep.testing.local_cluster import OwnDiskCluster
from sweep.testing.services import s3_environment, start_moto

BUCKET = "sweep-killed"
EXPERIMENT = "killed"  # tracking.experiment
TASK = "WNLI"
REGISTERED_MODEL = f"tiny-roberta-{TASK}"  # the registry's name for the demo's model on TASK
# the kill kinds: at a drawn instant alone ("random", not a searcher's name), right after an upload of either kind
AT_RANDOM = "random"
CHECKPOINT_UPLOAD = "checkpoint-upload"  # a request of a trial's checkpoint upload (ray/tune/…/checkpoint_…)
STATE_UPLOAD = "state-upload"  # Tune's experiment state, the searcher's state, the ledger (ray/ledger/)
UPLOAD_KINDS = (CHECKPOINT_UPLOAD, STATE_UPLOAD)
KILL_KINDS = (AT_RANDOM, *UPLOAD_KINDS)
POLL_S = 0.05  # how often a round looks at the clock, the driver and moto's log
FIRST_KILL_S = 1.0  # the earliest kill instant after the command started
STUCK_S = 600.0  # a round that neither ends nor reaches its kill this long after the drawn instant is killed
# one request line of moto_server's log (werkzeug's): `"PUT /bucket/key?query HTTP/1.1" 200 -`
REQUEST = re.compile(r'"(?P<method>[A-Z]+) /(?P<bucket>[^/ ?]+)/(?P<key>[^ ?]*)(?:\?(?P<query>[^ ]*))? HTTP/1\.1"')
STATE_NAMES = ("experiment_state-", "search_gen_state-", "searcher-state-")


def is_upload(method: str, query: str) -> bool:
    """A PUT, or one of a multipart upload's requests (start ``?uploads``, a part, complete ``?uploadId=``)."""
    return method == "PUT" or (method == "POST" and ("uploads" in query or "uploadId" in query))


@dataclass(frozen=True)
class Upload:
    """One upload request in moto's log."""

    method: str
    key: str  # under the bucket
    done: bool  # the object is in S3 now: a PUT of it whole, or a multipart upload's completion


def upload_kind(key: str) -> str | None:
    """Which kill kind an upload of ``key`` (under the bucket) triggers, None: neither."""
    if key.startswith(("ray/tune/", "ray/train/")) and "checkpoint_" in key:
        return CHECKPOINT_UPLOAD
    if key.startswith("ray/ledger/") or any(name in key for name in STATE_NAMES):
        return STATE_UPLOAD
    return None


def epochs_of(rows: list[dict]) -> list[int]:
    """The epochs of a history's evaluation rows, in order (rows without one: a DDP trial's workers-ready)."""
    return [int(row["epoch"]) for row in rows if row.get("epoch") is not None]


def kill_session(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` and every process of its session (it was started with ``start_new_session``)."""
    import psutil

    try:
        sid = os.getsid(proc.pid)
    except ProcessLookupError:  # it has ended: its session (a new one) is still its pid
        sid = proc.pid
    victims = [p for p in psutil.process_iter() if _sid(p.pid) == sid]
    for victim in victims:
        try:
            victim.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(victims, timeout=30)
    if proc.poll() is None:
        proc.wait(timeout=30)


def _sid(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except (ProcessLookupError, PermissionError):
        return None


@dataclass
class KillRecord:
    """One round: where its kill instant fell and what S3 held when everything had died."""

    kind: str
    drawn_s: float  # the instant drawn: the kill (random), else the earliest instant an upload may trigger it
    killed_at_s: float | None  # seconds after the command started; None: the sweep ended before the kill
    trigger: str = ""  # the request that triggered it (method and key)
    exit_code: int | None = None  # the sweep's exit code when it ended before the kill
    history_files: int = 0  # ray/history/*.json in S3 at the kill
    epochs_recorded: int = 0  # the evaluations those histories hold, all trials together
    finished_trials: list[str] = field(default_factory=list)  # histories with every epoch and trial_done
    command_s: float = 0.0  # the command's wall seconds, until the kill or its end
    cluster_s: float = 0.0  # the new cluster's start
    after_histories: int = 0  # the history files the run had to write before the kill could come

    @property
    def ended_first(self) -> bool:
        return self.killed_at_s is None

    def line(self) -> str:
        if self.ended_first:
            return (f"{self.kind:<17} drawn {self.drawn_s:6.1f} s: the sweep ended first (exit {self.exit_code}) "
                    f"after {self.command_s:.1f} s")
        gate = f" (after {self.after_histories} history writes)" if self.after_histories else ""
        return (f"{self.kind:<17} drawn {self.drawn_s:6.1f} s{gate}, killed at {self.killed_at_s:6.1f} s"
                f"{f' on {self.trigger}' if self.trigger else ''}: S3 had {self.history_files} histories, "
                f"{self.epochs_recorded} epochs, {len(self.finished_trials)} finished")


@dataclass
class KillRoundsResult:
    kills: list[KillRecord]
    final_exit: int | None
    final_s: float  # the last command's wall seconds (the one that ran to its end)
    command_s: float  # every command together (the killed ones up to their kill)
    total_s: float  # everything: the cluster starts, the commands, the kills and wipes
    violations: list[str]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "kills": [asdict(k) for k in self.kills]}


class KillRounds:
    """One sweep's cluster, its S3 and its one command line (the RayJob's entrypoint), killed round after round.

    ``start()`` starts moto and writes the data; each ``round(kind, rng, max_s)`` starts a new cluster, runs the
    command and kills everything at the drawn instant; ``finish(timeout)`` runs it once more to its end;
    ``verify()`` lists what was not exactly once; ``close()`` stops whatever is still running."""

    def __init__(self, root: Path, seeds: tuple[int, ...] = (1, 2, 3, 4), epochs: int = 3, n_train: int = 64) -> None:
        self.root = Path(root)
        self.seeds = tuple(seeds)
        self.epochs = epochs
        self.n_train = n_train
        self.driver = self.root / "driver"  # the head's disk: wiped at every kill
        self.logs = self.root / "logs"  # the rounds' outputs: kept, not on any node's disk
        self.kills: list[KillRecord] = []
        self.final_exit: int | None = None
        self.final_s = 0.0
        self.final_log: Path | None = None
        self.final_cluster_s = 0.0
        self.final_uploads: list[tuple[float, str]] = []  # (seconds after its start, kill kind) in finish()
        self.data = self.root / "input"  # written by start()
        self._moto: subprocess.Popen | None = None
        self._moto_log = self.root / "moto.log"
        self._cluster: OwnDiskCluster | None = None
        self._proc: subprocess.Popen | None = None
        self._rounds = 0
        self._ray_started = False
        self._began = 0.0
        # (kill index, trial id, ETag) of each history that was finished at that kill: never written again
        self._finished_etags: list[tuple[int, str, str]] = []
        self._s3 = None

    # ------------------------------------------------------------------ setup and teardown

    def start(self) -> KillRounds:
        """moto_server, the bucket, the input data (outside every wiped folder)."""
        import boto3

        self._began = time.monotonic()
        for folder in (self.driver, self.logs, self.root / "shared"):
            folder.mkdir(parents=True, exist_ok=True)
        self._moto, server = start_moto(self._moto_log)
        self._cluster = OwnDiskCluster(self.root, self.driver, self.root / "shared",
                                       extra_env=s3_environment(server.endpoint))
        env = self._cluster.env
        self._s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                                aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")
        self._s3.create_bucket(Bucket=BUCKET)
        # the input, as the image or a volume brings it: on no disk a kill wipes
        _write_data(self.data, self.n_train)
        return self

    def close(self) -> None:
        """Stop the driver, Ray and moto, whatever state a failure left them in."""
        try:
            if self._proc is not None and self._proc.poll() is None:
                kill_session(self._proc)
        finally:
            try:
                if self._ray_started:  # not before: `ray stop --force` would end another Ray on the machine
                    self._cluster.stop()
            finally:
                if self._moto is not None and self._moto.poll() is None:
                    self._moto.terminate()
                    try:
                        self._moto.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        self._moto.kill()
                        self._moto.wait()

    # ------------------------------------------------------------------ the command

    @property
    def overrides(self) -> list[str]:
        return [
            f"sweep.seeds={json.dumps(list(self.seeds)).replace(' ', '')}", f"train.epochs={self.epochs}",
            f"storage.data_dir={self.data}", f"tracking.uri=sqlite:///{self.driver / 'mlflow.db'}",
            f"tracking.experiment={EXPERIMENT}", f"cluster.storage_path=s3://{BUCKET}/ray",
            f"storage.output_prefix=s3://{BUCKET}/out", "tracking.copy_every_s=2", "resume=auto",
        ]

    def _launch(self, log: Path) -> subprocess.Popen:
        """``python -m sweep`` on the head's side, in its own session (a kill ends it and nothing else)."""
        args = [sys.executable, "-m", "sweep", "experiment=demo", "cluster.address=auto", "resources.gpus_per_trial=1",
                f"storage.cache_dir={self.driver / 'cache'}", f"out_dir={self.driver / 'sweep'}", *self.overrides]
        with log.open("w") as out:
            return subprocess.Popen(args, env=self._cluster.env, cwd=self.driver, stdout=out,
                                    stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def _new_cluster(self) -> float:
        """A new RayCluster (fresh disks); the seconds its start took."""
        started = time.monotonic()
        self._cluster.workers = {}
        self._ray_started = True
        self._cluster.start()
        return time.monotonic() - started

    def _next_log(self) -> Path:
        self._rounds += 1
        return self.logs / f"round-{self._rounds}.log"

    # ------------------------------------------------------------------ the rounds

    def round(self, kind: str, rng: random.Random, max_s: float, after_histories: int = 0) -> KillRecord:
        """A new cluster, the command, and everything killed at an instant of ``kind`` drawn by ``rng``. With
        ``after_histories``, not before this run has written that many history files (a trial's evaluations)
        to S3: kills that must fall among the trials' work on a machine whose start-up takes longer than
        drawn. A sweep that ends first is recorded so (``ended_first``); its run is then the final one
        (``finish`` runs nothing)."""
        if kind not in KILL_KINDS:
            raise ValueError(f"kill kind: got {kind!r}, allowed: {', '.join(KILL_KINDS)}")
        if self.final_exit is not None:
            raise RuntimeError("the sweep has ended: no round is left to kill")
        drawn = rng.uniform(FIRST_KILL_S, max(max_s, FIRST_KILL_S))
        cluster_s = self._new_cluster()
        log = self._next_log()
        seen = self._moto_log.stat().st_size  # requests before this command cannot trigger its kill
        self._proc = proc = self._launch(log)
        started = time.monotonic()
        histories_written = 0
        while True:
            elapsed = time.monotonic() - started
            if proc.poll() is not None:
                command_s = time.monotonic() - started
                self.final_exit, self.final_s, self.final_log = proc.returncode, command_s, log
                record = KillRecord(kind, drawn, None, exit_code=proc.returncode, command_s=command_s,
                                    cluster_s=cluster_s, after_histories=after_histories)
                self._proc = None
                break
            seen, uploads = self._uploads_since(seen)
            hit: str | None = None  # what triggers the kill ("" the clock alone)
            # in the log's order; the lines read before the instant are dropped: only a later upload triggers it
            for upload in uploads:
                histories_written += upload.done and upload.key.startswith("ray/history/")
                if (hit is None and elapsed >= drawn and histories_written >= after_histories
                        and upload_kind(upload.key) == kind):
                    hit = f"{upload.method} {upload.key}"
            if kind == AT_RANDOM and elapsed >= drawn and histories_written >= after_histories:
                hit = ""
            if hit is not None or elapsed > drawn + STUCK_S:
                killed_at = time.monotonic() - started
                self._kill(proc)
                trigger = hit if hit is not None else "stuck: neither its end nor an upload"
                record = KillRecord(kind, drawn, killed_at, trigger=trigger, command_s=killed_at, cluster_s=cluster_s,
                                    after_histories=after_histories)
                self._note_s3(record)
                break
            time.sleep(POLL_S)
        self.kills.append(record)
        return record

    def finish(self, timeout: float = 600.0) -> int:
        """The same command on a new cluster, to its end; its exit code (124: past ``timeout``, then killed).
        After a round whose sweep ended first, that round's exit code (nothing runs again). Each upload that
        could trigger a kill is noted as it comes (``final_uploads``): where the instants of an unkilled run lie."""
        if self.final_exit is not None:
            return self.final_exit
        cluster_s = self._new_cluster()
        log = self._next_log()
        seen = self._moto_log.stat().st_size
        self._proc = proc = self._launch(log)
        started = time.monotonic()
        while proc.poll() is None and time.monotonic() - started < timeout:
            seen, uploads = self._uploads_since(seen)
            elapsed = time.monotonic() - started
            self.final_uploads += [(elapsed, kind) for u in uploads if (kind := upload_kind(u.key))]
            time.sleep(POLL_S)
        if proc.poll() is None:
            kill_session(proc)
            code = 124
        else:
            code = proc.returncode
        self._proc = None
        self.final_exit, self.final_s, self.final_log = code, time.monotonic() - started, log
        self.final_cluster_s = cluster_s
        return code

    def last_upload_s(self, kind: str) -> float | None:
        """Seconds after the final run's start of its last upload of ``kind`` (None: none, or it ran no command)."""
        return max((at for at, k in self.final_uploads if k == kind), default=None)

    def _kill(self, proc: subprocess.Popen) -> None:
        """The RayCluster deleted: the driver and the worker node at once, every Ray process, the head's folder."""
        kill_session(proc)
        self._proc = None
        for node in self._cluster.workers.values():  # its trials must not write to S3 after the instant
            if node.poll() is None:
                kill_session(node)
        self._cluster.stop()
        for path in self.driver.iterdir():
            shutil.rmtree(path) if path.is_dir() else path.unlink()

    def _uploads_since(self, offset: int) -> tuple[int, list[Upload]]:
        """Each upload to the bucket that moto logged past ``offset``, and the new offset (a line still being
        written stays for the next look)."""
        with self._moto_log.open("rb") as log:
            log.seek(offset)
            chunk = log.read()
        end = chunk.rfind(b"\n") + 1
        uploads = []
        for line in chunk[:end].decode(errors="replace").splitlines():
            match = REQUEST.search(line)
            if match and match["bucket"] == BUCKET and is_upload(match["method"], match["query"] or ""):
                query = match["query"] or ""
                done = (match["method"] == "PUT" and "partNumber" not in query) or (
                    match["method"] == "POST" and "uploadId" in query)
                uploads.append(Upload(match["method"], urllib.parse.unquote(match["key"]), done))
        return offset + end, uploads

    def _note_s3(self, record: KillRecord) -> None:
        """What S3 held once everything had died: what a resume starts from."""
        histories = self.histories()
        record.history_files = len(histories)
        record.epochs_recorded = sum(len(epochs_of(rows)) for rows in histories.values())
        record.finished_trials = sorted(t for t, rows in histories.items() if self._finished(rows))
        etags = self.etags()
        self._finished_etags += [(len(self.kills), t, etags[t]) for t in record.finished_trials if t in etags]

    def _finished(self, rows: list[dict]) -> bool:
        return len(epochs_of(rows)) == self.epochs and bool(rows) and rows[-1].get("trial_done") is True

    # ------------------------------------------------------------------ S3

    def _keys(self, prefix: str) -> list[dict]:
        pages = self._s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        return [o for page in pages for o in page.get("Contents", [])]

    def histories(self) -> dict[str, list[dict]]:
        """Each trial's history in S3, by trial id."""
        return {Path(o["Key"]).stem: json.loads(self._s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read())
                for o in self._keys("ray/history/") if o["Key"].endswith(".json")}

    def etags(self) -> dict[str, str]:
        return {Path(o["Key"]).stem: o["ETag"] for o in self._keys("ray/history/") if o["Key"].endswith(".json")}

    # ------------------------------------------------------------------ the checks

    def final_log_tail(self, chars: int = 4000) -> str:
        return self.final_log.read_text(errors="replace")[-chars:] if self.final_log else "(no final round)"

    def verify(self) -> list[str]:
        """Everything that was not exactly once, one line each ([] = every trial ended exactly once)."""
        violations: list[str] = []
        for check in (self._check_exit, self._check_records, self._check_histories, self._check_mlflow):
            try:
                violations += check()
            except Exception as error:  # noqa: BLE001 - a check that cannot even look is a violation too
                violations.append(f"{check.__name__[7:]}: could not check: {type(error).__name__}: {error}")
        return violations

    def _check_exit(self) -> list[str]:
        found = []
        if self.final_exit != 0:
            found.append(f"exit: the final run ended with {self.final_exit}, not 0")
        if self.final_log is not None and "Traceback" in self.final_log.read_text(errors="replace"):
            found.append(f"exit: a Traceback in the final run's output ({self.final_log.name})")
        return found

    def _results(self) -> tuple[Path | None, bool, str]:
        """results.json, whether the best model's config.json is there, and where: the final run's out_dir, else
        (a resume of a sweep that had ended runs nothing again, and the wiped head's disk has none) the copies
        the sweep uploaded to storage.output_prefix."""
        out = self.driver / "sweep"
        if (out / "results.json").is_file():
            return out / "results.json", (out / "best" / TASK / "config.json").is_file(), str(out)
        copied = {o["Key"] for o in self._keys("out/")}
        if "out/results.json" not in copied:
            return None, False, f"{out} nor s3://{BUCKET}/out/"
        local = self.root / "results-from-s3.json"
        self._s3.download_file(BUCKET, "out/results.json", str(local))
        return local, f"out/best/{TASK}/config.json" in copied, f"s3://{BUCKET}/out/"

    def _check_records(self) -> list[str]:
        from sweep.results.records import load_records

        results, best_model, where = self._results()
        if results is None:
            return [f"records: no results.json in {where}"]
        records = load_records(results)
        found = []
        if sorted(r.seed for r in records) != sorted(self.seeds):
            found.append(f"records: seeds {sorted(r.seed for r in records)} in results.json ({where}), "
                         f"not {sorted(self.seeds)}")
        found += [f"records: seed {r.seed} ({r.trial_id}) {r.status} score={r.score} steps {r.steps_done}/"
                  f"{r.steps_total}" for r in records if not (r.ok and r.steps_done == r.steps_total > 0)]
        if not best_model:
            found.append(f"records: no best/{TASK}/config.json in {where}")
        return found

    def _check_histories(self) -> list[str]:
        histories, etags = self.histories(), self.etags()
        found = []
        if len(histories) != len(self.seeds):
            found.append(f"histories: {len(histories)} files in ray/history/, not {len(self.seeds)} (one per trial): "
                         f"{ {t: epochs_of(r) for t, r in histories.items()} }")
        wanted = list(range(1, self.epochs + 1))
        found += [f"histories: trial {t}'s epochs are {epochs_of(rows)}, not {wanted}"
                  for t, rows in sorted(histories.items()) if epochs_of(rows) != wanted]
        found += [f"histories: trial {t}, finished at kill {k + 1}, was written again (ETag {e} -> {etags.get(t)})"
                  for k, t, e in self._finished_etags if etags.get(t) != e]
        return found

    def _check_mlflow(self) -> list[str]:
        from mlflow import MlflowClient

        with tempfile.TemporaryDirectory(prefix="killed-mlflow-") as laptop:
            for o in self._keys("out/mlflow/"):
                target = Path(laptop) / o["Key"]
                target.parent.mkdir(parents=True, exist_ok=True)
                self._s3.download_file(BUCKET, o["Key"], str(target))
            store = Path(laptop) / "out" / "mlflow" / "mlflow.db"
            if not store.is_file():
                return ["mlflow: no out/mlflow/mlflow.db in S3"]
            uri = f"sqlite:///{store}"
            client = MlflowClient(tracking_uri=uri, registry_uri=uri)
            return self._mlflow_violations(client)

    def _mlflow_violations(self, client) -> list[str]:
        experiment = client.get_experiment_by_name(EXPERIMENT)
        if experiment is None:
            return [f"mlflow: no experiment {EXPERIMENT!r}"]
        runs = client.search_runs([experiment.experiment_id])
        parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
        found = []
        if len(parents) != 1:
            found.append(f"mlflow: {len(parents)} parent runs, not 1: "
                         f"{[(r.info.run_name, r.info.status) for r in parents]}")
        for parent in parents:
            if parent.info.status != "FINISHED":
                found.append(f"mlflow: parent {parent.info.run_name} is {parent.info.status}")
        parent_ids = {p.info.run_id for p in parents}
        children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") in parent_ids]
        seeds = sorted(int(r.data.params["seed"]) for r in children if "seed" in r.data.params)
        if len(children) != len(self.seeds) or seeds != sorted(self.seeds):
            found.append(f"mlflow: {len(children)} trial runs with seeds {seeds}, "
                         f"not one per seed {sorted(self.seeds)}")
        wanted = list(range(1, self.epochs + 1))
        for run in children:
            name = f"{run.info.run_name} (seed {run.data.params.get('seed')})"
            if run.info.status != "FINISHED":
                found.append(f"mlflow: trial run {name} is {run.info.status}")
            steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "score"))
            if steps != wanted:
                found.append(f"mlflow: trial run {name}'s score steps are {steps}, not {wanted}")
        records, _, _ = self._results()
        if records is not None:
            from sweep.results.records import load_records

            ran = {r.run_id for r in load_records(records)}
            if ran != {r.info.run_id for r in children}:
                found.append(f"mlflow: results.json's run ids {sorted(ran)} are not the trial runs' "
                             f"{sorted(r.info.run_id for r in children)}")
        versions = client.search_model_versions(f"name='{REGISTERED_MODEL}'")
        if len(versions) != 1:
            found.append(f"registry: {len(versions)} versions of {REGISTERED_MODEL}, not 1")
        return found

    # ------------------------------------------------------------------ all of it

    def run(self, kinds: list[str], rng: random.Random, max_s: float, timeout: float = 600.0) -> KillRoundsResult:
        """``start`` (if not yet), one round per kind (until the sweep ends by itself), ``finish``, ``verify``."""
        if self._s3 is None:
            self.start()
        for kind in kinds:
            if self.round(kind, rng, max_s).ended_first:
                break
        self.finish(timeout)
        return self.result(self.verify())

    def result(self, violations: list[str]) -> KillRoundsResult:
        command_s = sum(k.command_s for k in self.kills if not k.ended_first) + self.final_s
        return KillRoundsResult(self.kills, self.final_exit, self.final_s, command_s,
                                time.monotonic() - self._began, violations)


def _write_data(root: Path, n_train: int) -> Path:
    from sweep.data.synthetic import write_synthetic_glue

    return write_synthetic_glue(root, [TASK], n_train=n_train)

