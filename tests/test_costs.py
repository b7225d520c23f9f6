"""A trial's predicted cost from the staged data (sweep/plan/costs.py), checked against counts made here."""

from __future__ import annotations

import pytest

from sweep.config.tasks import load_task
from sweep.data.glue import load_task_data
from sweep.data.synthetic import write_synthetic_glue
from sweep.plan.costs import DataVolume, grid_points, model_params, sweep_trials, task_size, trained_rows, trial_seconds
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
    sizes = {"WNLI": DataVolume("WNLI", 635, 40.0), "RTE": DataVolume("RTE", 2490, 60.0)}
    cost = CostModel(seconds_per_token_param=1e-9)
    trials = sweep_trials(settings, sizes, params=1_000_000, cost=cost)
    assert grid_points(settings.sweep) == [{"epochs": 1}, {"epochs": 2}]
    assert len(trials) == 2 * 2 * 2
    seconds = {(t.task, t.seed, t.point): t.gpu_seconds for t in trials}
    assert seconds[("WNLI", 1, 0)] == pytest.approx(500 * 40 * 1 * 1e6 * 1e-9)  # capped at 500 rows
    assert seconds[("RTE", 2, 1)] == pytest.approx(500 * 60 * 2 * 1e6 * 1e-9)
    padded = demo_settings("train.padding=max_length", "train.max_seq_length=128", "train.max_train_samples=null").train
    assert trial_seconds(sizes["RTE"], padded, 1_000_000, cost) == pytest.approx(2490 * 128 * padded.epochs * 1e-3)
    assert grid_points(demo_settings().sweep) == [{}]


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


def test_rows_and_evaluations_follow_the_loops_own_rules(tiny_roberta_dir):
    """The plan counts what the loop trains: max_train_samples as subsample_rows applies it (the user's
    500 of RTE's 2,490 rows), and as many evaluations as eval_points gives over the epochs."""
    from dataclasses import replace

    from datasets import Dataset

    from sweep.plan.costs import capped, evaluations
    from sweep.train.loop import eval_points, subsample_rows

    rows = Dataset.from_dict({"x": list(range(2490))})
    for limit in (None, 1, 500, 2490, 5000):
        assert capped(2490, limit) == len(subsample_rows(rows, limit))
    quick = demo_settings("train.max_train_samples=500").train
    assert trained_rows(DataVolume("RTE", 2490, 52.0), quick) == 500
    base = demo_settings().train
    for n_rows in (1, 15, 16, 17, 200, 500):
        for values in ({}, {"evals_per_epoch": 3}, {"evals_per_epoch": 40}, {"eval_every": 5}, {"eval_every": 7},
                       {"eval_every": 13, "epochs": 3}, {"eval_every": 100}):
            train = replace(base, **values)
            batches = -(-n_rows // train.batch_size)
            want = sum(len(eval_points(batches, train, epoch)) for epoch in range(1, train.epochs + 1))
            assert evaluations(n_rows, train) == want, (n_rows, values)


def test_epochs_method_and_evaluations_change_the_cost():
    """Measured: rows x computed tokens x epochs x the method's step, plus each step's fixed part;
    evaluations: their count x the eval rows (capped by max_eval_samples per split) x tokens x the
    forward's cost. The GPU prior: real tokens, no fixed part."""
    from dataclasses import replace

    from sweep.plan.costs import METHOD_STEP_RATIO, StepCost

    size = DataVolume("MNLI", 1000, 50.0, eval_rows=(300, 200))
    train = replace(demo_settings().train, batch_size=10, epochs=2, evals_per_epoch=1, max_train_samples=None,
                    max_eval_samples=250)
    step = StepCost(train=1e-3, eval=2e-4, method="full", measured=True, per_step=0.05)
    steps = 100 * 2  # 1000 rows in batches of 10, 2 epochs
    want = 50 * (1000 * 2 * 1e-3 + 2 * (250 + 200) * 2e-4) + steps * 0.05
    assert trial_seconds(size, train, 10**6, step=step) == pytest.approx(want)
    four = trial_seconds(size, replace(train, epochs=4), 10**6, step=step)
    assert four == pytest.approx(2 * want)  # twice the epochs: twice the steps and evaluations
    lora = trial_seconds(size, replace(train, method="lora"), 10**6, step=step)
    ratio = METHOD_STEP_RATIO["lora"]
    assert lora == pytest.approx(50 * (1000 * 2 * 1e-3 * ratio + 2 * 450 * 2e-4) + steps * 0.05 * ratio)
    assert trial_seconds(size, replace(train, max_train_samples=100), 10**6, step=step) < want / 5
    bigger = trial_seconds(size, replace(train, batch_size=20), 10**6, step=step)
    assert bigger == pytest.approx(want - steps * 0.05 / 2)  # half the steps, the same tokens (no lengths known)
    # measured per computed token: max_length padding computes every row at full length
    padded = replace(train, padding="max_length", max_seq_length=128)
    assert trial_seconds(size, padded, 10**6, step=step) == pytest.approx(
        128 * (1000 * 2 * 1e-3 + 2 * 450 * 2e-4) + steps * 0.05)
    # the GPU prior: seconds per token·parameter x parameters, the forward a third of a step
    prior = trial_seconds(size, train, 10**6, CostModel(seconds_per_token_param=1e-9))
    assert prior == pytest.approx(50 * 1e-3 * (1000 * 2 + 2 * 450 / 3))


def test_dynamic_padding_computes_each_batch_at_its_longest_row():
    from dataclasses import replace

    from sweep.plan.costs import computed_tokens

    size = DataVolume("RTE", 4, 25.0, lengths=(10, 40, 20, 30))
    train = replace(demo_settings().train, padding="dynamic", max_seq_length=64)
    assert computed_tokens(size, train, 1) == 25  # a row alone pads nothing
    assert computed_tokens(size, train, 4) == 40  # one batch: every row at the longest
    assert computed_tokens(size, train, 2, grouped=True) == 30  # (40, 30) and (20, 10): the least padding
    assert 30 < computed_tokens(size, train, 2) < 40  # random pairs pad more than grouped ones
    assert computed_tokens(size, replace(train, padding="max_length"), 2) == 64
    assert computed_tokens(DataVolume("RTE", 4, 25.0), train, 2) == 25  # no lengths sampled: the mean
    assert computed_tokens(DataVolume("text", 9, 32.0, blocks=True, lengths=(3, 5)), train, 2) == 32


def test_computed_tokens_are_those_the_loops_batches_compute_on(tiny_roberta_dir, tmp_path):
    """The planned padding against the collator's own batches of the same rows, randomly batched."""
    import torch
    from torch.utils.data import DataLoader

    from sweep.data.collate import count_tokens, make_collator
    from sweep.plan.costs import computed_tokens

    data = write_synthetic_glue(tmp_path, ["RTE"], n_train=400)
    spec, tokenizer = load_task("RTE"), load_tokenizer(tiny_roberta_dir)
    train = demo_settings("train.max_seq_length=64", "train.batch_size=16").train
    size = task_size(spec, data, tokenizer, train)
    rows = load_task_data(spec, data)["train"]
    encoded = [dict(tokenizer(a, b, truncation=True, max_length=64)) for a, b in zip(rows["text_a"], rows["text_b"])]
    collate = make_collator(tokenizer, "dynamic", 64)
    computed = [count_tokens(batch).padded for seed in range(8)
                for batch in DataLoader(encoded, batch_size=16, shuffle=True, collate_fn=collate,
                                        generator=torch.Generator().manual_seed(seed))]
    assert min(size.lengths) < max(size.lengths)  # rows of several lengths: padding to plan for
    assert computed_tokens(size, train, 16) == pytest.approx(sum(computed) / (8 * len(encoded)), rel=0.05)
    assert computed_tokens(size, train, 16) > size.mean_tokens


def test_task_size_counts_each_eval_split(tiny_roberta_dir, tmp_path):
    data = write_synthetic_glue(tmp_path, ["MNLI"], n_train=120)
    spec = load_task("MNLI")
    size = task_size(spec, data, load_tokenizer(tiny_roberta_dir), demo_settings().train)
    splits = load_task_data(spec, data)
    assert size.eval_rows == tuple(len(splits[split]) for split in spec.eval_files) and len(size.eval_rows) == 2
