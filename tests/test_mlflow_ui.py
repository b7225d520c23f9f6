"""MLflow's UI on a real sweep, as its user opens it: the sweep's last line says ``runs: sweep ui out_dir=…``;
that command starts MLflow's UI on the sweep's store and prints the URL of its runs (sweep's page on that
server, sweep/tracking/ui_app.py); a real headless Chromium (tests/helpers/browser.py), fresh, opens it and
lands on the runs table with the sweep's trials listed under their parent, and from then on MLflow's
experiment list lands there too. What MLflow 3.17's UI does is in sweep/tracking/ui_urls.py's docstring; this
test holds it to that.

The sweep: the tiny RoBERTa on synthetic WNLI-layout data of 800 training rows, two seeds, one epoch (50
steps, about as many as the demo's 4 epochs of 200 rows): it learns (0.94 and 0.81 where a constant answer
scores 0.5), so its best becomes ``champion``. One epoch is one evaluation per trial: the runs table shows a
metric's last logged value, and with one evaluation that is the trial's result as results.csv has it (its
best evaluation; with several, the table shows the last one's).

Without Ray, a store with two sweeps' runs (written by the project's own tracking classes, as a sweep writes
them) served by ``sweep ui tracking_uri=...``: a fresh browser that opens the server's root, its experiment
list or a bookmarked experiment page, never the printed link, lands on the runs table, each parent's trials
under it, the metric's column in view, the two parents' names told apart where the table cuts them; what a
person changes there stays.
"""

from __future__ import annotations

import csv
import json
import os
import queue
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

from tests.helpers.sweeps import sweep_cmd

TIMEOUT_S = 60
UI_START_S = 180  # mlflow server's start, on a busy 2-core machine
TASK, SEEDS = "WNLI", (38, 39)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sweep_ui(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    """``python -m sweep ui ARGS`` to its end (a mistake, or a tracking server's URLs)."""
    return subprocess.run([sys.executable, "-m", "sweep", "ui", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


@dataclass
class RunningUi:
    proc: subprocess.Popen
    lines: list[str]
    stderr: Path

    def url(self, label: str) -> str:
        """The URL of the printed line ``<label>: URL ...``."""
        (url,) = [line.split()[1] for line in self.lines if line.startswith(f"{label}: http")]
        return url


def start_ui(command: list[str], cwd: Path, stderr: Path) -> RunningUi:
    """``sweep ui`` in the background, as a person starts it; its lines until it says it is running."""
    proc = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=stderr.open("w"), text=True)
    got: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [got.put(line.rstrip("\n")) for line in proc.stdout], daemon=True).start()
    lines: list[str] = []
    deadline = time.monotonic() + UI_START_S
    while not any(line.startswith("sweep ui: running") for line in lines):
        assert proc.poll() is None or not got.empty(), f"sweep ui ended ({proc.returncode}):\n{stderr.read_text()}"
        assert time.monotonic() < deadline, f"sweep ui said only {lines}:\n{stderr.read_text()[-3000:]}"
        try:
            lines.append(got.get(timeout=1))
        except queue.Empty:
            pass
    return RunningUi(proc, lines, stderr)


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> dict:
    """The sweep, run as a person types it in a folder of their own: relative paths, the default store
    (runs/mlflow.db in that folder)."""
    from tests.helpers.browser import chromium_path

    chromium_path()  # skip before the sweep when there is no browser
    from sweep.data.synthetic import write_synthetic_glue
    from tests.helpers.lanes import RAY_OF_ITS_OWN

    work = tmp_path_factory.mktemp("project")
    write_synthetic_glue(work / "data", [TASK], n_train=800)
    started = time.monotonic()
    # A Ray of its own, as conftest's ray_of_its_own gives a test: that fixture is a function's, set up after this
    # module's, and without it the sweep's Ray joined the cluster_utils head of the test beside it (two CI runs
    # ended here: "set cluster.storage_path=…", the sweep saw that cluster's nodes)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_ADDRESS", RAY_OF_ITS_OWN)
        done = sweep_cmd("experiment=demo", f"task={TASK}", "storage.data_dir=data", "train.epochs=1",
                         "train.max_train_samples=null", f"sweep.seeds=[{','.join(map(str, SEEDS))}]", "out_dir=out",
                         cwd=work, cache=cache_dir)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    print(f"the sweep took {time.monotonic() - started:.0f} s")
    assert "registry: tiny-roberta-WNLI version 1, now champion" in done.stdout, done.stdout[-3000:]
    return {"work": work, "out": work / "out", "stdout": done.stdout}


@pytest.mark.ray
@pytest.mark.slow
def test_sweep_ui_shows_the_sweeps_runs_and_its_champion(swept: dict, tmp_path: Path) -> None:
    from mlflow import MlflowClient

    from tests.helpers.browser import (
        browser_page,
        dismiss_dialog,
        mlflow_metric_text,
        show_run_columns,
        wait_for_rows,
        wait_for_text,
    )

    work, out = swept["work"], swept["out"]
    # The sweep's last line says how to look at it: the command, with its out_dir absolute.
    last = swept["stdout"].rstrip().splitlines()[-1]
    assert last == f"runs: sweep ui out_dir={out}", swept["stdout"][-2000:]
    command = shlex.split(last.removeprefix("runs: "))
    assert command[:2] == ["sweep", "ui"]
    store = json.loads((out / "mlflow-parent.json").read_text())
    assert store["uri"] == f"sqlite:///{work / 'runs' / 'mlflow.db'}"
    client = MlflowClient(store["uri"])
    parent = client.get_run(store["run_id"]).info.run_name
    trials = list(csv.DictReader((out / "results.csv").open()))
    assert sorted(int(t["seed"]) for t in trials) == list(SEEDS) and all(t["best_epoch"] == "1" for t in trials)
    expected = {}  # run name -> its metric as results.csv has it
    for trial in trials:
        name = client.get_run(trial["run_id"]).info.run_name
        assert name == f"{TASK} seed {trial['seed']}"
        expected[name] = mlflow_metric_text(float(trial["metric.acc"]))
    assert len(set(expected.values())) == len(SEEDS), expected  # distinct: a value on the wrong run would show
    champion = client.get_model_version_by_alias("tiny-roberta-WNLI", "champion").version

    # ... typed in another terminal (python -m sweep ui is `sweep ui`), on a free port.
    port = free_port()
    ui = start_ui([sys.executable, "-m", "sweep", *command[1:], f"port={port}"], work, tmp_path / "ui.err")
    server = f"http://127.0.0.1:{port}"
    try:
        eid, run_id = store["experiment_id"], store["run_id"]
        assert ui.lines == [
            f"sweep ui: starting MLflow's UI on {store['uri']} at {server}",
            f"runs: {server}/sweep/open?experiment={eid}&parent={run_id} (experiment glue-tiny-roberta)",
            f"sweep: {server}/#/experiments/{eid}/runs/{run_id}?workflowType=machine_learning (its parent "
            f"run: summary metrics, config, results)",
            f"models: {server}/#/models (the registry: each model's versions, @ champion)",
            "sweep ui: running until Ctrl-C or SIGTERM",
        ], ui.lines
        # A tracking server is not started again: its URLs (the runs table in the Model training view: it
        # may have no sweep page), the store's sweep experiments listed.
        remote = sweep_ui(f"tracking_uri={server}", cwd=work)
        assert remote.returncode == 0, remote.stderr
        assert remote.stdout.splitlines()[1:] == [
            f"runs: {server}/#/experiments/{eid}?workflowType=machine_learning (experiment glue-tiny-roberta)",
            ui.lines[3]], remote.stdout

        started = time.monotonic()
        with browser_page(TIMEOUT_S) as page:  # a fresh browser: nothing in its local storage
            # (a) The printed URL lands on the runs table (Model training view, not the GenAI overview) with
            # the parent expanded: the trials listed under it with no click on its +, each with its metric
            # as results.csv has it ("Columns": MLflow shows no metric column by default).
            page.goto(ui.url("runs"), wait_until="domcontentloaded")
            on_runs_table(page, eid, parent, tmp_path / "runs.png")
            show_run_columns(page, ["acc"])
            trials_listed(page, expected, tmp_path / "trials.png")
            # ... because it set what the two clicks ("Model training", the parent's +) set in the browser.
            stored = page.evaluate("() => ({...localStorage})")
            assert stored["mlflow.workflowType_v1"] == '"machine_learning"', stored
            state = json.loads(stored[f'MLflowLocalStorage-1.1-ExperimentPage-["{eid}"]-ReactComponentState'])
            assert state["runsExpanded"] == {run_id: True}, state
            # From MLflow's experiment list, a click lands on the runs table too (the browser's switch says
            # Model training now; a fresh browser's says GenAI): the trials still listed under the parent.
            page.get_by_role("link", name="Experiments", exact=True).first.click()
            click_experiment(page, eid, "glue-tiny-roberta")
            on_runs_table(page, eid, parent, tmp_path / "clicked.png")
            trials_listed(page, expected, tmp_path / "clicked-trials.png")

            # The sweep's parent run: its summary metrics.
            page.goto(ui.url("sweep"), wait_until="domcontentloaded")
            wait_for_text(page, [parent, "WNLI.best", "WNLI.learned"], TIMEOUT_S, url=page.url,
                          screenshot=tmp_path / "parent.png")

            # (b) The registry: the model's champion, and on its page the alias on the version it names.
            page.goto(ui.url("models"), wait_until="domcontentloaded")
            wait_for_rows(page, [["tiny-roberta-WNLI", "champion"]], TIMEOUT_S, screenshot=tmp_path / "models.png")
            dismiss_dialog(page, "Close")  # "Flexible, governed deployments with the new Model Registry UI"
            page.get_by_role("link", name="tiny-roberta-WNLI", exact=True).first.click()
            page.wait_for_url(re.compile(r"#/models/tiny-roberta-WNLI$"))
            wait_for_text(page, ["Registered at"], TIMEOUT_S, url=page.url)  # its versions table
            rows = wait_for_rows(page, [[f"Version {champion}", "champion"]], TIMEOUT_S,
                                 screenshot=tmp_path / "model.png")
            assert sum("champion" in row for row in rows if row.startswith("Version")) == 1, rows
        print(f"the browser's checks took {time.monotonic() - started:.0f} s")
    finally:
        if ui.proc.poll() is None:
            ui.proc.send_signal(signal.SIGTERM)  # as `kill` does to a UI left in the background
        code = ui.proc.wait(timeout=60)
    err = ui.stderr.read_text()
    assert code == 0 and "Traceback" not in err, err[-3000:]
    assert not answers(server), "the MLflow server outlived sweep ui"


def on_runs_table(page, experiment_id: str, parent: str, screenshot: Path) -> None:
    """The runs table of the experiment in the Model training view: the sweep's parent listed, no overview."""
    from tests.helpers.browser import wait_for_text

    text = wait_for_text(page, ["Run Name", parent, "Model registry"], TIMEOUT_S, url=page.url, screenshot=screenshot)
    assert f"#/experiments/{experiment_id}/runs" in page.url and "workflowType=machine_learning" in page.url
    assert "Token Usage" not in text


def trials_listed(page, expected: dict[str, str], screenshot: Path) -> None:
    """Each trial's row (its name and its metric) on the runs table, nothing clicked: under the parent,
    expanded. Two metrics, distinct: a value on the wrong run's row would show."""
    from tests.helpers.browser import wait_for_rows

    rows = wait_for_rows(page, [[name, value] for name, value in expected.items()], TIMEOUT_S, screenshot=screenshot)
    (first, second) = expected
    assert not any(first in row and expected[second] in row for row in rows), rows


def click_experiment(page, experiment_id: str, name: str) -> None:
    """In MLflow's experiment list, click the experiment's name (its link in the table)."""
    link = page.locator(f'a[href="#/experiments/{experiment_id}"]', has_text=name)
    link.first.wait_for(timeout=TIMEOUT_S * 1000)
    link.first.click()


# --- any URL of sweep ui's server: the runs table, for a browser that never opened the printed link ---------

EXPERIMENT = "glue-tiny-roberta"


@dataclass(frozen=True)
class TwoSweeps:
    uri: str
    experiment_id: str
    parents: dict[str, str]  # run id -> name, oldest first
    trials: dict[str, dict[str, str]]  # parent run id -> {trial name: its acc as the runs table shows it}


def record_sweep(uri: str, out: Path, seeds: tuple[int, ...]) -> tuple[str, str, dict[str, str]]:
    """A sweep's runs as a sweep writes them, with the project's tracking classes: its parent (its config a
    real Settings'), one trial run per seed with an evaluation, the end (summary metrics). (parent run id,
    its name, {trial name: its acc as shown})."""
    from sweep.config.tasks import load_task
    from sweep.config.validate import compose_settings
    from sweep.results.records import TrialRecord, summarize
    from sweep.tracking import SweepTracker, TrialLogger
    from tests.helpers.browser import mlflow_metric_text

    settings = compose_settings(f"task={TASK}", "model=tiny-roberta", f"sweep.seeds=[{','.join(map(str, seeds))}]")
    tracker = SweepTracker(uri, EXPERIMENT)
    parent = tracker.start(asdict(settings))
    shown, records = {}, []
    for seed in seeds:
        acc = 0.5 + seed / 1000  # distinct: a value on the wrong run's row would show
        trial = TrialLogger(uri, tracker.experiment_id, parent, f"{TASK} seed {seed}", {"task": TASK, "seed": seed})
        run_id = trial.start()
        trial.log_evaluation(1, {"acc": acc, "score": acc, "train_loss": 0.5})
        trial.end("FINISHED")
        records.append(TrialRecord(TASK, seed, metrics={"acc": acc}, score=acc, best_epoch=1, epochs_done=1,
                                   run_id=run_id))
        shown[f"{TASK} seed {seed}"] = mlflow_metric_text(acc)
    out.mkdir(parents=True, exist_ok=True)
    tracker.finish(records, summarize(records, [load_task(TASK)]), out)
    return parent, tracker.run_name, shown


@pytest.fixture(scope="module")
def two_sweeps(tmp_path_factory: pytest.TempPathFactory) -> TwoSweeps:
    """A store with two sweeps of one experiment that differ only in their start: the same task, model and
    number of seeds (other seeds), as a person's second try of a sweep is."""
    work = tmp_path_factory.mktemp("two-sweeps")
    uri = f"sqlite:///{work / 'mlflow.db'}"
    parents, trials = {}, {}
    for i, seeds in enumerate([(38, 39), (40, 41)]):
        if i:  # a parent's name has its start to the second: a person's next sweep starts seconds later at least
            second = int(time.time())
            while int(time.time()) == second:
                time.sleep(0.05)
        parent, name, shown = record_sweep(uri, work / f"out{i}", seeds)
        parents[parent], trials[parent] = name, shown
    from mlflow import MlflowClient

    experiment_id = MlflowClient(uri).get_experiment_by_name(EXPERIMENT).experiment_id
    return TwoSweeps(uri, experiment_id, parents, trials)


@pytest.fixture(scope="module")
def ui_of_two_sweeps(two_sweeps: TwoSweeps, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``sweep ui tracking_uri=<the store>`` running on a free port (a browser is needed: skips without one);
    its server's URL."""
    from tests.helpers.browser import chromium_path

    chromium_path()
    work = tmp_path_factory.mktemp("ui")
    ui = start_ui([sys.executable, "-m", "sweep", "ui", f"tracking_uri={two_sweeps.uri}", f"port={free_port()}"],
                  work, work / "ui.err")
    try:
        yield ui.url("models").removesuffix("/#/models")
    finally:
        ui.proc.send_signal(signal.SIGTERM)
        assert ui.proc.wait(timeout=60) == 0, ui.stderr.read_text()[-3000:]


def runs_of_two_sweeps(page, sweeps: TwoSweeps, screenshot: Path) -> list[tuple[str, str]]:
    """The experiment's runs table in the Model training view (not GenAI's overview), nothing clicked on
    it: each parent with its own trials listed under it, each trial's acc in a column in view, the two
    parents' names told apart as the table cuts them. The table's (name, part shown) top to bottom."""
    from tests.helpers.browser import run_name_cells, wait_for_rows, wait_for_text

    text = wait_for_text(page, ["Run Name", *sweeps.parents.values()], TIMEOUT_S, url=page.url,
                         screenshot=screenshot)
    assert "Token Usage" not in text and "Detect Issues" not in text, text[-2000:]  # the overview, its popover
    assert re.search(rf"#/experiments/{sweeps.experiment_id}(/runs)?([?]|$)", page.url), page.url
    wait_for_rows(page, [[name, acc] for trials in sweeps.trials.values() for name, acc in trials.items()],
                  TIMEOUT_S, screenshot=screenshot)
    column = page.locator('[role="columnheader"][col-id="metrics.`acc`"]').first
    box = column.bounding_box()  # shown, and in view without scrolling the table
    assert box is not None and box["x"] + box["width"] <= page.viewport_size["width"], box

    def nested(cells: list[tuple[str, str]]) -> bool:
        """Top to bottom, each parent followed by its own trials (a flat list puts a trial above its parent)."""
        names = [name for name, _ in cells]
        return all(name in names and sorted(names[names.index(name) + 1:][:len(sweeps.trials[parent])])
                   == sorted(sweeps.trials[parent]) for parent, name in sweeps.parents.items())

    deadline = time.monotonic() + TIMEOUT_S
    while not nested(cells := run_name_cells(page)) and time.monotonic() < deadline:
        time.sleep(0.25)  # the grid may still be laying its rows out
    assert nested(cells), cells
    read = [shown for name, shown in cells if name in sweeps.parents.values()]
    assert len(read) == 2 and read[0] != read[1], cells
    assert all(len(part) >= len("12-07 02:36:11") for part in read), cells  # the whole start is in view
    return cells


ENTRIES = {  # how a browser that never opened sweep ui's printed link gets to the runs
    "root": ("/", True),  # MLflow's home: its "Recent Experiments", clicked
    "experiment list": ("/#/experiments", True),  # the experiment list, clicked
    "bookmarked experiment": ("/#/experiments/{eid}", False),
}


@pytest.mark.parametrize("entry", list(ENTRIES))
def test_any_url_of_sweep_ui_opens_on_the_runs_with_trials_under_their_sweep(
        entry: str, two_sweeps: TwoSweeps, ui_of_two_sweeps: str, tmp_path: Path) -> None:
    """A fresh browser (nothing in its local storage) that opens any URL of the server ``sweep ui`` starts
    lands on the runs table, the trials under their parents, the metric shown: what the server's index page
    sets before MLflow's app reads it (sweep/tracking/ui_app.py)."""
    from tests.helpers.browser import browser_page

    path, click = ENTRIES[entry]
    with browser_page(TIMEOUT_S) as page:
        page.goto(ui_of_two_sweeps + path.format(eid=two_sweeps.experiment_id), wait_until="domcontentloaded")
        if click:
            click_experiment(page, two_sweeps.experiment_id, EXPERIMENT)
        runs_of_two_sweeps(page, two_sweeps, tmp_path / "runs.png")


def test_what_a_person_picks_in_the_ui_stays(two_sweeps: TwoSweeps, ui_of_two_sweeps: str, tmp_path: Path) -> None:
    """sweep ui's defaults are set once per browser, parent and column: a parent a person collapsed and a
    column they hid stay so the next time the UI loads, while a sweep's parent the browser has not seen yet
    opens expanded; a person's pick of the GenAI view is kept."""
    from sweep.tracking.ui_app import OFFERED_KEY, experiment_page_key
    from tests.helpers.browser import RUN_NAME_CELL, browser_page, run_name_cells, wait_for_text

    older, newer = two_sweeps.parents
    eid = two_sweeps.experiment_id
    acc = '[role="columnheader"][col-id="metrics.`acc`"]'

    def listed(page) -> set[str]:
        return {name for name, _ in run_name_cells(page)}

    def until(condition, page) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while not condition():
            assert time.monotonic() < deadline, (page.url, run_name_cells(page))
            time.sleep(0.25)

    with browser_page(TIMEOUT_S) as page:
        page.goto(f"{ui_of_two_sweeps}/#/experiments/{eid}", wait_until="domcontentloaded")
        runs_of_two_sweeps(page, two_sweeps, tmp_path / "runs.png")
        # the older sweep's parent collapsed (its expander), the metric's column hidden ("Columns", its entry)
        page.locator(RUN_NAME_CELL).filter(has=page.get_by_text(two_sweeps.parents[older], exact=True)) \
            .locator("button").first.click()
        until(lambda: not set(two_sweeps.trials[older]) & listed(page), page)
        page.get_by_role("button", name="Columns").click()
        page.locator('span[title="acc"]').first.click()
        page.keyboard.press("Escape")
        until(lambda: not page.locator(acc).count(), page)
        # as if the newer sweep had started since: the browser forgets it (its parent's entries alone), on a
        # page other than the experiment's, whose state MLflow keeps writing
        page.goto(f"{ui_of_two_sweeps}/#/experiments", wait_until="domcontentloaded")
        page.evaluate("""([offeredKey, stateKey, eid, run]) => {
            const offered = JSON.parse(localStorage.getItem(offeredKey));
            const state = JSON.parse(localStorage.getItem(stateKey));
            offered[eid].parents = offered[eid].parents.filter(p => p !== run);
            delete state.runsExpanded[run];
            localStorage.setItem(offeredKey, JSON.stringify(offered));
            localStorage.setItem(stateKey, JSON.stringify(state));
        }""", [OFFERED_KEY, experiment_page_key(eid), eid, newer])
        page.goto(f"{ui_of_two_sweeps}/", wait_until="domcontentloaded")  # the UI loaded again, from its root
        page.reload(wait_until="domcontentloaded")
        click_experiment(page, eid, EXPERIMENT)
        wait_for_text(page, [*two_sweeps.trials[newer]], TIMEOUT_S, url=page.url, screenshot=tmp_path / "again.png")
        assert not set(two_sweeps.trials[older]) & listed(page), run_name_cells(page)
        assert not page.locator(acc).count(), "the column hidden is shown again"
        # GenAI picked (the switch, top left): the experiment opens on GenAI's overview from then on
        page.get_by_role("radio", name="GenAI").or_(page.get_by_role("button", name="GenAI")).first.click()
        page.goto(f"{ui_of_two_sweeps}/", wait_until="domcontentloaded")
        page.reload(wait_until="domcontentloaded")
        click_experiment(page, eid, EXPERIMENT)
        wait_for_text(page, ["Overview"], TIMEOUT_S, url=page.url, screenshot=tmp_path / "genai.png")
        assert page.evaluate("() => localStorage.getItem('mlflow.workflowType_v1')") == '"genai"'


def test_the_index_page_carries_the_sweeps_defaults(two_sweeps: TwoSweeps) -> None:
    """What the index page's script is given (read from the store): each sweep experiment's parents, newest
    first, and its tasks' metric columns; put before MLflow's own script; nothing in it can end the script."""
    from mlflow import MlflowClient

    from sweep.tracking.ui_app import index_page, parent_metrics, sweep_defaults

    defaults = sweep_defaults(MlflowClient(two_sweeps.uri))
    assert defaults == {two_sweeps.experiment_id: {"parents": list(two_sweeps.parents)[::-1],
                                                   "columns": ["metrics.`acc`"]}}
    mlflow_index = '<!doctype html><html><head><meta charset="utf-8"/><script defer src="main.js"></script></head>'
    page = index_page(mlflow_index, defaults)
    assert page.index("sweep.ui.offered_v1") < page.index('src="main.js"'), page
    assert parent_metrics({"sweep.metrics": "acc,</script><b>,f1"}, {}) == ["acc", "f1"]
    assert parent_metrics({}, {"composed.task.RTE.metric": "acc", "composed.task.STS-B.metric": "pearson"}) == [
        "acc", "pearson"]  # a sweep from before the tag: its config's


# --- mistakes: one line, exit 2, nothing started ------------------------------------------------------


def test_sweep_ui_mistakes_are_one_line_and_start_nothing(tmp_path: Path) -> None:
    import sweep.cli.ui as ui
    from sweep.tracking import PARENT_FILE

    assert ui.PARENT_FILE == PARENT_FILE
    (tmp_path / "not-swept").mkdir()
    (tmp_path / "not-swept" / "results.csv").write_text("task\n")
    (tmp_path / "moved").mkdir()
    (tmp_path / "moved" / PARENT_FILE).write_text(json.dumps({"run_id": "r", "experiment_id": "1", "experiment": "e",
                                                              "uri": f"sqlite:///{tmp_path}/gone/mlflow.db"}))
    with socket.socket() as taken:  # a port this process listens on
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        (tmp_path / "runs").mkdir()
        (tmp_path / "runs" / "mlflow.db").touch()  # the default store exists: port= is what is wrong
        cases = [
            (["out_dir=nope"], f"error: out_dir: nope (in {tmp_path}): no such folder"),
            (["out_dir=not-swept"], f"error: out_dir: not-swept (in {tmp_path}) holds no record of a sweep's MLflow "
                                    f"run (mlflow-parent.json); it holds results.csv. The sweep ran with "
                                    f"tracking=none"),
            (["out_dir=moved"], f"error: out_dir: its sweep recorded to sqlite:///{tmp_path}/gone/mlflow.db "
                                f"(moved/mlflow-parent.json), and {tmp_path}/gone/mlflow.db is gone"),
            (["tracking_uri=sqlite:///nope.db"], f"error: tracking_uri: no MLflow store at {tmp_path}/nope.db"),
            (["out_dir=moved", "tracking_uri=sqlite:///mlflow.db"], "error: out_dir= or tracking_uri=: give one"),
            (["port=5x"], "error: port: expected a whole number, got '5x'"),
            (["port=0"], "error: port: must be a port in 1..65535, got 0"),
            ([f"port={port}"], f"error: port {port} is in use (by pid {os.getpid()}: "),
            (["tracking_uri=http://127.0.0.1:9"], "error: tracking_uri: no MLflow server answers at http://127.0.0.1:9"),
            (["colour=blue"], "error: colour: unknown option (known: out_dir, tracking_uri, port, host)"),
        ]
        for args, line in cases:
            done = sweep_ui(*args, cwd=tmp_path)
            assert (done.returncode, done.stdout) == (2, ""), (args, done)
            assert done.stderr.startswith(line) and done.stderr.count("\n") == 1, (args, done.stderr)
    shutil.rmtree(tmp_path / "runs")
    (tmp_path / "empty").mkdir()
    done = sweep_ui(cwd=tmp_path / "empty")  # no option: the default store, runs/mlflow.db here
    assert done.returncode == 2 and done.stderr.startswith(
        f"error: no MLflow store here: {tmp_path}/empty/runs/mlflow.db does not exist"), done.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(
        ["not-swept", "results.csv", "moved", PARENT_FILE, "empty"])  # no store was made
    assert sweep_ui("--help", cwd=tmp_path).stdout.startswith("usage: python -m sweep ui key=value ...")


def test_the_end_of_a_sweep_names_the_command_or_the_url() -> None:
    from sweep.tracking.ui_urls import look_line

    assert look_line("sqlite:////a/mlflow.db", "1", Path("/a/my out")) == "runs: sweep ui out_dir='/a/my out'"
    assert look_line("postgresql://db/mlflow", "1", Path("/a/out")) == "runs: sweep ui out_dir=/a/out"
    assert (look_line("https://me:pw@mlflow.example:5000/", "7", Path("/a/out"))
            == "runs: https://mlflow.example:5000/#/experiments/7?workflowType=machine_learning")


def test_the_landing_page_takes_only_mlflow_ids() -> None:
    """``/sweep/open`` on MLflow's own Flask app (the ``mlflow.app`` factory, outside uvicorn): the page for
    an experiment's and runs' ids, 400 for anything else; ``landing_url`` leaves out what the page refuses."""
    from importlib.metadata import entry_points

    from sweep.tracking.ui_app import APP_NAME, create_app
    from sweep.tracking.ui_urls import landing_url

    assert [e.value for e in entry_points(group="mlflow.app") if e.name == APP_NAME] == [
        "sweep.tracking.ui_app:create_app"], "pip install -e . registers the plugin (pyproject.toml)"
    client = create_app().test_client()
    run = "0123456789abcdef0123456789abcdef"
    page = client.get(f"/sweep/open?experiment=12&parent={run}")
    assert page.status_code == 200 and page.mimetype == "text/html"
    html = page.get_data(as_text=True)
    assert '"MLflowLocalStorage-1.1-ExperimentPage-[\\"12\\"]-ReactComponentState"' in html, html
    assert f'"parents": ["{run}"]' in html and '"route": "/experiments/12/runs?workflowType=machine_learning"' in html
    assert "http" not in html and "src=" not in html  # nothing loaded from anywhere
    for bad in ["", "experiment=1x", "experiment=1&parent=abc", f"experiment=1&parent={run.upper()}",
                "experiment=1&parent=%3Cscript%3E", f"parent={run}"]:
        answer = client.get(f"/sweep/open?{bad}")
        assert answer.status_code == 400 and answer.mimetype == "text/plain", bad
    server = "http://127.0.0.1:5000"
    assert landing_url(server, "3", [run]) == f"{server}/sweep/open?experiment=3&parent={run}"
    assert landing_url(server, "3", ["nope"]) == f"{server}/sweep/open?experiment=3"
    assert landing_url(server, "x'", [run]) == f"{server}/#/experiments/x'?workflowType=machine_learning"
