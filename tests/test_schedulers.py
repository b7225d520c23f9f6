"""ASHA rungs: who goes on, per task, with ties and repeated questions."""

from sweep.run.schedulers import AshaRungs


def test_milestones_double_from_the_grace_period_below_max_t():
    assert AshaRungs(max_t=9, grace_period=1, reduction_factor=2).milestones == [1, 2, 4, 8]
    assert AshaRungs(max_t=3).milestones == [1, 2]


def test_bottom_half_stops_at_a_rung_top_half_goes_on():
    rungs = AshaRungs(max_t=4)
    assert rungs.should_continue("RTE", "a", 1, 0.60)  # first at the rung: nothing to compare
    assert not rungs.should_continue("RTE", "b", 1, 0.50)
    assert rungs.should_continue("RTE", "c", 1, 0.70)
    assert rungs.should_continue("RTE", "d", 3, 0.10)  # not a rung: always on


def test_tasks_never_compete():
    rungs = AshaRungs(max_t=4)
    assert rungs.should_continue("SST-2", "a", 1, 0.90)
    assert rungs.should_continue("CoLA", "b", 1, 0.20)  # alone in CoLA's rung


def test_ties_go_on_and_asking_again_is_idempotent():
    rungs = AshaRungs(max_t=4)
    assert rungs.should_continue("RTE", "a", 1, 0.5)
    assert rungs.should_continue("RTE", "b", 1, 0.5)
    assert not rungs.should_continue("RTE", "c", 1, 0.4)
    assert not rungs.should_continue("RTE", "c", 1, 0.4)  # a DDP rank or a restart asks again
    assert len(rungs.recorded[("RTE", 1)]) == 3
