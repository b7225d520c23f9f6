"""Stopping a sweep cleanly, and one sweep per out_dir: real `python -m sweep` processes, real
signals, real files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from sweep.driver.stop import resume_command, stop_signals
from sweep.errors import SweepStopped
from sweep.lock import OWNER_FILE, hold_out_dir
from sweep.results.records import load_records
from tests.helpers.sweeps import sweep_cmd

IN_USE = "is in use by another sweep"


def test_resume_command_keeps_the_overrides_and_names_the_out_dir():
    line = resume_command(["experiment=demo", "sweep.seeds=[1,2]", "out_dir=/old", "resume=false", "+x=a b"],
                          "/runs/o 1")
    assert line == "python -m sweep experiment=demo 'sweep.seeds=[1,2]' '+x=a b' 'out_dir=/runs/o 1' resume=true"


def test_a_signal_outside_tune_stops_at_once_and_inside_goes_to_tunes_stop_handler():
    """Real signals to this process. Outside fit: SweepStopped at once. Inside: the handler that
    tune.run installs on SIGUSR1 (here a plain function in its place) gets the first signal and the
    sweep ends after fit returns; a second signal stops at once."""
    before = signal.getsignal(signal.SIGINT)
    with stop_signals() as stop:
        with pytest.raises(SweepStopped) as stopped:
            os.kill(os.getpid(), signal.SIGINT)
        assert (stopped.value.signal_name, stopped.value.exit_code) == ("SIGINT", 130)

    tune_asked = []
    previous_usr1 = signal.getsignal(signal.SIGUSR1)
    try:
        with stop_signals() as stop:
            with stop.tune_running():
                signal.signal(signal.SIGUSR1, lambda signum, frame: tune_asked.append(signum))  # as tune.run does
                os.kill(os.getpid(), signal.SIGTERM)
                assert tune_asked == [signal.SIGTERM]
                with pytest.raises(SweepStopped):
                    os.kill(os.getpid(), signal.SIGTERM)  # again: at once
            with pytest.raises(SweepStopped) as stopped:
                stop.check()
            assert (stopped.value.signal_name, stopped.value.exit_code) == ("SIGTERM", 143)
    finally:
        signal.signal(signal.SIGUSR1, previous_usr1)
    assert signal.getsignal(signal.SIGINT) is before  # restored


def hold_lock_in(out_dir: Path) -> subprocess.Popen:
    """Another process holding out_dir's lock the way a running sweep does (the same helper)."""
    code = ("import sys, time\nfrom pathlib import Path\nfrom sweep.lock import hold_out_dir\n"
            f"with hold_out_dir(Path({str(out_dir)!r})):\n    print('held', flush=True)\n    time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_sweep_on_a_held_out_dir_is_refused_with_one_line(tmp_path):
    out = tmp_path / "out"
    holder = hold_lock_in(out)
    try:
        r = sweep_cmd("experiment=demo", f"out_dir={out}", cwd=tmp_path, cache=tmp_path / "cache", timeout=120)
        assert r.returncode == 2, r.stderr
        (line,) = r.stderr.strip().splitlines()
        assert line.startswith(f"error: out_dir {out} {IN_USE} (pid {holder.pid}, started at ")
        assert line.endswith("); wait for it or choose another out_dir")
        assert sorted(p.name for p in out.iterdir()) == [".sweep.lock", ".sweep.lock.owner"]  # nothing written
    finally:
        holder.kill()  # SIGKILL: the OS releases the lock with the process
        holder.wait()
    with hold_out_dir(out):  # free again
        pass


def session_processes(sid: int) -> list[psutil.Process]:
    """Every live process of a session (the driver's: the local Ray it started runs in it)."""
    alive = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
            pass
    return alive


def epochs_reported(out: Path) -> int:
    rows = 0
    for path in (out / "ray" / "history").glob("*.json"):
        try:
            rows += len(json.loads(path.read_text()))
        except ValueError:  # being written
            pass
    return rows


@pytest.mark.ray
@pytest.mark.slow
def test_sigterm_stops_the_sweep_and_resume_finishes_it(tmp_path):
    """A running sweep: a second sweep on its out_dir is refused; SIGTERM after the first epoch
    stops it with the resume line, exit 143, and nothing of its local Ray left; `resume=true`
    then finishes every trial."""
    from sweep.data.synthetic import write_synthetic_glue

    out, cache = tmp_path / "out", tmp_path / "cache"
    data = write_synthetic_glue(tmp_path / "data", ["WNLI"], n_train=600, n_dev=32)
    args = ["experiment=demo", "sweep.seeds=[1,2,3]", "train.epochs=3", "train.max_train_samples=null",
            f"storage.data_dir={data}"]
    env = {**os.environ, "SWEEP_CACHE_DIR": str(cache), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "sweep", *args, f"out_dir={out}"], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    sid = os.getsid(proc.pid)
    try:
        deadline = time.time() + 300
        while not (out / OWNER_FILE).exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        second = sweep_cmd(*args, f"out_dir={out}", cwd=tmp_path, cache=cache, timeout=120)
        assert second.returncode == 2 and f"{IN_USE} (pid {proc.pid}, " in second.stderr, second.stderr
        assert proc.poll() is None, "the first sweep ended before the second was refused"

        while epochs_reported(out) == 0 and proc.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, "the sweep ended before the first epoch: " + proc.stderr.read()[-2000:]
        assert epochs_reported(out) >= 1, "no epoch within 300 s"
        proc.send_signal(signal.SIGTERM)
        t_term = time.time()
        _, stderr = proc.communicate(timeout=180)
        print(f"\nstopped {time.time() - t_term:.1f} s after SIGTERM; epochs on record {epochs_reported(out)}")
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "sweep: SIGTERM: stopping the trials and saving the sweep's state" in stderr  # Tune's own stop
    stop_line = stderr.strip().splitlines()[-1]
    assert stop_line == ("sweep: stopped by SIGTERM; resume with: "
                         + resume_command([*args, f"out_dir={out}"], str(out))), stderr[-3000:]
    assert not (out / "results.json").exists()
    deadline = time.time() + 30  # the driver shut its local Ray down: no raylet, GCS or worker left
    while session_processes(sid) and time.time() < deadline:
        time.sleep(0.5)
    assert not session_processes(sid), [p.cmdline() for p in session_processes(sid)]

    r = sweep_cmd(*args, f"out_dir={out}", "resume=true", cwd=tmp_path, cache=cache, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "resume: continuing the sweep" in r.stdout
    records = load_records(out / "results.json")
    assert sorted(rec.seed for rec in records) == [1, 2, 3]
    assert all(rec.status == "TERMINATED" and rec.epochs_done == 3 and rec.score is not None for rec in records)
    assert not (out / OWNER_FILE).exists()  # released
