"""The repos the Hub tests serve from the stand-in Hub (sweep/testing/stand_in_hub.py): a roberta-base-shaped
model (a tiny RoBERTa built offline, in safetensors, beside the formats a sweep must not fetch), nyu-mll/glue's
RTE in the Hub's parquet layout, a gated and a private repo."""

from __future__ import annotations

import io
from pathlib import Path

from sweep.testing.stand_in_hub import StandInHub

# What the real roberta-base holds beside safetensors: a sweep fetches none of them.
NOT_FETCHED = {"pytorch_model.bin": b"\0" * 4096, "tf_model.h5": b"\0" * 4096, "flax_model.msgpack": b"\0" * 4096,
               "onnx/model.onnx": b"\0" * 4096, "rust_model.ot": b"\0" * 1024, "README.md": b"# roberta-base\n"}
GATED, PRIVATE, PRIVATE_TOKEN = "meta-llama/gated-model", "acme/private-model", "hf_private_reader_token_1234"


def model_files(model_dir: Path) -> dict[str, bytes]:
    """A save_pretrained folder's files, with NOT_FETCHED beside them."""
    files = {p.name: p.read_bytes() for p in model_dir.iterdir() if p.is_file() and not p.name.startswith(".")}
    assert "model.safetensors" in files, sorted(files)
    return {**files, **NOT_FETCHED}


def glue_files(data_dir: Path, tasks: tuple[str, ...] = ("RTE",)) -> dict[str, bytes]:
    """nyu-mll/glue's files for ``tasks``, from a folder in GLUE's TSV layout (real or synthetic rows), as the Hub
    lays them out: ``<config>/<split>-00000-of-00001.parquet`` with the task's Hub columns and label indices, a
    test split (the dev rows unlabeled, -1) a sweep must not fetch, and a README."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sweep.config.tasks import load_task
    from sweep.data.glue import load_task_data
    from sweep.data.task_files import hub_split

    out = {"README.md": glue_card(tasks)}

    def parquet(spec, rows, labels) -> bytes:
        texts = (rows["text_a"], rows["text_b"]) if spec.is_pair else (rows["text_a"],)
        table = pa.table({**dict(zip(spec.hf.text_columns, texts)), "label": labels,
                          "idx": pa.array(range(len(rows)), pa.int32())})
        buffer = io.BytesIO()
        pq.write_table(table, buffer)
        return buffer.getvalue()

    for name in tasks:
        spec = load_task(name)
        data = load_task_data(spec, data_dir)
        for split, rows in data.items():  # our label index -> the Hub's (its label names' order)
            labels = rows["label"] if spec.kind == "regression" else [
                spec.hf.label_names.index(spec.labels[i]) for i in rows["label"]]
            out[f"{spec.hf.config}/{hub_split(spec, split)}-00000-of-00001.parquet"] = parquet(spec, rows, labels)
        dev = data[spec.primary_eval]
        test = hub_split(spec, spec.primary_eval).replace("validation", "test")
        out[f"{spec.hf.config}/{test}-00000-of-00001.parquet"] = parquet(spec, dev, [-1] * len(dev))
    return out


def glue_card(tasks: tuple[str, ...]) -> bytes:
    """The README whose YAML maps each config to its parquet files, as nyu-mll/glue's does (``datasets.load_dataset``
    reads it)."""
    from sweep.config.tasks import load_task
    from sweep.data.task_files import hub_split

    lines = ["---", "configs:"]
    for name in tasks:
        spec = load_task(name)
        lines += [f"- config_name: {spec.hf.config}", "  data_files:"]
        for split in ("train", *spec.eval_files):
            theirs = hub_split(spec, split)
            lines += [f"  - split: {theirs}", f"    path: {spec.hf.config}/{theirs}-*"]
    return ("\n".join([*lines, "---", "# GLUE, as the stand-in Hub serves it", ""])).encode()


def hub_with_sources(model_dir: Path, data_dir: Path) -> StandInHub:
    """A started stand-in Hub holding roberta-base (the tiny model in its shape), nyu-mll/glue's RTE, a gated
    model and a private one (readable with PRIVATE_TOKEN only)."""
    hub = StandInHub()
    files = model_files(model_dir)
    hub.add_repo("roberta-base", files)
    hub.add_repo("nyu-mll/glue", glue_files(data_dir), repo_type="dataset")
    hub.add_repo(GATED, files, gated=True)
    hub.add_repo(PRIVATE, files, token=PRIVATE_TOKEN)
    hub.start()
    return hub


def fetched(hub: StandInHub, repo_type: str, repo_id: str) -> dict[str, int]:
    """How many times each file of a repo was downloaded (its bytes GET), by path."""
    return {path: n for (kind, repo, path), n in hub.file_gets.items() if (kind, repo) == (repo_type, repo_id)}
