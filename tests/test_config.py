"""Every shipped config composes and validates; bad values are one-line errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.errors import MissingConfigException

from configs import compose_config
from sweep.config import ConfigError, validate
from sweep.tasks import CONF_DIR, GLUE_TASKS, load_task


_compose = compose_config


# Options that cannot run without one value of the user's (each is an error without it, tested below).
NEEDS = {"storage=s3": ["storage.bucket=my-bucket"]}


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


@pytest.mark.parametrize("group", sorted(SCHEMAS))
def test_the_schema_defaults_agree_with_the_default_yaml(group, monkeypatch):
    """Every field the default config sets has the same value as the dataclass default (which only
    fills keys an option leaves out), so a reader of conf/ sees the defaults that run."""
    import dataclasses

    from omegaconf import OmegaConf

    import sweep.config as config

    monkeypatch.setenv("SWEEP_CACHE_DIR", "/somewhere/cache")
    yaml_values = OmegaConf.to_container(_compose()[group], resolve=True)
    schema = getattr(config, SCHEMAS[group])
    defaults = {f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
                for f in dataclasses.fields(schema)}
    differ = {k: (defaults[k], v) for k, v in yaml_values.items() if k in defaults and defaults[k] != v}
    assert differ == {}, f"{SCHEMAS[group]} default vs conf/{group}: {differ}"
    assert set(yaml_values) <= set(defaults)


def test_a_disagreeing_default_is_caught(monkeypatch):
    """The check above can fail: a changed dataclass default shows up as a difference."""
    import dataclasses

    from omegaconf import OmegaConf

    from sweep.config import TrainConfig

    yaml_values = OmegaConf.to_container(_compose()["train"], resolve=True)
    changed = {f.name: f.default for f in dataclasses.fields(TrainConfig)} | {"lr": 1e-3}
    assert {k for k, v in yaml_values.items() if changed[k] != v} == {"lr"}


def test_plus_experiment_still_means_the_preset():
    from sweep.__main__ import plain_experiment

    assert plain_experiment(["sweep", "+experiment=demo", "task=RTE"]) == ["sweep", "experiment=demo", "task=RTE"]
    assert validate(_compose("experiment=demo")).model.name == "tiny-roberta"
    assert validate(_compose()).model.name == "roberta-base"  # experiment: null by default


def test_declared_node_types_compose_and_bad_ones_are_refused():
    ok = validate(_compose("cluster.node_types=[{name:gpu-workers,resources:{CPU:8,GPU:1},max_workers:4}]"))
    assert ok.cluster.node_types == [{"name": "gpu-workers", "resources": {"CPU": 8, "GPU": 1}, "max_workers": 4}]
    for override, message in [
        ("cluster.node_types=[{name:gpu-workers,resources:{CPU:8,GPU:1}}]", "cluster.node_types[0].max_workers: must be a whole number"),
        ("cluster.node_types=[{name:gpu-workers,resources:{},max_workers:2}]", "cluster.node_types[0].resources: must map"),
        ("cluster.node_types=[{resources:{GPU:1},max_workers:2}]", "cluster.node_types[0]: must be a mapping with name"),
        ("cluster.node_types=[{name:g,resources:{GPU:1},max_workers:2,maxx:3}]", "unknown keys ['maxx']"),
    ]:
        with pytest.raises(ConfigError) as error:
            validate(_compose(override))
        assert message in str(error.value)
