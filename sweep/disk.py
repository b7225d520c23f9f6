"""A full disk as one clear error: which folder, how many bytes the write needed, how many are free,
and which setting moves it.

Every write site that can fill a disk (a checkpoint, the tokenized cache, the exported best model,
the result files) wraps its write in ``writing(...)``; an ENOSPC/EDQUOT inside becomes a
``DiskFullError`` whose one line ``python -m sweep`` prints (exit 2). The atomic helpers
(sweep/files.py) already remove their temporaries on any error, so nothing half-written stays.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sweep.errors import DiskFullError

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# pyarrow (Ray's checkpoint copy, datasets' save_to_disk), safetensors and shutil.copytree report the
# errno only in their text; torch.save not at all ("iostream error", "unexpected pos"): then the
# free space left decides
_FULL_TEXT = re.compile(r"no space left on device|disk quota exceeded|storagefull|errno:? ?(28|122)\b", re.IGNORECASE)
NEARLY_FULL = 2**20  # below this much free space, a write that failed was the disk filling up
# The one line a DiskFullError carries; found again in a trial's error text on the driver
_LINE = re.compile(r"no space left on \S.*? and rerun with resume=true")


def is_disk_full(exc: BaseException | None, folder: Path | None = None) -> bool:
    """An ENOSPC/EDQUOT anywhere in ``exc``'s chain of causes (with ``folder``, the folder written
    to: also a write that failed without saying why while that disk is all but full)."""
    chain, seen = exc, set()
    while chain is not None and id(chain) not in seen:
        seen.add(id(chain))
        if isinstance(chain, DiskFullError) or _FULL_TEXT.search(str(chain)):
            return True
        if isinstance(chain, OSError) and chain.errno in FULL_ERRNOS:
            return True
        chain = chain.__cause__ or chain.__context__
    return exc is not None and folder is not None and free_bytes(folder) < NEARLY_FULL


def existing(folder: Path) -> Path:
    """``folder`` or its nearest existing parent (what disk_usage can measure)."""
    folder = Path(folder).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def mount_point(folder: Path) -> Path:
    folder = existing(folder).resolve()
    while not os.path.ismount(folder) and folder != folder.parent:
        folder = folder.parent
    return folder


def free_bytes(folder: Path) -> int:
    return shutil.disk_usage(existing(folder)).free


def folder_size(path: Path) -> int:
    """Bytes in the files under ``path`` (a file: its size; missing: 0)."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MB"


def disk_full_message(what: str, folder: Path, needed: int, key: str | None) -> str:
    moves = f" (or set {key})" if key else ""
    return (f"no space left on {mount_point(folder)}: writing {what} to {folder} needs about {_mb(needed)}, "
            f"{_mb(free_bytes(folder))} free; free space{moves} and rerun with resume=true")


@contextmanager
def writing(what: str, folder: str | Path, needed: int | Callable[[], int], key: str | None = None) -> Iterator[None]:
    """Turn a full disk inside the block into a ``DiskFullError``. ``needed`` is the size of what is
    written (bytes, or a function that measures it once the write failed: a staged folder's size)."""
    try:
        yield
    except DiskFullError:
        raise
    except Exception as e:  # torch and safetensors raise their own types for a full disk
        if not is_disk_full(e, Path(folder)):
            raise
        size = needed() if callable(needed) else needed
        raise DiskFullError(disk_full_message(what, Path(folder), size, key)) from e


def disk_full_line(text: str | None) -> str | None:
    """The DiskFullError's line in an error text (a trial's traceback, as Ray reports it), else None."""
    found = _LINE.search(text or "")
    return found.group(0) if found else None
