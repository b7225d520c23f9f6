"""Archives are unpacked safely: nothing lands outside the target, bad archives are clear errors."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from sweep.errors import StagingError
from sweep.storage.archive import UnsafeArchiveError, extract_archive, pack_folder

LIMIT = 2**30


def _archive(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def _link(name: str, target: str, kind=tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


def test_pack_then_extract_round_trips_the_folder(tmp_path):
    src = tmp_path / "roberta-base"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text("{}")
    (src / "sub" / "w.bin").write_bytes(b"\0" * 1000)
    archive = pack_folder(src, tmp_path / "m.tgz")
    target = tmp_path / "out"
    target.mkdir()
    extract_archive(archive, target, "m.tgz", LIMIT)
    assert (target / "roberta-base" / "config.json").read_text() == "{}"
    assert (target / "roberta-base" / "sub" / "w.bin").stat().st_size == 1000


@pytest.mark.parametrize(
    "member, reason",
    [
        (_file("../escape.txt"), "climbs out with '..'"),
        (_file("data/../../escape.txt"), "climbs out with '..'"),
        (_file("/tmp/sweep-absolute-escape.txt"), "has an absolute path"),
        (_link("data/link", "../../escape.txt"), "outside the target"),
        (_link("data/link", "/etc/passwd"), "outside the target"),
        (_link("data/hard", "../escape.txt", tarfile.LNKTYPE), "outside the target"),
    ],
)
def test_unsafe_members_are_refused_and_nothing_is_written_outside(tmp_path, member, reason):
    archive = _archive(tmp_path / "bad.tgz", [_file("data/ok.txt"), member])
    target = tmp_path / "stage" / "target"
    target.mkdir(parents=True)
    before = set(tmp_path.rglob("*"))
    with pytest.raises(UnsafeArchiveError, match=reason) as err:
        extract_archive(archive, target, "s3://b/bad", LIMIT)
    assert "s3://b/bad" in str(err.value)
    created = {p for p in set(tmp_path.rglob("*")) - before if target not in p.parents}
    assert created == set(), f"written outside the target: {created}"
    assert not Path("/tmp/sweep-absolute-escape.txt").exists()


def test_a_link_inside_the_target_is_kept(tmp_path):
    archive = _archive(tmp_path / "ok.tgz", [_file("m/weights.bin", b"w"), _link("m/alias.bin", "weights.bin")])
    target = tmp_path / "t"
    target.mkdir()
    extract_archive(archive, target, "ok", LIMIT)
    assert (target / "m" / "alias.bin").read_bytes() == b"w"


def test_a_device_member_is_refused(tmp_path):
    info = tarfile.TarInfo("m/dev")
    info.type = tarfile.CHRTYPE
    archive = _archive(tmp_path / "dev.tgz", [(info, None)])
    (tmp_path / "t").mkdir()
    with pytest.raises(UnsafeArchiveError, match="device"):
        extract_archive(archive, tmp_path / "t", "dev", LIMIT)


def test_an_archive_over_the_size_limit_is_refused(tmp_path):
    archive = _archive(tmp_path / "big.tgz", [_file("m/a", b"a" * 600), _file("m/b", b"b" * 600)])
    (tmp_path / "t").mkdir()
    with pytest.raises(StagingError, match="storage.max_unpack_gb"):
        extract_archive(archive, tmp_path / "t", "big", max_bytes=1000)


@pytest.mark.parametrize("content", [b"not a tar at all", b"\x1f\x8b\x08\x00" + b"\0" * 40])
def test_a_corrupt_archive_is_a_clear_error(tmp_path, content):
    (tmp_path / "bad.tgz").write_bytes(content)
    (tmp_path / "t").mkdir()
    with pytest.raises(StagingError, match="not a readable tar archive"):
        extract_archive(tmp_path / "bad.tgz", tmp_path / "t", "s3://b/k", LIMIT)


def test_a_truncated_archive_is_a_clear_error(tmp_path):
    src = tmp_path / "m"
    src.mkdir()
    (src / "w.bin").write_bytes(bytes(range(256)) * 4000)
    whole = pack_folder(src, tmp_path / "m.tgz").read_bytes()
    (tmp_path / "cut.tgz").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "t").mkdir()
    with pytest.raises(StagingError, match="not a readable tar archive"):
        extract_archive(tmp_path / "cut.tgz", tmp_path / "t", "cut", LIMIT)
