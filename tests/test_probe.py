"""The CPU timing probe (sweep/plan/probe.py): real steps of the real model, the driver left as it was."""

from __future__ import annotations

import random

import pytest

from sweep.config.tasks import load_task
from sweep.data.synthetic import write_synthetic_glue
from sweep.plan.costs import DataVolume
from sweep.plan.probe import cpu_note, probe_step_cost, probe_task, split_step_time, why_no_probe
from tests.helpers.configs import demo_settings


def test_the_probe_times_real_steps_on_a_trials_threads_and_leaves_the_driver_as_it_was(tiny_roberta_dir, tmp_path):
    import numpy as np
    import torch

    data = write_synthetic_glue(tmp_path, ["RTE"], n_train=200)
    train = demo_settings("train.max_train_samples=100").train
    threads = torch.get_num_threads()
    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    want = random.random(), np.random.rand(), torch.rand(1).item()
    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    cache = tmp_path / "cache"
    probe = probe_step_cost(load_task("RTE"), tiny_roberta_dir, data, train, threads=1, cache_dir=cache)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == want  # an unseeded search stays unseeded
    assert torch.get_num_threads() == threads
    assert probe.step.measured and probe.step.method == "full" and 1 <= probe.steps <= 3
    # Both timed, of the same order: a batch's forward is part of a training step on it, but which measures more on
    # the tiny model (its step mostly fixed cost) is up to the machine: under CI's load the forward came out 1.05x
    # the step. So no order between them, only that neither is off by an order of magnitude (a wrong count of
    # tokens or steps would be).
    tokens = train.batch_size * train.max_seq_length
    step_time, forward_time = probe.step.per_step + probe.step.train * tokens, probe.step.eval * tokens
    assert 0 < forward_time < 10 * step_time
    assert probe.step.per_step >= 0 and probe.step.train > 0
    assert probe.seconds < 30 and "ms/token computed" in cpu_note(probe, "")
    # a checkpoint was saved and timed beside the trials' cache, then removed
    assert 0 < probe.save_seconds < probe.seconds and list(cache.iterdir()) == []
    assert "to end each trial with its 4 checkpoint(s)" in cpu_note(probe, "", 1, saves=4)


def test_a_steps_fixed_part_and_its_part_per_token_are_told_apart():
    """MiniLM's figures on 1 thread: 0.09 s a step + 0.65 ms per computed token."""
    def step(tokens: int) -> tuple[float, int]:
        return 0.09 + 0.65e-3 * tokens, tokens

    per_token, per_step = split_step_time([step(120), step(110)], [step(1024), step(960), step(1000)])
    assert per_token == pytest.approx(0.65e-3) and per_step == pytest.approx(0.09)
    # nothing to tell them apart: all of it per token
    full = [step(1000)]
    assert split_step_time([], full) == (pytest.approx((0.09 + 0.65) / 1000), 0.0)
    assert split_step_time([step(600)], full) == (pytest.approx((0.09 + 0.65) / 1000), 0.0)
    # noise made the few-row steps slower than the full ones: no line through them
    assert split_step_time([(0.8, 100)], full) == (pytest.approx((0.09 + 0.65) / 1000), 0.0)


def test_the_probe_runs_only_where_every_trial_runs_on_this_machines_cpu():
    assert why_no_probe(on_cpu=True, joined=False, nodes=1, local_sources=True) == ""
    assert "GPU" in why_no_probe(on_cpu=False, joined=False, nodes=1, local_sources=True)
    assert "cluster's nodes" in why_no_probe(on_cpu=True, joined=True, nodes=1, local_sources=True)
    assert "cluster's nodes" in why_no_probe(on_cpu=True, joined=False, nodes=2, local_sources=True)
    assert "staged on the nodes" in why_no_probe(on_cpu=True, joined=False, nodes=1, local_sources=False)
    assert cpu_note(None, "why") == "why"


def test_the_probe_times_the_task_with_the_most_tokens_to_train():
    sizes = {"RTE": DataVolume("RTE", 2490, 60.0), "SST-2": DataVolume("SST-2", 67_349, 13.0),
             "QQP": DataVolume("QQP", 9, 9.0, error="unread")}
    assert probe_task(sizes, demo_settings("train.max_train_samples=null").train) == "SST-2"
    assert probe_task(sizes, demo_settings("train.max_train_samples=500").train) == "RTE"
