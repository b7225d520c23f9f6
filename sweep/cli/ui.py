"""``sweep ui [out_dir=DIR | tracking_uri=URI] [port=5000] [host=127.0.0.1]``: MLflow's own UI on the store a
sweep recorded to, and the URLs of its runs.

``out_dir=`` finds the store in the sweep's ``mlflow-parent.json`` (its store's URI, experiment and parent
run); with neither option it is the sweep's default store, ``runs/mlflow.db`` in this folder. For a store the
sweep wrote itself (sqlite, or another database) it starts ``mlflow server`` on it (artifacts where the
sweep put them, and sweep's page for its runs: sweep/tracking/ui_urls.py, ui_app.py), waits until ``/health``
answers and prints one line per URL; it runs until Ctrl-C or SIGTERM, which stop the server with it (exit
0). An http(s) tracking server has a UI already: its URLs are printed and nothing is started. A mistake (no
such folder, no store, a port in use) is one line, exit 2, before anything starts.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from sweep.cli.key_values import Option, UsageError, non_empty, parse_key_values, port_number, usage
from sweep.config.defaults import STORE_FILE, TRACKING_URI, mlflow_server_env

PROG = "sweep ui"
PARENT_FILE = "mlflow-parent.json"  # sweep.tracking.PARENT_FILE (a test checks they agree): no MLflow import here
# mlflow server's first start is slow on a busy machine (docs/benchmarks.md: Behind the code's choices)
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 15.0
OPTIONS: dict[str, Option] = {
    "out_dir": Option(non_empty, None,
                      "a sweep's out_dir (relative to this folder): the MLflow store its mlflow-parent.json names"),
    "tracking_uri": Option(non_empty, None,
                           "a store instead: sqlite:///FILE (relative to this folder) or another database URI; or "
                           "an http(s) MLflow server, whose URLs are printed (nothing is started). With neither "
                           f"option: the sweep's default store, {TRACKING_URI} in this folder (./mlflow.db where an "
                           "earlier sweep left one)"),
    "port": Option(port_number, 5000, "the UI's port"),
    "host": Option(non_empty, "127.0.0.1", "the address the UI listens on; 0.0.0.0 for every interface"),
}
HELP = """
It prints the URL of each sweep experiment's runs table, the sweep's parent run (out_dir=) and the
model registry. For a store it serves, any URL of that server opens on the runs in any browser (the
root, the experiment list, a bookmark: sweep's app plugin on MLflow's server sets MLflow's "Model
training" view where the browser has none, each sweep's parent expanded and each task's metric
column shown, once: what a person changes there stays), and the runs URL is a page of sweep's
(/sweep/open) that sets them and shows the runs table. On an http(s) tracking server the URL is the
runs table in the Model training view: click the parent's + to show the trials, "Columns" for their
metric."""


class _Stop(BaseException):
    """SIGINT/SIGTERM/SIGHUP while the UI runs: stop the server, exit 0."""


@dataclass(frozen=True)
class Store:
    uri: str
    named_by: str  # what the uri came from, for the error lines
    experiment_id: str | None = None  # out_dir's sweep: its experiment and parent run
    experiment: str | None = None
    parent_run_id: str | None = None


def _fail(message: object) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def _say(line: str) -> None:
    print(line, flush=True)  # flushed: `sweep ui ... > ui.log &` has each line as it happens


# --- which store ---------------------------------------------------------------------------------


def _contents(folder: Path, most: int = 6) -> str:
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir())
    if not names:
        return "nothing (it is empty)"
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def store_of_out_dir(text: str) -> Store:
    """The store a sweep's out_dir names in its mlflow-parent.json (raises UsageError)."""
    folder = Path(os.path.expanduser(text))
    shown = text if folder.is_absolute() else f"{text} (in {Path.cwd()})"
    if not folder.is_dir():
        raise UsageError(f"out_dir: {shown}: {'not a folder' if folder.exists() else 'no such folder'}")
    record = folder / PARENT_FILE
    if not record.is_file():
        raise UsageError(
            f"out_dir: {shown} holds no record of a sweep's MLflow run ({PARENT_FILE}); it holds {_contents(folder)}. "
            f"The sweep ran with tracking=none, or stopped before its run was made, or this is not a sweep's "
            f"out_dir; for a store of your own pass tracking_uri=... (a sweep's default store is {STORE_FILE} in the "
            f"folder it ran in)")
    try:
        saved = json.loads(record.read_text())
        uri = saved["uri"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"out_dir: {record} is not a sweep's record of its MLflow run ({e})") from None
    return Store(uri, f"{record}", str(saved.get("experiment_id") or "") or None, saved.get("experiment"),
                 saved.get("run_id"))


def choose_store(out_dir: str | None, tracking_uri: str | None) -> Store:
    from sweep.config.paths import absolute_store

    if out_dir and tracking_uri:
        raise UsageError("out_dir= or tracking_uri=: give one (out_dir= names its sweep's store)")
    if out_dir:
        store = store_of_out_dir(out_dir)
        return Store(absolute_store(store.uri), store.named_by, store.experiment_id, store.experiment,
                     store.parent_run_id)
    if tracking_uri:
        return Store(absolute_store(tracking_uri), "tracking_uri")
    from sweep.config.settings import TrackingConfig

    return Store(absolute_store(TrackingConfig().uri), "default")


def check_store_file(store: Store, db: Path | None) -> None:
    """A sqlite store must exist: ``mlflow server`` would make an empty one and show nothing."""
    if db is None or db.is_file():
        return
    if store.named_by == "default":
        raise UsageError(f"no MLflow store here: {db} does not exist (a sweep's default store, {TRACKING_URI} "
                         f"in the folder it ran in); pass out_dir=<a sweep's out_dir> or tracking_uri=...")
    if store.named_by == "tracking_uri":
        raise UsageError(f"tracking_uri: no MLflow store at {db}: no such file")
    raise UsageError(f"out_dir: its sweep recorded to {store.uri} ({store.named_by}), and {db} is gone (moved or "
                     f"deleted?)")


# --- the port ------------------------------------------------------------------------------------


def _listener(port: int) -> str | None:
    """Which process listens on ``port`` ("pid N: command"), when this user may see it."""
    try:
        import psutil

        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
                argv = psutil.Process(conn.pid).cmdline()
                shown = " ".join([os.path.basename(argv[0]), *argv[1:]]) if argv else "?"
                return f"pid {conn.pid}: {shown if len(shown) <= 60 else shown[:59] + '…'}"
    except Exception:  # no permission, or it went away: the line says less
        return None
    return None


def check_port(host: str, port: int) -> None:
    """Raise UsageError when ``host:port`` cannot be listened on (in use, or no such address)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise UsageError(f"host={host}: no such address ({e.strerror})") from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server does: TIME_WAIT is no use
        try:
            probe.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                owner = _listener(port)
                raise UsageError(f"port {port} is in use{f' (by {owner})' if owner else ''}; pass port=N") from None
            raise UsageError(f"host={host} port={port}: cannot listen there ({e.strerror})") from None


def browser_host(host: str) -> str:
    """The host part of the URL a browser on this machine opens (a wildcard address is not one)."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


# --- the lines -----------------------------------------------------------------------------------


def url_lines(server: str, store: Store, landing: bool = False) -> list[str]:
    """The runs table of each sweep experiment (out_dir=: its sweep's), its parent run, the registry.
    ``landing``: the server is ``sweep ui``'s own (``--app-name sweep-ui``), whose page opens the runs table
    with the sweep's parent expanded and "Model training" kept for the browser; else the runs table's URL."""
    from sweep.tracking.ui_urls import experiments_url, landing_url, models_url, run_url, runs_url, sweep_experiments

    if store.experiment_id:
        experiments = [(store.experiment_id, store.experiment or store.experiment_id)]
    else:
        experiments = sweep_experiments(server)
    parents = [store.parent_run_id] if store.parent_run_id else []
    lines = [f"runs: {landing_url(server, eid, parents) if landing else runs_url(server, eid)} (experiment {name})"
             for eid, name in experiments]
    if not experiments:
        lines.append(f"runs: no sweep has recorded to this store yet; every experiment: {experiments_url(server)}")
    if store.experiment_id and store.parent_run_id:
        lines.append(f"sweep: {run_url(server, store.experiment_id, store.parent_run_id)} (its parent run: "
                     f"summary metrics, config, results)")
    lines.append(f"models: {models_url(server)} (the registry: each model's versions, @ champion)")
    return lines


# --- the server ----------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when ``sweep ui`` dies, even by SIGKILL (Linux; elsewhere nothing)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (mlflow's CLI and its uvicorn), SIGKILL if it lingers."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            continue
    try:  # what is left of its group (uvicorn outliving the CLI)
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def serve(store: Store, host: str, port: int) -> int:
    from sweep.secrets import scrub
    from sweep.tracking.ui_urls import app_installed, server_command, sqlite_file

    db = sqlite_file(store.uri)
    check_store_file(store, db)
    check_port(host, port)
    server = f"http://{browser_host(host)}:{port}"
    landing = app_installed()  # sweep's page on the server (an installed sweep has it: pyproject.toml)
    command = server_command(store.uri, host, port, app=landing)
    if "MLFLOW_UVICORN_OPTS" not in os.environ:
        command.append("--uvicorn-opts=--no-access-log")  # a line per request of the UI would bury ours

    def stop_on(signum, frame):
        raise _Stop(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop_on)
    proc = None
    try:
        _say(f"sweep ui: starting MLflow's UI on {scrub(store.uri)} at {server}")
        # its own session: Ctrl-C reaches sweep ui, which stops the whole server; its log goes to our stderr
        proc = subprocess.Popen(command, cwd=db.parent if db is not None else None, env=mlflow_server_env(),
                                stdin=subprocess.DEVNULL, stdout=sys.stderr.fileno(), start_new_session=True,
                                preexec_fn=_die_with_parent)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _healthy(server):
            if proc.poll() is not None:
                print(f"error: mlflow server exited with status {proc.returncode} before it answered (its output "
                      f"is above): {' '.join(command)}", file=sys.stderr)
                return 1
            if time.monotonic() > deadline:
                print(f"error: mlflow server did not answer {server}/health within {START_TIMEOUT_S:.0f} s",
                      file=sys.stderr)
                return 1
            time.sleep(0.5)
        for line in url_lines(server, store, landing):
            _say(line)
        _say("sweep ui: running until Ctrl-C or SIGTERM")
        proc.wait()
        print(f"error: mlflow server exited with status {proc.returncode}", file=sys.stderr)
        return 1
    except _Stop:
        return 0
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # the server is being stopped: a second Ctrl-C waits for it
        if proc is not None:
            _stop(proc)


def show_server(store: Store) -> int:
    """An http(s) tracking server: its UI is there already; print its URLs."""
    from sweep.tracking.ui_urls import server_address, server_problem

    server = server_address(store.uri)
    problem = server_problem(store.uri)
    if problem is not None:
        source = "tracking_uri" if store.named_by == "tracking_uri" else f"the store {store.named_by} names"
        _fail(f"{source}: no MLflow server answers at {server} ({problem})")
    _say(f"sweep ui: {server} is a tracking server with its own UI; nothing started here")
    for line in url_lines(server, store):
        _say(line)
    return 0


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help", "help") for a in args):
        print(usage(prog, OPTIONS) + "\n" + HELP)
        return 0
    try:
        options = parse_key_values(args, OPTIONS)
        store = choose_store(options["out_dir"], options["tracking_uri"])
        from sweep.tracking.ui_urls import is_server

        if is_server(store.uri):
            return show_server(store)
        return serve(store, options["host"], options["port"])
    except UsageError as e:
        _fail(e)
