"""No stale comments in sweep/ (issue 53): no ``file.py:NNN`` pointers (line numbers move, in other
projects' sources and in ours), and no measured figures (timings, speed-ups, memory) in comments and
docstrings: those go to docs/benchmarks.md, with the command that measures them. Plain Python, no Ray."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "sweep"

POINTER = re.compile(r"\b\w+\.py:\d+")
# A figure with a unit of time, memory, speed or share: "1.63-1.68 s", "~17 MiB", "2.2x", "1.44×", "3%".
FIGURE = re.compile(
    r"\d[\d.,]*\s*(?:-\s*\d[\d.,]*\s*)?(?:ms|s|min|MiB|GiB|KiB|KB|MB|GB|CPU-s|tokens/s|req/s|x|×|%)(?![\w/])"
)
# ... said to be a measurement's result, on its line or the one before or after it.
MEASURED = re.compile(r"measured|\btook\b|faster|slower|instead of|speed-?up|\bgrew\b|as fast|->|→", re.I)


def _texts(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and every docstring line (any string statement) of ``path``."""
    source = path.read_text()
    out = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
           if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            out += [(node.value.lineno + i, line) for i, line in enumerate(node.value.value.splitlines())]
    return sorted(out)


def _files() -> list[Path]:
    return sorted(SWEEP.rglob("*.py"))


def pointers(path: Path) -> list[str]:
    rel = path.relative_to(ROOT)
    return [f"{rel}:{line}: {POINTER.search(text).group()!r} points at a line number, which moves: name the "
            f"module and function instead (another project's: with its version, e.g. Ray 2.60's "
            f"``Monitor._run``, ray/autoscaler/_private/monitor.py)"
            for line, text in _texts(path) if POINTER.search(text)]


def figures(path: Path) -> list[str]:
    rel = path.relative_to(ROOT).as_posix()
    texts = _texts(path)
    found = []
    for i, (line, text) in enumerate(texts):
        figure = FIGURE.search(text)
        if not figure:
            continue
        near = [t for ln, t in texts[max(i - 1, 0):i + 2] if abs(ln - line) <= 1]
        if any(MEASURED.search(t) for t in near):
            found.append(f"{rel}:{line}: {figure.group()!r} looks like a measured result in a comment or "
                         f"docstring: move it to docs/benchmarks.md (\"Behind the code's choices\": the figure "
                         f"and the command that measures it) and leave the reason here, with "
                         f"\"(docs/benchmarks.md: <section>)\"")
    return found


def test_no_line_number_pointers():
    found = [msg for path in _files() for msg in pointers(path)]
    assert not found, "\n".join(found)


def test_no_measured_figures_in_comments():
    found = [msg for path in _files() for msg in figures(path)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("text, hits", [
    ("# (ray/autoscaler/_private/monitor.py:451); v2", True),
    ("see sweep/config/validate.py:70", True),
    ("``Monitor._run`` in ray/autoscaler/_private/monitor.py", False),
])
def test_pointer_pattern(text, hits):
    assert bool(POINTER.search(text)) is hits


@pytest.mark.parametrize("text, hits", [
    ("process's CPU per 1,000 tokens 1.63-1.68 s -> 1.49-1.54 s).", True),
    ("CPU-s each (a 2-seed local sweep of the tiny model: 39-44 -> 35 CPU-s in all).", True),
    ("timed them alone, ran each trial's steps 2.2x slower than the probe", True),
    ("1.44x as fast with a CPU hog beside it", True),
    ("the process grew ~7 MiB a trial (11 trials: 641 -> 709 MiB)", True),
    ("START_TIMEOUT_S = 180.0  # a limit, not a measurement: 180 s", False),
    ("'2 x {GPU: 1, CPU: 1}' for each distinct bundle", False),
    ("the module was measured on this machine", False),
])
def test_figure_pattern(text, hits):
    assert bool(FIGURE.search(text) and MEASURED.search(text)) is hits
