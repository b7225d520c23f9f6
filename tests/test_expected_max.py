"""Expected validation performance: the unbiased estimator (Tang et al. 2020) against enumerating every
n-subset of the trials, Dodge et al. 2019's against enumerating every draw with replacement, both against
hand-computed values; that the two differ (Dodge's bias); the csv, the printed line and the plot name the
estimator."""

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


def brute_force_subsets(scores: list[float], n: int, higher: bool = True) -> tuple[float, float]:
    """Mean and sd of the best of n trials drawn without replacement, over every one of the C(N, n) subsets
    (of positions: tied scores are different trials)."""
    best = [max(draw) if higher else min(draw) for draw in itertools.combinations(scores, n)]
    assert len(best) == math.comb(len(scores), n)
    return statistics.fmean(best), statistics.pstdev(best)


def test_three_scores_by_hand():
    curve = expected_max([0.7, 0.5, 0.6], estimator="dodge")
    assert [p.n for p in curve] == [1, 2, 3]
    assert curve[0].mean == pytest.approx(0.6) and curve[0].std == pytest.approx(math.sqrt(0.02 / 3))
    assert curve[1].mean == pytest.approx(5.8 / 9)  # weights 1/9, 3/9, 5/9 on 0.5, 0.6, 0.7
    assert curve[2].mean == pytest.approx(18 / 27)  # weights 1/27, 7/27, 19/27


def test_five_scores_by_hand():
    curve = expected_max([1, 2, 3, 4, 5], estimator="dodge")
    assert curve[0].mean == pytest.approx(3.0)
    assert curve[1].mean == pytest.approx((1 * 1 + 2 * 3 + 3 * 5 + 4 * 7 + 5 * 9) / 25)  # (i² - (i-1)²) / 25
    assert curve[-1].mean == pytest.approx(sum(i * (i**5 - (i - 1) ** 5) for i in range(1, 6)) / 5**5)


@pytest.mark.parametrize("higher", [True, False])
def test_the_closed_form_equals_enumerating_every_draw(higher):
    scores = [0.61, 0.55, 0.70, 0.55, 0.64]  # a tie included
    for point in expected_max(scores, higher, estimator="dodge"):
        mean, std = brute_force(scores, point.n, higher)
        assert (point.mean, point.std) == (pytest.approx(mean), pytest.approx(std, abs=1e-12))


def test_three_scores_by_hand_unbiased():
    curve = expected_max([0.7, 0.5, 0.6])
    assert [p.estimator for p in curve] == ["unbiased"] * 3  # the default
    assert curve[0].mean == pytest.approx(0.6) and curve[0].std == pytest.approx(math.sqrt(0.02 / 3))
    assert curve[1].mean == pytest.approx((0.6 + 0.7 + 0.7) / 3)  # the pairs' best: {.5,.6} .6, {.5,.7} .7, {.6,.7} .7
    assert curve[1].std == pytest.approx(statistics.pstdev([0.6, 0.7, 0.7]))
    assert (curve[2].mean, curve[2].std) == (pytest.approx(0.7), 0.0)  # all three: always the best one


@pytest.mark.parametrize("higher", [True, False])
@pytest.mark.parametrize("scores", [
    [0.61, 0.55, 0.70, 0.55, 0.64, 0.58],  # a tie, N = 6
    [0.5, 0.5, 0.5, 0.9, 0.9, 0.7],  # ties at both ends
    [3.2, 7.5, 2.9, 3.1, 12.0, 3.0, 3.3],  # perplexity-like, N = 7
])
def test_the_unbiased_curve_equals_the_best_of_every_subset(scores, higher):
    """For every n: E[best of n trials drawn without replacement] and its sd, exactly (the U-statistic)."""
    curve = expected_max(scores, higher)
    assert [p.n for p in curve] == list(range(1, len(scores) + 1))
    for point in curve:
        mean, std = brute_force_subsets(scores, point.n, higher)
        assert (point.mean, point.std) == (pytest.approx(mean, abs=1e-12), pytest.approx(std, abs=1e-9))
    best = max(scores) if higher else min(scores)
    assert curve[0].mean == pytest.approx(statistics.fmean(scores))  # n = 1: the mean
    assert (curve[-1].mean, curve[-1].std) == (pytest.approx(best), 0.0)  # n = N: the best trial


def test_the_unbiased_weights_are_math_combs():
    """The weights come by a recurrence (speed); they are C(i - 1, n - 1) / C(N, n)."""
    from sweep.results.expected_max import _unbiased_weights

    for size in (1, 2, 7, 40):
        for n in range(1, size + 1):
            exact = [math.comb(i - 1, n - 1) / math.comb(size, n) for i in range(1, size + 1)]
            assert _unbiased_weights(size, n) == pytest.approx(exact, rel=1e-12, abs=1e-300)


def test_dodge_is_biased_low_where_the_unbiased_is_not():
    """One lucky trial among N: a real n-trial experiment finds it with probability n / N; drawing with
    replacement finds it with probability 1 - (1 - 1/N)^n, less, so Dodge's curve sits lower (Tang et al.)."""
    scores = [0.5] * 9 + [0.9]
    unbiased, dodge = expected_max(scores), expected_max(scores, estimator="dodge")
    for n in range(2, 11):
        assert unbiased[n - 1].mean == pytest.approx(0.5 + 0.4 * n / 10)
        assert dodge[n - 1].mean == pytest.approx(0.5 + 0.4 * (1 - 0.9**n))
        assert dodge[n - 1].mean < unbiased[n - 1].mean - 1e-9
    assert dodge[-1].mean == pytest.approx(0.7605, abs=1e-4)  # best of all 10 trials, said 0.76: it was 0.9
    assert (unbiased[0].mean, unbiased[0].std) == (pytest.approx(dodge[0].mean), pytest.approx(dodge[0].std))
    with pytest.raises(ValueError, match="estimator"):
        expected_max(scores, estimator="bootstrap")


@pytest.mark.parametrize("higher", [True, False])
def test_over_every_sample_of_a_population_the_unbiased_is_right_on_average_and_dodge_low(higher):
    """The bias itself: trials drawn i.i.d. from a small population, every one of its 3^5 samples of N = 5
    trials enumerated (equally likely), each sample's estimate averaged, against the population's true
    E[best of n] (every n-tuple of it). The unbiased estimate's average is the truth for every n; Dodge's
    misses it for n > 1 (short of the best: lower for max, higher for min)."""
    population, size = [0.2, 0.5, 0.9], 5
    samples = list(itertools.product(population, repeat=size))
    for estimator in ("unbiased", "dodge"):
        average = [statistics.fmean(c[n - 1].mean for c in (expected_max(s, higher, estimator) for s in samples))
                   for n in range(1, size + 1)]
        truth = [brute_force(population, n, higher)[0] for n in range(1, size + 1)]
        if estimator == "unbiased":
            assert average == pytest.approx(truth, abs=1e-12)
        else:
            assert average[0] == pytest.approx(truth[0])  # one trial: the mean, no bias
            sign = 1 if higher else -1
            assert all(sign * (t - a) > 0.01 for a, t in zip(average[1:], truth[1:]))


def test_more_trials_never_lower_the_expected_best_and_the_gain_share():
    curve = expected_max([0.5, 0.52, 0.9, 0.51, 0.53, 0.5, 0.55, 0.6, 0.58, 0.5])
    assert all(b.mean >= a.mean - 1e-12 for a, b in zip(curve, curve[1:]))
    enough = trials_for_share(curve)
    gain = curve[-1].mean - curve[0].mean
    assert (curve[enough - 1].mean - curve[0].mean) >= 0.9 * gain > (curve[enough - 2].mean - curve[0].mean)
    line = format_curve("RTE", curve)
    assert line.startswith(f"RTE (unbiased E[max]): best of 1 {curve[0].mean:.4f} ± {curve[0].std:.4f}, of 5 ")
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
    assert rows[0] == "task,point,n,expected_max,std,estimator"
    assert [r for r in rows if r.startswith("RTE,,")] == [f"RTE,,{p.n},{p.mean:.6g},{p.std:.6g},unbiased"
                                                          for p in expected_max([0.5, 0.6, 0.7, 0.9])]
    assert 'RTE,"lr=0.2",2,' in "\n".join(rows)  # per grid point too
    assert not [r for r in rows if r.startswith("WNLI")]  # no finished trial, no curve
    assert (tmp_path / "expected_max.png").read_bytes()[:4] == b"\x89PNG"
    out = capsys.readouterr().out
    assert "RTE (unbiased E[max]): best of 1 0.6750 ± " in out
    assert "RTE [lr=0.1] (unbiased E[max]): best of 1 0.5500" in out
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


def test_the_plot_names_its_estimator_and_its_band():
    from sweep.config.tasks import load_task
    from sweep.results.expected_max import sweep_curves
    from sweep.results.records import TrialRecord
    from sweep.results.report import expected_max_figure

    records = [TrialRecord("RTE", seed, {"lr": 0.1}, score=score) for seed, score in ((1, 0.5), (2, 0.7), (3, 0.6))]
    specs = [load_task("RTE"), load_task("WNLI")]
    titles = {estimator: expected_max_figure(sweep_curves(records, specs, estimator), specs).get_suptitle()
              for estimator in ("unbiased", "dodge")}
    assert titles["unbiased"].startswith("unbiased E[max] (Tang et al. 2020)")
    assert titles["dodge"].startswith("E[max] of Dodge et al. 2019") and "(biased)" in titles["dodge"]
    assert all(t.endswith("band: ±1 sd of the best of n") for t in titles.values())
