"""A trial's predicted cost from the staged data (sweep/plan/costs.py), checked against counts made here."""

from __future__ import annotations

import pytest

from sweep.config.tasks import load_task
from sweep.data.glue import load_task_data
from sweep.data.synthetic import write_synthetic_glue
from sweep.plan.costs import TaskSize, grid_points, model_params, sweep_trials, task_size, trial_seconds
from sweep.plan.makespan import CostModel
from sweep.train.loading import load_tokenizer
from tests.helpers.configs import demo_settings


def test_rows_and_mean_tokens_are_those_of_the_training_file(tiny_roberta_dir, tmp_path):
    """Fewer rows than the sample: the mean is over every row, as the loop will tokenize them."""
    data = write_synthetic_glue(tmp_path, ["RTE"], n_train=150)
    spec, tokenizer = load_task("RTE"), load_tokenizer(tiny_roberta_dir)
    train = demo_settings("train.max_seq_length=16").train
    size = task_size(spec, data, tokenizer, train)
    rows = load_task_data(spec, data)["train"]
    lengths = [len(tokenizer(a, b, truncation=True, max_length=16)["input_ids"])
               for a, b in zip(rows["text_a"], rows["text_b"])]
    assert size.rows == 150 and size.mean_tokens == pytest.approx(sum(lengths) / len(lengths))
    assert size.mean_tokens <= 16  # truncated as training truncates


def test_a_causal_lm_corpus_is_counted_in_blocks(tiny_roberta_dir, tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    text = "\n".join(f"line {i} of a small corpus with some words in it" for i in range(300))
    (folder / "train.txt").write_text(text)
    spec = demo_settings("task=text", f"task.path={folder}").tasks[0]
    tokenizer = load_tokenizer(tiny_roberta_dir)
    size = task_size(spec, folder, tokenizer, demo_settings("train.block_size=32").train)
    tokens = sum(len(tokenizer(line)["input_ids"]) for line in text.splitlines())
    assert size.blocks and size.mean_tokens == 32
    # from a sample; the tail is held out
    assert size.rows == pytest.approx(tokens * (1 - spec.holdout_fraction) / 32, rel=0.05)


def test_model_params_from_the_config_match_the_loaded_model(tiny_roberta_dir):
    from transformers import AutoModel

    assert model_params(tiny_roberta_dir) == sum(p.numel()
                                                 for p in AutoModel.from_pretrained(tiny_roberta_dir).parameters())


def test_every_trial_is_costed_and_grid_points_change_the_cost():
    """rows x tokens x epochs x params x c; a grid over epochs doubles a point's cost; max_train_samples caps rows."""
    settings = demo_settings("task=[WNLI,RTE]", "sweep.seeds=[1,2]", "train.max_train_samples=500",
                             "+sweep.grid.epochs=[1,2]")
    sizes = {"WNLI": TaskSize("WNLI", 635, 40.0), "RTE": TaskSize("RTE", 2490, 60.0)}
    cost = CostModel(seconds_per_token_param=1e-9)
    trials = sweep_trials(settings, sizes, params=1_000_000, cost=cost)
    assert grid_points(settings) == [{"epochs": 1}, {"epochs": 2}]
    assert len(trials) == 2 * 2 * 2
    seconds = {(t.task, t.seed, t.point): t.gpu_seconds for t in trials}
    assert seconds[("WNLI", 1, 0)] == pytest.approx(500 * 40 * 1 * 1e6 * 1e-9)  # capped at 500 rows
    assert seconds[("RTE", 2, 1)] == pytest.approx(500 * 60 * 2 * 1e6 * 1e-9)
    padded = demo_settings("train.padding=max_length", "train.max_seq_length=128", "train.max_train_samples=null").train
    assert trial_seconds(sizes["RTE"], padded, 1_000_000, cost) == pytest.approx(2490 * 128 * padded.epochs * 1e-3)
    assert grid_points(demo_settings()) == [{}]


def test_the_forecast_is_the_work_left_over_the_gpus_and_follows_measured_throughput():
    """A: 100 s on 2 GPUs (DDP: 100/1.9 s holding 2 GPUs); B: two 10 s trials at half a GPU (20 s
    each holding 0.5). On 2 GPUs: (2 x 100/1.9 + 2 x 20 x 0.5) / 2 GPU-seconds per second."""
    from sweep.plan.costs import Forecast
    from sweep.plan.makespan import TrialWork

    trials = [TrialWork("A", 1, 100.0), TrialWork("B", 1, 10.0), TrialWork("B", 2, 10.0)]
    forecast = Forecast(trials, ["a1", "b1", "b2"], {"A": 2.0, "B": 0.5}, params=1000, capacity=2, on_gpus=True)
    assert forecast.remaining() == pytest.approx((2 * 100 / 1.9 + 2 * 20 * 0.5) / 2)
    # A measures half the prior's speed (on its 2 GPUs): every prediction doubles
    prior_rate_on_2_gpus = 1 / (forecast.prior * 1000) * 1.9
    forecast.observe("A", tokens=prior_rate_on_2_gpus / 2 * 10, seconds=10)
    assert forecast.remaining() == pytest.approx(2 * (2 * 100 / 1.9 + 2 * 20 * 0.5) / 2)
    forecast.finish("a1")
    assert forecast.remaining() == pytest.approx(2 * (2 * 20 * 0.5) / 2)
    # B seed 1 is running and has done 3 of its 4 epochs: a quarter of it is left
    forecast.advance("trial-b1", "b1", 0.75)
    assert forecast.remaining() == pytest.approx(2 * (1.25 * 20 * 0.5) / 2)
    forecast.finish("b1", "trial-b1")  # finished: counted once, not as done and as running
    assert forecast.remaining() == pytest.approx(2 * (20 * 0.5) / 2)


def test_on_cpus_the_gpu_prior_is_not_shown_until_an_epoch_is_measured():
    from sweep.plan.costs import Forecast
    from sweep.plan.makespan import TrialWork

    forecast = Forecast([TrialWork("A", s, 1.0) for s in (1, 2, 3, 4)], ["a1", "a2", "a3", "a4"], {}, params=10,
                        capacity=2, on_gpus=False)
    assert forecast.remaining() is None
    forecast.observe("A", tokens=1 / (forecast.prior * 10) / 50, seconds=1)  # 50x slower than the prior
    forecast.finish("a1")
    assert forecast.remaining() == pytest.approx(3 * 50 / 2)


def test_a_task_whose_data_does_not_read_is_costed_as_the_others_mean(tiny_roberta_dir, tmp_path):
    """Its trials will fail with the data's own error; the plan must not stop the other tasks."""
    from types import SimpleNamespace

    from sweep.plan.costs import measure_sizes

    data = write_synthetic_glue(tmp_path, ["WNLI", "RTE"], n_train=100)
    (data / "glue_data" / "RTE" / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tmaybe\n")
    settings = demo_settings("task=[WNLI,RTE]")
    sizes, _ = measure_sizes(settings, SimpleNamespace(model_dir=tiny_roberta_dir, data_dir=data))
    assert "unknown label 'maybe'" in sizes["RTE"].error
    assert (sizes["RTE"].rows, sizes["RTE"].mean_tokens) == (sizes["WNLI"].rows, sizes["WNLI"].mean_tokens)


def test_the_forecast_kept_as_trials_move_equals_the_sum_over_every_trial():
    """The progress line asks after every report, so the work left is kept up to date per key, not
    summed over the sweep each time: it must equal that sum after any order of advances and ends."""
    import random

    from sweep.plan.costs import Forecast
    from sweep.plan.makespan import DEFAULT_SPEEDUP, TrialWork

    rng = random.Random(0)
    keys = [f"k{i % 40}" for i in range(60)]  # 40 points, some sampled twice
    trials = [TrialWork("A" if i % 3 else "B", i, rng.uniform(5, 50)) for i in range(60)]
    shares = {"A": 1.0, "B": 0.5}
    forecast = Forecast(trials, keys, shares, params=1000, capacity=3, on_gpus=True)
    ids = [f"t{i}" for i in range(60)]
    for _ in range(400):
        i = rng.randrange(60)
        if rng.random() < 0.8:
            forecast.advance(ids[i], keys[i], rng.random())
        elif ids[i] in forecast.running:
            forecast.finish(keys[i], ids[i])
        # the plain sum over every predicted point, at the measured scale
        started: dict[str, float] = {}
        for key, fraction in forecast.running.values():
            started[key] = started.get(key, 0.0) + fraction
        want = sum(max(0.0, copies - forecast.done.get(key, 0) - started.get(key, 0.0))
                   * DEFAULT_SPEEDUP.seconds(seconds, shares[task]) * shares[task]
                   for key, (task, seconds, copies) in forecast.predicted.items()) / 3
        assert forecast.remaining() == pytest.approx(want, rel=1e-9, abs=1e-9)
