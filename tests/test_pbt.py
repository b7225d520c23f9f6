"""sweep.scheduler=pbt on a real sweep: 4 trials of one task, the bottom one clones a top one's
checkpoint and goes on from its step with a mutated lr; the trial's history and results.json say
so, and the best model is exported as usual. Tiny model, generated data, local Ray.

Two epochs are too short for the tiny model to learn the task: the trials of sane lrs tie at the
majority class and rank by eval-loss noise. So the search seed draws one lr of about 0.5, which
diverges: that trial ranks last at every evaluation and must be exploited by its second one at the
latest (its first may come before any other trial's)."""

from __future__ import annotations

import json

import pytest

from sweep.results.export_layout import MADE_BY
from sweep.results.records import load_records
from sweep.results.trial_reports import CHECKPOINT_MARKER, Report
from tests.helpers.sweeps import sweep_cmd

pytestmark = [pytest.mark.slow, pytest.mark.ray]

LOW, HIGH = 1e-6, 1.0
SEARCH_SEED = 10  # draws lrs 5.4e-1 (diverges), 8.2e-6, 4.3e-5, 3.3e-3 from [LOW, HIGH]
DIVERGING = 0.3


def histories(out) -> dict[str, list[Report]]:
    """Each trial's own history file (Tune's trial id -> its rows), wherever the storage put it."""
    (folder,) = {p.parent for p in out.rglob("history/*.json")}
    return {p.stem: [Report.from_row(row) for row in json.loads(p.read_text())] for p in folder.glob("*.json")}


def test_pbt_clones_a_top_trials_checkpoint_with_a_mutated_lr_and_says_so(tmp_path):
    out = tmp_path / "out"
    r = sweep_cmd("experiment=demo", "task=RTE", "sweep.seeds=[38,39,40,41]", "train.epochs=2",
                  "train.evals_per_epoch=2", "tracking=none", "sweep.scheduler=pbt",
                  "sweep.keep_checkpoints=all", f"sweep.search_seed={SEARCH_SEED}",
                  f"+sweep.pbt.mutations.lr={{dist:loguniform,low:{LOW},high:{HIGH}}}",
                  f"out_dir={out}",
                  cwd=tmp_path, cache=tmp_path / "cache", timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    records = load_records(out / "results.json")
    assert len(records) == 4 and all(rec.status == "TERMINATED" for rec in records)
    assert sorted(rec.seed for rec in records) == [38, 39, 40, 41]  # an exploit keeps the trial's own seed
    rows = histories(out)
    steps = sorted({row.step for trial in rows.values() for row in trial if row.is_evaluation})
    exploits = [(trial, row) for trial, trial_rows in rows.items() for row in trial_rows if row.donor]
    assert exploits, "no trial exploited another"
    evaluations = {trial: [row for row in trial_rows if row.is_evaluation] for trial, trial_rows in rows.items()}
    (diverging,) = [trial for trial, rows_of in evaluations.items() if rows_of[0].pbt["lr"] > DIVERGING]
    evaluations = evaluations[diverging]
    assert any(row.donor for row in evaluations[:3]), f"the diverging trial was not exploited: {evaluations}"
    for trial, row in exploits:
        donor_rows = {d.step: d for d in rows[row.donor] if d.is_evaluation}
        assert row.donor != trial and row.donor_step in donor_rows  # a step the donor evaluated and saved
        assert donor_rows[row.donor_step].checkpoint_id
        # it went on from the donor's step: its next evaluation is the one after it ...
        assert row.step == steps[steps.index(row.donor_step) + 1]
        # ... with the donor's lr mutated (x0.8, x1.2 or drawn again), within the range
        donor_lr = donor_rows[row.donor_step].pbt["lr"]
        assert row.pbt["lr"] != donor_lr and LOW <= row.pbt["lr"] <= HIGH
    # every evaluation's checkpoint is still there, the exploited trial's last own one included (Tune
    # stops that trial without counting it: the next stretch's first checkpoint took its folder)
    markers = [json.loads(p.read_text()) for p in out.rglob(CHECKPOINT_MARKER) if "best" not in p.parts]
    held = {(m["trial_id"], m["checkpoint_id"]) for m in markers}
    assert len(held) == len(markers)
    evaluated = {(row.trial_id, row.checkpoint_id) for trial_rows in rows.values() for row in trial_rows
                 if row.is_evaluation}
    assert evaluated <= held, f"evaluations without their checkpoint: {sorted(evaluated - held)}"
    # results.json: each trial's schedule; an exploiting trial's names the donor and the step
    by_trial = {rec.trial_id: rec for rec in records}
    for trial, row in exploits:
        (rec,) = [rec for name, rec in by_trial.items() if trial in name]
        assert {"from_step": row.donor_step, "values": row.pbt, "donor": row.donor} in rec.schedule
        assert rec.schedule[0]["from_step"] == 0 and rec.hparams["lr"] == rec.schedule[-1]["values"]["lr"]
    # the best model is exported as usual: the best evaluation's own checkpoint
    best = max(records, key=lambda rec: rec.score)
    assert (out / "best" / "RTE" / "config.json").exists()
    assert f'"seed": {best.seed}' in (out / "best" / "RTE" / MADE_BY).read_text()
