"""The runnable commands of a Markdown page: its fenced ``bash`` blocks, each with what the line right
before its fence says of it.

- ``<!-- not run: REASON -->``: the block is not run (it needs a GPU, a cluster, a bucket, or it is the
  test command itself); the reason is kept and checked to be there.
- ``<!-- background: ready when URL answers -->``: the block's command keeps running (a server); it is
  started in the background and is ready when ``URL`` answers.
- nothing: the block runs in the foreground and must exit 0.

Only ``bash`` blocks are commands: output and trees are ``text`` blocks.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^(```+|~~~+)\s*([\w+-]*)")
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(?P<reason>.*?)\s*-->$")
BACKGROUND = re.compile(r"^<!--\s*background:\s*ready when\s+(?P<url>\S+)\s+answers\s*-->$")
# `sweep <overrides>` is a sweep; these first words are the sweep command's other subcommands.
OPERATORS = {"|", "||", "&&", "&", ";", ">", ">>", "<", "2>", "2>&1"}
SUBCOMMANDS = {"run", "submit", "serve", "infer", "ui", "upload", "upload-mlflow", "replay"}


@dataclass(frozen=True)
class Block:
    """One fenced ``bash`` block: where it is, its text, and how it is to be run."""

    page: str
    line: int  # of the opening fence, 1-based
    text: str
    not_run: str | None = None  # the stated reason, when it is not run
    ready_url: str | None = None  # a background block: the URL that answers once it is ready

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def bash_blocks(page: Path, root: Path) -> list[Block]:
    """Every fenced ``bash`` block of ``page`` in order, with its marker (if any) read."""
    lines = page.read_text().splitlines()
    blocks: list[Block] = []
    fence: str | None = None
    body: list[str] = []
    start = 0
    language = ""
    for number, line in enumerate(lines, 1):
        match = FENCE.match(line.strip())
        if fence is None and match:
            fence, language, start, body = match.group(1), match.group(2), number, []
        elif fence is not None and line.strip().startswith(fence) and not line.strip()[len(fence):].strip():
            if language == "bash":
                blocks.append(_block(page.relative_to(root).as_posix(), start, "\n".join(body),
                                     lines[start - 2].strip() if start > 1 else ""))
            fence = None
        elif fence is not None:
            body.append(line)
    return blocks


def _block(page: str, line: int, text: str, before: str) -> Block:
    not_run = NOT_RUN.match(before)
    background = BACKGROUND.match(before)
    return Block(page, line, text, not_run=not_run.group("reason") if not_run else None,
                 ready_url=background.group("url") if background else None)


def commands(text: str) -> list[str]:
    """The block's commands, one per logical line (backslash continuations joined), comments left out."""
    joined = re.sub(r"\s*\\\n\s*", " ", text)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def with_overrides(command: str, overrides: list[str]) -> str:
    """``command`` with ``overrides`` appended when it is a sweep (``sweep <overrides>``, ``sweep run``,
    ``python -m sweep <overrides>``); any other command unchanged. A trailing comment is dropped."""
    words = shlex.split(command, comments=True)
    rest = words[1:] if words[:1] == ["sweep"] else words[3:] if words[:3] == ["python", "-m", "sweep"] else None
    if rest is None or (rest and (rest[0] in SUBCOMMANDS - {"run"} or rest[0].startswith("-"))):
        return command
    if OPERATORS & set(words) or any(word.endswith(";") for word in words):
        raise ValueError(f"a sweep in a pipeline or a list: {command!r}; give it a line of its own")
    return shlex.join(words + overrides)
