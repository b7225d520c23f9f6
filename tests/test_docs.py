"""The docs (Ray-free, fast): the site builds with ``mkdocs build --strict`` and a broken link fails it; the
README stays a five-minute read; no link in the README or docs/ points outside the repository; and
docs/architecture.md names every module of sweep/."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
README_MAX_CHARS = 12_000
CELL_MAX_CHARS = 300
LOCAL_HOSTS = ("127.0.0.1", "localhost")

FENCE = re.compile(r"^\s*(```+|~~~+)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
# [text](target "title"), ![alt](target): the target up to whitespace or the closing parenthesis
INLINE_LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]*)>?(?:\s+[\"'(][^)]*)?\)")
REFERENCE_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$", re.M)
AUTOLINK = re.compile(r"<([a-zA-Z][a-zA-Z0-9+.-]*:[^>\s]*)>")
HTML_LINK = re.compile(r"""\b(?:href|src)\s*=\s*["']([^"']+)["']""", re.I)
BARE_URL = re.compile(r"\b(?:https?|ftp)://[^\s)>\]]+")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], cwd=config.parent, env=env, capture_output=True, text=True,
                          timeout=300)


def prose(text: str) -> str:
    """The page without its fenced code blocks and inline code spans: what Markdown reads as text."""
    kept, fence = [], None
    for line in text.splitlines():
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)
        elif fence is not None and line.strip().startswith(fence) and not line.strip().lstrip(fence[0]):
            fence = None
        elif fence is None:
            kept.append(line)
    return CODE_SPAN.sub(" ", "\n".join(kept))


def link_targets(text: str) -> list[str]:
    """Every link or image target of a Markdown page, outside code."""
    body = prose(text)
    found = [m.group(1) for pattern in (INLINE_LINK, REFERENCE_DEFINITION, AUTOLINK, HTML_LINK)
             for m in pattern.finditer(body)]
    # a bare URL in prose is a link on GitHub (and a pointer outside the repo anywhere)
    without_links = INLINE_LINK.sub(" ", AUTOLINK.sub(" ", body))
    return found + BARE_URL.findall(without_links)


def outside_the_repository(page: Path, target: str) -> str | None:
    """Why ``target`` (a link on ``page``) points outside the repository, or None when it does not."""
    if not target or target.startswith("#"):
        return None
    if SCHEME.match(target):
        host = re.match(r"^https?://([^/:?#]+)", target)
        return None if host and host.group(1) in LOCAL_HOSTS else "a link out of the repository"
    path = target.split("#", 1)[0].split("?", 1)[0]
    if path.startswith("/"):
        return "an absolute path"
    resolved = (page.parent / path).resolve()
    if not resolved.is_relative_to(ROOT):
        return "a path out of the repository"
    if not resolved.exists():
        return "no such file in the repository"
    return None


def table_cells(text: str) -> list[str]:
    """Every cell of every Markdown table outside code blocks, as written (code spans count toward its size)."""
    cells: list[str] = []
    fence = None
    for line in text.splitlines():
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)
            continue
        if fence is not None:
            if line.strip().startswith(fence):
                fence = None
            continue
        if line.lstrip().startswith("|"):
            cells += [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
    return cells


# --- (a) the site -----------------------------------------------------------------------------------


def test_the_site_builds_strict(tmp_path: Path) -> None:
    r = mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "WARNING" not in r.stdout + r.stderr, r.stdout + r.stderr
    built = {p.relative_to(tmp_path / "site").as_posix() for p in (tmp_path / "site").glob("*.html")}
    assert {f"{p.stem}.html" for p in DOCS.glob("*.md")} <= built


@pytest.mark.parametrize("breakage, named", [
    ("\n[a page that is not there](no-such-page.md)\n", "no-such-page.md"),
    ("\n[an anchor that is not there](configuration.md#no-such-heading)\n", "no-such-heading"),
    (None, "unlisted.md"),  # a page left out of the nav
])
def test_a_broken_link_fails_the_build(tmp_path: Path, breakage: str | None, named: str) -> None:
    """strict is on, and the validation makes each kind of breakage a warning: the build fails, naming it."""
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(DOCS, tmp_path / "docs")
    if breakage is None:
        (tmp_path / "docs" / "unlisted.md").write_text("# Not in the nav\n")
    else:
        with (tmp_path / "docs" / "index.md").open("a") as page:
            page.write(breakage)
    r = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert r.returncode != 0, r.stdout + r.stderr
    assert named in r.stdout + r.stderr


# --- (b) the README is a five-minute read ---------------------------------------------------------------


def test_the_readme_is_short() -> None:
    text = README.read_text()
    assert len(text) <= README_MAX_CHARS, f"README.md has {len(text)} characters; move detail to docs/"
    long_cells = [c for c in table_cells(text) if len(c) > CELL_MAX_CHARS]
    assert not long_cells, f"README table cells over {CELL_MAX_CHARS} characters: {long_cells}"


def test_the_readme_says_paths_are_relative_to_the_working_folder() -> None:
    assert "relative to the folder you run the command" in " ".join(README.read_text().split())


# --- (c) nothing points outside the repository ----------------------------------------------------------


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_link_points_outside_the_repository(page: Path) -> None:
    bad = {target: why for target in link_targets(page.read_text())
           if (why := outside_the_repository(page, target))}
    assert not bad, f"{page.relative_to(ROOT)}: {bad}"


def test_the_readme_links_into_docs() -> None:
    targets = [t.split("#", 1)[0] for t in link_targets(README.read_text()) if t.startswith("docs/")]
    assert targets and all((ROOT / t).is_file() for t in targets), targets


def test_the_link_check_can_fail(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    text = """\
See [the design](../shared/DESIGN.md), [Hydra](https://hydra.cc), <https://example.com/x>,
https://example.org and [ok](#here); `curl http://example.net` and [local](http://127.0.0.1:8080/v2).

```bash
curl https://example.com/in-a-code-block
```
"""
    targets = link_targets(text)
    assert targets == ["../shared/DESIGN.md", "https://hydra.cc", "#here", "http://127.0.0.1:8080/v2",
                       "https://example.com/x", "https://example.org"], targets
    bad = [t for t in targets if outside_the_repository(page, t)]
    assert bad == ["../shared/DESIGN.md", "https://hydra.cc", "https://example.com/x", "https://example.org"]


# --- (d) the architecture page names every module -------------------------------------------------------


def test_architecture_names_every_module() -> None:
    text = (DOCS / "architecture.md").read_text()
    missing = []
    for path in sorted((ROOT / "sweep").rglob("*.py")):
        if path.name == "__init__.py":
            continue
        relative = path.relative_to(ROOT)
        dotted = ".".join(relative.with_suffix("").parts)
        if relative.as_posix() not in text and not re.search(rf"(?<![\w.]){re.escape(dotted)}(?![\w])", text):
            missing.append(relative.as_posix())
    assert not missing, f"docs/architecture.md does not name: {missing}"
