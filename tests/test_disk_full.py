"""A full disk (issue 14, item 3): one clear line naming the folder and the bytes, nothing
half-written, and a resumed sweep that finishes once there is room.

The disk is a real size-limited tmpfs (CI runs as root); where mounting is refused the cases skip
and say why.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from datasets import Dataset, DatasetDict

from sweep.data.cache import cached_dataset
from sweep.disk import disk_full_line, folder_size, is_disk_full
from sweep.errors import USER_ERRORS, DiskFullError
from sweep.files import atomic_folder, partial_folders, write_text
from sweep.results.export_layout import MADE_BY
from sweep.results.records import TrialRecord, export_best, load_records
from tests.helpers.sweeps import sweep_cmd

MB = 2**20


@pytest.fixture
def small_disk(tmp_path):
    """``small_disk(size)`` mounts a tmpfs of ``size`` (mount's syntax: 1m, 256k) and returns its
    folder; ``small_disk.grow(folder, size)`` remounts it bigger, keeping its files."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a size-limited tmpfs here (needs root): {r.stderr.strip() or r.returncode}")
        mounted.append(where)
        return where

    def grow(where: Path, size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(where)], check=True)

    mount.grow = grow
    yield mount
    for where in reversed(mounted):
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path, leave: int) -> None:
    """Take all but ``leave`` bytes of ``disk`` (a filler file), so what comes next is too big."""
    import shutil

    free = shutil.disk_usage(disk).free
    (disk / ".filler").write_bytes(b"\0" * max(0, free - leave))


def mb(n: int) -> str:
    return f"{n / MB:.1f} MB"


def assert_one_line(e: DiskFullError, folder: Path, needed: int, key: str) -> None:
    line = str(e)
    assert "\n" not in line
    assert line.startswith("no space left on ") and f"to {folder} needs about {mb(needed)}, " in line, line
    assert re.search(r", \d+\.\d MB free; free space \(or set " + re.escape(key) + r"\) and rerun with resume=true$",
                     line)
    assert isinstance(e, USER_ERRORS)  # python -m sweep prints it as one line, exit 2


def test_the_line_is_found_again_in_a_trial_traceback():
    # what the driver reads from a failed trial's error text (Ray's traceback, the cause first)
    line = ("no space left on /mnt: writing a checkpoint to /mnt/x needs about 1.0 MB, 0.0 MB free; "
            "free space (or set out_dir) and rerun with resume=true")
    text = f"Traceback ...\nOSError: [Errno 28] No space left on device\n\nsweep.errors.DiskFullError: {line}\n"
    assert disk_full_line(text) == line
    assert disk_full_line("ValueError: label 7 is not one of the task's labels") is None
    assert is_disk_full(OSError(28, "No space left on device"))
    # pyarrow's form
    assert is_disk_full(OSError("[Errno 28] Error writing bytes to file. Detail: [errno 28] No space left on device"))
    assert not is_disk_full(OSError(2, "No such file or directory"))


def test_tokenized_cache_on_a_full_disk_names_folder_and_bytes_and_leaves_no_entry(small_disk):
    disk = small_disk("1m")
    rows = DatasetDict({"train": Dataset.from_dict({"input_ids": [[i] * 128 for i in range(4000)]})})
    needed = sum(split.data.nbytes for split in rows.values())
    assert needed > 1 * MB

    with pytest.raises(DiskFullError) as e:
        cached_dataset(disk, "k1", lambda: rows, "tokenized RTE")
    assert_one_line(e.value, disk / "tokenized", needed, "storage.cache_dir")
    assert "writing tokenized RTE" in str(e.value)
    # no half-written cache entry: only the key's lock file (a later build would hit nothing)
    assert sorted(p.name for p in (disk / "tokenized").iterdir()) == ["k1.lock"]

    small_disk.grow(disk, "16m")  # free space, build again: the cache works
    assert cached_dataset(disk, "k1", lambda: rows, "tokenized RTE")["train"]["input_ids"][5][:2] == [5, 5]


def test_export_best_onto_a_full_disk_keeps_the_previous_export_whole(small_disk, tiny_roberta_dir, tmp_path):
    disk = small_disk("4m")
    target = disk / "best" / "WNLI"
    small = tmp_path / "small-ckpt"
    small.mkdir()
    (small / "config.json").write_text("{}")
    first = TrialRecord(task="WNLI", seed=38, score=0.5, checkpoint=str(small))
    export_best(first, target, "tiny-roberta")
    before = {p.name: p.read_bytes() for p in target.iterdir()}

    needed = folder_size(tiny_roberta_dir)
    fill(disk, leave=needed // 2)  # half the model fits
    record = TrialRecord(task="WNLI", seed=39, score=0.6, checkpoint=str(tiny_roberta_dir))
    with pytest.raises(DiskFullError) as e:
        export_best(record, target, "tiny-roberta")
    assert_one_line(e.value, target.parent, needed, "out_dir")
    # the old export, whole; no half-copied folder beside it
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert partial_folders(target) == []
    assert sorted(p.name for p in target.parent.iterdir()) == ["WNLI"]

    (disk / ".filler").unlink()  # free space: the export goes through
    export_best(record, target, "tiny-roberta")
    assert (target / "config.json").is_file() and '"seed": 39' in (target / MADE_BY).read_text()


def test_atomic_writes_on_a_full_disk_leave_no_temporary(small_disk):
    disk = small_disk("1m")
    path = disk / "results.json"
    write_text(path, "old")
    text = "x" * (2 * MB)
    with pytest.raises(DiskFullError) as e:
        write_text(path, text, key="out_dir")
    assert_one_line(e.value, disk, len(text), "out_dir")
    assert "writing results.json" in str(e.value)
    assert path.read_text() == "old"
    assert sorted(p.name for p in disk.iterdir()) == ["results.json"]  # the temp file went

    target = disk / "model"
    with pytest.raises(OSError), atomic_folder(target) as tmp:
        (tmp / "weights.bin").write_bytes(b"\0" * (2 * MB))
    assert not target.exists() and partial_folders(target) == []
    assert sorted(p.name for p in disk.iterdir()) == ["results.json"]


@pytest.mark.parametrize("writer", ["save_pretrained", "torch.save"])
def test_a_checkpoint_staged_on_a_full_temp_dir_is_one_line(small_disk, tiny_roberta_dir, writer):
    # EvaluationReporter.report stages each checkpoint in the system temp dir through these two writers
    # (finetune.save): each one's own error for a full disk is recognised
    import torch
    from transformers import AutoModel

    from sweep.disk import writing

    model = AutoModel.from_pretrained(tiny_roberta_dir)
    disk = small_disk("256k")
    folder = disk / "sweep-ckpt-x"
    folder.mkdir()
    save = {"save_pretrained": lambda: model.save_pretrained(folder),
            "torch.save": lambda: torch.save(model.state_dict(), folder / "resume.pt")}[writer]
    with pytest.raises(DiskFullError) as e, writing("a checkpoint", disk, lambda: folder_size(folder), key="TMPDIR"):
        save()
    assert str(e.value).startswith(f"no space left on {disk}: writing a checkpoint to {disk} needs about ")
    assert str(e.value).endswith("free; free space (or set TMPDIR) and rerun with resume=true")


@pytest.mark.ray
@pytest.mark.slow
def test_sweep_on_a_full_disk_stops_with_one_line_then_resume_finishes(small_disk, tmp_path):
    disk = small_disk("512k")  # Tune's small files fit, a tiny-roberta checkpoint does not
    out, cache = disk / "out", tmp_path / "cache"
    args = ["experiment=demo", "tracking=none", "sweep.seeds=[38,39]", "train.epochs=1",
            "train.max_train_samples=32", "train.max_eval_samples=32", f"out_dir={out}"]
    r = sweep_cmd(*args, cwd=tmp_path, cache=cache, timeout=180)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: no space left on {disk}: writing the checkpoint of epoch 1 to {out}/"), \
        r.stderr[-3000:]
    assert re.search(r"needs about \d+\.\d MB, \d+\.\d MB free; "
                     r"free space \(or set out_dir\) and rerun with resume=true$", last)
    assert "Traceback" not in r.stderr
    assert not (out / "results.json").exists()
    assert not list(out.rglob("checkpoint_*")), "a half-copied checkpoint was left in the storage"

    small_disk.grow(disk, "64m")
    r = sweep_cmd(*args, "resume=true", cwd=tmp_path, cache=cache, timeout=180)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    records = load_records(out / "results.json")
    assert sorted(rec.seed for rec in records) == [38, 39]
    assert all(rec.status == "TERMINATED" and rec.score is not None for rec in records), records
    assert (out / "best" / "WNLI" / "config.json").is_file()
