"""Packing a folder into a ``.tgz`` and unpacking one safely.

Unpacking refuses, before writing the member: absolute names, ``..`` components, links that point
outside the target, devices/FIFOs, and archives whose members add up to more than a size limit.
Python's ``data`` extraction filter does the link/device checks; the explicit checks come first
so the error names the member and the reason (the filter silently strips a leading ``/``).
"""

from __future__ import annotations

import tarfile
import zlib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from sweep.errors import StagingError


class UnsafeArchiveError(StagingError):
    """An archive member would be written outside its target (or is not a plain file/folder/link)."""


def pack_folder(folder: Path, archive: Path) -> Path:
    """``tar -czf archive folder`` from the folder's parent: the archive holds ``<folder name>/...``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise StagingError(f"{folder} is not a folder; nothing to pack")
    with tarfile.open(archive, "w:gz", compresslevel=6) as tar:
        tar.add(folder, arcname=folder.name, recursive=True)
    return archive


def _check_member(member: tarfile.TarInfo, label: str) -> None:
    name = PurePosixPath(member.name)
    if member.name.startswith(("/", "\\")) or name.is_absolute():
        raise UnsafeArchiveError(f"{label}: member {member.name!r} has an absolute path; refused")
    if ".." in name.parts:
        raise UnsafeArchiveError(f"{label}: member {member.name!r} climbs out with '..'; refused")
    if member.isdev() or member.isfifo():
        raise UnsafeArchiveError(f"{label}: member {member.name!r} is a device or FIFO; refused")
    if member.issym() or member.islnk():
        target = PurePosixPath(member.linkname)
        # A symlink's target is relative to its own folder; a hard link's to the archive root.
        resolved = (name.parent / target) if member.issym() else target
        depth = 0
        for part in resolved.parts:
            depth += -1 if part == ".." else (0 if part == "." else 1)
            if depth < 0:
                break
        if target.is_absolute() or depth < 0:
            raise UnsafeArchiveError(
                f"{label}: member {member.name!r} links to {member.linkname!r}, outside the target; refused"
            )


def _checked(tar: tarfile.TarFile, label: str, max_bytes: int) -> Iterator[tarfile.TarInfo]:
    total = 0
    for member in tar:
        _check_member(member, label)
        total += max(member.size, 0)
        if total > max_bytes:
            raise StagingError(
                f"{label}: unpacks to more than {max_bytes / 2**30:.2f} GiB; refused "
                "(raise storage.max_unpack_gb if the object really is that large)"
            )
        yield member


def extract_archive(archive: Path, target: Path, label: str, max_bytes: int) -> None:
    """Unpack a tar archive (any compression tarfile reads) into ``target``, safely, in one pass.

    ``target`` should be a fresh temporary folder: on any error the caller discards it whole.
    """
    try:
        with tarfile.open(archive, "r:*") as tar:
            tar.extractall(target, members=_checked(tar, label, max_bytes), filter="data")
    except tarfile.FilterError as e:  # what the data filter still catches (e.g. link tricks)
        raise UnsafeArchiveError(f"{label}: {e}; refused") from None
    except (tarfile.ReadError, tarfile.CompressionError, EOFError, zlib.error, OSError) as e:
        if isinstance(e, OSError) and not isinstance(e, (tarfile.TarError, EOFError)) and e.errno is not None:
            raise  # a real I/O problem on this machine (disk full, permissions): not the archive's fault
        raise StagingError(
            f"{label}: not a readable tar archive ({type(e).__name__}: {e}); "
            "re-upload it with `python -m sweep upload`"
        ) from None
