"""The rungs: ASHA and seed halving per task, the tie-free ranking, the trivial score of each metric."""

import json

import numpy as np
import pytest

from sweep.config.tasks import load_task
from sweep.plan.rung_boards import AshaRungs, EvalPoint, SeedHalving
from sweep.plan.rungs import BELOW_CUT, DEGENERATE, RungEntry, asha_verdict, halving_verdicts, keep_count, ranked
from sweep.train.metrics import task_metrics, trivial_metrics, trivial_score


def point(trial: str, score: float, task: str = "RTE", epoch: int = 1, seed: int | None = None,
          loss: float | None = None, trivial: float | None = None, progress: float = 0.25,
          end_of_epoch: bool = True) -> EvalPoint:
    return EvalPoint(task=task, trial_id=trial, seed=seed if seed is not None else ord(trial[0]), epoch=epoch, step=10,
                     progress=progress, end_of_epoch=end_of_epoch, score=score, eval_loss=loss, trivial=trivial)


# --- the trivial score of each metric, from the eval labels ---------------------------------------

def test_trivial_accuracy_is_the_majority_share_and_mcc_zero():
    labels = np.array([0, 1, 1, 1, 0, 1, 1, 1])  # 6 of 8 are class 1
    assert trivial_score(load_task("RTE"), labels) == pytest.approx(0.75)  # acc
    assert trivial_score(load_task("CoLA"), labels) == 0.0  # mcc of a constant answer


def test_trivial_f1_is_the_f1_of_answering_positive_whatever_the_majority():
    mostly_positive = np.array([1, 1, 1, 0])  # always "1": precision 3/4, recall 1 -> F1 6/7
    assert trivial_score(load_task("MRPC"), mostly_positive) == pytest.approx(6 / 7)
    # the majority "0" scores F1 0, but a model stuck on "1" learned nothing either: precision 1/4 -> F1 2/5
    mostly_negative = np.array([0, 0, 0, 1])
    assert trivial_score(load_task("MRPC"), mostly_negative) == pytest.approx(2 / 5)


def test_trivial_correlation_is_zero_and_lm_has_none():
    assert trivial_score(load_task("STS-B"), np.array([0.5, 1.0, 4.0, 2.5])) == 0.0
    assert trivial_score(load_task("wikitext-2"), np.array([1, 2, 3])) is None


def test_a_constant_prediction_scores_exactly_the_trivial_score():
    """What a degenerate run outputs (the majority class everywhere) meets the trivial score exactly."""
    spec = load_task("MRPC")
    labels = np.array([1, 0, 1, 1, 0, 1])
    constant = task_metrics(spec, np.ones_like(labels), labels)
    assert constant == trivial_metrics(spec, labels)
    assert trivial_score(spec, labels) == constant["f1"]


# --- the ranking: metric, then eval loss, then seed -----------------------------------------------

def test_ranking_breaks_ties_by_eval_loss_then_seed():
    a = RungEntry("a", 1, 0.5, eval_loss=0.69)
    b = RungEntry("b", 2, 0.5, eval_loss=0.60)
    c = RungEntry("c", 3, 0.7, eval_loss=0.90)
    d = RungEntry("d", 0, 0.5, eval_loss=0.69)
    assert [e.trial_id for e in ranked([a, b, c, d])] == ["c", "b", "d", "a"]


def test_keep_is_a_count_or_a_share():
    assert keep_count(2, 6) == 2 and keep_count(0.5, 6) == 3 and keep_count(0.5, 5) == 3
    assert keep_count(0.1, 4) == 1 and keep_count(9, 4) == 4


# --- ASHA: ties no longer keep everyone; degenerate runs stop ---------------------------------------

def test_asha_milestones_double_from_the_grace_period_below_max_t():
    assert AshaRungs(max_t=9, grace_period=1, reduction_factor=2).milestones == [1, 2, 4, 8]
    assert AshaRungs(max_t=3).milestones == [1, 2]


def test_asha_bottom_half_stops_top_half_goes_on():
    rungs = AshaRungs(max_t=4)
    assert rungs.at_eval(point("a", 0.60)).go_on  # first at the rung: nothing to compare
    assert not rungs.at_eval(point("b", 0.50)).go_on
    assert rungs.at_eval(point("c", 0.70)).go_on
    assert rungs.at_eval(point("d", 0.10, epoch=3)).go_on  # not a rung: always on
    assert rungs.at_eval(point("e", 0.10, epoch=1, end_of_epoch=False)).go_on  # mid-epoch: not a rung


def test_asha_tasks_never_compete():
    rungs = AshaRungs(max_t=4)
    assert rungs.at_eval(point("a", 0.90, task="SST-2")).go_on
    assert rungs.at_eval(point("b", 0.20, task="CoLA")).go_on  # alone in CoLA's rung


def test_asha_ties_are_ranked_by_eval_loss_and_the_answer_is_repeated():
    """The issue's case: failed seeds tie at 0.5; the old median rule kept every tie."""
    rungs = AshaRungs(max_t=4)
    assert rungs.at_eval(point("a", 0.5, loss=0.70)).go_on
    second = rungs.at_eval(point("b", 0.5, loss=0.69))  # ties a; lower loss: ranked first of 2, kept
    assert second.go_on
    third = rungs.at_eval(point("c", 0.5, loss=0.71))  # ranked 3 of 3: cut (top ceil(3/2) = 2)
    assert not third.go_on and third.reason == BELOW_CUT and "ranked 3 of 3" in third.detail
    assert rungs.at_eval(point("c", 0.5, loss=0.71)) == third  # a DDP rank or a restart asks again: same answer
    assert len(rungs.recorded[("RTE", 1)]) == 3


def test_asha_stops_a_degenerate_trial_once_another_learns():
    rungs = AshaRungs(max_t=4)
    assert rungs.at_eval(point("a", 0.5, trivial=0.5)).go_on  # nobody above trivial yet
    assert rungs.at_eval(point("b", 0.9, trivial=0.5)).go_on
    verdict = rungs.at_eval(point("c", 0.5, trivial=0.5, loss=0.1))  # would rank 2 of 3, but is degenerate
    assert not verdict.go_on and verdict.reason == DEGENERATE
    assert rungs.verdict_of("c") == verdict and rungs.verdict_of("b") is None


def test_asha_verdict_below_the_trivial_score_is_degenerate_too():
    entries = [RungEntry("a", 1, 0.45, trivial=0.5), RungEntry("b", 2, 0.8, trivial=0.5)]
    verdict = asha_verdict(entries[0], entries, 2, "at epoch 1")
    assert verdict.reason == DEGENERATE and "seed 2 has 0.8000" in verdict.detail


# --- seed halving: one decision per task once every trial is at the rung ---------------------------

def test_halving_keeps_the_best_k_and_stops_degenerate_first():
    entries = [RungEntry("a", 1, 0.50, 0.70, 0.5), RungEntry("b", 2, 0.90, 0.3, 0.5), RungEntry("c", 3, 0.80, 0.4, 0.5),
               RungEntry("d", 4, 0.50, 0.60, 0.5), RungEntry("e", 5, 0.70, 0.5, 0.5), RungEntry("f", 6, 0.60, 0.5, 0.5)]
    verdicts = halving_verdicts(entries, keep=2, where="at 25% of training")
    assert sorted(t for t, v in verdicts.items() if v.go_on) == ["b", "c"]
    assert verdicts["a"].reason == verdicts["d"].reason == DEGENERATE
    assert verdicts["e"].reason == verdicts["f"].reason == BELOW_CUT


def test_halving_with_every_trial_at_trivial_still_keeps_k():
    entries = [RungEntry(t, s, 0.5, loss, 0.5) for t, s, loss in (("a", 1, 0.7), ("b", 2, 0.6), ("c", 3, 0.8))]
    verdicts = halving_verdicts(entries, keep=1, where="")
    assert [t for t, v in verdicts.items() if v.go_on] == ["b"]  # nobody learns: no one is degenerate; lowest loss


def test_halving_waits_for_every_trial_of_the_task():
    board = SeedHalving({"RTE": 3, "CoLA": 1}, keep=1, at=0.25)
    assert board.at_eval(point("a", 0.9, progress=0.125)).go_on  # before the rung
    assert board.at_eval(point("a", 0.9, progress=0.25)) is None  # at the rung, 2 others to come: wait
    assert board.at_eval(point("b", 0.7, progress=0.3)) is None
    assert not board.decided("RTE")
    assert board.at_eval(point("x", 0.1, task="CoLA")).go_on  # CoLA has one trial: decided alone
    last = board.at_eval(point("c", 0.8, progress=0.25))
    assert board.decided("RTE") and not last.go_on and "ranked 2 of 3" in last.detail
    assert board.verdict_of("a").go_on and not board.verdict_of("b").go_on
    assert board.at_eval(point("a", 0.2, progress=0.5)).go_on  # later evaluations: the decision holds


def test_halving_does_not_wait_for_a_trial_that_failed_before_the_rung():
    board = SeedHalving({"RTE": 3}, keep=0.5, at=0.25)
    assert board.at_eval(point("a", 0.9)) is None
    assert board.at_eval(point("b", 0.6)) is None
    assert board.gone("RTE", "c")  # failed before the rung: decided now
    assert board.verdict_of("a").go_on and not board.verdict_of("b").go_on  # keep ceil(0.5 * 2) = 1
    assert board.gone("RTE", "a")  # a kept trial ending later changes nothing
    assert board.verdict_of("a").go_on


def test_a_resumed_sweeps_board_learns_the_rungs_again_from_the_histories(tmp_path):
    """resume=true starts a new board: the rung rows and the failures before a rung in the trials'
    histories give it the same decision as the board of the killed driver."""
    from sweep.plan.rung_boards import recorded_rungs
    from sweep.results.trial_reports import TrialHistories

    def row(trial, seed, step, score, rung=False):
        return {"trial_id": trial, "task": "RTE", "seed": seed, "epoch": 1, "step": step, "progress": step / 40,
                "end_of_epoch": step % 20 == 0, "score": score, "eval/eval_loss": 0.6, "trivial_score": 0.5,
                "rung": rung}

    histories = {
        "t1": [row("t1", 1, 5, 0.5), row("t1", 1, 10, 0.8, rung=True), row("t1", 1, 15, 0.9)],
        "t2": [row("t2", 2, 5, 0.5), row("t2", 2, 10, 0.5, rung=True)],
        "t3": [{"trial_id": "t3", "task": "RTE", "seed": 3, "trial_error": "DataFormatError: train.tsv:4"}],
        "t4": [row("t4", 4, 5, 0.6)],  # running, before its rung when the driver died
    }
    for trial, rows in histories.items():
        (tmp_path / f"{trial}.json").write_text(json.dumps(rows))
    points, gone = recorded_rungs(TrialHistories(str(tmp_path)))
    assert [(p.trial_id, p.step, p.score) for p in points] == [("t1", 10, 0.8), ("t2", 10, 0.5)]
    assert gone == [("RTE", "t3")]
    board = SeedHalving({"RTE": 4}, keep=1, at=0.25)
    for p in points:
        assert board.at_eval(p) is None
    board.gone(*gone[0])
    assert not board.decided("RTE")  # t4 has still to reach its rung
    assert board.at_eval(point("t4", 0.7, seed=4, trivial=0.5)).reason == BELOW_CUT
    assert board.verdict_of("t1").go_on and board.verdict_of("t2").reason == DEGENERATE
