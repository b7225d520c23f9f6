"""Seed soups (sweep.soup=true) without Ray: the shared start (train.init_seed), the soup's weights (LoRA: the
mean of B·A, exactly; full: the mean weights), the end's step that makes, scores and exports it, the registry
taking it only where it wins on the selection split, and the config's one-line refusals."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification

from sweep.config.tasks import load_task
from sweep.config.validate import compose_settings
from sweep.data.selection import Selection
from sweep.errors import ConfigError
from sweep.outputs.export import model_writer
from sweep.outputs.reports import ResultsFiles
from sweep.outputs.soup import SOUP_FOLDER, SeedSoup, Soup
from sweep.outputs.steps import Outcome, run_steps
from sweep.results.export_layout import MADE_BY
from sweep.results.records import TrialRecord, summarize
from sweep.results.trial_reports import CHECKPOINT_MARKER
from sweep.train.loading import load_for_task
from sweep.train.loop import evaluate_model, finetune, setup
from sweep.train.lora import ADAPTER_FOLDER, export_merged
from sweep.train.soup_weights import SoupError, write_soup
from tests.helpers.configs import train_config

QUICK = train_config(lr=5e-3, batch_size=16, epochs=1, max_seq_length=64, max_train_samples=64, max_eval_samples=32,
                     init_seed=0)
LORA = replace(QUICK, method="lora", lora=replace(QUICK.lora, r=4))
SEEDS = (1, 2, 3)


@pytest.fixture(scope="module")
def base(tiny_roberta_dir: Path) -> Path:
    """The base every seed starts from (RoBERTa's head reads no pooler: a base without one merges exactly)."""
    return tiny_roberta_dir


@pytest.fixture(scope="module")
def seeds(base, synthetic_glue_dir, cache_dir, tmp_path_factory) -> dict[str, list[Path]]:
    """Each method's checkpoints of RTE for three seeds that share a start."""
    root = tmp_path_factory.mktemp("seeds")
    spec = load_task("RTE")
    out = {}
    for name, train in (("lora", LORA), ("full", QUICK)):
        out[name] = [root / name / f"seed-{seed}" for seed in SEEDS]
        for seed, folder in zip(SEEDS, out[name]):
            finetune(spec, base, synthetic_glue_dir, train, seed, out_dir=folder, cache_dir=cache_dir)
    return out


def test_init_seed_gives_every_seed_the_same_new_head_and_its_own_dropout(base, synthetic_glue_dir, cache_dir):
    spec = load_task("RTE")

    def head(train, seed):
        run = setup(spec, base, synthetic_glue_dir, train, seed, cache_dir=cache_dir)
        return run.bare_model.classifier.out_proj.weight.detach().clone(), torch.rand(3)

    (shared_a, draw_a), (shared_b, draw_b) = head(QUICK, 1), head(QUICK, 2)
    assert torch.equal(shared_a, shared_b)  # one start
    assert not torch.equal(draw_a, draw_b)  # the trial's own seed draws what comes after (dropout)
    own_a, _ = head(replace(QUICK, init_seed=None), 1)
    own_b, _ = head(replace(QUICK, init_seed=None), 2)
    assert not torch.equal(own_a, own_b)  # without it each seed draws its own head


def _merged(checkpoint: Path, base: Path, spec, target: Path) -> dict[str, torch.Tensor]:
    export_merged(checkpoint, base, spec, target)
    return load_file(target / "model.safetensors")


def test_a_lora_soup_is_exactly_the_mean_of_the_seeds_updates(base, seeds, tmp_path):
    """Merged into the base, the soup's weights are the base plus the mean of each seed's B·A, and its head the
    mean head: the mean of the seeds' merged models, to float precision. Averaging A and B apart is not."""
    spec = load_task("RTE")
    merged = [_merged(folder, base, spec, tmp_path / f"merged-{i}") for i, folder in enumerate(seeds["lora"])]
    write_soup(seeds["lora"], tmp_path / "soup")
    config = json.loads((tmp_path / "soup" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (4 * len(SEEDS), 4 * len(SEEDS))  # rank Σr, scaling 1
    soup = _merged(tmp_path / "soup", base, spec, tmp_path / "merged-soup")
    base_weights = load_file(next(base.glob("*.safetensors")))
    changed = 0
    for key, value in soup.items():
        mean = sum(m[key] for m in merged) / len(merged)
        torch.testing.assert_close(value, mean, atol=1e-6, rtol=1e-5)
        changed += key in base_weights and not torch.allclose(value, base_weights[key])
    assert changed >= 4  # the query and value projections of both layers moved: the soup is not the base

    # the naive soup (A and B averaged apart) is another model: mean(B)·mean(A) != mean(B·A)
    states = [load_file(folder / "adapter_model.safetensors") for folder in seeds["lora"]]
    a_key = next(k for k in states[0] if ".query.lora_A." in k)
    b_key = a_key.replace("lora_A", "lora_B")
    naive = (sum(s[b_key] for s in states) / 3) @ (sum(s[a_key] for s in states) / 3)
    exact = sum(s[b_key] @ s[a_key] for s in states) / 3
    assert not torch.allclose(naive, exact, atol=1e-6)


def test_a_full_soup_is_the_mean_of_the_weights(seeds, tmp_path):
    marked = tmp_path / "marked"  # a Ray trial's checkpoint says which evaluation it holds; a soup is none of them
    shutil.copytree(seeds["full"][0], marked)
    (marked / CHECKPOINT_MARKER).write_text('{"epoch": 1}')
    write_soup([marked, *seeds["full"][1:]], tmp_path / "soup")
    assert not (tmp_path / "soup" / CHECKPOINT_MARKER).exists()
    soup = load_file(tmp_path / "soup" / "model.safetensors")
    states = [load_file(folder / "model.safetensors") for folder in seeds["full"]]
    for key, value in soup.items():
        if value.is_floating_point():
            torch.testing.assert_close(value, sum(s[key] for s in states) / 3)
    assert (tmp_path / "soup" / "config.json").is_file() and (tmp_path / "soup" / "tokenizer_config.json").is_file()
    assert not (tmp_path / "soup" / "training_state.pt").exists()  # a soup has no optimizer to resume


def test_target_modules_in_another_order_are_the_same_adapter(seeds, tmp_path):
    """PEFT saves target_modules from a set: two seeds may list them in another order (seen on MiniLM)."""
    shuffled = tmp_path / "shuffled"
    shutil.copytree(seeds["lora"][1], shuffled)
    config = json.loads((shuffled / "adapter_config.json").read_text())
    config["target_modules"] = list(reversed(config["target_modules"]))
    (shuffled / "adapter_config.json").write_text(json.dumps(config))
    write_soup([seeds["lora"][0], shuffled], tmp_path / "soup")
    assert (tmp_path / "soup" / "adapter_model.safetensors").is_file()


def test_checkpoints_that_do_not_average_are_refused(seeds, tmp_path):
    with pytest.raises(SoupError, match="some checkpoints are LoRA adapters and some whole models"):
        write_soup([seeds["lora"][0], seeds["full"][0]], tmp_path / "mixed")
    with pytest.raises(SoupError, match="needs 2 checkpoints or more"):
        write_soup(seeds["lora"][:1], tmp_path / "one")


def _records(folders: list[Path], scores: list[float], reports: list[float]) -> list[TrialRecord]:
    return [TrialRecord(task="RTE", seed=seed, score=score, metrics={"acc": score}, report_score=report,
                        report_metrics={"acc": report}, checkpoint=str(folder), hparams={"lr": 0.005})
            for seed, folder, score, report in zip(SEEDS, folders, scores, reports)]


@pytest.mark.parametrize("best_score, wins", [(0.0, True), (1.0, False)])
def test_the_end_makes_scores_and_exports_the_soup_beside_the_best_seed(base, seeds, synthetic_glue_dir, tmp_path,
                                                                         capsys, best_score, wins):
    """The step exports out_dir/soup/RTE (the merged model with how it was made), scores it on the trials'
    selection and report rows, and it wins only where its selection score beats the best seed's."""
    spec = load_task("RTE")
    selection = Selection("train", 0.2, 0)
    records = _records(seeds["lora"], [best_score, 0.0, 0.0], [0.5, 0.5, 0.5])
    records.append(TrialRecord(task="RTE", seed=9, score=0.0, hparams={"lr": 0.001}, checkpoint=str(seeds["lora"][0])))
    step = SeedSoup([spec], model_writer("lora", [spec], lambda: base), lambda: synthetic_glue_dir, LORA, selection,
                    "tiny-roberta")
    outcome = Outcome(records=records, out_dir=tmp_path / "out", best={"RTE": records[0]})
    run_steps([step, ResultsFiles([spec], None, LORA, synthetic=True, registry=False)], outcome)
    soup = outcome.soups["RTE"]
    folder = tmp_path / "out" / SOUP_FOLDER / "RTE"
    assert soup.folder == folder and soup.seeds == list(SEEDS)  # the best point's seeds, not seed 9's other point
    assert (folder / ADAPTER_FOLDER / "adapter_model.safetensors").is_file()
    made_by = json.loads((folder / MADE_BY).read_text())
    assert made_by["soup_of_seeds"] == list(SEEDS) and made_by["hparams"] == {"lr": 0.005}
    # its scores are what the trials' evaluation gives its model on the same rows
    metrics, report = evaluate_model(folder, spec, synthetic_glue_dir, LORA, selection)
    assert (soup.metrics, soup.report_metrics) == (metrics, report)
    assert soup.score == metrics["acc"] and soup.report_score == report["acc"]
    assert soup.wins is wins
    model = AutoModelForSequenceClassification.from_pretrained(folder, local_files_only=True).eval()
    tokenizer, _ = load_for_task(folder, spec)
    with torch.no_grad():
        logits = model(**tokenizer(["A cat sat."], ["A cat."], return_tensors="pt")).logits
    assert logits.shape == (1, 2)
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("soup RTE:")]
    assert f"the mean of seeds 1, 2, 3 of the best point: acc {soup.score:.4f}" in line
    assert ("beats the best seed" in line) is wins
    (summary,) = outcome.summaries
    assert (summary.soup_seeds, summary.soup_score, summary.soup_wins) == (3, soup.score, wins)
    assert "soup_report_score" in (tmp_path / "out" / "summary.csv").read_text().splitlines()[0]


def test_a_task_with_one_checkpoint_gets_no_soup_and_one_line(base, seeds, synthetic_glue_dir, tmp_path, capsys):
    spec = load_task("RTE")
    records = _records(seeds["lora"], [0.6, 0.5, 0.5], [0.5, 0.5, 0.5])
    records[1].checkpoint = records[2].checkpoint = None  # pruned, or lost with a node
    step = SeedSoup([spec], model_writer("lora", [spec], lambda: base), lambda: synthetic_glue_dir, LORA,
                    Selection(), "tiny-roberta")
    outcome = run_steps([step], Outcome(records=records, out_dir=tmp_path, best={"RTE": records[0]}))
    assert outcome.soups == {} and not (tmp_path / SOUP_FOLDER).exists()
    assert ("soup RTE: not made: 1 of the best point's seeds kept a checkpoint, and a soup averages 2 or more"
            in capsys.readouterr().out)


def test_the_registry_takes_the_soup_only_where_it_wins(base, tmp_path, capsys):
    """tracking=mlflow: the soup gets its own run with its scores; the version registered for the task is the
    soup's (its run, its folder) where it won on the selection split, else the best trial's."""
    from sweep.tracking import SweepTracker
    from sweep.tracking.parent import TrialTracking
    from sweep.tracking.session import TrackingSession

    settings = compose_settings("task=RTE", "model=tiny-roberta", "sweep.seeds=[1,2]", "tracking.experiment=soups")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    for wins in (True, False):
        out = tmp_path / f"out-{wins}"
        tracker = SweepTracker(uri, "soups", spool_dir=out / "mlflow-unsent")
        tracker.start({"task": "RTE"})
        session = TrackingSession(settings.tracking, settings.storage, "tiny-roberta", settings.tasks, out,
                                  resume=False, tracker=tracker)
        session.trials = TrialTracking(uri, tracker.experiment_id, tracker.run_id, "soups", str(out / "mlflow-unsent"))
        trial = tracker.run_id  # the best trial's run: any run of the store will do for the registry
        export_merged_dir = out / "best" / "RTE"
        for folder in (export_merged_dir, out / SOUP_FOLDER / "RTE"):
            folder.mkdir(parents=True)
            AutoModelForSequenceClassification.from_pretrained(base, num_labels=2).save_pretrained(folder)
        record = TrialRecord(task="RTE", seed=1, score=0.6, metrics={"acc": 0.6}, run_id=trial)
        soup = Soup("RTE", [1, 2], {}, out / SOUP_FOLDER / "RTE", {"acc": 0.7}, 0.7 if wins else 0.5,
                    {"acc": 0.65}, 0.65, wins=wins)
        summaries = summarize([record], settings.tasks)
        assert session.end([record], summaries, {"RTE": record}, None, failed=False, soups={"RTE": soup})
        run = client.get_run(soup.run_id)
        assert run.info.run_name == "RTE soup" and run.data.tags["mlflow.parentRunId"] == tracker.run_id
        assert run.data.params["soup_of_seeds"] == "1,2" and run.data.metrics["report.acc"] == 0.65
        assert run.data.tags["sweep.soup_wins"] == str(wins).lower()
        latest = max(client.search_model_versions("name='tiny-roberta-RTE'"), key=lambda v: int(v.version))
        assert latest.run_id == (soup.run_id if wins else trial)


@pytest.mark.parametrize("overrides, says", [
    (["sweep.seeds=[1]"], "sweep.soup: averages the seeds of the best point, and each point runs on 1 seed"),
    (["sweep.seeds=[1,2]", "train.init_seed=null"],
     "sweep.soup: the trials do not share a base: each seed draws its own new head for RTE (train.init_seed=null)"),
    (["sweep.seeds=[1,2]", "+sweep.search.lr={dist: loguniform, low: 1e-5, high: 1e-3}", "sweep.num_samples=2"],
     "sweep.soup: averages the seeds of the best point, and random search draws a new point for every trial"),
])
def test_a_soup_that_cannot_be_made_is_one_line_when_the_config_loads(overrides, says):
    with pytest.raises(ConfigError) as error:
        compose_settings("task=RTE", "sweep.soup=true", "train.init_seed=0", *overrides)
    assert str(error.value).startswith(says), str(error.value)


def test_a_causal_lm_soup_needs_no_init_seed():
    """No new head: every seed's adapters start at B = 0 on the same frozen base."""
    settings = compose_settings("task=wikitext-2", "model=tiny-gpt2", "train.method=lora", "sweep.seeds=[1,2]",
                                "sweep.soup=true")
    assert settings.sweep.soup and settings.train.init_seed is None
