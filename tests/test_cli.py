"""The command line as a person types it: a real process, real files, real exit codes."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sweep.config.tasks import load_task
from sweep.results.export_layout import MADE_BY
from sweep.results.records import load_records
from sweep.results.trial_reports import TRAINING_STATE
from tests.helpers.sweeps import sweep_cmd, sweep_killed_after


def test_help_lists_every_task_and_model(tmp_path):
    out = sweep_cmd("--help", cwd=tmp_path, cache=tmp_path / "cache").stdout
    for name in ("CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE", "WNLI", "glue",
                 "roberta-base", "bert-base-uncased", "gpt2", "minilm", "tiny-roberta", "tiny-gpt2"):
        assert name in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["train.lr=-1"], "error: train.lr: must be > 0, got -1.0"),
        (["sweep.seeds=[]"], "error: sweep.seeds: is empty"),
        (["model=roberta-base"], "model.path"),
        (["experiment=demo", "storage.data_dir=/nonexistent/data"],
         "error: storage.data_dir: /nonexistent/data is not a folder"),
        (["experiment=demo", "train.method=lora", "train.lora.target_modules=[nosuch]"],
         "error: train.lora.target_modules: nosuch matches no layer of tiny-roberta (roberta); choose from: dense, "
         "key, query, value"),
        (["experiment=demo", "train.method=lora", "train.lora.r=0"], "error: train.lora.r: must be a positive integer"),
        (["experiment=demo", "sweep.soup=true", "sweep.seeds=[38,39]"],
         "error: sweep.soup: the trials do not share a base: each seed draws its own new head for WNLI"),
    ],
)
def test_bad_input_is_one_clear_line_and_writes_nothing(tmp_path, args, message):
    out_dir = tmp_path / "out"
    r = sweep_cmd(*args, f"out_dir={out_dir}", cwd=tmp_path, cache=tmp_path / "cache", timeout=120)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert "Traceback" not in r.stderr
    assert not (out_dir / "results.csv").exists() and not (out_dir / "best").exists()


def test_missing_task_folder_fails_before_any_trial(tmp_path):
    data = tmp_path / "data" / "glue_data" / "WNLI"
    data.mkdir(parents=True)
    r = sweep_cmd("experiment=demo", "task=RTE", f"storage.data_dir={data.parent.parent}",
                  f"out_dir={tmp_path / 'out'}", cwd=tmp_path, cache=tmp_path / "cache", timeout=120)
    assert r.returncode == 2
    assert "error: no data for task RTE: looked in" in r.stderr
    assert "epoch" not in r.stderr + r.stdout  # no trial ran


@pytest.mark.parametrize(
    "args, line, allowed",
    [
        (["train.lrr=3"], "error: train.lrr: no such key (keys of train: ", ["lr", "batch_size", "max_seq_length"]),
        (["task=RTE", "task.path=x"], "error: task.path: no such key (keys of task: RTE)", []),
        (["model=nosuch"], "error: model: Could not find 'model/nosuch'; available options in 'model': ",
         ["roberta-base", "minilm", "tiny-roberta", "tiny-gpt2"]),
        (["task=NOPE"], "error: task: Could not find 'task/NOPE'; available options in 'task': ",
         ["WNLI", "glue", "wikitext-2"]),
        (["model=minilm", "train.max_seq_length=100000"],
         "error: train.max_seq_length: 100000 is more than minilm holds (512 positions); use at most 512", []),
        (["experiment=demo", "model.builder.max_positions=66", "train.max_seq_length=100"],
         "error: train.max_seq_length: 100 is more than tiny-roberta holds (64 positions); use at most 64", []),
        (["experiment=demo", "model=tiny-gpt2", "task=wikitext-2", "train.block_size=300"],
         "error: train.block_size: 300 is more than tiny-gpt2 holds (256 positions); use at most 256", []),
        # validate's errors come before Hydra writes too
        (["train.lr=-1"], "error: train.lr: must be > 0, got -1.0", []),
        (["-m", "experiment=demo", "model=tiny-roberta,nosuch"], "error: model: Could not find 'model/nosuch'",
         ["tiny-gpt2"]),
    ],
)
def test_a_config_mistake_is_one_line_exit_2_and_nothing_is_written(tmp_path, args, line, allowed):
    """Hydra's composition errors and validate's alike: one line naming the key and what is allowed,
    before Hydra makes its run folder, the out_dir or the MLflow store (all would land in tmp_path)."""
    work = tmp_path / "work"
    work.mkdir()
    r = sweep_cmd(*args, f"out_dir={work / 'out'}", cwd=work, cache=tmp_path / "cache", timeout=120)
    assert r.returncode == 2, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith(line), r.stderr
    assert all(a in lines[0] for a in allowed), lines[0]
    assert list(work.iterdir()) == []  # no outputs/, multirun/, out_dir or mlflow.db


@pytest.mark.ray
@pytest.mark.slow
def test_a_lora_sweep_over_ranks_exports_a_merged_model_that_serves_and_its_adapter(tmp_path):
    """train.method=lora with a grid over train.lora.r: one trial per rank; best/WNLI is the merged
    model (what the server loads) with the adapter beside it, both in the registry, no optimizer state."""
    from mlflow import MlflowClient

    from tests.helpers.serving import ask_a_pair, output

    out = tmp_path / "out"
    r = sweep_cmd("experiment=demo", "train.method=lora", "+sweep.grid.lora.r=[2,8]", "sweep.seeds=[38]",
                  "train.epochs=2", "train.evals_per_epoch=2", "sweep.predict_test=true", f"out_dir={out}",
                  cwd=tmp_path, cache=tmp_path / "cache")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert sorted(int(row["hp.lora.r"]) for row in rows) == [2, 8]
    assert all(row["status"] == "TERMINATED" for row in rows)
    best = out / "best" / "WNLI"
    assert {"config.json", "model.safetensors", "adapter"} <= {p.name for p in best.iterdir()}
    assert {p.name for p in (best / "adapter").iterdir()} >= {"adapter_config.json", "adapter_model.safetensors"}
    assert not list(best.rglob(TRAINING_STATE))
    made_by = json.loads((best / MADE_BY).read_text())
    assert made_by["hparams"]["lora.r"] in (2, 8)

    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    # two epochs leave both ranks at the trivial score: registered, never champion, one line says so (issue 18)
    assert "warning: WNLI learned nothing: best acc 0.5000 is within noise" in r.stdout
    assert "registry: tiny-roberta-WNLI version 1, not promoted: it learned nothing" in r.stdout
    assert "champion" not in client.get_registered_model("tiny-roberta-WNLI").aliases
    version = client.get_model_version("tiny-roberta-WNLI", "1")
    model_id = version.source.removeprefix("models:/")
    registered = {a.path for a in client.list_logged_model_artifacts(model_id)}
    assert {"MLmodel", "model", "adapter"} <= registered
    assert {a.path for a in client.list_logged_model_artifacts(model_id, "adapter")} >= {
        "adapter/adapter_config.json", "adapter/adapter_model.safetensors"}
    # sweep.predict_test: the best model's predictions on WNLI's test split, GLUE's layout, zipped
    with zipfile.ZipFile(out / "glue_submission.zip") as submission:
        assert submission.namelist() == ["WNLI.tsv"]
        lines = submission.read("WNLI.tsv").decode().splitlines()
    test_rows = (tmp_path / "cache").rglob("WNLI/test.tsv")
    assert lines[0] == "index\tprediction" and len(lines) == len(next(test_rows).read_text().splitlines())
    assert {line.split("\t")[1] for line in lines[1:]} <= {"0", "1"}
    # the grid varied one key, over too few trials to rank it: one line, not an error
    assert "importance: WNLI: needs at least 4 finished trials" in r.stdout

    answer = ask_a_pair(best, tmp_path / "serve.log", tmp_path / "cache")
    assert answer.status_code == 200, answer.text
    assert output(answer.json(), "label")[0] in load_task("WNLI").labels  # the task's own names, from the merged config


def _launch_ids(out: Path) -> dict[str, set[str]]:
    """task/seed -> the driver launches that reported for it (from Tune's per-trial progress.csv)."""
    ids = {}
    for progress in (out / "ray" / "tune").glob("*/progress.csv"):
        rows = list(csv.DictReader(progress.open()))
        if rows:
            # train_driver_fn_<experiment>_<index>_...: the trial is experiment + index
            ids["_".join(progress.parent.name.split("_")[3:5])] = {r["launch_id"] for r in rows}
    return ids


@pytest.mark.ray
@pytest.mark.slow
def test_resume_after_the_driver_is_killed_skips_finished_trials(tmp_path):
    out, cache = tmp_path / "out", tmp_path / "cache"
    # two evaluations per epoch: the killed trials go on from mid-epoch checkpoints too
    args = ["experiment=demo", "sweep.seeds=[38,39,40,41]", "train.epochs=2", "train.evals_per_epoch=2",
            "sweep.keep_checkpoints=all", f"out_dir={out}"]
    done_before_kill = sweep_killed_after(2, *args, cwd=tmp_path, cache=cache)
    assert done_before_kill >= 2, "the sweep ended before it could be killed"
    assert not (out / "results.json").exists()
    first = _launch_ids(out)

    r = sweep_cmd(*args, "resume=true", cwd=tmp_path, cache=cache, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "resume: continuing the sweep" in r.stdout
    records = load_records(out / "results.json")
    assert sorted(rec.seed for rec in records) == [38, 39, 40, 41]
    unfinished = [(rec.seed, rec.status, rec.epochs_done, rec.steps_done, rec.steps_total) for rec in records
                  if not (rec.status == "TERMINATED" and rec.epochs_done == 2 and rec.steps_done == rec.steps_total)]
    assert not unfinished, unfinished
    after = _launch_ids(out)
    (launch_1,) = {next(iter(ids)) for ids in first.values() if len(ids) == 1} or {None}
    rerun = {t for t, ids in after.items() if ids - {launch_1}}
    assert len(rerun) <= 4 - done_before_kill, (after, done_before_kill)  # finished trials did not run again
    assert rerun, "the unfinished trials ran after the resume"

    # MLflow (the default sqlite store, runs/mlflow.db in cwd): one parent for both launches, every trial its child
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/runs/mlflow.db")
    experiment = client.get_experiment_by_name("glue-tiny-roberta").experiment_id
    (parent,) = client.search_runs([experiment], "tags.sweep.model = 'tiny-roberta'")
    assert f"tracking: continuing MLflow run {parent.info.run_id}" in r.stdout
    trials = client.search_runs([experiment], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert sorted(int(t.data.params["seed"]) for t in trials) == [38, 39, 40, 41]  # one run per trial, none twice
    assert len(client.search_runs([experiment])) == 5
    assert parent.info.status == "FINISHED" and parent.data.metrics["trials.finished"] == 4  # the summary covers all

    # the same command once more (a RayJob run again after it finished): its ledger says the end is done
    results = (out / "results.json").read_bytes()
    again = sweep_cmd(*args, "resume=true", cwd=tmp_path, cache=cache, timeout=300)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "resume: this sweep ended at 2" in again.stdout and "nothing runs again" in again.stdout
    assert "sweep: " not in again.stdout and (out / "results.json").read_bytes() == results  # no plan, no trial
    assert len(client.search_runs([experiment])) == 5


@pytest.mark.ray
@pytest.mark.slow
def test_multirun_runs_one_sweep_per_model_and_compares_them(tmp_path):
    sweep_dir = tmp_path / "multi"
    r = sweep_cmd("-m", "experiment=demo", "model=tiny-roberta,tiny-gpt2", "sweep.seeds=[38]", "train.epochs=1",
                  f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path, cache=tmp_path / "cache", timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    for job in ("0", "1"):
        assert (sweep_dir / job / "summary.csv").exists() and (sweep_dir / job / "best" / "WNLI").is_dir()
    rows = list(csv.DictReader((sweep_dir / "comparison.csv").open()))
    assert [(row["job"], row["task"]) for row in rows] == [("0", "WNLI"), ("1", "WNLI")]
    assert "model=tiny-roberta" in r.stdout and "model=tiny-gpt2" in r.stdout


@pytest.mark.parametrize("plus", ["", "+"])
def test_experiment_with_or_without_plus_and_the_console_script(tmp_path, plus):
    r = sweep_cmd(f"{plus}experiment=demo", "--cfg", "job", cwd=tmp_path, cache=tmp_path / "cache", timeout=60)
    assert r.returncode == 0, r.stderr
    assert "name: tiny-roberta" in r.stdout
    script = Path(sys.executable).parent / "sweep"  # [project.scripts] sweep = sweep.__main__:cli
    r2 = subprocess.run([str(script), f"{plus}experiment=demo", "--cfg", "job"], cwd=tmp_path,
                        capture_output=True, text=True, timeout=60)
    assert r2.returncode == 0, r2.stderr
    assert r2.stdout == r.stdout


@pytest.mark.parametrize("args", [["--help"], ["train.lr=-1"], ["resources.gpus_per_trial=-1"], ["task=NOPE"],
                                  ["train.lrr=3"], ["model=minilm", "train.max_seq_length=100000"]])
def test_help_and_config_errors_load_no_torch_transformers_or_ray(tmp_path, args):
    """What a person sees first comes fast: the modules loaded by the end of the process are listed."""
    probe = ("import atexit, sys\n"
             "atexit.register(lambda: print('HEAVY', sorted(m for m in ('torch', 'transformers', 'ray', 'mlflow') "
             "if m in sys.modules), file=sys.stderr))\n"
             f"sys.argv = ['sweep', *{args!r}]\n"
             "from sweep.__main__ import cli\ncli()\n")
    r = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "SWEEP_CACHE_DIR": str(tmp_path / "cache")})
    assert "HEAVY []" in r.stderr, r.stderr
    if args != ["--help"]:
        assert r.returncode in (1, 2) and "Traceback" not in r.stderr
