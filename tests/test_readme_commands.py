"""The README's commands, run as written: every fenced ``bash`` block of README.md, in order, from the
root of a copy of the repository laid out as a fresh clone (``../shared/data`` beside it, the test's
virtualenv as ``.venv``), each block in its own ``bash -euo pipefail`` that starts where the previous
one left off (its environment and working folder: `. .venv/bin/activate` carries on, as in one
terminal). Sweeps get small settings appended (``SMALL``); a ``background`` block (a server) is started
and must answer its URL; a ``not run`` block is skipped for its stated reason (tests/test_readme_blocks.py
checks the reasons are there). A command that stops working fails here. The Hugging Face Hub the tour
reads GLUE from is a stand-in on localhost (sweep/testing/stand_in_hub.py) holding nyu-mll/glue's SST-2 and
MRPC made from the real rows of ``../shared/data``; ``make demo`` reads nothing from it."""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sweep.config.tasks import load_task
from sweep.results.export_layout import MADE_BY
from sweep.results.records import rank_key
from sweep.results.trial_reports import TRAINING_STATE
from sweep.testing.hub_repos import fetched, glue_files
from sweep.testing.stand_in_hub import StandInHub
from tests.helpers.doc_blocks import Block, bash_blocks, commands, with_overrides

pytestmark = [pytest.mark.slow, pytest.mark.ray]

ROOT = Path(__file__).resolve().parents[1]
# The README's sweeps at a size that proves the command works (real rows, every step of the sweep), in
# a minute or two on 2 CPUs: the README states what its full size measures.
SMALL = ["train.max_train_samples=64", "train.max_eval_samples=64", "train.epochs=1"]
BLOCK_TIMEOUT_S = 600
READY_TIMEOUT_S = 180


def fresh_clone(to: Path) -> Path:
    """The repository's files as a clone has them (tracked, and new files git does not ignore), under
    ``to/<name>``, with ``../shared`` and ``.venv`` linked to this checkout's."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    clone = to / ROOT.name
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, clone / name)
    (clone / ".venv").symlink_to(Path(sys.prefix))
    (to / "shared").symlink_to(ROOT.parent / "shared")
    # `make` reinstalls when pyproject.toml is newer than the venv's stamp: the copy is the same file.
    stamp = clone / ".venv" / ".installed"
    if stamp.exists():
        before = stamp.stat().st_mtime - 1
        os.utime(clone / "pyproject.toml", (before, before))
    return clone


def run_foreground(block: Block, state: Path, env: dict[str, str]) -> tuple[dict[str, str], str]:
    """Runs ``block`` (its sweeps made small) where the last block left off; the environment and folder
    it leaves, and what it printed. Fails the test, with the output, when a command fails."""
    script = "\n".join(with_overrides(command, SMALL) for command in commands(block.text))
    saved = f'\nenv -0 > "{state}/env"; pwd > "{state}/pwd"\n'
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", f'cd "{env["PWD"]}"\n{script}{saved}'],
                            env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
    if result.returncode != 0:
        pytest.fail(f"{block.where}: exit {result.returncode}\n$ {script}\n{result.stdout[-4000:]}\n"
                    f"{result.stderr[-4000:]}")
    after = dict(item.split("=", 1) for item in (state / "env").read_text().split("\0") if "=" in item)
    after["PWD"] = (state / "pwd").read_text().strip()
    return after, result.stdout


def start_background(block: Block, env: dict[str, str], log: Path) -> subprocess.Popen:
    """Starts ``block``'s one command and waits for its URL; fails with its log if it never answers."""
    (command,) = commands(block.text)
    proc = subprocess.Popen(["bash", "-c", f'cd "{env["PWD"]}" && exec {command}'], env=env, text=True,
                            stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{block.where}: `{command}` exited {proc.returncode} before {block.ready_url} "
                        f"answered\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(block.ready_url, timeout=5) as answer:
                if answer.status == 200:
                    return proc
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(1)
    pytest.fail(f"{block.where}: {block.ready_url} did not answer in {READY_TIMEOUT_S} s\n{log.read_text()[-4000:]}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_every_readme_command_runs_as_written(tmp_path: Path, shared_data_dir: Path, cache_dir: Path) -> None:
    clone = fresh_clone(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    hub = StandInHub()
    glue = hub.add_repo("nyu-mll/glue", glue_files(shared_data_dir, ("SST-2", "MRPC")), repo_type="dataset")
    hub.start()
    env = {**hub.env(tmp_path / "hf-home"), "PWD": str(clone), "SWEEP_CACHE_DIR": str(cache_dir)}
    env.pop("VIRTUAL_ENV", None)  # as a new terminal: the README activates the venv itself
    for name in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "ARGS", "PYTEST_ADDOPTS"):  # `make test ARGS=...`'s
        env.pop(name, None)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if not p.startswith(sys.prefix))
    servers: list[subprocess.Popen] = []
    printed: dict[str, str] = {}  # each block's first command: what it printed
    logs: dict[str, Path] = {}  # a background block's: read once it has stopped
    try:
        for block in bash_blocks(clone / "README.md", clone):
            if block.not_run is not None:
                continue
            first = shlex.join(shlex.split(commands(block.text)[0], comments=True))  # no trailing comment
            if block.ready_url:
                log = tmp_path / f"background-{block.line}.log"
                servers.append(start_background(block, env, log))
                logs[first] = log
            else:
                env, printed[first] = run_foreground(block, state, env)
    finally:
        for proc in servers:
            stop(proc)
        hub.stop()
    printed |= {command: log.read_text() for command, log in logs.items()}

    # What each step is there for, beyond its exit status.
    demo_out = the_demos_out_dir(clone)
    assert_the_demo_kept_exactly_the_best_model(demo_out, printed["make demo"])
    tour = clone / "runs" / "tour"
    assert [row["task"] for row in csv.DictReader((tour / "summary.csv").open())] == ["SST-2", "MRPC"]
    rows = list(csv.DictReader((tour / "results.csv").open()))
    assert {(r["source.data.repo"], r["source.data.sha"]) for r in rows} == {("nyu-mll/glue", glue)}  # the Hub's rows
    assert fetched(hub, "dataset", "nyu-mll/glue") == {f"{c}/{s}-00000-of-00001.parquet": 1  # once, no test split
                                                       for c in ("sst2", "mrpc") for s in ("train", "validation")}
    ui = next(text for command, text in printed.items() if command.startswith("sweep ui"))
    assert re.search(r"^runs: http://127\.0\.0\.1:5000/\S+", ui, re.MULTILINE), ui
    answer = next(text for command, text in printed.items() if command.startswith("sweep infer"))
    assert re.fullmatch(r"\S+\t[0-9.]+\n", answer), answer  # label<TAB>score, as the README says


def the_demos_out_dir(clone: Path) -> Path:
    """`make demo` has no out_dir: Hydra's outputs/<date>/<time>/ in the folder it ran in."""
    (out,) = (clone / "outputs").glob("*/*")
    return out


def assert_the_demo_kept_exactly_the_best_model(out: Path, stdout: str) -> None:
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == 3 and {row["status"] for row in rows} == {"TERMINATED"}, rows  # the demo's 3 seeds
    mode = load_task("WNLI").mode
    best_seed = max(rows, key=lambda row: rank_key(mode, float(row["score"]), int(row["seed"])))["seed"]
    made_by = json.loads((out / "best" / "WNLI" / MADE_BY).read_text())
    assert str(made_by["seed"]) == best_seed
    assert (out / "best" / "WNLI" / "config.json").exists()
    assert not list((out / "best").rglob(TRAINING_STATE)), "the optimizer state was exported"
    assert not list((out / "ray").rglob("checkpoint_*")), "pruned checkpoints left behind"
    assert f"best WNLI: seed {best_seed}" in stdout
    assert "WNLI (unbiased E[max]): best of 1 " in stdout and (out / "expected_max.csv").is_file()  # seeds enough
