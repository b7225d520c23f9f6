"""Every shipped config composes and validates; bad values are one-line errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.errors import MissingConfigException

from sweep.config.tasks import CONF_DIR, GLUE_TASKS, load_task
from sweep.config.validate import validate
from sweep.errors import ConfigError
from tests.helpers.configs import compose_config

_compose = compose_config


# Options that cannot run without one value of the user's (each is an error without it, tested below).
NEEDS = {"storage=s3": ["storage.bucket=my-bucket"], "model=hub": ["model.hub_id=google/electra-small-discriminator"],
         "task=hub": ["task.dataset=me/reviews", "task.labels=[negative,positive]"]}


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


@pytest.mark.parametrize("group", ["task", "model", "train", "sweep", "resources", "storage", "tracking", "cluster"])
def test_every_shipped_option_composes_and_validates(group):
    for option in _options(group):
        settings = validate(_compose(f"{group}={option}", *NEEDS.get(f"{group}={option}", ())))
        assert settings.tasks, f"{group}={option} selects no task"


def test_every_experiment_composes_and_validates():
    for option in _options("experiment"):
        validate(_compose(f"experiment={option}"))


def test_task_selection_single_list_and_glue():
    assert [t.name for t in validate(_compose("task=WNLI")).tasks] == ["WNLI"]
    assert [t.name for t in validate(_compose("task=[WNLI,RTE,MRPC]")).tasks] == ["WNLI", "RTE", "MRPC"]
    assert [t.name for t in validate(_compose("task=glue")).tasks] == list(GLUE_TASKS)


def test_defaults_are_the_original_recipe():
    s = validate(_compose())
    assert (s.train.lr, s.train.batch_size, s.train.epochs, s.train.max_seq_length) == (2e-5, 32, 3, 128)
    assert s.sweep.seeds == list(range(38, 48))


def test_public_overrides_reach_the_settings(tmp_path: Path):
    s = validate(_compose(
        "sweep.seeds=[38,39]", "train.lr=1e-5", "train.epochs=1", f"out_dir={tmp_path}",
        f"storage.data_dir={tmp_path}", f"model.path={tmp_path}", "model=bert-base-uncased",
    ))
    assert s.sweep.seeds == [38, 39] and s.train.lr == 1e-5 and s.train.epochs == 1
    assert s.out_dir == str(tmp_path) and s.storage.data_dir == str(tmp_path)
    assert s.model.name == "bert-base-uncased" and s.model.path == str(tmp_path)


def test_unknown_task_lists_the_tasks():
    with pytest.raises(MissingConfigException) as e:
        _compose("task=NOPE")
    for name in GLUE_TASKS:
        assert name in str(e.value)


@pytest.mark.parametrize(
    "override, expected",
    [
        ("train.lr=-1", "train.lr: must be > 0, got -1.0"),
        ("train.lr=abc", "train.lr: Value 'abc' of type 'str' could not be converted to Float"),
        ("train.epochs=0", "train.epochs: must be a positive integer, got 0"),
        ("train.epochs=1.5", "train.epochs: Value '1.5'"),
        ("train.batch_size=x", "train.batch_size: Value 'x'"),
        ("sweep.seeds=[]", "sweep.seeds: is empty"),
        ("sweep.seeds=[1,1]", "sweep.seeds: has duplicates"),
        ("sweep.seeds=[a]", "sweep.seeds[0]: Value 'a'"),
        ("train.padding=none", "train.padding: got 'none', allowed: dynamic, max_length"),
        ("train.precision=fp8", "train.precision: got 'fp8', allowed: auto, fp32, bf16, fp16"),
        ("+train.learning_rate=1", "train.learning_rate: Key 'learning_rate' not in 'TrainConfig' (keys of train: lr,"),
        ("resources.gpus_per_trial=-1", "resources.gpus_per_trial: must be >= 0"),
        ("resources.gpus_per_trial=1.5", "resources.gpus_per_trial: above 1 must be a whole number"),
        ("train.warmup_ratio=1.5", "train.warmup_ratio: must be in [0, 1)"),
        ("sweep.keep_checkpoints=some", "sweep.keep_checkpoints: got 'some', allowed: best, all"),
        ("storage.kind=ftp", "storage.kind: got 'ftp', allowed: local, s3"),
        ("storage=s3", "storage.bucket: is required with storage=s3"),
        ("storage.output_prefix=/tmp/out", "storage.output_prefix: must look like s3://BUCKET/PREFIX"),
        ("+storage.max_unpack_gb=0", "storage.max_unpack_gb: must be > 0"),
        ("+storage.progress_every_s=-1", "storage.progress_every_s: must be >= 0"),
        ("+storage.aws_secret_access_key=hunter2-secret", "storage.aws_secret_access_key: credentials are never read"),
        ("+storage.access_key=hunter2-secret", "storage.access_key: credentials are never read"),
        ("resume=maybe", "resume: expected true, false or auto, got 'maybe'"),
        ("resume=1", "resume: expected true, false or auto, got 1"),
    ],
)
def test_bad_values_are_one_line_errors_naming_the_key(override, expected):
    with pytest.raises(ConfigError) as e:
        validate(_compose(override))
    message = str(e.value)
    assert message.startswith(expected), message
    assert "\n" not in message and "hunter2" not in message  # a credential's value is never echoed


def test_malformed_task_config_names_the_key():
    with pytest.raises(ConfigError, match=r"task.WNLI.labels: a classification task needs"):
        validate(_compose("task.WNLI.labels=[only]"))
    with pytest.raises(ConfigError, match=r"task.WNLI.mode: got 'up', allowed: max, min"):
        validate(_compose("task.WNLI.mode=up"))


def test_task_specs_match_glue():
    assert load_task("CoLA").header is False and load_task("CoLA").metric == "mcc"
    assert load_task("STS-B").kind == "regression" and load_task("STS-B").num_labels == 1
    assert load_task("MNLI").num_labels == 3 and list(load_task("MNLI").eval_files) == ["matched", "mismatched"]
    assert load_task("MRPC").metric == "f1" and load_task("QQP").metric == "acc_and_f1"


# ---- one home per default: the YAML tree; the schema's defaults agree with it ---------------------

SCHEMAS = {"train": "TrainConfig", "sweep": "SweepConfig", "resources": "ResourcesConfig",
           "storage": "StorageConfig", "tracking": "TrackingConfig", "cluster": "ClusterConfig"}


def _schema_defaults(schema: type) -> dict:
    """A dataclass's defaults as the YAML writes them (a nested dataclass, e.g. sweep.halving, as a mapping)."""
    import dataclasses

    made = {f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            for f in dataclasses.fields(schema)}
    return {k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for k, v in made.items()}


def _yaml_homes(group: str) -> dict:
    """Each key of ``group`` -> its value in the YAML that is its home: the default option (config.yaml's
    defaults list), else the first other option that sets it (storage=s3's keys)."""
    from omegaconf import OmegaConf

    default = OmegaConf.to_container(_compose()[group], resolve=True)
    others = [OmegaConf.to_container(_compose(f"{group}={o}")[group], resolve=True) for o in _options(group)]
    homes: dict = {}
    for values in (default, *others):
        homes |= {k: v for k, v in values.items() if k not in homes}
    return homes


def _disagreements(schema: type, homes: dict) -> dict:
    defaults = _schema_defaults(schema)
    return {k: (defaults.get(k, "<no such field>"), homes.get(k, "<set in no YAML>"))
            for k in set(defaults) | set(homes) if defaults.get(k) != homes.get(k) or k not in homes}


@pytest.mark.parametrize("group", sorted(SCHEMAS))
def test_the_schema_defaults_agree_with_the_default_yaml(group, monkeypatch):
    """Every field of the schema has its default in conf/ (the default option, else another option of the
    group) and the dataclass default is that value (it only fills keys an option leaves out), so a reader of
    conf/ sees the defaults that run: each default has one home, the YAML, checked here field by field."""
    import sweep.config.settings as config

    monkeypatch.setenv("SWEEP_CACHE_DIR", "/somewhere/cache")
    differ = _disagreements(getattr(config, SCHEMAS[group]), _yaml_homes(group))
    assert differ == {}, f"{SCHEMAS[group]} default vs conf/{group}: {differ}"


def test_every_model_option_sets_every_model_key():
    """model has no default option of its own: each option sets every key (the dataclass default never
    applies), and a builder's defaults are the tiny RoBERTa's; the top-level keys agree with config.yaml."""
    import dataclasses

    from omegaconf import OmegaConf

    from sweep.config.settings import BuilderConfig, ModelConfig, Settings

    builder_keys = set(_schema_defaults(BuilderConfig))
    for option in _options("model"):
        values = OmegaConf.to_container(_compose(f"model={option}").model, resolve=True)
        assert set(values) == set(_schema_defaults(ModelConfig)), option
        assert values["builder"] is None or set(values["builder"]) == builder_keys, option
    tiny = OmegaConf.to_container(_compose("model=tiny-roberta").model.builder)
    assert _disagreements(BuilderConfig, tiny) == {}
    top = _compose()
    fields = {f.name: f.default for f in dataclasses.fields(Settings)}
    assert (top.out_dir, top.resume) == (fields["out_dir"], fields["resume"])


def test_a_disagreeing_default_is_caught(monkeypatch):
    """The check above can fail: a changed dataclass default, or a field no YAML sets, shows up."""
    import dataclasses

    from sweep.config.settings import StorageConfig, TrainConfig

    homes = _yaml_homes("train")
    changed = dataclasses.make_dataclass("TrainConfig", [("lr", float, dataclasses.field(default=1e-3))],
                                         bases=(TrainConfig,))
    assert set(_disagreements(changed, homes)) == {"lr"}
    extra = dataclasses.make_dataclass("StorageConfig", [("new_key", int, dataclasses.field(default=1))],
                                       bases=(StorageConfig,))
    assert _disagreements(extra, _yaml_homes("storage")) == {"new_key": (1, "<set in no YAML>")}


@pytest.mark.parametrize("home", [None, "/elsewhere/cache"])
def test_the_cache_folder_and_store_defaults_have_one_home_in_code(home, monkeypatch):
    """conf/'s cache_dir (every storage option) and tracking.uri resolve to sweep.config.defaults' values,
    which the schema, the Jobs client, the tracking fallback and the server import."""
    import sweep.cluster.jobs as ray_jobs
    import sweep.tracking.store as store
    from sweep.config.defaults import CACHE_DIR_ENV, TRACKING_URI, default_cache_dir
    from sweep.config.settings import StorageConfig, TrackingConfig

    if home is None:
        monkeypatch.delenv(CACHE_DIR_ENV, raising=False)
    else:
        monkeypatch.setenv(CACHE_DIR_ENV, home)
    expected = home or f"{Path.home()}/.cache/sweep"
    assert default_cache_dir() == expected == StorageConfig().cache_dir
    for option in _options("storage"):
        assert _compose(f"storage={option}").storage.cache_dir == expected, option
    assert _compose().tracking.uri == TRACKING_URI == TrackingConfig().uri
    assert ray_jobs.DEFAULT_TRACKING_URI == store.FALLBACK_URI == TRACKING_URI


def test_plus_experiment_still_means_the_preset():
    from sweep.cli.run import plain_experiment

    assert plain_experiment(["sweep", "+experiment=demo", "task=RTE"]) == ["sweep", "experiment=demo", "task=RTE"]
    assert validate(_compose("experiment=demo")).model.name == "tiny-roberta"
    assert validate(_compose()).model.name == "roberta-base"  # experiment: null by default


def test_declared_node_types_compose_and_bad_ones_are_refused():
    ok = validate(_compose("cluster.node_types=[{name:gpu-workers,resources:{CPU:8,GPU:1},max_workers:4}]"))
    assert ok.cluster.node_types == [{"name": "gpu-workers", "resources": {"CPU": 8, "GPU": 1}, "max_workers": 4}]
    for override, message in [
        ("cluster.node_types=[{name:gpu-workers,resources:{CPU:8,GPU:1}}]",
         "cluster.node_types[0].max_workers: must be a whole number"),
        ("cluster.node_types=[{name:gpu-workers,resources:{},max_workers:2}]",
         "cluster.node_types[0].resources: must map"),
        ("cluster.node_types=[{resources:{GPU:1},max_workers:2}]",
         "cluster.node_types[0]: must be a mapping with name"),
        ("cluster.node_types=[{name:g,resources:{GPU:1},max_workers:2,maxx:3}]", "unknown keys ['maxx']"),
    ]:
        with pytest.raises(ConfigError) as error:
            validate(_compose(override))
        assert message in str(error.value)


# ---- lengths the model holds (sweep.config.model_limits) ---------------------------------------------

@pytest.mark.parametrize(
    "overrides, expected",
    [
        # a package's config.json (BERT: every position usable)
        (["model=minilm", "train.max_seq_length=100000"],
         "train.max_seq_length: 100000 is more than minilm holds (512 positions); use at most 512"),
        # a builder: 66 positions, RoBERTa's first two never used
        (["experiment=demo", "model.builder.max_positions=66", "train.max_seq_length=65"],
         "train.max_seq_length: 65 is more than tiny-roberta holds (64 positions); use at most 64"),
        (["experiment=demo", "model.builder.max_positions=66", "+sweep.grid.max_seq_length=[32,128]"],
         "sweep.grid.max_seq_length: 128 is more than tiny-roberta holds (64 positions); use at most 64"),
        (["experiment=demo", "model.builder.max_positions=66",
          "+sweep.search.max_seq_length={dist:choice,values:[32,99]}"],
         "sweep.search.max_seq_length: 99 is more than tiny-roberta holds (64 positions)"),
        # a causal LM: block_size against GPT-2's n_positions
        (["model=tiny-gpt2", "task=wikitext-2", "train.block_size=257"],
         "train.block_size: 257 is more than tiny-gpt2 holds (256 positions); use at most 256"),
    ],
)
def test_a_length_beyond_the_model_is_one_line_naming_the_key(overrides, expected):
    from sweep.config.model_limits import check_lengths

    with pytest.raises(ConfigError) as e:
        check_lengths(validate(_compose(*overrides)))
    assert str(e.value).startswith(expected) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize(
    "overrides",
    [
        ["model=minilm", "train.max_seq_length=512"],
        ["experiment=demo", "model.builder.max_positions=66", "train.max_seq_length=64"],
        # the grid replaces train.max_seq_length: only the values tried count
        ["experiment=demo", "model.builder.max_positions=66", "train.max_seq_length=1000",
         "+sweep.grid.max_seq_length=[32,64]"],
        ["model=tiny-gpt2", "task=wikitext-2", "train.block_size=256"],
        # block_size is for causal LM tasks only; max_seq_length for the others only
        ["model=minilm", "task=RTE", "train.block_size=100000"],
        ["model=tiny-gpt2", "task=wikitext-2", "train.max_seq_length=100000"],
        # a hub model with no local copy: its staging finds the folder (and checks it) or fails
        ["model=roberta-base", "train.max_seq_length=100000"],
    ],
)
def test_a_length_the_model_holds_passes(overrides):
    from sweep.config.model_limits import check_lengths

    check_lengths(validate(_compose(*overrides)))


def test_a_model_folders_config_json_gives_its_positions(tmp_path):
    """model.path (and a staged folder, checked where it is staged): RoBERTa's pad_token_id + 1 rows
    of the position table are never used, so 130 rows hold 128 tokens."""
    import json

    from sweep.config.model_limits import check_lengths, check_model_folder

    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "roberta", "max_position_embeddings": 130, "pad_token_id": 1}))
    check_lengths(validate(_compose(f"model.path={tmp_path}", "train.max_seq_length=128")))
    with pytest.raises(ConfigError,
                       match=r"^train.max_seq_length: 129 is more than roberta-base holds \(128 positions\)"):
        check_lengths(validate(_compose(f"model.path={tmp_path}", "train.max_seq_length=129")))
    staged = validate(_compose("train.max_seq_length=129"))  # e.g. storage=s3: only the node has the folder
    with pytest.raises(ConfigError, match=r"^train.max_seq_length: 129 is more than roberta-base holds"):
        check_model_folder(staged, tmp_path)


def test_a_built_model_holds_exactly_what_its_builder_promises(tiny_roberta_dir):
    """The positions known before the build (builder params) are the built model's own, and the
    model really runs that many tokens and fails on one more (RoBERTa's offset is real)."""
    import torch
    from transformers import AutoModel

    from sweep.config.model_limits import builder_positions, folder_positions
    from sweep.models.quiet import quiet_transformers

    positions = builder_positions(validate(_compose("model=tiny-roberta")).model.builder)
    assert positions == folder_positions(tiny_roberta_dir) == 512
    with quiet_transformers():
        model = AutoModel.from_pretrained(tiny_roberta_dir)
    with torch.no_grad():
        model(input_ids=torch.full((1, positions), 5))
        with pytest.raises((IndexError, RuntimeError), match="out of"):  # the position table (or its buffers) runs out
            model(input_ids=torch.full((1, positions + 1), 5))


def test_usable_positions_reads_a_config_json_and_a_loaded_config_alike():
    """One rule for the positions: the CLI's check reads config.json (a dict), the trial and the
    server read the loaded model's config object; GPT-2 names them n_positions, RoBERTa loses its offset."""
    from transformers import BertConfig, GPT2Config, RobertaConfig

    from sweep.config.model_limits import usable_positions

    gpt2 = GPT2Config(n_positions=256)
    assert usable_positions(gpt2) == usable_positions(gpt2.to_dict()) == 256
    roberta = RobertaConfig(max_position_embeddings=130, pad_token_id=1)
    assert usable_positions(roberta) == usable_positions(roberta.to_dict()) == 128
    bert = BertConfig(max_position_embeddings=96, pad_token_id=0)
    assert usable_positions(bert) == usable_positions(bert.to_dict()) == 96
    assert usable_positions({"model_type": "gpt2"}) is None


# ---- the command line, checked before Hydra runs the job (sweep.config.command_line) ----------------

def test_the_command_line_check_lets_every_kind_of_good_argument_through(tmp_path):
    from sweep.config.command_line import check_command_line

    for argv in (
        ["--help"],
        ["experiment=demo", "--cfg", "job"],
        ["experiment=demo", f"hydra.run.dir={tmp_path}/run", "+resources.tasks.WNLI.gpus_per_trial=0"],
        ["experiment=demo", "model.builder.max_positions=66", "train.max_seq_length=64"],
        ["-m", "experiment=demo", "model=tiny-roberta,tiny-gpt2", f"hydra.sweep.dir={tmp_path}/multi"],
        ["task=text", f"task.path={tmp_path}", "model=tiny-gpt2"],
    ):
        check_command_line(argv)
    assert list(tmp_path.iterdir()) == []  # checking writes nothing


@pytest.mark.parametrize(
    "argv, expected",
    [
        # every job of a multirun is composed and validated: the bad value of a sweep is found
        (["-m", "experiment=demo", "model=tiny-roberta,nosuch"],
         "model: Could not find 'model/nosuch'; available options in 'model': "),
        (["-m", "experiment=demo", "train.max_seq_length=64,600"],
         "train.max_seq_length: 600 is more than tiny-roberta holds (512 positions)"),
        (["train.lr=[1"], "train.lr=[1: not a valid override ("),
        (["model.nosuch=1"],
         "model.nosuch: no such key (keys of model: name, hub_id, revision, path, package, builder)"),
        (["nosuch=1"], "nosuch: no such key (keys of the config: task, model, train, sweep, resources, storage, "
                       "tracking, cluster, out_dir, resume)"),
        (["sweep.grid.lr=[1e-5,2e-5]"],
         "sweep.grid.lr: not in sweep.grid yet; add it with +sweep.grid.lr=[1e-5,2e-5]"),
        (["+train.epochs=1"],
         "Could not append to config. An item is already at 'train.epochs'; Either remove + prefix: 'train.epochs=1'"),
    ],
)
def test_the_command_line_check_names_the_mistake_on_one_line(argv, expected):
    from sweep.config.command_line import check_command_line

    with pytest.raises(ConfigError) as e:
        check_command_line(argv)
    assert str(e.value).startswith(expected) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("value, resumes", [("true", True), ("false", False), ("auto", True), ("AUTO", True)])
def test_resume_is_true_false_or_auto(value, resumes):
    assert validate(_compose(f"resume={value}")).resume is resumes
