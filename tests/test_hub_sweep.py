"""The Hugging Face Hub as a source, end to end against a stand-in Hub on localhost (sweep/testing/stand_in_hub.py):
`sweep task=RTE model=roberta-base` with nothing else reads the model and GLUE's rows from the Hub, each file
fetched once; the same command offline runs from the cache; an empty cache offline, a gated or private repo,
a revision or repo that does not exist are one line each, exit 2, before anything is written; the token is in
no file the sweep wrote. The two-node case (a fetch per node, a node without the Hub served by the driver) is
tests/test_own_disks.py's."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sweep.testing.hub_repos import GATED, NOT_FETCHED, PRIVATE, PRIVATE_TOKEN, fetched, hub_with_sources

COMMAND = ["task=RTE", "model=roberta-base", "train=quick", "sweep.seeds=[1,2]"]  # the command, as typed
TOKEN = "hf_sweep_test_token_never_written_0042"


@pytest.fixture(scope="module")
def hub(tmp_path_factory, tiny_roberta_dir):
    from sweep.data.synthetic import write_synthetic_glue

    data = write_synthetic_glue(tmp_path_factory.mktemp("glue"), ["RTE"], n_train=64, n_dev=32)
    hub = hub_with_sources(tiny_roberta_dir, data)
    yield hub
    hub.stop()


def sweep_here(*args: str, cwd: Path, env: dict[str, str], timeout: float = 420) -> subprocess.CompletedProcess:
    """``sweep ARGS`` as a person types it in ``cwd`` (the console script's module)."""
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, "-m", "sweep", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def online(hub, root: Path, **extra: str) -> dict[str, str]:
    env = hub.env(root / "hf-home")
    env.pop("HF_HUB_DISABLE_PROGRESS_BARS")  # as a user has it
    return {**env, "SWEEP_CACHE_DIR": str(root / "sweep-cache"), **extra}


def offline(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return {**env, "HF_HOME": str(root / "hf-home"), "HF_HUB_OFFLINE": "1",
            "SWEEP_CACHE_DIR": str(root / "sweep-cache")}


def files_under(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()]


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(900)
def test_a_sweep_reads_model_and_glue_from_the_hub_once_then_runs_offline_from_the_cache(hub, tmp_path):
    """The issue's command, nothing else: 2/2 trials on the Hub's RTE rows, every file a sweep needs fetched once
    (none of the other weight formats, not the test split), the commit shas in results.csv, the export and
    MLflow; the token in none of its files; then the Hub gone and HF_HUB_OFFLINE=1: the same command runs."""
    import mlflow

    first = sweep_here(*COMMAND, cwd=tmp_path / "work", env=online(hub, tmp_path, HF_TOKEN=TOKEN))
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    model_sha, glue_sha = hub.repos[("model", "roberta-base")].sha, hub.repos[("dataset", "nyu-mll/glue")].sha
    assert "2/2 done" in first.stdout and "SYNTHETIC" not in first.stdout
    assert "HTTP Request" not in first.stdout + first.stderr  # no line per request of the Hub's client
    needed = sorted(set(hub.repos[("model", "roberta-base")].files) - set(NOT_FETCHED))  # config, tokenizer, weights
    assert f"model: hf://roberta-base@{model_sha[:12]} (revision main, {len(needed)} files" in first.stdout
    assert fetched(hub, "model", "roberta-base") == {f: 1 for f in needed}  # not .bin, .h5, .msgpack, onnx/
    assert "model.safetensors" in needed and "config.json" in needed
    assert fetched(hub, "dataset", "nyu-mll/glue") == {"rte/train-00000-of-00001.parquet": 1,
                                                       "rte/validation-00000-of-00001.parquet": 1}

    (out,) = (tmp_path / "work" / "outputs").glob("*/*")
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert {(r["source.model.sha"], r["source.data.sha"], r["source.data.repo"]) for r in rows} == {
        (model_sha, glue_sha, "nyu-mll/glue")} and len(rows) == 2
    made_by = json.loads((out / "best" / "RTE" / "sweep_made_by.json").read_text())
    assert made_by["sources"]["model.sha"] == model_sha and made_by["sources"]["data.sha"] == glue_sha
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'work' / 'runs' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("glue-roberta-base").experiment_id])
    assert len(runs) == 3  # the parent and each trial carry both shas
    assert {(r.data.params["sources.model.sha"], r.data.params["sources.data.sha"]) for r in runs} == {
        (model_sha, glue_sha)}
    assert "registry: roberta-base-RTE version 1" in first.stdout

    written = files_under(tmp_path / "work") + files_under(tmp_path / "sweep-cache")
    assert [p for p in written if TOKEN.encode() in p.read_bytes()] == []
    assert TOKEN not in first.stdout + first.stderr

    hub_gets = sum(hub.file_gets.values())
    hub.stop()
    try:
        again = sweep_here(*COMMAND, cwd=tmp_path / "offline", env=offline(tmp_path))
    finally:
        hub.start()
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "2/2 done" in again.stdout and f"hf://roberta-base@{model_sha[:12]}" in again.stdout
    assert sum(hub.file_gets.values()) == hub_gets


def refused(*args: str, env: dict[str, str], cwd: Path) -> str:
    """The command's one line for a source it cannot have, exit 2, before any folder is written."""
    done = sweep_here(*args, cwd=cwd, env=env, timeout=120)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in done.stdout, done.stderr
    assert sorted(p.name for p in cwd.iterdir()) == [], "nothing written before the refusal"
    return lines[0]


@pytest.mark.ray  # `sweep` itself: it would start a local Ray if it did not refuse
def test_an_empty_cache_offline_is_one_line_naming_the_repo_and_what_to_do(tmp_path):
    line = refused(*COMMAND, env=offline(tmp_path), cwd=tmp_path / "work")
    assert "model.hub_id: model repo roberta-base@main is not in the Hugging Face cache" in line
    assert "HF_HUB_OFFLINE=1" in line and "model.path=DIR" in line


@pytest.mark.ray  # `sweep` itself: it would start a local Ray if it did not refuse
def test_a_cached_model_offline_without_cached_data_names_the_dataset(hub, tmp_path):
    warm = subprocess.run([sys.executable, "-c", "from huggingface_hub import snapshot_download as s; "
                           "s('roberta-base', allow_patterns=['config.json', 'model.safetensors'])"],
                          env=online(hub, tmp_path), capture_output=True, text=True, timeout=120)
    assert warm.returncode == 0, warm.stderr
    line = refused(*COMMAND, env=offline(tmp_path), cwd=tmp_path / "work")
    assert "task.RTE: dataset repo nyu-mll/glue@main is not in the Hugging Face cache" in line
    assert "storage.data_dir=DIR" in line


@pytest.mark.ray  # `sweep` itself: it would start a local Ray if it did not refuse
def test_a_gated_repo_without_a_token_is_one_line(hub, tmp_path):
    line = refused(*COMMAND, "model=hub", f"model.hub_id={GATED}", env=online(hub, tmp_path), cwd=tmp_path / "w")
    assert f"model.hub_id: the model repo '{GATED}' on {hub.endpoint} is gated and no token was given" in line
    assert "HF_TOKEN" in line


@pytest.mark.ray  # `sweep` itself: it would start a local Ray if it did not refuse
def test_a_private_repo_with_another_token_is_one_line_and_the_token_is_not_in_it(hub, tmp_path):
    line = refused(*COMMAND, "model=hub", f"model.hub_id={PRIVATE}", env=online(hub, tmp_path, HF_TOKEN=TOKEN),
                   cwd=tmp_path / "w")
    assert f"'{PRIVATE}' on {hub.endpoint} was not found, or is private and the token given" in line
    assert TOKEN not in line and PRIVATE_TOKEN not in line


@pytest.mark.ray  # `sweep` itself: it would start a local Ray if it did not refuse
def test_a_revision_or_repo_that_does_not_exist_is_one_line(hub, tmp_path):
    line = refused(*COMMAND, "model.revision=v9.9", env=online(hub, tmp_path), cwd=tmp_path / "a")
    assert "has no revision 'v9.9' (a branch, tag or commit sha); set model.revision=..." in line
    line = refused(*COMMAND, "model=hub", "model.hub_id=nobody/nothing", env=online(hub, tmp_path), cwd=tmp_path / "b")
    assert "'nobody/nothing'" in line and "was not found" in line
    line = refused(*COMMAND, "task.RTE.hf.revision=nope", env=online(hub, tmp_path), cwd=tmp_path / "c")
    assert "task.RTE: the dataset repo 'nyu-mll/glue'" in line and "set task.RTE.hf.revision=..." in line


def test_the_private_repo_is_read_with_its_token(hub, tmp_path):
    """The token reaches the Hub (huggingface_hub's own HF_TOKEN): the command gets past its sources."""
    from sweep.config.validate import compose_settings

    code = ("from sweep.storage.hub_sources import hub_pins; from sweep.config.validate import compose_settings; "
            f"print(hub_pins(compose_settings('task=RTE', 'model=hub', 'model.hub_id={PRIVATE}')).model.sha)")
    done = subprocess.run([sys.executable, "-c", code], env=online(hub, tmp_path, HF_TOKEN=PRIVATE_TOKEN),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == hub.repos[("model", PRIVATE)].sha
    assert compose_settings("model=hub", f"model.hub_id={PRIVATE}").model.name == "private-model"


def test_a_resumed_sweep_asks_for_the_commits_it_pinned_not_the_branch(hub, tmp_path):
    """check_sources keeps the commits in out_dir; with resume=true it asks the Hub for those commits again
    (a branch that moved since does not change what the sweep trains on)."""
    code = ("import sys; from pathlib import Path; from sweep.config.validate import compose_settings\n"
            "from sweep.storage.staging import check_sources\n"
            "s = compose_settings('task=RTE', 'model=roberta-base', 'tracking=none', *sys.argv[2:])\n"
            "print(check_sources(s, Path(sys.argv[1])).hub.model.sha)\n")
    out = tmp_path / "out"
    out.mkdir()
    env = online(hub, tmp_path)
    first = subprocess.run([sys.executable, "-c", code, str(out)], env=env, capture_output=True, text=True,
                           timeout=180)
    assert first.returncode == 0, first.stderr
    kept = json.loads((out / "hub-pins.json").read_text())
    sha = hub.repos[("model", "roberta-base")].sha
    assert kept == {"model:roberta-base@main": sha,
                    "dataset:nyu-mll/glue@main": hub.repos[("dataset", "nyu-mll/glue")].sha}
    asked = len(hub.requests)
    again = subprocess.run([sys.executable, "-c", code, str(out), "resume=true"], env=env, capture_output=True,
                           text=True, timeout=180)
    assert again.returncode == 0 and again.stdout.split()[-1] == sha, again.stderr
    resolved = [r for r in hub.requests[asked:] if r.startswith("GET /api/models/roberta-base/revision/")]
    assert resolved and all(r.split("/revision/")[1].split("?")[0] == sha for r in resolved), resolved
