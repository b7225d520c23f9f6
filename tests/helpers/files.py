"""What the export tests check of the files a sweep publishes: their modes, under a umask the test sets."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def umask(mask: int) -> Iterator[None]:
    """The process's umask for the block (the usual 022 of a login), the previous one restored after."""
    before = os.umask(mask)
    try:
        yield
    finally:
        os.umask(before)


def modes(folder: Path) -> dict[str, str]:
    """Each path under ``folder`` (itself as ".") and its permission bits in octal: 0o644 files, 0o755 folders."""
    folder = Path(folder)
    return {str(p.relative_to(folder)): oct(stat.S_IMODE(p.lstat().st_mode)) for p in [folder, *folder.rglob("*")]}


def unshared(folder: Path) -> dict[str, str]:
    """The paths under ``folder`` whose mode is not what a published file (0644) or folder (0755) has."""
    return {path: mode for path, mode in modes(folder).items()
            if mode != ("0o755" if (Path(folder) / path).is_dir() else "0o644")}
