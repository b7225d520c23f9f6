"""Expected validation performance (Dodge et al. 2019): the closed form against hand-computed values
and against enumerating every draw of n trials."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from sweep.results.expected_max import expected_max, format_curve, trials_for_share


def brute_force(scores: list[float], n: int, higher: bool = True) -> tuple[float, float]:
    """Mean and sd of the best of n draws with replacement, over every one of the N^n equally likely draws."""
    best = [max(draw) if higher else min(draw) for draw in itertools.product(scores, repeat=n)]
    return statistics.fmean(best), statistics.pstdev(best)


def test_three_scores_by_hand():
    curve = expected_max([0.7, 0.5, 0.6])
    assert [p.n for p in curve] == [1, 2, 3]
    assert curve[0].mean == pytest.approx(0.6) and curve[0].std == pytest.approx(math.sqrt(0.02 / 3))
    assert curve[1].mean == pytest.approx(5.8 / 9)  # weights 1/9, 3/9, 5/9 on 0.5, 0.6, 0.7
    assert curve[2].mean == pytest.approx(18 / 27)  # weights 1/27, 7/27, 19/27


def test_five_scores_by_hand():
    curve = expected_max([1, 2, 3, 4, 5])
    assert curve[0].mean == pytest.approx(3.0)
    assert curve[1].mean == pytest.approx((1 * 1 + 2 * 3 + 3 * 5 + 4 * 7 + 5 * 9) / 25)  # (i² - (i-1)²) / 25
    assert curve[-1].mean == pytest.approx(sum(i * (i**5 - (i - 1) ** 5) for i in range(1, 6)) / 5**5)


@pytest.mark.parametrize("higher", [True, False])
def test_the_closed_form_equals_enumerating_every_draw(higher):
    scores = [0.61, 0.55, 0.70, 0.55, 0.64]  # a tie included
    for point in expected_max(scores, higher):
        mean, std = brute_force(scores, point.n, higher)
        assert (point.mean, point.std) == (pytest.approx(mean), pytest.approx(std, abs=1e-12))


def test_more_trials_never_lower_the_expected_best_and_the_gain_share():
    curve = expected_max([0.5, 0.52, 0.9, 0.51, 0.53, 0.5, 0.55, 0.6, 0.58, 0.5])
    assert all(b.mean >= a.mean - 1e-12 for a, b in zip(curve, curve[1:]))
    enough = trials_for_share(curve)
    gain = curve[-1].mean - curve[0].mean
    assert (curve[enough - 1].mean - curve[0].mean) >= 0.9 * gain > (curve[enough - 2].mean - curve[0].mean)
    line = format_curve("RTE", curve)
    assert line.startswith(f"RTE: best of 1 {curve[0].mean:.4f} ± {curve[0].std:.4f}, of 5 ")
    assert line.endswith(f"90% of the gain by {enough} trials")


def test_equal_scores_and_no_scores():
    assert trials_for_share(expected_max([0.5, 0.5])) is None
    assert format_curve("WNLI", expected_max([0.5, 0.5])).endswith("every trial scored the same")
    assert expected_max([]) == [] and format_curve("WNLI", []) == "WNLI: no finished trials"


def test_the_end_of_a_sweep_writes_the_curves_plots_them_and_says_a_line_per_task(tmp_path, capsys):
    from sweep.config.validate import compose_settings
    from sweep.outputs.reports import ExpectedMax
    from sweep.outputs.steps import Outcome
    from sweep.results.records import TrialRecord

    settings = compose_settings("experiment=demo", "task=[WNLI,RTE]", "+sweep.grid.lr=[0.1,0.2]")
    records = [TrialRecord("RTE", seed, {"lr": lr}, score=score)
               for seed, lr, score in ((1, 0.1, 0.5), (2, 0.1, 0.6), (1, 0.2, 0.7), (2, 0.2, 0.9))]
    records += [TrialRecord("WNLI", 1, {"lr": 0.1}, score=None, status="ERROR")]
    ExpectedMax(settings.tasks).run(Outcome(records, tmp_path))
    rows = (tmp_path / "expected_max.csv").read_text().splitlines()
    assert rows[0] == "task,point,n,expected_max,std"
    assert [r for r in rows if r.startswith("RTE,,")] == [f"RTE,,{p.n},{p.mean:.6g},{p.std:.6g}"
                                                          for p in expected_max([0.5, 0.6, 0.7, 0.9])]
    assert 'RTE,"lr=0.2",2,' in "\n".join(rows)  # per grid point too
    assert not [r for r in rows if r.startswith("WNLI")]  # no finished trial, no curve
    assert (tmp_path / "expected_max.png").read_bytes()[:4] == b"\x89PNG"
    out = capsys.readouterr().out
    assert "RTE: best of 1 0.6750 ± " in out and "RTE [lr=0.1]: best of 1 0.5500" in out
    assert "WNLI: no finished trials" in out


def test_a_point_of_one_trial_has_no_curve_of_its_own():
    """A search's samples are each their own point: only the task's curve, and the grid points that repeat."""
    from sweep.config.tasks import load_task
    from sweep.results.expected_max import sweep_curves
    from sweep.results.records import TrialRecord

    searched = [TrialRecord("RTE", 1, hparams={"lr": lr}, score=s) for lr, s in ((1e-5, 0.6), (3e-5, 0.7), (1e-4, 0.5))]
    assert [(c.task, c.point) for c in sweep_curves(searched, [load_task("RTE")])] == [("RTE", "")]
    grid = [TrialRecord("RTE", seed, hparams={"lr": lr}, score=0.5 + seed / 10)
            for lr in (1e-5, 2e-5) for seed in (1, 2)]
    assert [c.point for c in sweep_curves(grid, [load_task("RTE")])] == ["", "lr=1e-05", "lr=2e-05"]
