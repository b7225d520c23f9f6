"""Submit the sweep to a running Ray cluster as a Ray Job, and follow it (the second of the three
places in docs/architecture.md §6). The command is ``sweep submit`` (sweep/cli/submit.py, also
``python -m sweep submit``):

    sweep submit --address http://HEAD:8265 [--working-dir DIR] [--no-wait] [--job-id ID] -- task=RTE ...
    sweep submit status JOB_ID | logs JOB_ID [--follow] | stop JOB_ID | list     [--address URL]

Ray's Jobs API (``JobSubmissionClient``), the way CodeFlare SDK's job.submit/status/logs/stop work.
The job runs ``python -m sweep <overrides>`` on the head. ``--address`` defaults to $RAY_API_SERVER_ADDRESS,
then $RAY_ADDRESS (Ray's own order: ``dashboard_url``). Authentication is Ray's: with RAY_AUTH_MODE=token its
client sends the token from RAY_AUTH_TOKEN, the file RAY_AUTH_TOKEN_PATH names, or ~/.ray/auth_token. Without
it nothing is sent: like `ray job submit`, a local token never goes to an address the user did not mean it for.
The cluster needs ray[default] (its dashboard serves the Jobs API); this client needs only requests/aiohttp.

The first half (the address, the entrypoint, the upload's excludes, messages) is plain Python the unit
tests call without Ray; only the second half talks to the cluster. ``ACTIONS`` maps a ``Command``'s
action to what does it (each returns the exit status).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shlex
import signal
import sys
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from sweep.config.defaults import TRACKING_URI

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

PROG = "python -m sweep submit"  # in the commands printed to follow, check or stop a job
# Left out of a --working-dir upload: environments, run outputs, stores and caches (Ray caps a
# working_dir at 100 MiB, and none of these belong on the cluster). gitignore syntax, any depth.
WORKING_DIR_EXCLUDES = (".venv", "outputs", "multirun", "runs", "mlflow.db", "mlruns", "mlartifacts", ".git",
                        "__pycache__", ".pytest_cache", ".cache", "*.egg-info", "bench_results")
DEFAULT_TRACKING_URI = TRACKING_URI  # conf/tracking/mlflow.yaml's, from its one home in code
PROBE_TIMEOUT_S = 5.0  # Ray's client sets no timeout: an address that never answers would hang it
STOP_TIMEOUT_S = 30.0
EXIT_FAILED, EXIT_USAGE, EXIT_DETACHED = 1, 2, 130
# Where Ray's clients look for the token (ray/_private/authentication, C++ AuthenticationTokenLoader).
TOKEN_HELP = ("set RAY_AUTH_MODE=token and the cluster's token in RAY_AUTH_TOKEN, or in a file named by "
              "RAY_AUTH_TOKEN_PATH (default ~/.ray/auth_token); `ray get-auth-token` on the head prints it")


class SubmitError(Exception):
    """A person's mistake or an unreachable cluster: the command prints it as one ``error:`` line, exit 2."""


@dataclass(frozen=True)
class Command:
    """What the command line asks for; ``address`` is already the dashboard's http(s) URL."""

    action: str  # submit | status | logs | stop | list
    address: str
    job_id: str | None = None
    overrides: tuple[str, ...] = ()
    working_dir: Path | None = None
    wait: bool = True
    follow: bool = False


# ---------------------------------------------------------------- plain Python: no Ray below here


def dashboard_url(address: str | None, env: Mapping[str, str]) -> str:
    """--address, else Ray's variables, as an http(s) URL without a trailing slash."""
    address = address or env.get("RAY_API_SERVER_ADDRESS") or env.get("RAY_ADDRESS")
    if not address:
        raise SubmitError("no Ray cluster given: pass --address http://HEAD:8265 (the Ray dashboard) "
                          "or set RAY_ADDRESS=http://HEAD:8265")
    address = address.strip().rstrip("/")
    if address in ("auto", "local"):  # ray.init's words, valid in RAY_ADDRESS but no URL
        raise SubmitError(f"address {address!r}: the Ray dashboard's URL is needed, e.g. http://HEAD:8265")
    if "://" not in address:
        # Ray would read a bare host:port as the GCS address; here it is always the dashboard.
        address = f"http://{address}"
    if not address.startswith(("http://", "https://")):
        raise SubmitError(f"address {address!r}: the Ray dashboard's URL is needed, e.g. http://HEAD:8265 "
                          "(not a ray:// client address)")
    return address


def entrypoint(overrides: Sequence[str]) -> str:
    """The job's shell command: each override quoted, so brackets and spaces reach Hydra intact."""
    return " ".join(["python", "-m", "sweep", *(shlex.quote(o) for o in overrides)])


def runtime_env(working_dir: Path | None) -> dict[str, Any] | None:
    if working_dir is None:
        return None
    return {"working_dir": str(working_dir), "excludes": list(WORKING_DIR_EXCLUDES)}


def override_value(overrides: Sequence[str], key: str) -> str | None:
    """What the overrides set ``key`` to (the last one wins, as in Hydra); None when unset, null or deleted."""
    value: str | None = None
    for item in overrides:
        name, has_value, raw = item.partition("=")
        if name.lstrip("+~") != key:
            continue
        raw = raw.strip().strip("'\"")
        value = None if name.startswith("~") or not has_value or raw in ("", "null") else raw
    return value


def output_locations(overrides: Sequence[str]) -> list[str]:
    """Where the sweep's outputs will be, said before submitting (a job's disk is the head's disk)."""
    storage = override_value(overrides, "cluster.storage_path")
    prefix = override_value(overrides, "storage.output_prefix")
    out_dir = override_value(overrides, "out_dir")
    on_head = (f"the head node's disk ({out_dir}, relative to the job's working directory)" if out_dir
               else "the head node's disk (under the job's working directory, outputs/)")
    lines = []
    if storage:
        lines.append(f"outputs: the trials' checkpoints and Tune's state go to {storage} (cluster.storage_path)")
    if prefix:
        lines.append(f"outputs: the best model per task and the result files go to {prefix} (storage.output_prefix)")
    if not storage and not prefix:
        lines.append(f"warning: results stay on {on_head}; to keep them, set storage.output_prefix=s3://BUCKET/PREFIX "
                     "and cluster.storage_path=s3://BUCKET/PREFIX")
    elif not prefix:
        lines.append(f"note: the best models and result files stay on {on_head}; "
                     "storage.output_prefix=s3://BUCKET/PREFIX uploads them")
    elif not storage:
        lines.append(f"note: checkpoints stay on {on_head}; a cluster of several nodes needs "
                     "cluster.storage_path=s3://BUCKET/PREFIX (or a folder every node shares)")
    lines.append(tracking_location(overrides, prefix))
    return lines


def tracking_location(overrides: Sequence[str], prefix: str | None) -> str:
    """Where the sweep's MLflow records will be: a server, the head's sqlite file (uploaded to
    ``<prefix>/mlflow/`` with storage.output_prefix, else lost with the head), or none. Scrubbed:
    a tracking URI can carry a password."""
    from sweep.secrets import scrub
    from sweep.tracking.store_upload import SUBDIR, sqlite_file

    kind = override_value(overrides, "tracking.kind") or override_value(overrides, "tracking") or "mlflow"
    if kind == "none":
        return "outputs: no MLflow records (tracking=none)"
    uri = override_value(overrides, "tracking.uri") or DEFAULT_TRACKING_URI
    db = sqlite_file(uri)
    if db is None:
        fallback = ""
        if override_value(overrides, "tracking.required") in ("false", "False"):
            fallback = (f"; if it does not answer, {DEFAULT_TRACKING_URI} on the head"
                        + (f", uploaded to {prefix.rstrip('/')}/{SUBDIR}/" if prefix else " (lost with the head)"))
        return f"outputs: the MLflow records go to {scrub(uri)} (tracking.uri){fallback}"
    where = (f"{scrub(uri)} on the head node's disk"
             + ("" if db.is_absolute() else ", relative to the job's working directory"))
    if prefix:
        return (f"outputs: the MLflow records go to {where}, and with their artifacts to "
                f"{prefix.rstrip('/')}/{SUBDIR}/ when the sweep ends (storage.output_prefix)")
    return (f"warning: the MLflow records stay in {where}; to keep them, set storage.output_prefix=s3://BUCKET/PREFIX "
            f"(the store is uploaded to PREFIX/{SUBDIR}/) or tracking.uri=http://MLFLOW-SERVER:5000")


_PY_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b")
_NOISE = ("Set the environment variable HYDRA_FULL_ERROR=1",)  # Hydra's hint after a traceback


def job_error_line(log: str) -> str | None:
    """The line of a job's log that says why it failed: the sweep's last ``error:`` line, else the last
    Python exception line, else the last non-empty line."""
    lines = [line.strip() for line in log.splitlines()]
    lines = [line for line in lines if line and not line.startswith(_NOISE)]
    for pick in (lambda s: s.startswith("error:"), lambda s: bool(_PY_EXCEPTION.match(s))):
        found = [line for line in lines if pick(line)]
        if found:
            return found[-1]
    return lines[-1] if lines else None


def auth_error_message(address: str, status: int, env: Mapping[str, str]) -> str:
    """One line for a 401/403; it never shows the token (only where Ray reads it from)."""
    why = "no token sent" if status == 401 else "the token is wrong"
    note = ""
    if env.get("RAY_AUTH_MODE", "").lower() != "token":
        note = " (RAY_AUTH_MODE is not 'token' here, so Ray's client sent no token)"
    return f"the Ray cluster at {address} refused the request ({status}: {why}): {TOKEN_HELP}{note}"


def unreachable_message(address: str, reason: str) -> str:
    return (f"cannot reach the Ray dashboard at {address}: {reason}; is the cluster up / port-forwarded "
            "(kubectl port-forward svc/<cluster>-head-svc 8265:8265)?")


def server_said(address: str, text: str) -> str:
    """Ray's "Request failed with status code 404: Job x does not exist." as the answer it carries."""
    first = text.strip().splitlines()[0] if text.strip() else "an error"
    found = re.match(r"Request failed with status code (\d+): (.*)", first)
    return (f"the Ray cluster at {address} answered {found[1]}: {found[2]}" if found
            else f"the Ray cluster at {address} answered: {first}")


def short_reason(error: BaseException) -> str:
    """requests/aiohttp wrap the socket error in a paragraph; keep the part a person acts on."""
    text = str(error)
    found = re.findall(r"\[Errno -?\d+\] ([^'\")]+)", text)
    if found:
        return found[-1].strip()
    if "timed out" in text.lower() or type(error).__name__.endswith("Timeout"):
        return f"no answer within {PROBE_TIMEOUT_S:.0f} s"
    from sweep.failures import first_line

    return first_line(error, 200)


def check_token_env(env: Mapping[str, str]) -> None:
    """An unreadable RAY_AUTH_TOKEN_PATH: Ray's token loader raises an AuthenticationError that reads
    like the cluster refused the token; it is a local mistake, so say that before Ray is asked."""
    path = env.get("RAY_AUTH_TOKEN_PATH")
    if env.get("RAY_AUTH_MODE", "").lower() == "token" and path and not env.get("RAY_AUTH_TOKEN"):
        if not os.access(path, os.R_OK) or not Path(path).is_file():
            raise SubmitError(f"RAY_AUTH_TOKEN_PATH={path} is not a readable file: {TOKEN_HELP}")


def again_commands(job_id: str, address: str) -> list[str]:
    return [f"  follow: {PROG} logs {job_id} --follow --address {address}",
            f"  status: {PROG} status {job_id} --address {address}",
            f"  stop:   {PROG} stop {job_id} --address {address}"]


def detach_message(job_id: str, address: str) -> str:
    lines = [f"detached: job {job_id} keeps running on the cluster (Ctrl-C does not stop it)"]
    lines += [line for line in again_commands(job_id, address) if "status:" not in line]
    return "\n".join(lines)


def end_message(job_id: str, status: str, log: str, job_message: str | None) -> str:
    """The last word on a job: its status and, unless it succeeded, the line that says why."""
    if status == "SUCCEEDED":
        return f"job {job_id}: SUCCEEDED"
    said = (job_message or "").strip().splitlines()[:1]
    # A stopped job's log just ends; Ray's own message ("Job was intentionally stopped") says more.
    why = said[0] if status == "STOPPED" and said else job_error_line(log) or (said[0] if said else None)
    return f"job {job_id}: {status}" + (f" -- {why}" if why else "")


# ---------------------------------------------------------------- Ray's Jobs API


def probe(address: str) -> None:
    """Fail fast on an address that is down or black-holed (Ray's own requests have no timeout).

    /api/authentication_mode needs no token, so this says nothing about auth; Ray's client does that.
    """
    import requests

    try:
        requests.get(f"{address}/api/authentication_mode", timeout=PROBE_TIMEOUT_S)
    except requests.exceptions.RequestException as e:
        raise SubmitError(unreachable_message(address, short_reason(e))) from None


@contextmanager
def talking_to(address: str) -> Iterator[None]:
    """Ray's client errors as one line: auth (401/403), unreachable, or what the server said."""
    import aiohttp
    import requests
    from ray.exceptions import AuthenticationError

    try:
        yield
    except AuthenticationError as e:
        # Ray formats a 401 as "Authentication required", a 403 as "Authentication failed".
        status = 401 if e.message.startswith("Authentication required") else 403
        raise SubmitError(auth_error_message(address, status, os.environ)) from None
    except aiohttp.WSServerHandshakeError as e:  # the log stream's websocket gets the 401/403 this way
        if e.status in (401, 403):
            raise SubmitError(auth_error_message(address, e.status, os.environ)) from None
        raise SubmitError(f"the Ray cluster at {address} refused the log stream ({e.status}: {e.message})") from None
    except (requests.exceptions.RequestException, aiohttp.ClientConnectionError, ConnectionError) as e:
        raise SubmitError(unreachable_message(address, short_reason(e))) from None
    except RuntimeError as e:  # Ray's client raises RuntimeError for any other non-200 answer
        raise SubmitError(server_said(address, str(e))) from None


def connect(address: str) -> JobSubmissionClient:
    probe(address)
    from ray.job_submission import JobSubmissionClient

    # The SDK logs every websocket close at INFO into the user's terminal; warnings still show.
    logging.getLogger("ray.dashboard.modules.job.sdk").setLevel(logging.WARNING)

    # Ray's client lets RAY_ADDRESS / RAY_API_SERVER_ADDRESS override its address argument; --address
    # must win (it was already resolved from them when not given).
    saved = {k: os.environ.pop(k) for k in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS") if k in os.environ}
    try:
        with talking_to(address):
            return JobSubmissionClient(address)
    finally:
        os.environ.update(saved)


def submit(client: JobSubmissionClient, command: Command) -> str:
    return client.submit_job(entrypoint=entrypoint(command.overrides), submission_id=command.job_id,
                             runtime_env=runtime_env(command.working_dir))


def detach_now(job_id: str, address: str) -> None:
    """Ctrl-C while following: say how to get back, and leave at once. Unwinding asyncio.run would
    first close the log websocket, whose close handshake may wait seconds on a busy head (seen in
    CI: no exit within 15 s); the job lives on the cluster, so nothing local needs cleaning up."""
    sys.stdout.flush()
    print("\n" + detach_message(job_id, address), file=sys.stderr, flush=True)
    os._exit(EXIT_DETACHED)


def stream_logs(client: JobSubmissionClient, job_id: str, out: TextIO, address: str | None = None) -> str:
    """Print the job's log as it comes until the job ends; returns the log's tail (for the error line).
    With ``address``, Ctrl-C detaches at once (``detach_now``)."""
    tail: deque[str] = deque(maxlen=512)

    async def pump() -> None:
        if address is not None:
            asyncio.get_running_loop().add_signal_handler(signal.SIGINT, detach_now, job_id, address)
        async for chunk in client.tail_job_logs(job_id):
            out.write(chunk)
            out.flush()
            tail.append(chunk)

    asyncio.run(pump())
    return "".join(tail)


def wait_terminal(client: JobSubmissionClient, job_id: str, timeout_s: float) -> str:
    """The job's status once terminal, or its current one after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = client.get_job_status(job_id)
        if status.is_terminal() or time.monotonic() >= deadline:
            return status.value
        time.sleep(0.5)


def follow(client: JobSubmissionClient, job_id: str, address: str) -> int:
    """Stream until the job ends; 0 only for SUCCEEDED. Ctrl-C detaches and leaves the job running."""
    try:
        with talking_to(address):
            log = stream_logs(client, job_id, sys.stdout, address)
            # The stream closes when the server sees the job end; the status may lag a moment.
            status = wait_terminal(client, job_id, timeout_s=10)
            if not log.strip():
                log = client.get_job_logs(job_id)
            info = client.get_job_info(job_id)
    except KeyboardInterrupt:
        print("\n" + detach_message(job_id, address), file=sys.stderr)
        return EXIT_DETACHED
    print(end_message(job_id, status, log, info.message), file=sys.stdout if status == "SUCCEEDED" else sys.stderr)
    return 0 if status == "SUCCEEDED" else EXIT_FAILED


def run_submit(command: Command) -> int:
    for line in output_locations(command.overrides):
        print(line, file=sys.stderr if line.startswith("warning:") else sys.stdout)
    client = connect(command.address)
    with talking_to(command.address):
        job_id = submit(client, command)
    print(f"submitted: job {job_id} to {command.address}: {entrypoint(command.overrides)}", flush=True)
    if not command.wait:
        print("\n".join(again_commands(job_id, command.address)))
        return 0
    return follow(client, job_id, command.address)


def run_status(command: Command) -> int:
    client = connect(command.address)
    with talking_to(command.address):
        info = client.get_job_info(command.job_id)
        status = info.status.value
        log = client.get_job_logs(command.job_id) if status in ("FAILED", "STOPPED") else ""
    if status in ("FAILED", "STOPPED"):
        print(end_message(command.job_id, status, log, info.message))
    else:
        print(f"job {command.job_id}: {status}")
    return 0


def run_logs(command: Command) -> int:
    client = connect(command.address)
    if command.follow:
        with talking_to(command.address):
            client.get_job_status(command.job_id)  # an unknown job: the server's one line, not a websocket error
        return follow(client, command.job_id, command.address)
    with talking_to(command.address):
        sys.stdout.write(client.get_job_logs(command.job_id))
    return 0


def run_stop(command: Command) -> int:
    client = connect(command.address)
    with talking_to(command.address):
        client.stop_job(command.job_id)  # False when it had already ended: the status below says so
        status = wait_terminal(client, command.job_id, STOP_TIMEOUT_S)
    if status not in ("STOPPED", "SUCCEEDED", "FAILED"):
        print(f"job {command.job_id}: still {status} {STOP_TIMEOUT_S:.0f} s after the stop request", file=sys.stderr)
        return EXIT_FAILED
    print(f"job {command.job_id}: {status}")
    return 0


def run_list(command: Command) -> int:
    client = connect(command.address)
    with talking_to(command.address):
        jobs = client.list_jobs()
    jobs.sort(key=lambda j: j.start_time or 0)
    print(f"{'job':<32} {'status':<10} {'started':<19} entrypoint")
    for job in jobs:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(job.start_time / 1000)) if job.start_time else "-"
        print(f"{job.submission_id or job.job_id or '-':<32} {job.status.value:<10} {started:<19} {job.entrypoint}")
    return 0


ACTIONS = {"submit": run_submit, "status": run_status, "logs": run_logs, "stop": run_stop, "list": run_list}
