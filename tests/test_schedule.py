"""sweep.plan.makespan against cases small enough to work out by hand (the arithmetic is in the comments)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from sweep.plan.makespan import (
    CostModel,
    Speedup,
    TrialWork,
    auto_shares,
    format_duration,
    lower_bound,
    make_plan,
    order_longest_first,
    simulate,
    tight_lower_bound,
    timeline,
)

BENCH = Path(__file__).resolve().parents[1] / "scripts" / "bench_schedule.py"
FULL = Speedup(1.0)  # linear DDP: keeps hand arithmetic whole


def work(task: str, seed: int, seconds: float) -> TrialWork:
    return TrialWork(task, seed, seconds)


# --- cost model ---------------------------------------------------------------------------------


def test_cost_model_multiplies_rows_tokens_epochs_params_by_the_constant() -> None:
    # 1,000 rows x 10 tokens x 2 epochs x 1e6 params = 2e10 token·params; x 1e-12 s = 0.02 s
    assert CostModel(1e-12).seconds(1000, 10, 2, 1e6) == pytest.approx(0.02)
    # the default is calibrated on run_glue's SST-2: 67,349 rows x 13 tokens x 3 epochs, 125M params -> 1,566 s
    assert CostModel().seconds(67_349, 13, 3, 125e6) == pytest.approx(1566.0)


def test_refine_replaces_the_prior_then_keeps_a_running_mean() -> None:
    model = CostModel()
    # 2,000 tokens/s on a 1e8-param model: 1 / (2e3 x 1e8) = 5e-12 s per token·param
    assert model.refine(2000, 1e8) == pytest.approx(5e-12)
    # 4,000 tokens/s: 2.5e-12; mean of the two measurements = 3.75e-12
    assert model.refine(4000, 1e8) == pytest.approx(3.75e-12)
    assert model.observations == 2
    assert model.seconds(100, 10, 1, 1e8) == pytest.approx(100 * 10 * 1e8 * 3.75e-12)
    with pytest.raises(ValueError):
        model.refine(0, 1e8)


# --- DDP model and order ------------------------------------------------------------------------


def test_ddp_time_and_fractional_share() -> None:
    ddp = Speedup(0.9)
    assert ddp.seconds(1900, 1) == 1900
    assert ddp.seconds(1900, 2) == pytest.approx(1000)  # 1900 / (1 + 0.9)
    assert ddp.seconds(730, 8) == pytest.approx(100)  # 730 / (1 + 0.9 x 7)
    assert ddp.seconds(100, 0.5) == pytest.approx(200)  # half a GPU: twice as long
    with pytest.raises(ValueError):
        ddp.seconds(100, 1.5)  # Ray takes fractions below 1 or whole GPUs only
    with pytest.raises(ValueError):
        Speedup(1.2)  # super-linear DDP would void the lower bound


def test_longest_first_at_the_assigned_share_ties_by_seed_then_task() -> None:
    trials = [work("A", 2, 100), work("B", 1, 100), work("A", 1, 100), work("C", 1, 300)]
    # one GPU each: C (300) first; the three 100 s trials by seed, then task: A1, B1, A2
    assert [(t.task, t.seed) for t in order_longest_first(trials)] == [("C", 1), ("A", 1), ("B", 1), ("A", 2)]
    # C on 4 GPUs at eff 1 takes 75 s: now last
    shares = {"A": 1, "B": 1, "C": 4}
    assert [(t.task, t.seed) for t in order_longest_first(trials, shares, FULL)] == [
        ("A", 1), ("B", 1), ("A", 2), ("C", 1)]


# --- simulator ----------------------------------------------------------------------------------


def test_longest_first_beats_the_given_order_on_one_node() -> None:
    trials = [work("a", 1, 1), work("b", 1, 1), work("c", 1, 4)]
    shares = {"a": 1, "b": 1, "c": 1}
    # given order on 2 GPUs: a, b at 0; c at 1 -> ends 5
    assert simulate(trials, shares, 2, order="given") == 5.0
    # longest first: c and a at 0, b at 1 -> ends 4
    assert simulate(trials, shares, 2, order="longest_first") == 4.0


def test_a_two_gpu_trial_waits_for_two_free_gpus_on_one_node_while_others_backfill() -> None:
    # two nodes of two GPUs. Given order: A 10 s, B 20 s fill node 0; C 30 s takes node 1 GPU 0;
    # D needs 2 GPUs (38 s / 1.9 = 20 s): at t=10 one GPU is free on each node, still no fit;
    # E (5 s) backfills node 1 at t=0. D starts at 20 when B frees node 0: ends 40.
    trials = [work("A", 1, 10), work("B", 1, 20), work("C", 1, 30), work("D", 1, 38), work("E", 1, 5)]
    shares = {"A": 1, "B": 1, "C": 1, "D": 2, "E": 1}
    placed = {p.trial.task: p for p in timeline(trials, shares, 4, gpus_per_node=2, order="given")}
    assert (placed["E"].start, placed["E"].node) == (0.0, 1)
    assert (placed["D"].start, placed["D"].node, placed["D"].gpus) == (20.0, 0, (0, 1))
    assert placed["D"].end == pytest.approx(40.0)
    assert simulate(trials, shares, 4, gpus_per_node=2, order="given") == pytest.approx(40.0)


def test_fractional_shares_pack_onto_one_gpu_up_to_a_whole() -> None:
    # three thirds fit one GPU (3 x 3,333 units <= 10,000): all start at 0 and take 3 x 10 s
    thirds = [work("P", seed, 10) for seed in (1, 2, 3)]
    assert [p.start for p in timeline(thirds, {"P": 1 / 3}, 1)] == [0.0, 0.0, 0.0]
    assert simulate(thirds, {"P": 1 / 3}, 1) == pytest.approx(30.0)
    # 2 GPUs: halves P1, P2 fill GPU 0 (fullest GPU that fits), P3 half of GPU 1; each 10 / 0.5 = 20 s.
    # Q wants a whole GPU: none is, until the halves end at 20 -> Q runs 20..50
    trials = [work("P", 1, 10), work("P", 2, 10), work("P", 3, 10), work("Q", 1, 30)]
    placed = timeline(trials, {"P": 0.5, "Q": 1}, 2, order="given")
    assert [(p.trial.seed, p.gpus) for p in placed if p.trial.task == "P"] == [(1, (0,)), (2, (0,)), (3, (1,))]
    assert next(p.start for p in placed if p.trial.task == "Q") == 20.0
    assert simulate(trials, {"P": 0.5, "Q": 1}, 2, order="given") == 50.0


def test_a_share_no_node_can_hold_is_refused() -> None:
    with pytest.raises(ValueError, match="largest node has 8"):
        simulate([work("A", 1, 10)], {"A": 16}, 64)
    with pytest.raises(ValueError, match="no GPU share for task 'A'"):
        simulate([work("A", 1, 10)], {}, 8)


# --- bounds -------------------------------------------------------------------------------------


def test_lower_bound_is_work_or_span() -> None:
    trials = [work("A", 1, 10), work("A", 2, 10), work("B", 1, 38)]
    # 4 GPUs, up to 2 per trial: work 58 / 4 = 14.5; span 38 / 1.9 = 20 -> 20
    assert lower_bound(trials, 4, 2) == pytest.approx(20.0)
    assert lower_bound(trials, 4, 1) == 38.0  # one GPU each: the span is B itself
    # ten 10 s trials on 2 GPUs: work 50 beats the span 10 / 7.3
    assert lower_bound([work("A", s, 10) for s in range(10)], 2, 8) == 50.0


def test_tight_bound_counts_the_work_ddp_loses() -> None:
    trials = [work("A", 1, 19), work("B", 1, 10)]
    # 2 GPUs: simple bound max(29 / 2, 19 / 1.9) = 14.5. To end by M < 19, A needs 2 GPUs for 10 s,
    # holding 20 GPU-seconds: (20 + 10) / 2 = 15 -> 15 (the best real plan takes 19)
    assert lower_bound(trials, 2, 2) == 14.5
    assert tight_lower_bound(trials, 2, 2) == pytest.approx(15.0)


# --- share search and plan ----------------------------------------------------------------------


def test_auto_shares_gives_a_dominant_task_two_gpus_when_that_ends_sooner() -> None:
    trials = [work("L", 1, 19), work("S", 1, 5), work("S", 2, 5)]
    # 2 GPUs, all on 1: L 0..19 beside S, S -> 19. L on 2: 0..10, then S, S side by side -> 15.
    # S on 2 as well: 10 + 2 x 5 / 1.9 = 15.26, worse: S keeps 1.
    assert auto_shares(trials, 2) == {"L": 2, "S": 1}
    assert simulate(trials, {"L": 2, "S": 1}, 2) == pytest.approx(15.0)


def test_auto_shares_keeps_one_gpu_when_more_does_not_help() -> None:
    trials = [work("A", 1, 10), work("B", 1, 10)]
    # 2 GPUs: side by side -> 10. A on 2 (5.26 s) must wait for B -> 15.26; both on 2 -> 10.53
    assert auto_shares(trials, 2) == {"A": 1, "B": 1}


def test_make_plan_describes_shares_times_and_the_bound() -> None:
    trials = [work("MNLI", 1, 5700), work("MNLI", 2, 5700), work("RTE", 1, 660), work("RTE", 2, 660)]
    plan = make_plan(trials, 4, gpus_per_node=4, shares={"MNLI": 2, "RTE": 1})
    # MNLI on 2 GPUs: 5700 / 1.9 = 3000 s, both at once on 4 GPUs; RTE (660 s) after -> 3660 s.
    # loose bound: work (11400 + 1320) / 4 = 3180 s vs span 5700 / 3.7 = 1541 s -> 3180. Tight: to end
    # before 5700 s each MNLI trial needs >= 2 GPUs, holding 2 x 3000 GPU-s: (12000 + 1320) / 4 = 3330 s
    # (3 or 4 GPUs hold more: 3383 s, 3411 s, above their own durations); 3330 / 3660 = 0.91
    assert plan.makespan == pytest.approx(3660.0)
    assert plan.lower_bound == pytest.approx(3330.0)
    assert [(t.task, t.seed) for t in plan.order] == [("MNLI", 1), ("MNLI", 2), ("RTE", 1), ("RTE", 2)]
    assert plan.describe() == [
        "4 trials on 4 GPUs (1 node(s), up to 4 GPUs each), longest first",
        "MNLI  2 trials x 2 GPU  ~50m each",
        "RTE   2 trials x 1 GPU  ~11m each",
        "predicted makespan 1h01m (lower bound 56m, 0.91)",
    ]


def test_make_plan_with_one_share_for_all_and_auto() -> None:
    trials = [work("L", 1, 19), work("S", 1, 5), work("S", 2, 5)]
    assert make_plan(trials, 2, shares=1.0).makespan == 19.0
    auto = make_plan(trials, 2)
    assert auto.shares == {"L": 2, "S": 1}
    assert auto.makespan == pytest.approx(15.0)


def test_format_duration() -> None:
    assert [format_duration(s) for s in (45, 83, 599, 1380, 4920, 11100)] == [
        "45s", "1m23s", "9m59s", "23m", "1h22m", "3h05m"]


# --- the bench ----------------------------------------------------------------------------------


def bench_module():
    spec = importlib.util.spec_from_file_location("bench_schedule", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_writes_the_ratios_per_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "schedule.json"
    bench_module().main(["--sizes", "8", "16", "--out", str(out)])
    data = json.loads(out.read_text())
    assert set(data["sizes"]) == {"8", "16"}
    for figures in data["sizes"].values():
        assert {"fifo", "planned"} <= set(figures)
        assert 0 < figures["fifo"] <= 1 and 0 < figures["planned"] <= 1
        assert figures["bound_s"] >= figures["loose_bound_s"]  # planned is judged by the tight bound
    # config order on 1 GPU each, as the issue measured: 0.95 on 8 GPUs, 0.76 on 16
    assert (data["sizes"]["8"]["fifo"], data["sizes"]["16"]["fifo"]) == (0.951, 0.759)
    assert "fifo" in capsys.readouterr().out


def test_bench_replays_a_results_file(tmp_path: Path) -> None:
    # a 2-GPU trial's one-GPU time is wall x gpus (100 x 2); a CPU / fractional one is its wall time
    records = [{"task": "A", "seed": 1, "wall_seconds": 100, "gpus": 2},
               {"task": "B", "seed": 1, "wall_seconds": 50, "gpus": 0.5}]
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"trials": records}))
    trials = bench_module().trials_from_results(path)
    assert trials == [TrialWork("A", 1, 200.0), TrialWork("B", 1, 50.0)]
    path.write_text(json.dumps(records))  # a bare list reads the same
    assert bench_module().trials_from_results(path) == trials


def test_the_plan_reaches_095_of_the_bound_at_every_size(tmp_path: Path) -> None:
    """The issue's goal on the published GLUE x 10 seeds, 8..64 GPUs (a deterministic replay, no timing)."""
    data = bench_module().main(["--out", str(tmp_path / "schedule.json")])
    planned = {size: figures["planned"] for size, figures in data["sizes"].items()}
    assert set(planned) == {"8", "16", "32", "64"}
    assert min(planned.values()) >= 0.95, planned
