"""The MLflow UI as a user sees it: a real headless Chromium (Debian's ``chromium``, installed by the
Makefile) driven by Playwright, which reads the rendered text of a page.

Playwright's own browser downloads are never used (``playwright install`` cannot reach its CDN here):
``executable_path`` points at the system ``chromium``. The tests run as root, hence ``--no-sandbox``;
``--disable-dev-shm-usage`` because containers often have a tiny /dev/shm.

MLflow 3.17's UI is a hash-routed single-page app:

- ``<server>/#/experiments/<id>/runs``: the experiment's runs table (``/#/experiments/<id>`` alone opens
  the experiment's overview for some experiment kinds, so the helpers name the runs tab explicitly);
- ``<server>/#/models/<name>``: a registered model's page, its versions table with their aliases.
"""

from __future__ import annotations

import shutil
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

LAUNCH_ARGS = ["--no-sandbox", "--disable-dev-shm-usage"]
VIEWPORT = {"width": 1920, "height": 1200}  # wide enough that the runs table shows its metric columns


def chromium_path() -> str:
    """The system Chromium's path; skips the test when neither it nor Playwright is installed."""
    pytest.importorskip("playwright.sync_api", reason="playwright is in the dev extra: make install")
    path = shutil.which("chromium")
    if path is None:
        pytest.skip("no `chromium` on PATH (make install puts Debian's there: apt-get install chromium)")
    return path


def experiment_runs_url(server_url: str, experiment_id: str) -> str:
    """The runs table of an experiment in MLflow 3's UI."""
    return f"{server_url.rstrip('/')}/#/experiments/{experiment_id}/runs"


def registered_model_url(server_url: str, name: str) -> str:
    """A registered model's page (its versions, with their aliases) in MLflow 3's UI."""
    return f"{server_url.rstrip('/')}/#/models/{urllib.parse.quote(name, safe='')}"


@contextmanager
def browser_page(timeout_s: float = 60) -> Iterator:
    """A Playwright ``Page`` of a fresh headless system Chromium, closed (with the browser) on exit."""
    executable = chromium_path()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, headless=True, args=LAUNCH_ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.set_default_timeout(timeout_s * 1000)
            yield page
        finally:
            browser.close()


def page_text(page) -> str:
    """What a user reads on the page: the body's ``innerText`` (only rendered, visible text)."""
    try:
        return page.evaluate("() => document.body ? document.body.innerText : ''")
    except Exception:  # the page navigated while we read it: the next poll reads it again
        return ""


def wait_for_text(page, wait_for: list[str], timeout_s: float = 60, *, url: str | None = None,
                  screenshot: Path | None = None, poll_s: float = 0.25) -> str:
    """Poll the page's text until every string of ``wait_for`` is in it, and return that text.

    On timeout: an AssertionError naming the missing strings, the URL and the tail of the page text (and
    a screenshot to ``screenshot`` first, when given)."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = page_text(page)
        missing = [s for s in wait_for if s not in text]
        if not missing:
            return text
        if time.monotonic() >= deadline:
            if screenshot is not None:
                save_screenshot(page, screenshot)
            raise AssertionError(
                f"not on {url or page.url} after {timeout_s:.0f} s: {missing!r}\n"
                f"--- page text (tail) ---\n{text[-3000:]}"
            )
        time.sleep(poll_s)


def save_screenshot(page, path: Path) -> Path:
    """A full-page PNG of what the browser shows now (to look at a failing UI test)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=True)
    return path


def rendered_text(url: str, wait_for: list[str], timeout_s: float = 60, *, screenshot: Path | None = None,
                  interact: Callable | None = None) -> str:
    """Open ``url`` in headless Chromium, wait until every string of ``wait_for`` is in the page's text,
    and return the body's ``innerText``.

    ``interact(page)``, when given, runs after the page loaded and before the wait (e.g. expanding a
    row). On timeout: AssertionError with the URL and the page text's tail (and a screenshot if asked)."""
    with browser_page(timeout_s) as page:
        page.goto(url, wait_until="domcontentloaded")
        if interact is not None:
            interact(page)
        return wait_for_text(page, wait_for, timeout_s, url=url, screenshot=screenshot)


def mlflow_runs_text(server_url: str, experiment_id: str, wait_for: list[str], timeout_s: float = 60, *,
                     expand_parents: bool = True, screenshot: Path | None = None) -> str:
    """The rendered text of an experiment's runs table, with nested (child) runs made visible.

    MLflow's table shows a parent run's children collapsed under it; ``expand_parents`` clicks each
    parent row's expander until no collapsed one is left."""
    return rendered_text(experiment_runs_url(server_url, experiment_id), wait_for, timeout_s,
                         screenshot=screenshot, interact=expand_child_runs if expand_parents else None)


def expand_child_runs(page, timeout_s: float = 30) -> None:
    """Expand every collapsed parent run of the runs table (no-op once the table has no collapsed row)."""
    raise NotImplementedError  # filled in below once the UI is inspected
