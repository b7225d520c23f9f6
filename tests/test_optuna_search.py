"""sweep.search_alg=optuna on a real sweep: every trial's search point comes from its task's TPE study,
the study is told each trial's best score, and a killed driver's resume goes on with the same study
(no point asked twice, the count right). Tiny model, generated data, local Ray."""

from __future__ import annotations

import pickle
import re

import pytest

from sweep.results.records import load_records
from tests.helpers.sweeps import sweep_cmd, sweep_killed_after

pytestmark = [pytest.mark.slow, pytest.mark.ray]

SAMPLES = 6


def test_tpe_search_resumed_after_the_driver_is_killed_keeps_its_study(tmp_path):
    out, cache = tmp_path / "out", tmp_path / "cache"
    args = ["experiment=demo", "sweep.seeds=[38]", "train.epochs=1", "tracking=none",
            "+sweep.search.lr={dist:loguniform,low:1e-6,high:1e-1}", "sweep.search_alg=optuna",
            "sweep.search_seed=0", f"sweep.num_samples={SAMPLES}", f"out_dir={out}"]
    done_before_kill = sweep_killed_after(2, *args, cwd=tmp_path, cache=cache)
    assert 2 <= done_before_kill < SAMPLES, "the sweep ended before it could be killed"

    r = sweep_cmd(*args, "resume=true", cwd=tmp_path, cache=cache, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "resume: continuing the sweep" in r.stdout
    records = load_records(out / "results.json")
    lrs = [rec.hparams["lr"] for rec in records]
    assert len(records) == SAMPLES and all(rec.status == "TERMINATED" for rec in records)
    # each launch saves its own, named by its start time; Tune restores the newest (the greatest name)
    launches = sorted((out / "ray" / "tune").rglob("searcher-state-*.pkl"), key=lambda p: p.name)
    assert len(launches) == 2
    saved = launches[-1]
    state = pickle.loads(saved.read_bytes())
    assert len(set(lrs)) == SAMPLES and all(1e-6 <= lr <= 1e-1 for lr in lrs), (  # no point asked twice
        [(rec.trial_id, rec.hparams, rec.score) for rec in records], state, r.stdout[-3000:])

    # the searcher Tune saved with the experiment: one WNLI study told every trial's best score
    told = state["studies"].finished["WNLI"]
    assert sorted(round(score, 6) for _, score in told) == sorted(round(rec.score, 6) for rec in records)
    assert sorted(params["lr"] for params, _ in told) == sorted(lrs)
    # the resumed launch's searcher handed out the trials its ledger said were left, its study re-seeded with the rest
    kept = int(re.search(rf"of its {SAMPLES} trials (\d+) finished", r.stdout).group(1))
    assert not state["studies"].running.get("WNLI") and state["position"] == state["count"] == SAMPLES - kept


def test_seeds_per_point_runs_each_point_on_its_seeds_and_tells_the_study_their_mean(tmp_path):
    out = tmp_path / "out"
    r = sweep_cmd("experiment=demo", "sweep.seeds=[38,39,40]", "train.epochs=2", "tracking=none",
                  "+sweep.search.lr={dist:loguniform,low:1e-5,high:1e-1}", "sweep.search_alg=optuna",
                  "sweep.search_seed=1", "sweep.num_samples=2", "sweep.seeds_per_point=3", f"out_dir={out}",
                  cwd=tmp_path, cache=tmp_path / "cache")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    records = load_records(out / "results.json")
    points: dict[float, list] = {}
    for rec in records:
        points.setdefault(rec.hparams["lr"], []).append(rec)
    assert sorted(sorted(rec.seed for rec in recs) for recs in points.values()) == [[38, 39, 40]] * 2
    (saved,) = (out / "ray" / "tune").rglob("searcher-state-*.pkl")
    told = pickle.loads(saved.read_bytes())["studies"].finished["WNLI"]
    assert len(told) == 2
    for params, score in told:
        assert score == pytest.approx(sum(rec.score for rec in points[params["lr"]]) / 3)
    assert "points WNLI by the mean of their seeds: lr=" in r.stdout


def test_tpe_under_asha_tells_a_stopped_trial_its_best_score_so_far(tmp_path):
    """ASHA still applies with search_alg=optuna: a point that cannot learn (its lr near 1e-9) is
    stopped at a rung once another learns, and its study is told the best score it reached."""
    from sweep.data.synthetic import write_synthetic_glue

    out = tmp_path / "out"
    data = write_synthetic_glue(tmp_path / "data", ["RTE"], n_train=600, n_dev=64)
    r = sweep_cmd("experiment=demo", "task=RTE", "sweep.seeds=[1]", "train.epochs=3", "train.max_train_samples=null",
                  "tracking=none", f"storage.data_dir={data}", "sweep.scheduler=asha",
                  "+sweep.search.lr={dist:loguniform,low:1e-9,high:1e-2}", "sweep.search_alg=optuna",
                  "sweep.search_seed=3", "sweep.num_samples=6", f"out_dir={out}",
                  cwd=tmp_path, cache=tmp_path / "cache", timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    records = load_records(out / "results.json")
    assert len(records) == 6 and all(rec.status == "TERMINATED" for rec in records)
    stopped = [rec for rec in records if rec.stopped]
    assert stopped and all(rec.epochs_done < 3 for rec in stopped), [(rec.hparams, rec.score) for rec in records]
    (saved,) = (out / "ray" / "tune").rglob("searcher-state-*.pkl")
    told = {params["lr"]: score for params, score in pickle.loads(saved.read_bytes())["studies"].finished["RTE"]}
    assert told == pytest.approx({rec.hparams["lr"]: rec.score for rec in records})
