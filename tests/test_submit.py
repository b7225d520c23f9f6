"""python -m sweep submit: the plain parts without Ray, then a real head (`ray start --head`, token auth on).

The slow tests start and stop a Ray head with `ray start` / `ray stop --force`, which end every Ray
process on the machine: run them under the machine's lock,
    flock /tmp/ray-machine.lock .venv/bin/python -m pytest tests/test_submit.py
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest

from sweep.cli.submit import parse_args
from sweep.cluster.jobs import (
    WORKING_DIR_EXCLUDES,
    Command,
    SubmitError,
    auth_error_message,
    check_token_env,
    dashboard_url,
    detach_message,
    end_message,
    entrypoint,
    job_error_line,
    output_locations,
    override_value,
    runtime_env,
    server_said,
    short_reason,
)
from sweep.testing.local_cluster import free_port

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the venv's bin/: its python runs the CLI, its ray starts the head
RAY_ENV = ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


# ---------------------------------------------------------------- arguments


def test_overrides_are_everything_after_the_double_dash():
    cmd = parse_args(["--address", "http://head:8265", "--", "+experiment=demo", "sweep.seeds=[38,39]",
                      "--not-an-option"], env={})
    assert cmd == Command(action="submit", address="http://head:8265",
                          overrides=("+experiment=demo", "sweep.seeds=[38,39]", "--not-an-option"))


def test_submit_options(tmp_path: Path):
    cmd = parse_args(["--address", "http://head:8265/", "--working-dir", str(tmp_path), "--no-wait",
                      "--job-id", "rte-1", "--", "task=RTE"], env={})
    assert (cmd.address, cmd.working_dir, cmd.wait, cmd.job_id) == ("http://head:8265", tmp_path, False, "rte-1")


def test_address_defaults_to_ray_address_and_the_flag_wins():
    assert parse_args(["--", "task=RTE"], env={"RAY_ADDRESS": "http://a:8265"}).address == "http://a:8265"
    # Ray's own order: RAY_API_SERVER_ADDRESS before RAY_ADDRESS.
    env = {"RAY_ADDRESS": "http://a:8265", "RAY_API_SERVER_ADDRESS": "http://b:8265"}
    assert parse_args(["status", "j"], env=env).address == "http://b:8265"
    assert parse_args(["--address", "http://c:8265", "--", "task=RTE"], env=env).address == "http://c:8265"


def test_missing_address_is_one_clear_error():
    with pytest.raises(SubmitError, match="--address http://HEAD:8265.*RAY_ADDRESS"):
        parse_args(["--", "task=RTE"], env={})


def test_address_forms():
    assert dashboard_url("127.0.0.1:8265", {}) == "http://127.0.0.1:8265"  # never read as a GCS address
    assert dashboard_url("https://ray.example.com/", {}) == "https://ray.example.com"
    for wrong in ("ray://head:10001", "auto"):
        with pytest.raises(SubmitError, match="dashboard's URL"):
            dashboard_url(None, {"RAY_ADDRESS": wrong})


def test_subcommands_take_the_address_before_or_after():
    env = {"RAY_ADDRESS": "http://env:8265"}
    assert parse_args(["status", "raysubmit_1"], env) == Command("status", "http://env:8265", "raysubmit_1")
    assert parse_args(["--address", "http://h:1", "stop", "j"], env) == Command("stop", "http://h:1", "j")
    assert parse_args(["logs", "j", "--follow", "--address", "http://h:1"], env) == \
        Command("logs", "http://h:1", "j", follow=True)
    assert parse_args(["list"], env).action == "list"


@pytest.mark.parametrize("argv, message", [
    (["--address", "http://h:1", "task=RTE"], "after `--`"),
    (["--address", "http://h:1"], "no sweep overrides"),
    (["--address", "http://h:1", "status", "j", "--", "task=RTE"], "takes no sweep overrides"),
    (["--address", "http://h:1", "--working-dir", "/no/such/dir", "--", "task=RTE"], "not a folder"),
])
def test_bad_command_lines(argv, message):
    with pytest.raises(SubmitError, match=message):
        parse_args(argv, env={})


# ---------------------------------------------------------------- what is submitted


def test_entrypoint_quotes_each_override():
    overrides = ["+experiment=demo", "sweep.seeds=[38,39]", "train.lr=1e-5", "+sweep.grid.lr=[1e-5, 2e-5]",
                 "out_dir=/tmp/a b", "storage.output_prefix=s3://b/$USER"]
    line = entrypoint(overrides)
    assert line.startswith("python -m sweep +experiment=demo 'sweep.seeds=[38,39]' train.lr=1e-5 ")
    assert shlex.split(line)[3:] == overrides  # the shell gives Hydra exactly these


def test_working_dir_upload_leaves_out_environments_outputs_and_caches(tmp_path: Path):
    assert runtime_env(None) is None
    env = runtime_env(tmp_path)
    assert env["working_dir"] == str(tmp_path)
    for name in (".venv", "outputs", "multirun", "mlflow.db", "mlruns", "mlartifacts", ".git", "__pycache__",
                 ".pytest_cache", ".cache", "*.egg-info", "bench_results"):
        assert name in env["excludes"]
    assert env["excludes"] == list(WORKING_DIR_EXCLUDES)


# ---------------------------------------------------------------- messages


def test_override_value_last_wins_and_null_or_deleted_is_unset():
    both = ["cluster.storage_path=/a", "cluster.storage_path=s3://b/c"]
    assert override_value(both, "cluster.storage_path") == "s3://b/c"
    assert override_value(["+storage.output_prefix='s3://x/y'"], "storage.output_prefix") == "s3://x/y"
    assert override_value(["cluster.storage_path=null"], "cluster.storage_path") is None
    assert override_value(["cluster.storage_path=s3://a", "~cluster.storage_path"], "cluster.storage_path") is None
    assert override_value(["cluster.storage_path_x=1"], "cluster.storage_path") is None


def test_outputs_unset_warns_they_stay_on_the_head():
    line, mlflow = output_locations(["+experiment=demo"])
    assert line.startswith("warning: results stay on the head node's disk")
    assert "outputs/" in line
    assert "storage.output_prefix=s3://" in line and "cluster.storage_path=s3://" in line
    assert mlflow.startswith("warning: the MLflow records stay in sqlite:///runs/mlflow.db on the head node's disk, "
                             "relative to the job's working directory; to keep them, set storage.output_prefix=s3://")
    assert "tracking.uri=http://" in mlflow


def test_outputs_set_say_where_they_go():
    lines = output_locations(["cluster.storage_path=s3://bkt/ckpt", "storage.output_prefix=s3://bkt/out/"])
    assert len(lines) == 3 and not any(line.startswith("warning") for line in lines)
    assert "s3://bkt/ckpt" in lines[0] and "s3://bkt/out" in lines[1]
    assert lines[2] == ("outputs: the MLflow records go to sqlite:///runs/mlflow.db on the head node's disk, "
                        "relative to the job's working directory, and with their artifacts to s3://bkt/out/mlflow/ "
                        "when the sweep ends (storage.output_prefix)")


def test_mlflow_records_on_a_server_are_said_without_its_password():
    both = ["cluster.storage_path=s3://bkt/ckpt", "storage.output_prefix=s3://bkt/out"]
    line = output_locations([*both, "tracking.uri=http://sweep:s3cr3t-pass@mlflow.sweep.svc:5000"])[-1]
    assert line == "outputs: the MLflow records go to http://sweep:***@mlflow.sweep.svc:5000 (tracking.uri)"
    assert "s3cr3t" not in " ".join(output_locations(["tracking.uri=postgresql://u:s3cr3t@db/mlflow"]))
    # No sqlite store, so no warning about the head, even without storage.output_prefix.
    assert not output_locations(["cluster.storage_path=s3://b/c", "tracking.uri=http://mlflow:5000"])[-1].startswith("warning")
    # An unreachable server with tracking.required=false falls back to the head's sqlite file: said too.
    fallback = output_locations(["tracking.uri=http://mlflow:5000", "tracking.required=false"])[-1]
    assert fallback.endswith("if it does not answer, sqlite:///runs/mlflow.db on the head (lost with the head)")
    fallback = output_locations([*both, "tracking.uri=http://mlflow:5000", "tracking.required=false"])[-1]
    assert fallback.endswith("if it does not answer, sqlite:///runs/mlflow.db on the head, uploaded to s3://bkt/out/mlflow/")


@pytest.mark.parametrize("overrides", [["tracking=none"], ["tracking.kind=none"],
                                       ["tracking=mlflow", "tracking.kind=none"],
                                       ["tracking=none", "tracking.uri=http://mlflow:5000"]])
def test_no_mlflow_records_with_tracking_none(overrides):
    line = output_locations(overrides)[-1]
    assert line == "outputs: no MLflow records (tracking=none)"


def test_a_sqlite_store_elsewhere_on_the_head_still_warns():
    line = output_locations(["tracking=none", "tracking.kind=mlflow", "tracking.uri=sqlite:////data/mlflow.db"])[-1]
    assert line.startswith("warning: the MLflow records stay in sqlite:////data/mlflow.db on the head node's disk;")


def test_outputs_half_set_note_the_other_half():
    only_storage = output_locations(["cluster.storage_path=s3://bkt/ckpt", "out_dir=/data/run1"])
    assert "s3://bkt/ckpt" in only_storage[0]
    assert "/data/run1" in only_storage[1] and "storage.output_prefix=" in only_storage[1]
    only_prefix = output_locations(["storage.output_prefix=s3://bkt/out"])
    assert "cluster.storage_path=" in only_prefix[1]


def test_job_error_line_prefers_the_sweeps_error_line():
    log = ("sweep: 2 trials\nerror: train.lr: must be > 0, got -1.0\n"
           "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.\n")
    assert job_error_line(log) == "error: train.lr: must be > 0, got -1.0"


def test_job_error_line_falls_back_to_the_exception_then_the_last_line():
    traceback = ("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                 "ray.exceptions.RayTaskError: boom\nSet the environment variable HYDRA_FULL_ERROR=1 ...\n\n")
    assert job_error_line(traceback) == "ray.exceptions.RayTaskError: boom"
    assert job_error_line("starting\nKilled\n\n") == "Killed"
    assert job_error_line("  \n") is None


def test_end_message():
    assert end_message("j", "SUCCEEDED", "error: old", None) == "job j: SUCCEEDED"
    failed = end_message("j", "FAILED", "x\nerror: bad\ny", "Job entrypoint command failed")
    assert failed == "job j: FAILED -- error: bad"
    assert end_message("j", "STOPPED", "[00:10] 0/1 done", "Job was intentionally stopped.") == \
        "job j: STOPPED -- Job was intentionally stopped."


def test_auth_message_names_the_variables_never_the_token():
    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "s3cr3t-token-value"}
    line = auth_error_message("http://h:8265", 403, env)
    assert "refused the request (403" in line and "RAY_AUTH_TOKEN" in line and "\n" not in line
    assert "s3cr3t" not in line
    assert "RAY_AUTH_MODE is not 'token'" in auth_error_message("http://h:8265", 401, {})


def test_server_answers_are_one_line():
    said = server_said("http://h:1", "Request failed with status code 404: Job j does not exist..\nmore")
    assert said == "the Ray cluster at http://h:1 answered 404: Job j does not exist.."
    other = server_said("http://h:1", "Version check returned 404.")
    assert other == "the Ray cluster at http://h:1 answered: Version check returned 404."


def test_short_reason_keeps_the_socket_error():
    error = ConnectionError("HTTPConnectionPool(host='127.0.0.1', port=1): Max retries exceeded with url: /x "
                            "(Caused by NewConnectionError('<obj>: Failed to establish a new connection: "
                            "[Errno 111] Connection refused'))")
    assert short_reason(error) == "Connection refused"


def test_unreadable_token_path_is_said_before_ray_aborts(tmp_path: Path):
    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(tmp_path / "missing")}
    check_token_env(env | {"RAY_AUTH_TOKEN": "x"})  # RAY_AUTH_TOKEN comes first: the path is not read
    with pytest.raises(SubmitError, match="RAY_AUTH_TOKEN_PATH=.*missing is not a readable file"):
        check_token_env(env)


def test_detach_message_says_how_to_follow_and_stop():
    text = detach_message("raysubmit_1", "http://h:8265")
    assert "python -m sweep submit logs raysubmit_1 --follow --address http://h:8265" in text
    assert "python -m sweep submit stop raysubmit_1 --address http://h:8265" in text


# ---------------------------------------------------------------- the CLI as a process


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without Ray's address/auth variables, the venv's bin/ first on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in RAY_ENV}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env | extra


def cli(*args: str, env: dict[str, str], timeout: float = 120) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run([str(BIN / "python"), "-m", "sweep", "submit", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)
    return done, time.monotonic() - started


def one_line_error(done: subprocess.CompletedProcess) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1, done.stderr
    return errors[0]


def test_unreachable_address_is_one_line_within_10s():
    done, took = cli("list", "--address", f"http://127.0.0.1:{free_port()}", env=clean_env())
    assert done.returncode == 2
    assert one_line_error(done).startswith("error: cannot reach the Ray dashboard at http://127.0.0.1:")
    assert "port-forwarded" in done.stderr
    assert took < 10


# ---------------------------------------------------------------- a real head


@dataclass(frozen=True)
class Head:
    url: str
    token_path: Path
    client_env: dict[str, str]  # how a Ray client is set up for it: RAY_AUTH_MODE=token + the token's file

    def auth_header(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token_path.read_text().strip()}"}


def wait_for_dashboard(url: str, headers: dict[str, str], timeout_s: float = 90) -> None:
    import requests

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{url}/api/jobs/", headers=headers, timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(1)
    raise TimeoutError(f"the Ray dashboard at {url} did not answer within {timeout_s} s")


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory):
    """`ray start --head` from the venv with token auth on, as Ray does by default when a token exists."""
    import requests

    token_path = tmp_path_factory.mktemp("auth") / "auth_token"
    token_path.write_text(uuid.uuid4().hex)
    token_path.chmod(0o600)
    port, dashboard_port = free_port(), free_port()
    # RAY_AUTH_MODE unset: `ray start` turns token auth on because a token is there (RAY_AUTH_TOKEN_PATH,
    # not ~/.ray/auth_token, to leave other people's Ray alone). Jobs inherit this env: PATH's python
    # is the venv's, and the job's driver finds the token to join (cluster.address=auto).
    head_env = clean_env(RAY_AUTH_TOKEN_PATH=str(token_path))
    started = subprocess.run(
        [str(BIN / "ray"), "start", "--head", f"--port={port}", f"--dashboard-port={dashboard_port}",
         "--dashboard-host=127.0.0.1", "--num-cpus=2", "--include-dashboard=true", "--disable-usage-stats"],
        env=head_env, cwd=REPO, capture_output=True, text=True, timeout=120)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        url = f"http://127.0.0.1:{dashboard_port}"
        h = Head(url, token_path, clean_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token_path)))
        wait_for_dashboard(url, h.auth_header())
        assert requests.get(f"{url}/api/authentication_mode", timeout=5).json()["authentication_mode"] == "token"
        assert requests.get(f"{url}/api/jobs/", timeout=5).status_code == 401  # no token, no answer
        yield h
    finally:
        subprocess.run([str(BIN / "ray"), "stop", "--force"], env=head_env, capture_output=True, timeout=120)


# The head has no GPU and no autoscaler: on a joined cluster that is an error unless CPU is asked for.
SWEEP = ["experiment=demo", "tracking=none", "sweep.seeds=[38]", "cluster.address=auto", "resources.gpus_per_trial=0"]


@pytest.mark.ray
@pytest.mark.ray_cluster
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_submit_and_follow_a_tiny_sweep(head: Head, tmp_path: Path):
    out_dir = tmp_path / "out"
    done, took = cli("--address", head.url, "--working-dir", str(REPO), "--",
                     *SWEEP, "train.epochs=1", f"out_dir={out_dir}", env=head.client_env, timeout=360)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "warning: results stay on the head node's disk" in done.stderr
    assert "submitted: job raysubmit_" in done.stdout
    assert "best WNLI: seed 38" in done.stdout  # the sweep's own output, streamed back
    assert "mean ± std" in done.stdout and "\nWNLI " in done.stdout  # its summary table
    assert done.stdout.rstrip().splitlines()[-1].endswith(": SUCCEEDED")
    assert (out_dir / "results.csv").is_file()
    print(f"submit + follow of a 1-trial, 1-epoch sweep: {took:.1f} s")


@pytest.mark.ray
@pytest.mark.ray_cluster
@pytest.mark.slow
@pytest.mark.timeout(200)
def test_no_wait_then_status_logs_and_list(head: Head):
    job_id = f"sweep-bad-lr-{uuid.uuid4().hex[:8]}"
    done, _ = cli("--address", head.url, "--no-wait", "--job-id", job_id, "--", *SWEEP, "train.lr=-1",
                  env=head.client_env)
    assert done.returncode == 0, done.stderr
    assert f"submitted: job {job_id}" in done.stdout
    assert f"logs {job_id} --follow --address {head.url}" in done.stdout

    deadline = time.monotonic() + 120
    while True:
        status, _ = cli("status", job_id, "--address", head.url, env=head.client_env)
        assert status.returncode == 0, status.stderr
        if "FAILED" in status.stdout or time.monotonic() > deadline:
            break
        assert any(s in status.stdout for s in ("PENDING", "RUNNING")), status.stdout
        time.sleep(2)
    assert status.stdout.strip() == f"job {job_id}: FAILED -- error: train.lr: must be > 0, got -1.0"

    logs, _ = cli("logs", job_id, "--address", head.url, env=head.client_env)
    assert logs.returncode == 0 and "error: train.lr: must be > 0" in logs.stdout
    followed, _ = cli("logs", job_id, "--follow", "--address", head.url, env=head.client_env)
    assert followed.returncode == 1  # a followed job that failed fails the command
    assert f"job {job_id}: FAILED -- error: train.lr" in followed.stderr
    listed, _ = cli("list", "--address", head.url, env=head.client_env)
    assert any(line.startswith(job_id) and "FAILED" in line for line in listed.stdout.splitlines())
    for command in (["status", "no-such-job"], ["logs", "no-such-job", "--follow"]):
        missing, _ = cli(*command, "--address", head.url, env=head.client_env)
        assert missing.returncode == 2
        said = one_line_error(missing)
        assert said == f"error: the Ray cluster at {head.url} answered 404: Job no-such-job does not exist."


def train_state(head: Head) -> tuple[list, list]:
    """The head's live placement groups and the processes running trials (Tune's trial actors,
    where a one-worker trial's loop runs, and Train workers), through Ray's state API."""
    from ray.util.state.api import StateApiClient
    from ray.util.state.common import ListApiOptions, StateResource

    with mock.patch.dict(os.environ):
        for k in RAY_ENV:  # they would override the address
            os.environ.pop(k, None)
        headers = {"Content-Type": "application/json", **head.auth_header()}
        client = StateApiClient(address=head.url, headers=headers)
        groups = client.list(StateResource.PLACEMENT_GROUPS, ListApiOptions(limit=1000), raise_on_missing_output=False)
        actors = client.list(StateResource.ACTORS, ListApiOptions(limit=1000), raise_on_missing_output=False)
    live_groups = [g for g in groups if g.state != "REMOVED"]
    workers = [a for a in actors if a.class_name in ("ImplicitFunc", "RayTrainWorker") and a.state != "DEAD"]
    return live_groups, workers


class Lines:
    """A process's output read line by line as it comes (the test checks what arrived, and when)."""

    def __init__(self, stream) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append(line)

    def text(self) -> str:
        return "".join(self.lines)


@pytest.mark.ray
@pytest.mark.ray_cluster
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ctrl_c_detaches_and_stop_ends_the_sweep_and_its_workers(head: Head, tmp_path: Path):
    job_id = f"sweep-long-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(
        [str(BIN / "python"), "-m", "sweep", "submit", "--address", head.url, "--job-id", job_id, "--",
         *SWEEP, "train.epochs=50", f"out_dir={tmp_path / 'out'}"],
        env=head.client_env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    try:
        deadline = time.monotonic() + 180
        workers: list = []
        while time.monotonic() < deadline and not workers and proc.poll() is None:
            time.sleep(2)
            _, workers = train_state(head)
        assert workers, out.text()[-3000:] + err.text()[-3000:]
        # Followed live: the sweep's first line arrives while the job still runs. Ray's log tail
        # polls, so the line may come a few seconds after the workers do (CI saw it lag).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "sweep: 1 trials" not in out.text() and proc.poll() is None:
            time.sleep(1)
        assert f"submitted: job {job_id}" in out.text() and "sweep: 1 trials" in out.text(), out.text()[-3000:]
        assert proc.poll() is None  # still following a running job

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(0.5)
    assert "detached: job" in err.text() and "Traceback" not in err.text()
    assert f"python -m sweep submit logs {job_id} --follow --address {head.url}" in err.text()
    assert f"python -m sweep submit stop {job_id} --address {head.url}" in err.text()
    status, _ = cli("status", job_id, "--address", head.url, env=head.client_env)
    assert status.stdout.strip() == f"job {job_id}: RUNNING"  # Ctrl-C left it running

    stopped, took = cli("stop", job_id, "--address", head.url, env=head.client_env, timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.strip() == f"job {job_id}: STOPPED"
    assert took < 30
    deadline = time.monotonic() + 20  # the GCS removes a dead job's groups and actors within moments
    while time.monotonic() < deadline:
        groups, workers = train_state(head)
        if not groups and not workers:
            break
        time.sleep(1)
    assert (groups, workers) == ([], [])
    print(f"stop -> STOPPED in {took:.1f} s")


@pytest.mark.ray
@pytest.mark.ray_cluster
@pytest.mark.slow
@pytest.mark.parametrize("auth, code", [({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "wrong-token-123"}, 403),
                                        ({}, 401)])
def test_a_wrong_or_missing_token_is_one_line_within_10s(head: Head, auth: dict, code: int):
    done, took = cli("--address", head.url, "--", *SWEEP, env=clean_env(**auth))
    assert done.returncode == 2
    line = one_line_error(done)
    assert line.startswith(f"error: the Ray cluster at {head.url} refused the request ({code}")
    assert "RAY_AUTH_TOKEN" in line
    assert "wrong-token-123" not in done.stdout + done.stderr
    assert head.token_path.read_text().strip() not in done.stdout + done.stderr
    assert took < 10
