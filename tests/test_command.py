"""The one ``sweep`` command (sweep/cli/): its subcommands, each one's --help, its one-line mistakes, and
``sweep <overrides>`` / ``python -m sweep <overrides>`` as ``sweep run``. Real processes of this checkout's
code (the installed console script may be another checkout's, so ``sweep`` is its main() under that name)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sweep.cli.main import COMMANDS, main
from sweep.cli.serve import OPTIONS
from sweep.cli.ui import OPTIONS as UI_OPTIONS

# What each subcommand's --help must name (its options and arguments).
NAMES = {
    "submit": ["--address", "--working-dir", "--no-wait", "--job-id", "status", "logs", "stop", "list"],
    "serve": [f"{key}=" for key in OPTIONS],
    "infer": ["--url", "--grpc", "--model", "--pair", "--max-new-tokens", "--temperature", "--top-p", "--seed",
              "--stop", "--timeout", "--json", "--stream", "texts"],
    "upload": ["--bucket", "--key", "--plain", "--endpoint", "--region", "folders"],
    "upload-mlflow": ["tracking_uri", "dest", "--endpoint", "--region"],
    "replay": ["file", "--uri"],
    "ui": [f"{key}=" for key in UI_OPTIONS],
}
HEAVY = ("torch", "transformers", "ray", "mlflow", "kserve", "boto3")


def sweep(*args: str, cwd: Path, module: bool = False, timeout: float = 120) -> subprocess.CompletedProcess:
    """``sweep ARGS`` (the console script's main, named sweep), or ``python -m sweep ARGS`` with module=True.
    stderr ends with the heavy modules the process had loaded (``HEAVY [...]``)."""
    probe = ("import atexit, sys\n"
             f"atexit.register(lambda: print('HEAVY', sorted(m for m in {HEAVY!r} if m in sys.modules), "
             "file=sys.stderr))\n")
    if module:
        probe += "import runpy\nsys.argv[0] = 'sweep/__main__.py'\nrunpy.run_module('sweep', run_name='__main__')\n"
    else:
        probe += "sys.argv[0] = 'sweep'\nfrom sweep.cli.main import main\nmain()\n"
    env = {**os.environ, "SWEEP_CACHE_DIR": str(cwd.parent / "cache"), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-c", probe, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """An empty working directory (the cache beside it): what a command writes there shows."""
    (tmp_path / "work").mkdir()
    return tmp_path / "work"


def commands_listed(help_text: str) -> list[str]:
    """The names under ``commands:`` in the top-level help."""
    section = help_text.split("\ncommands:\n", 1)[1].split("\n\n", 1)[0]
    return [line.split()[0] for line in section.splitlines()]


def lines_of(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith("HEAVY ")]


def test_every_subcommand_has_a_name_to_check():
    assert sorted(COMMANDS) == sorted(["run", *NAMES])


def test_help_lists_every_subcommand_then_the_sweeps_own_help(work):
    r = sweep("--help", cwd=work)
    assert r.returncode == 0, r.stderr
    head, _, hydra_help = r.stdout.partition("sweep run: fine-tune a model")
    assert head.startswith("usage: sweep [run] [OVERRIDE ...]")
    assert commands_listed(head) == list(COMMANDS)
    assert "`sweep <overrides>` is `sweep run <overrides>`" in head
    for name in ("RTE", "WNLI", "glue", "roberta-base", "tiny-gpt2"):  # the sweep's groups follow
        assert name in hydra_help
    assert "HEAVY []" in r.stderr
    # sweep run --help is Hydra's help, headed by the tool's name (not its job's, __main__), and the tail above
    run = sweep("run", "--help", cwd=work)
    assert run.returncode == 0 and run.stdout.startswith("sweep run: fine-tune a model"), run.stderr
    assert run.stdout == "sweep run: fine-tune a model" + hydra_help
    assert list(work.iterdir()) == []  # no outputs/


def test_python_m_sweep_is_the_same_command(work):
    r = sweep("--help", cwd=work, module=True)
    assert r.returncode == 0 and r.stdout.startswith("usage: python -m sweep [run]"), r.stderr
    assert commands_listed(r.stdout) == list(COMMANDS)
    r = sweep("submit", "--help", cwd=work, module=True)
    assert r.returncode == 0 and r.stdout.startswith("usage: python -m sweep submit "), r.stderr


@pytest.mark.parametrize("command", list(NAMES))
def test_each_subcommand_help_names_its_options_and_loads_nothing_heavy(work, command):
    r = sweep(command, "--help", cwd=work)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: sweep {command} "), r.stdout
    assert [name for name in NAMES[command] if name not in r.stdout] == []
    assert "HEAVY []" in r.stderr


@pytest.mark.parametrize("command", ["submit", "serve", "infer", "upload"])
def test_python_m_sweep_runs_each_subcommand(command):
    """The spelling the image and the manifests run: ``python -m sweep serve ...``."""
    r = subprocess.run([sys.executable, "-m", "sweep", command, "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith(f"usage: python -m sweep {command} "), r.stderr
    assert [name for name in NAMES[command] if name not in r.stdout] == []


@pytest.mark.parametrize("word", ["bogus-sub", "sumbit", "help"])
def test_an_unknown_command_is_one_line_exit_2(work, word):
    r = sweep(word, "--address", "x", cwd=work)
    assert r.returncode == 2
    assert lines_of(r.stderr) == [f"error: {word}: no such command ({', '.join(COMMANDS)}) nor an override "
                                  "(key=value); `sweep --help` lists both"]
    assert r.stdout == "" and list(work.iterdir()) == []


def test_a_bad_override_is_the_same_line_with_or_without_run(work):
    line = "error: model: Could not find 'model/nope'; available options in 'model': "
    answers = [sweep(*args, "task=WNLI", "model=nope", cwd=work, module=module)
               for args, module in [((), False), (("run",), False), ((), True)]]
    for r in answers:
        assert r.returncode == 2
        [got] = lines_of(r.stderr)
        assert got.startswith(line) and "tiny-roberta" in got, r.stderr
        assert "HEAVY []" in r.stderr
    assert len({r.stderr for r in answers}) == 1
    assert list(work.iterdir()) == []  # nothing written: no outputs/, no mlflow.db


def test_a_subcommand_names_itself_in_its_errors(work):
    r = sweep("submit", "--address", "http://h:1", "task=RTE", cwd=work)
    assert r.returncode == 2
    assert lines_of(r.stderr) == ["error: put the sweep's overrides after `--`: sweep submit --address URL -- task=RTE"]
    r = sweep("serve", "model=/m", "prot=1", cwd=work)
    assert r.returncode == 2 and lines_of(r.stderr)[0].startswith("error: prot: unknown option (known: model, "), \
        r.stderr


def test_replay_of_something_that_holds_no_kept_calls(work):
    r = sweep("replay", str(work / "nothing.jsonl"), cwd=work)
    assert r.returncode == 2
    assert lines_of(r.stderr) == [f"error: replay: {work / 'nothing.jsonl'} is not a file or folder "
                                  "of kept MLflow calls"]


def bad_model_folder(tmp_path: Path) -> str:
    (tmp_path / "not-a-model").mkdir(exist_ok=True)
    return str(tmp_path / "not-a-model")


@pytest.mark.parametrize("args, line", [
    (["storage.data_dir=/tmp/sweep-no-such-dir"], "error: storage.data_dir: /tmp/sweep-no-such-dir is not a folder"),
    (["model.path={bad_model}"], "error: model 'tiny-roberta': model.path {bad_model} has no config.json"),
    (["task=STS-B", "storage.data_dir={data}"], "error: no data for task STS-B: looked in {data}/glue_data/STS-B"),
    (["task=RTE", "storage.data_dir=data"], "error: no data for task RTE: looked in {data}/glue_data/RTE"),
    (["train.method=qlora"], "error: train.method=qlora: a 4-bit base (bitsandbytes) needs a CUDA GPU"),
    (["sweep.seeds=38"], "error: sweep.seeds: a list is expected, not 38; write sweep.seeds=[38]"),
    (["out_dir=/proc/sweep-nope"], "error: out_dir=/proc/sweep-nope: cannot be made (No such file or directory)"),
])
def test_what_reads_files_is_refused_in_one_line_before_any_folder_or_torch(work, args, line):
    """The data folder, the model folder, a task's splits, QLoRA without a GPU, a scalar for a list, an
    out_dir that cannot be made: one line, exit 2, before Hydra's run folder (no outputs/, no out_dir, no
    mlflow.db, no mlartifacts/) and, but for QLoRA's GPU check, before torch is imported."""
    (work / "data").mkdir()  # a relative data_dir: resolved against the working directory
    values = {"bad_model": bad_model_folder(work.parent), "data": str(work / "data")}
    argv = [a.format(**values) for a in args]
    out = [] if any(a.startswith("out_dir=") for a in argv) else [f"out_dir={work.parent / 'out'}"]
    r = sweep("experiment=demo", *argv, *out, cwd=work)
    assert r.returncode == 2, r.stderr
    (only,) = lines_of(r.stderr)
    assert only.startswith(line.format(**values)), only
    assert sorted(p.name for p in work.iterdir()) == ["data"] and not (work.parent / "out").exists()
    if "qlora" not in line:
        assert "HEAVY []" in r.stderr



def test_help_names_the_tool_and_a_closed_pipe_is_silent(work):
    """`sweep --help | head -3`: the reader leaves early; no BrokenPipe traceback. Hydra's part of the help
    names the tool, not its job (``__main__``)."""
    r = subprocess.run(f"{sys.executable} -m sweep --help | head -3", shell=True, cwd=work, capture_output=True,
                       text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert len(r.stdout.splitlines()) == 3 and r.stderr == "", r.stderr
    full = sweep("--help", cwd=work)
    assert "sweep run: fine-tune a model" in full.stdout and "__main__ is powered by Hydra" not in full.stdout


@pytest.mark.parametrize("args, line", [
    (["serve", "port=abc"], "error: port: expected a whole number, got 'abc'"),
    (["infer", "--grpc", "127.0.0.1:1", "hello"], "python -m sweep infer: error: --grpc needs --model NAME"),
])
def test_a_subcommands_bad_value_is_one_line_exit_2(work, args, line):
    r = sweep(*args, cwd=work, module=True)
    assert r.returncode == 2, r.stderr
    assert lines_of(r.stderr)[-1].startswith(line), r.stderr


def test_a_command_leaves_its_objects_frozen_for_the_interpreters_exit(capsys):
    """Whatever the command did, its objects are out of the collector when it returns: the exit's own
    collections would otherwise walk all of torch, Ray and MLflow (seconds after a sweep's last line)."""
    gc.unfreeze()
    try:
        with pytest.raises(SystemExit):
            main(["ui", "--help"])
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    assert "usage:" in capsys.readouterr().out
