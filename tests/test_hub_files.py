"""Which files of a Hub repo a sweep fetches, and the config that names Hub sources (no Ray, no network)."""

from __future__ import annotations

import pytest

from sweep.errors import ConfigError, StagingError
from sweep.storage.hub_files import dataset_files, model_files, model_lacks, split_files
from sweep.storage.hub_sources import data_on_hub, model_on_hub
from tests.helpers.configs import compose_settings

# roberta-base's files on the Hub (2026), weights in five formats and an onnx/ folder
ROBERTA_REPO = ["config.json", "dict.txt", "flax_model.msgpack", "merges.txt", "model.safetensors", "onnx/model.onnx",
                "pytorch_model.bin", "rust_model.ot", "tf_model.h5", "tokenizer.json", "vocab.json", "README.md",
                ".gitattributes"]


def test_a_model_is_its_config_tokenizer_and_safetensors_weights_only():
    assert model_files(ROBERTA_REPO) == ["config.json", "merges.txt", "model.safetensors", "tokenizer.json",
                                         "vocab.json"]


def test_sharded_safetensors_come_with_their_index_and_bin_only_where_there_is_no_safetensors():
    sharded = ["config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
               "model.safetensors.index.json", "pytorch_model.bin", "spiece.model", "tokenizer_config.json"]
    assert model_files(sharded) == ["config.json", "model-00001-of-00002.safetensors",
                                    "model-00002-of-00002.safetensors", "model.safetensors.index.json",
                                    "spiece.model", "tokenizer_config.json"]
    assert "pytorch_model.bin" in model_files(["config.json", "pytorch_model.bin", "tf_model.h5"])
    assert "tf_model.h5" not in model_files(["config.json", "pytorch_model.bin", "tf_model.h5"])


def test_a_repo_without_config_or_pytorch_weights_is_named_for_what_it_lacks():
    assert model_lacks(model_files(["config.json", "tf_model.h5"])) == [
        "weights (model.safetensors or pytorch_model.bin)"]
    assert model_lacks(model_files(["model.safetensors"])) == ["config.json"]
    assert model_lacks(model_files(ROBERTA_REPO)) == []


def test_a_dataset_gives_only_the_parquet_files_of_the_splits_a_sweep_reads():
    glue = ["README.md", "rte/train-00000-of-00001.parquet", "rte/validation-00000-of-00001.parquet",
            "rte/test-00000-of-00001.parquet", "mnli/train-00000-of-00001.parquet",
            "mnli/validation_matched-00000-of-00001.parquet", "mnli_matched/validation-00000-of-00001.parquet"]
    assert dataset_files(glue, [("rte", "train"), ("rte", "validation")]) == [
        "rte/train-00000-of-00001.parquet", "rte/validation-00000-of-00001.parquet"]  # not its test split
    assert dataset_files(glue, [("mnli", "train"), ("mnli", "validation_matched")]) == [
        "mnli/train-00000-of-00001.parquet", "mnli/validation_matched-00000-of-00001.parquet"]
    assert split_files(glue, "mnli", "validation_matched") == ["mnli/validation_matched-00000-of-00001.parquet"]
    assert split_files(glue, "mnli", "validation") == []  # validation_matched is not validation


def test_the_hub_is_the_default_source_of_a_hub_model_and_of_glue_data():
    settings = compose_settings("task=[RTE,MNLI]", "model=roberta-base")
    assert model_on_hub(settings)
    assert [spec.name for spec in data_on_hub(settings)] == ["RTE", "MNLI"]
    assert {(spec.hf.repo, spec.hf.revision) for spec in data_on_hub(settings)} == {("nyu-mll/glue", "main")}


def test_a_local_source_comes_before_the_hub(tmp_path):
    assert not model_on_hub(compose_settings("model=minilm"))  # its package
    assert not model_on_hub(compose_settings("model=tiny-roberta"))  # built here
    assert not model_on_hub(compose_settings("model=roberta-base", f"model.path={tmp_path}"))
    assert data_on_hub(compose_settings("task=RTE", f"storage.data_dir={tmp_path}")) == []
    assert data_on_hub(compose_settings("task=RTE", "storage.synthetic_data=true")) == []


def test_synthetic_data_is_asked_for_and_a_data_folder_comes_first(tmp_path):
    assert compose_settings("experiment=demo").storage.synthetic
    assert not compose_settings("task=WNLI").storage.synthetic
    assert not compose_settings("experiment=demo", f"storage.data_dir={tmp_path}").storage.synthetic  # real rows


def test_a_text_task_without_a_folder_or_hub_dataset_is_one_line():
    settings = compose_settings("task=text", "model=tiny-gpt2")
    with pytest.raises(StagingError, match="task text: no data: .*storage.data_dir=DIR"):
        data_on_hub(settings)


def test_any_hub_model_and_any_hub_dataset_without_a_yaml():
    settings = compose_settings("model=hub", "model.hub_id=google/electra-small-discriminator", "model.revision=v1.0",
                                "task=hub", "task.dataset=me/reviews", "task.labels=[neg,pos]",
                                "task.eval_split=test")
    assert (settings.model.name, settings.model.revision) == ("electra-small-discriminator", "v1.0")
    hf = settings.tasks[0].hf
    assert (hf.repo, hf.config, hf.label_names, dict(hf.splits)) == (
        "me/reviews", "data", ("neg", "pos"), {"train": "train", "dev": "test"})
    with pytest.raises(ConfigError, match="model.hub_id: model=hub needs the Hub repo"):
        compose_settings("model=hub")
    with pytest.raises(ConfigError, match="task.dataset: required with this task"):
        compose_settings("task=hub")
    with pytest.raises(ConfigError, match="task.labels: required"):
        compose_settings("task=hub", "task.dataset=me/reviews")


def test_wikitext_names_its_hub_dataset():
    hf = compose_settings("task=wikitext-2-raw", "model=tiny-gpt2").tasks[0].hf
    assert (hf.repo, hf.config, dict(hf.splits)) == ("Salesforce/wikitext", "wikitext-2-raw-v1",
                                                     {"train": "train", "valid": "validation", "test": "test"})


def test_the_hub_data_folder_links_glue_configs_and_writes_wikitext_rows_as_its_files(tmp_path):
    """nyu-mll/glue's rte/ read as the Hub's parquet layout; Salesforce/wikitext's rows (each a line of the
    file) written as wiki.{train,valid,test}.raw, whichever splits the task trains and evaluates on."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sweep.config.tasks import load_task
    from sweep.data.glue import load_task_data
    from sweep.data.task_files import check_corpus, split_files
    from sweep.storage.hub import HubPin
    from sweep.storage.hub_data import hub_data_dir

    glue, wiki = tmp_path / "glue-snapshot", tmp_path / "wiki-snapshot"
    for split, labels in (("train", [0, 1, 1]), ("validation", [1, 0])):
        (glue / "rte").mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"sentence1": [f"a {i}" for i in labels], "sentence2": ["b"] * len(labels),
                                 "label": labels, "idx": list(range(len(labels)))}),
                       glue / "rte" / f"{split}-00000-of-00001.parquet")
    for split in ("train", "validation", "test"):
        (wiki / "wikitext-2-raw-v1").mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"text": ["", f" = {split} = \n", f" the {split} text .\n"]}),
                       wiki / "wikitext-2-raw-v1" / f"{split}-00000-of-00001.parquet")
    rte, corpus = load_task("RTE"), load_task("wikitext-2-raw")
    def pin(name: str, repo: str, snapshot) -> HubPin:
        files = tuple(str(p.relative_to(snapshot)) for p in snapshot.rglob("*.parquet"))
        return HubPin(repo, "dataset", "main", name[0] * 40, files, 0, f"task.{name}")

    tasks = [(rte, pin("RTE", "nyu-mll/glue", glue), glue), (corpus, pin("wiki", "Salesforce/wikitext", wiki), wiki)]
    data = hub_data_dir(tasks, tmp_path / "cache")
    assert hub_data_dir(tasks, tmp_path / "cache") == data  # made once
    rows = load_task_data(rte, data)
    assert list(rows["train"]["label"]) == [0, 1, 1] and list(rows["dev"]["text_a"]) == ["a 1", "a 0"]
    check_corpus(corpus, data)
    files = split_files(corpus, data)
    assert [p.name for p in files["train"]] == ["wiki.train.raw"]
    assert (data / "wikitext-2-raw" / "wiki.valid.raw").read_text() == "\n = validation = \n the validation text .\n"
    chosen = load_task("wikitext-2-raw")  # a task trained on valid, evaluated on test, reads the same folder
    assert (data / "wikitext-2-raw" / "wiki.test.raw").is_file() and chosen.folder == "wikitext-2-raw"
