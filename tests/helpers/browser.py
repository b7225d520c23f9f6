"""The MLflow UI as a user sees it: a real headless Chromium (Debian's ``chromium``, installed by the
Makefile) driven by Playwright, which reads the rendered text of a page.

Playwright's own browser downloads are never used (``playwright install`` cannot reach its CDN here):
``executable_path`` points at the system ``chromium``. The tests run as root, hence ``--no-sandbox``;
``--disable-dev-shm-usage`` because containers often have a tiny /dev/shm.

What MLflow 3.17.2's UI (a hash-routed single-page app) needs, as found with this helper:

- The UI has two views, switched top left ("GenAI" / "Model training"); the browser keeps the choice in its
  local storage (``mlflow.workflowType_v1``: the JSON string ``"genai"`` or ``"machine_learning"``), GenAI
  until a person picks the other. The experiment's ``mlflow.experimentKind`` tag does not choose it. In the
  GenAI view ``/#/experiments/<id>`` (and a click on the experiment in the experiment list) opens the Overview
  (Usage/Quality/Tool calls of traces), which greets a browser with a "Detect Issues in Your Traces" popover.
- ``<server>/#/experiments/<id>/runs`` is the runs table in either view ("Training runs" in GenAI's, "Runs"
  in Model training's); ``/#/experiments/<id>?workflowType=machine_learning`` opens the Model training view
  on it without storing it, so the experiment list's links still open the Overview until the switch is
  clicked once.
- Nested runs (tag ``mlflow.parentRunId``) are listed collapsed under their parent: the parent's Run Name
  cell has an expander button to click (``expand_child_runs``). No URL parameter expands them: which parents
  are open is the experiment page's state in local storage, ``MLflowLocalStorage-1.1-ExperimentPage-["<id>"]-
  ReactComponentState`` (JSON; ``runsExpanded``: ``{"<run id>": true}``), left out of shared views; a
  ``searchFilter`` on the parent's id lists them under the parent, collapsed, all the same. The UI expands a
  parent by itself only on a browser's first visit of the experiment and only for children tagged
  ``mlflow.runType=evaluation``.
- Hence the server ``sweep ui`` starts for a store (``mlflow server --app-name sweep-ui``, sweep/tracking/ui_app.py)
  serves MLflow's index page, which every URL of the UI loads first, with a script that sets both before
  MLflow's app reads them (Model training where the browser has no view yet; each sweep's parent expanded and
  its tasks' metric columns shown, once per browser): a fresh browser that opens the root, the experiment list
  or a bookmarked experiment lands on the trials under their parents (tests/test_mlflow_ui.py). The URL it
  prints, ``<server>/sweep/open?experiment=<id>&parent=<run id>``, sets them too, then shows the runs table.
- The runs table cuts a run's name with an ellipsis at its column's width (about 18 characters of a parent's
  name): ``run_name_cells`` reads the part shown.
- Metric and param columns are hidden by default (the default columns are Dataset, Source, Models; the
  experiment page's state's ``selectedColumns``, ids such as ``metrics.`acc```, which sweep ui's page sets):
  "Columns" menu, click the key's entry (``show_run_columns``). A shared view (experiment tag
  ``mlflow.sharedViewState.<key>`` = JSON ``{"selectedColumns": ["metrics.`acc`"]}``, opened with
  ``?viewStateShareKey=<key>``) shows them too, but writes to the experiment.
- A metric shows every digit, as JavaScript's ``String(value)`` (``mlflow_metric_text``).
- ``<server>/#/models/<name>`` is a registered model's page: rows "Version 2 | <date> | ... | @ champion".
  ``<server>/#/models``, the registry, opens with a modal ("Flexible, governed deployments with the new Model
  Registry UI"): reading the page works through it, a click needs it closed first (``dismiss_dialog``).
- The body's innerText lists the runs table column block by column block (pinned run names first, then
  the values), so a name and its value are paired by ``grid_rows``, which joins a row's parts.
"""

from __future__ import annotations

import os
import shutil
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path

import pytest

LAUNCH_ARGS = ["--no-sandbox", "--disable-dev-shm-usage"]
VIEWPORT = {"width": 1920, "height": 1200}  # wide enough that the runs table shows its metric columns


def chromium_path() -> str:
    """The system Chromium's path; skips the test when neither it nor Playwright is installed, except in
    CI (CI=true), where `make install` must have put both there: a UI test that silently skips proves nothing."""
    missing = None
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing = "no playwright (it is in the dev extra: make install)"
    path = shutil.which("chromium")
    if path is None:
        missing = "no `chromium` on PATH (make install puts Debian's there: apt-get install chromium)"
    if missing:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(missing)
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


def grid_rows(page) -> list[str]:
    """The text of each table row on the page, one string per row, its cells joined by `` | ``.

    MLflow's runs table (ag-grid) splits a row into a pinned part (checkbox, run name) and a scrolling
    part (metrics, params), two ``role=row`` elements of one ``aria-rowindex``: they are joined here, so
    a run's name and its metric values are in one string. Plain ``<tr>`` rows (the registered model's
    versions table) are one string each."""
    return page.evaluate(
        """() => {
            const rows = new Map();
            document.querySelectorAll('[role="row"], tr').forEach((row, i) => {
                const key = row.getAttribute('aria-rowindex') ?? `tr-${i}`;
                const cells = [...row.querySelectorAll('[role="gridcell"], [role="cell"], td, th')];
                const texts = (cells.length ? cells : [row]).map(c => c.innerText.replace(/\\s+/g, ' ').trim());
                rows.set(key, [...(rows.get(key) ?? []), ...texts.filter(t => t)]);
            });
            return [...rows.values()].map(texts => texts.join(' | ')).filter(t => t);
        }"""
    )


def wait_for_rows(page, expected: list[list[str]], timeout_s: float = 60, *, screenshot: Path | None = None,
                  poll_s: float = 0.25) -> list[str]:
    """Poll until, for each entry of ``expected``, one table row holds all of its strings (a run's name and
    its metric value); return the rows. On timeout: AssertionError with the unmatched entries, the URL and
    the rows."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            rows = grid_rows(page)
        except Exception:  # navigating: read again
            rows = []
        missing = [want for want in expected if not any(all(s in row for s in want) for row in rows)]
        if not missing:
            return rows
        if time.monotonic() >= deadline:
            if screenshot is not None:
                save_screenshot(page, screenshot)
            shown = "\n".join(rows) or page_text(page)[-3000:]
            raise AssertionError(f"no row on {page.url} after {timeout_s:.0f} s holds {missing!r}\n"
                                 f"--- rows ---\n{shown}")
        time.sleep(poll_s)


def rendered_text(url: str, wait_for: list[str], timeout_s: float = 60, *, screenshot: Path | None = None) -> str:
    """Open ``url`` in a fresh headless Chromium, wait until every string of ``wait_for`` is in the page's
    text, and return the body's ``innerText``. On timeout: AssertionError with the URL and the text's tail
    (and a screenshot to ``screenshot``, when given)."""
    with browser_page(timeout_s) as page:
        page.goto(url, wait_until="domcontentloaded")
        return wait_for_text(page, wait_for, timeout_s, url=url, screenshot=screenshot)


# --- MLflow 3.17's runs table -------------------------------------------------------------------------

RUN_NAME_CELL = '[role="gridcell"][col-id="attributes.`Run Name`"]'


def expand_child_runs(page, rounds: int = 5) -> int:
    """Expand every parent run of the runs table; return how many rows were expanded.

    MLflow lists a run with a ``mlflow.parentRunId`` tag under its parent, collapsed: the parent's Run Name
    cell holds an expander button (the only button in that cell; its children's cells have none). Each
    parent is clicked once (a fresh browser profile starts with all collapsed; a second click would
    collapse it), again for parents that the first clicks revealed (nested sweeps), up to ``rounds``
    times. Only rows that ag-grid rendered are seen: enough for the few runs of a test."""
    expanded: set[str] = set()
    for _ in range(rounds):
        clicked = 0
        cells = page.locator(RUN_NAME_CELL).filter(has=page.locator("button"))
        for i in range(cells.count()):
            cell = cells.nth(i)
            run = cell.locator("a").first.get_attribute("href") or f"row-{i}"
            if run in expanded:
                continue
            cell.locator("button").first.click()
            expanded.add(run)
            clicked += 1
        if not clicked:
            break
        page.wait_for_timeout(300)  # the children's rows render
    return len(expanded)


def run_name_cells(page) -> list[tuple[str, str]]:
    """The runs table's run names top to bottom (by ``aria-rowindex``: ag-grid's DOM order may differ), each
    as (the name, the part a person reads): the name's span cuts a wider text with an ellipsis, so the part
    read is the characters that end left of the span's right edge less the ellipsis' width."""
    return [tuple(pair) for pair in page.evaluate(
        """() => [...document.querySelectorAll('[role="row"]')]
            .filter(row => row.querySelector('[col-id="attributes.`Run Name`"] a span'))
            .sort((a, b) => Number(a.getAttribute('aria-rowindex')) - Number(b.getAttribute('aria-rowindex')))
            .map(row => {
                const span = row.querySelector('[col-id="attributes.`Run Name`"] a span');
                const text = span.textContent, node = span.firstChild;
                if (!node || span.scrollWidth <= span.clientWidth) return [text, text];
                const style = getComputedStyle(span);
                const ctx = document.createElement('canvas').getContext('2d');
                ctx.font = `${style.fontStyle} ${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
                const edge = span.getBoundingClientRect().right - ctx.measureText('\u2026').width;
                const range = document.createRange();
                let shown = 0;
                for (let k = 1; k <= text.length; k++) {
                    range.setStart(node, k - 1);
                    range.setEnd(node, k);
                    if (range.getBoundingClientRect().right > edge) break;
                    shown = k;
                }
                return [text, text.slice(0, shown)];
            })"""
    )]


def show_run_columns(page, names: list[str]) -> None:
    """Show the runs table's columns of these metric or param keys (by default MLflow 3 shows only the
    attributes Dataset, Source and Models): open the "Columns" menu and click each key's entry (a tree
    node titled with the key), unless a column of that key is already shown."""
    missing = [name for name in names
               if not page.locator(f'[role="columnheader"][col-id$=".`{name}`"]').count()]
    if not missing:
        return
    page.get_by_role("button", name="Columns").click()
    for name in missing:
        page.locator(f'span[title="{name}"]').first.click()
    page.keyboard.press("Escape")


def open_mlflow_runs(page, server_url: str, experiment_id: str, first_run: str, *, columns: Sequence[str] = (),
                     expand: bool = True, timeout_s: float = 60) -> None:
    """Open an experiment's runs table on ``page`` as a user would read it: wait for the run named
    ``first_run`` (a top-level run: the parent of a sweep), expand the parents, show ``columns``."""
    url = experiment_runs_url(server_url, experiment_id)
    page.goto(url, wait_until="domcontentloaded")
    wait_for_text(page, [first_run], timeout_s, url=url)
    if expand:
        expand_child_runs(page)
    if columns:
        show_run_columns(page, list(columns))


def dismiss_dialog(page, button: str, wait_s: float = 10) -> None:
    """Click ``button`` of a dialog MLflow greets a page's first visit with ("Got it" of the GenAI overview's
    popover, "Close" of the registry's modal), when one shows within ``wait_s``: until then it holds every
    other click, as it would a person's."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.get_by_role("dialog").get_by_role("button", name=button, exact=True).first.click(timeout=wait_s * 1000)
    except PlaywrightTimeout:
        pass


def mlflow_metric_text(value: float) -> str:
    """A metric value as the runs table shows it: JavaScript's ``String(number)``, every digit kept (no
    rounding: 0.123456789 shows as such). Python's ``repr`` has the same shortest round-trip digits but
    other rules for where to write an exponent (JavaScript: below 1e-6 or from 1e21 on; ``1e-7``, ``0.00005``,
    ``2``, where Python writes ``1e-07``, ``5e-05``, ``2.0``)."""
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")):
        return {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}[repr(value)]
    if value == 0:
        return "0"
    sign, digit_tuple, exponent = Decimal(repr(abs(value))).normalize().as_tuple()
    digits = "".join(map(str, digit_tuple))
    k, n = len(digits), exponent + len(digits)  # value = 0.<digits> * 10**n
    minus = "-" if value < 0 else ""
    if k <= n <= 21:
        return minus + digits + "0" * (n - k)
    if 0 < n <= 21:
        return minus + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return minus + "0." + "0" * -n + digits
    mantissa = digits if k == 1 else digits[0] + "." + digits[1:]
    return f"{minus}{mantissa}e{'+' if n - 1 > 0 else '-'}{abs(n - 1)}"
