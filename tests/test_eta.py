"""The sweep's remaining time (sweep/plan/eta.py): predicted loops and start-ups, then what trials show."""

from __future__ import annotations

import random

import pytest

from sweep.plan.eta import Forecast, Overheads
from sweep.plan.makespan import DEFAULT_SPEEDUP, TrialWork

PRIORS = Overheads(launch=5.0, cold=10.0, warm=1.0, finish=0.0)  # the end: tests of its own below


def cpu_forecast(loops: list[float], slots: int = 2, known: bool = True) -> Forecast:
    trials = [TrialWork("A", seed, seconds) for seed, seconds in enumerate(loops)]
    return Forecast(trials, [f"k{i}" for i in range(len(loops))], None, slots, slots, known, PRIORS)


def test_before_any_trial_cpu_slots_take_the_trials_in_waves_with_their_start_ups():
    """3 trials of 30 s on 2 slots: launch, two cold starts at once, then the third on a reused
    process. The work over the slots would say 1.5 trials; the slots say 2."""
    forecast = cpu_forecast([30.0, 30.0, 30.0])
    assert forecast.remaining(0.0) == pytest.approx(5 + (10 + 30) + (1 + 30))


def test_each_trial_ends_after_its_loop_first_by_the_prior_then_as_the_ended_trials_took():
    """The end (the last checkpoint saved, the trial's run closed, its process freed): 3 s a trial by the
    prior; two trials that ended 8 s after their loop's last report make it 8 s for the rest."""
    trials = [TrialWork("A", seed, 30.0) for seed in range(3)]
    forecast = Forecast(trials, ["k0", "k1", "k2"], None, 2, 2, True, Overheads(launch=5.0, cold=10.0, warm=1.0,
                                                                                  finish=3.0))
    assert forecast.remaining(0.0) == pytest.approx(5 + (10 + 30 + 3) + (1 + 30 + 3))
    for i in (0, 1):
        forecast.start(f"t{i}", f"k{i}", now=0.0)
        forecast.report(f"t{i}", progress=1.0, loop_started=10.0, reported_at=40.0, pid=i)
    # both loops are done: only their ends are left (the prior), then the third trial on a reused process
    assert forecast.remaining(40.0) == pytest.approx(3 + (1 + 30 + 3))
    assert forecast.remaining(45.0) == pytest.approx(0 + (1 + 30 + 3))  # an end past its prior: ending now
    for i in (0, 1):
        forecast.finish(f"t{i}", now=48.0)
    assert forecast.ending() == pytest.approx(8.0)
    assert forecast.remaining(48.0) == pytest.approx(1 + 30 + 8)
    forecast.start("t2", "k2", now=48.0)
    forecast.report("t2", progress=0.5, loop_started=49.0, reported_at=64.0, pid=0)
    assert forecast.remaining(64.0) == pytest.approx(15 + 8)  # the loop's rest at its own pace, then its end


def test_an_end_is_learnt_only_from_a_trial_that_reported_its_loop_done():
    """A trial stopped early (the rungs), failed or paused ends without its loop's last report: its end
    says nothing of how long a finished loop takes to end."""
    forecast = Forecast([TrialWork("A", 0, 30.0), TrialWork("A", 1, 30.0)], ["k0", "k1"], None, 1, 1, True,
                        Overheads(launch=0.0, cold=0.0, warm=0.0, finish=3.0))
    forecast.start("t0", "k0", now=0.0)
    forecast.report("t0", progress=0.5, loop_started=0.0, reported_at=15.0, pid=1)
    forecast.finish("t0", now=60.0)
    assert forecast.ending() == 3.0
    assert forecast.remaining(60.0) == pytest.approx(30 + 3)


def test_on_gpus_the_ends_are_part_of_the_work_left():
    trials = [TrialWork("A", seed, 10.0) for seed in range(4)]
    forecast = Forecast(trials, [f"k{i}" for i in range(4)], {"A": 1.0}, 2, 2, True,
                        Overheads(launch=0.0, cold=0.0, warm=0.0, finish=2.0), speedup=DEFAULT_SPEEDUP)
    assert forecast.remaining(0.0) == pytest.approx(4 * (10 + 2) / 2)


def test_an_unmeasured_cpu_shows_no_eta_until_a_trial_shows_its_pace():
    forecast = cpu_forecast([1.0] * 4, known=False)  # the GPU prior's seconds: only their ratios mean anything
    forecast.start("t0", "k0", now=100.0)
    forecast.start("t1", "k1", now=100.0)
    assert forecast.remaining(100.0) is None
    forecast.report("t0", progress=0.5, loop_started=110.0, reported_at=130.0, pid=7)  # 40 s a trial
    assert forecast.scale == pytest.approx(40.0)
    # t0 ends at its own pace (150); t1 started cold like t0 and runs the predicted 40 s (150);
    # then the two left, each a warm start + 40 s, one per slot
    assert forecast.remaining(130.0) == pytest.approx(20 + 1 + 40)


def test_observed_durations_replace_the_priors_as_trials_finish():
    """Predicted 10 s loops that take 25 s: after the first wave every estimate is 2.5 times as long,
    and the start-ups are the observed ones (cold 4 s, warm 0.5 s), not the priors."""
    forecast = cpu_forecast([10.0] * 6)
    for i in (0, 1):
        forecast.start(f"t{i}", f"k{i}", now=0.0)
    assert forecast.remaining(0.0) == pytest.approx((10 + 10) + 2 * (1 + 10))
    for i in (0, 1):
        forecast.report(f"t{i}", progress=1.0, loop_started=4.0, reported_at=29.0, pid=i)
        forecast.finish(f"t{i}")
    assert forecast.scale == pytest.approx(2.5) and forecast.startup(cold=True) == pytest.approx(4.0)
    assert forecast.remaining(29.0) == pytest.approx(2 * (1 + 25))  # four left on two slots, warm
    forecast.start("t2", "k2", now=29.0)
    forecast.report("t2", progress=0.5, loop_started=29.5, reported_at=42.0, pid=0)  # a reused process
    assert forecast.startup(cold=False) == pytest.approx(0.5)
    # t2 ends at 54.5 by its own pace; three left: 42 -> slot 1 free now, slot 2 at 54.5
    assert forecast.remaining(42.0) == pytest.approx(max(12.5 + 25.5, 25.5 * 2))


def test_a_running_trial_past_its_prediction_counts_as_ending_now_and_resumed_reports_teach_nothing():
    forecast = cpu_forecast([10.0], slots=1)
    forecast.start("t0", "k0", now=0.0)
    assert forecast.remaining(100.0) == 0.0
    forecast.start("t0", "k0", now=50.0)  # paused (seed halving, PBT) or retried: it goes on from a checkpoint
    forecast.report("t0", progress=0.5, loop_started=52.0, reported_at=53.0, resumed=True)
    assert forecast.scale == 1.0  # one second for half the trial says nothing of its pace
    assert forecast.remaining(53.0) == pytest.approx(5.0)  # the other half at the predicted pace


def test_gpu_shares_the_work_left_over_the_gpus_never_less_than_a_running_trial():
    """A: 100 s on 2 GPUs (DDP: 100/1.9 s holding 2); B: two 10 s trials at half a GPU (20 s holding
    0.5); 4 GPUs. A then runs at 1.9x its prediction: B's trials take 1.9x too."""
    trials = [TrialWork("A", 1, 100.0), TrialWork("B", 1, 10.0), TrialWork("B", 2, 10.0)]
    forecast = Forecast(trials, ["a1", "b1", "b2"], {"A": 2.0, "B": 0.5}, capacity=4, concurrency=3, known=True,
                        overheads=Overheads(launch=0.0, cold=0.0, warm=0.0, finish=0.0))
    assert forecast.remaining(0.0) == pytest.approx((2 * 100 / 1.9 + 2 * 20 * 0.5) / 4)
    forecast.start("ta", "a1", now=0.0)
    forecast.report("ta", progress=0.1, loop_started=0.0, reported_at=10.0)  # 100 s at its pace, not 52.6
    assert forecast.scale == pytest.approx(1.9)
    work = (90 * 2 + 2 * 20 * 1.9 * 0.5) / 4
    assert work < 90 and forecast.remaining(10.0) == pytest.approx(90.0)  # A alone outlasts the work over 4 GPUs


def test_the_work_kept_as_trials_start_equals_the_sum_over_the_trials_not_started():
    """The progress line asks after every report: the pending work is kept as trials start, not
    summed over the sweep each time (1,000-trial sweeps); it must equal that sum in any order."""
    rng = random.Random(0)
    keys = [f"k{i % 40}" for i in range(60)]  # 40 points, some sampled twice
    trials = [TrialWork("A" if i % 3 else "B", i, rng.uniform(5, 50)) for i in range(60)]
    shares = {"A": 1.0, "B": 0.5}
    forecast = Forecast(trials, keys, shares, capacity=3, concurrency=6, known=True)
    for n, i in enumerate(rng.sample(range(60), 45)):
        forecast.start(f"t{n}", keys[i], now=float(n))
        left = {key: keys.count(key) - forecast.started_keys.get(key, 0) for key in set(keys)}
        by_key = {key: (t.task, t.gpu_seconds) for key, t in zip(keys, trials)}
        want = sum(n_left * DEFAULT_SPEEDUP.seconds(by_key[key][1], shares[by_key[key][0]]) * shares[by_key[key][0]]
                   for key, n_left in left.items())
        assert forecast.pending_loop == pytest.approx(want, rel=1e-9, abs=1e-9)
        assert forecast.pending == sum(left.values())
