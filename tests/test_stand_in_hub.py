"""The stand-in Hub (sweep/testing/stand_in_hub.py) as huggingface_hub sees it: downloads, repo info, the errors
of gated, private and missing things, and the GETs it counts. huggingface_hub runs in a child process, as it reads
HF_ENDPOINT once, on import."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sweep.testing.stand_in_hub import StandInHub

TOKEN = "hf_stand_in_secret"
CONFIG = json.dumps({"model_type": "roberta", "hidden_size": 16, "num_hidden_layers": 1}).encode()
WEIGHTS = b"\x00" * 4096  # a .safetensors name is enough for an LFS file
README = b"""---
configs:
- config_name: rte
  data_files:
  - split: train
    path: rte/train-*
  - split: validation
    path: rte/validation-*
---
"""


def rte_parquet(rows: int) -> bytes:
    """``rows`` rows with GLUE RTE's columns, as a parquet file's bytes."""
    table = pa.table({"sentence1": [f"premise {i}" for i in range(rows)],
                      "sentence2": [f"claim {i}" for i in range(rows)],
                      "label": [i % 2 for i in range(rows)], "idx": list(range(rows))})
    out = io.BytesIO()
    pq.write_table(table, out)
    return out.getvalue()


GLUE = {"README.md": README, "rte/train-00000-of-00001.parquet": rte_parquet(20),
        "rte/validation-00000-of-00001.parquet": rte_parquet(8), "cola/train-00000-of-00001.parquet": rte_parquet(4)}
ROBERTA = {"config.json": CONFIG, "model.safetensors": WEIGHTS, "vocab.json": b"{}"}


@pytest.fixture(scope="module")
def hub() -> Iterator[StandInHub]:
    hub = StandInHub()
    hub.add_repo("roberta-base", ROBERTA)
    hub.add_repo("nyu-mll/glue", GLUE, repo_type="dataset")
    hub.add_repo("org/private", {"config.json": CONFIG}, token=TOKEN)
    hub.add_repo("org/gated", {"config.json": CONFIG}, token=TOKEN, gated=True)
    with hub:
        yield hub


def in_child(hub: StandInHub, home: Path, code: str, token: str | None = None) -> object:
    """What ``code`` (huggingface_hub's calls, its result in ``out``) returns in a process pointed at ``hub``."""
    script = f"import json\n{code}\nprint(json.dumps(out))"
    done = subprocess.run([sys.executable, "-c", script], env=hub.env(home, token), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_model_downloads_and_its_sha_downloads_nothing_again(hub: StandInHub, tmp_path: Path) -> None:
    sha = hub.repos[("model", "roberta-base")].sha
    before = hub.file_gets.copy()
    folder, info = in_child(hub, tmp_path, """
from huggingface_hub import HfApi, snapshot_download
folder = snapshot_download("roberta-base", revision="main", allow_patterns=["config.json", "model.safetensors"])
info = HfApi().model_info("roberta-base", revision="main", files_metadata=True)
out = [folder, {"sha": info.sha, "siblings": {s.rfilename: [s.size, s.lfs is not None] for s in info.siblings}}]""")
    assert Path(folder).name == sha
    assert {p.name: p.read_bytes() for p in Path(folder).iterdir()} == {
        "config.json": CONFIG, "model.safetensors": WEIGHTS}
    assert info == {"sha": sha, "siblings": {"config.json": [len(CONFIG), False], "model.safetensors": [4096, True],
                                             "vocab.json": [2, False]}}
    assert hub.file_gets - before == {("model", "roberta-base", "config.json"): 1,
                                      ("model", "roberta-base", "model.safetensors"): 1}

    gets, served = hub.file_gets.copy(), hub.bytes_served
    again = in_child(hub, tmp_path, f"""
from huggingface_hub import snapshot_download
out = snapshot_download("roberta-base", revision="{sha}", allow_patterns=["config.json", "model.safetensors"])""")
    assert again == folder
    assert (hub.file_gets, hub.bytes_served) == (gets, served)


def test_a_dataset_folder_downloads_alone(hub: StandInHub, tmp_path: Path) -> None:
    folder = in_child(hub, tmp_path, """
from huggingface_hub import snapshot_download
out = snapshot_download("nyu-mll/glue", repo_type="dataset", allow_patterns=["rte/*"])""")
    files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in Path(folder).rglob("*") if p.is_file()}
    assert files == {path: data for path, data in GLUE.items() if path.startswith("rte/")}
    assert any(r.startswith("GET /api/datasets/nyu-mll/glue/tree/") for r in hub.requests)


ERRORS = """
import huggingface_hub as hub
def error(call):
    try:
        call()
    except Exception as e:
        return type(e).__name__
    return None
out = {
    "gated file": error(lambda: hub.hf_hub_download("org/gated", "config.json")),
    "gated snapshot": error(lambda: hub.snapshot_download("org/gated")),
    "private file": error(lambda: hub.hf_hub_download("org/private", "config.json")),
    "private info": error(lambda: hub.HfApi().model_info("org/private")),
    "bad revision": error(lambda: hub.hf_hub_download("roberta-base", "config.json", revision="v9")),
    "bad revision info": error(lambda: hub.HfApi().model_info("roberta-base", revision="v9")),
    "missing file": error(lambda: hub.hf_hub_download("roberta-base", "missing.json")),
    "unknown repo": error(lambda: hub.snapshot_download("nobody/nothing")),
}"""
NOT_HERE = {"bad revision": "RevisionNotFoundError", "bad revision info": "RevisionNotFoundError",
            "missing file": "RemoteEntryNotFoundError", "unknown repo": "RepositoryNotFoundError"}


@pytest.mark.parametrize(("token", "denied"), [
    (None, {"gated file": "GatedRepoError", "gated snapshot": "GatedRepoError",
            "private file": "RepositoryNotFoundError", "private info": "RepositoryNotFoundError"}),
    ("hf_someone_else", {"gated file": "GatedRepoError", "gated snapshot": "GatedRepoError",
                         "private file": "RepositoryNotFoundError", "private info": "RepositoryNotFoundError"}),
    (TOKEN, {"gated file": None, "gated snapshot": None, "private file": None, "private info": None}),
], ids=["no token", "another token", "the token"])
def test_the_hubs_errors_reach_the_library_as_its_own(hub: StandInHub, tmp_path: Path, token: str | None,
                                                       denied: dict[str, str | None]) -> None:
    assert in_child(hub, tmp_path, ERRORS, token=token) == denied | NOT_HERE


def test_gets_of_a_files_bytes_are_counted_and_heads_are_not(hub: StandInHub, tmp_path: Path) -> None:
    path = ("dataset", "nyu-mll/glue", "README.md")
    gets, served = hub.file_gets[path], hub.bytes_served
    code = """
from huggingface_hub import hf_hub_download
out = hf_hub_download("nyu-mll/glue", "README.md", repo_type="dataset")"""
    assert Path(in_child(hub, tmp_path, code)).read_bytes() == README
    assert Path(in_child(hub, tmp_path, code)).read_bytes() == README  # a HEAD finds it cached
    assert (hub.file_gets[path] - gets, hub.bytes_served - served) == (1, len(README))
    assert hub.requests[-1] == "HEAD /datasets/nyu-mll/glue/resolve/main/README.md"

    ranged = urllib.request.Request(f"{hub.endpoint}/datasets/nyu-mll/glue/resolve/main/README.md",
                                    headers={"Range": "bytes=4-10"})
    with urllib.request.urlopen(ranged) as answer:
        assert (answer.status, answer.read(), answer.headers["Content-Range"]) == (
            206, README[4:11], f"bytes 4-10/{len(README)}")
    assert (hub.file_gets[path] - gets, hub.bytes_served - served) == (2, len(README) + 7)


def test_a_stopped_hub_refuses_connections() -> None:
    hub = StandInHub()
    port = int(hub.start().rsplit(":", 1)[1])
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    hub.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)
