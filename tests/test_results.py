"""Best trial per task, seed statistics and the result files, on plain records."""

from __future__ import annotations

import csv
import json
import statistics

import pytest

from sweep.config.tasks import load_task
from sweep.results.records import (
    MADE_BY,
    TrialRecord,
    best_per_task,
    export_best,
    format_summary,
    load_records,
    summarize,
    write_results,
)
from tests.helpers.files import modes, umask, unshared

COLA, RTE = load_task("CoLA"), load_task("RTE")


def _rec(task, seed, score, status="TERMINATED", **kw):
    return TrialRecord(task=task, seed=seed, score=score, status=status, metrics={"x": score or 0.0}, **kw)


def test_best_by_metric_with_negative_mcc_winning():
    records = [_rec("CoLA", 38, -0.4), _rec("CoLA", 39, -0.1), _rec("CoLA", 40, None, status="ERROR")]
    assert best_per_task(records, [COLA])["CoLA"].seed == 39


def test_ties_go_to_the_lower_seed():
    records = [_rec("RTE", 41, 0.6), _rec("RTE", 39, 0.6), _rec("RTE", 40, 0.5)]
    assert best_per_task(records, [RTE])["RTE"].seed == 39


def test_min_mode_picks_the_lowest():
    lm = type(RTE)(**{**RTE.__dict__, "name": "LM", "kind": "causal_lm", "metric": "perplexity", "mode": "min",
                      "labels": None})
    records = [_rec("LM", 1, 30.0), _rec("LM", 2, 12.0), _rec("LM", 3, 50.0)]
    assert best_per_task(records, [lm])["LM"].seed == 2


def test_summary_statistics_recomputed_from_rows():
    scores = [0.5, 0.7, 0.6, 0.9]
    records = [_rec("RTE", 38 + i, s, gpus=1.0, wall_seconds=1800) for i, s in enumerate(scores)]
    records.append(_rec("RTE", 50, None, status="ERROR", error="boom"))
    (s,) = summarize(records, [RTE])
    assert s.n == 4 and s.failed == 1
    assert s.mean == pytest.approx(statistics.fmean(scores))
    assert s.std == pytest.approx(statistics.stdev(scores))
    assert s.median == pytest.approx(0.65) and (s.min, s.max) == (0.5, 0.9)
    assert (s.best_seed, s.best_score) == (41, 0.9)
    assert s.gpu_hours == pytest.approx(2.0)
    assert "1 failed" in format_summary([s])


def test_task_with_only_failures_has_no_best():
    (s,) = summarize([_rec("RTE", 38, None, status="ERROR")], [RTE])
    assert s.n == 0 and s.best_seed is None and s.failed == 1
    assert "RTE" in format_summary([s])


def test_result_files_round_trip(tmp_path):
    records = [_rec("RTE", 38, 0.5, hparams={"lr": 1e-5}), _rec("RTE", 39, 0.7, hparams={"lr": 1e-5})]
    write_results(tmp_path, records, summarize(records, [RTE]))
    assert [r.seed for r in load_records(tmp_path / "results.json")] == [38, 39]
    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert [r["seed"] for r in rows] == ["38", "39"] and rows[0]["hp.lr"] == "1e-05"
    (summary_row,) = csv.DictReader((tmp_path / "summary.csv").open())
    assert summary_row["best_seed"] == "39"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temporary files left behind"


def test_export_best_copies_and_records_how(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    r = _rec("RTE", 39, 0.7, checkpoint=str(ckpt), hparams={"lr": 2e-5}, best_epoch=2)
    out = export_best(r, tmp_path / "best" / "RTE", "tiny-roberta")
    made = json.loads((out / MADE_BY).read_text())
    assert (out / "config.json").exists()
    assert made["seed"] == 39 and made["score"] == 0.7 and made["model"] == "tiny-roberta" and made["best_epoch"] == 2


def test_an_export_is_readable_by_all_whatever_modes_the_checkpoint_has(tmp_path):
    """A server running as another user reads best/<TASK>/: files 0644, folders 0755 (umask 022)."""
    import numpy as np
    from safetensors.numpy import save_file

    ckpt = tmp_path / "ckpt"
    (ckpt / "private").mkdir(parents=True, mode=0o700)  # as tempfile.mkdtemp leaves a folder
    save_file({"w": np.zeros(2, dtype=np.float32)}, ckpt / "model.safetensors")  # safetensors writes it 0600
    (ckpt / "config.json").write_text("{}")
    (ckpt / "private" / "notes.txt").write_text("x")
    (ckpt / "private" / "notes.txt").chmod(0o600)
    r = _rec("RTE", 39, 0.7, checkpoint=str(ckpt))
    with umask(0o022):
        out = export_best(r, tmp_path / "best" / "RTE", "tiny-roberta")
    assert {"model.safetensors", "private/notes.txt", MADE_BY} <= set(modes(out))
    assert unshared(out) == {}


def test_export_without_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="RTE .seed 39. has no checkpoint"):
        export_best(_rec("RTE", 39, 0.7), tmp_path / "out", "m")
