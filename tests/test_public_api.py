"""The public Python API (Ray-free): ``sweep.load_settings`` gives the command's settings and its one-line
mistakes, ``import sweep`` stays light, each choice has one home (its Literal), and the run-time staging
leaves the settings as they were. ``sweep.run`` itself runs a sweep: tests/test_public_api_sweep.py."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest

import sweep
from sweep.config.command_line import check_command_line
from sweep.config.load import plain_experiment
from sweep.config.validate import compose, validate
from sweep.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("overrides", [
    ["experiment=demo"],
    ["task=[RTE,MRPC]", "model=minilm", "train=quick", "train.lr=1e-4", "sweep.seeds=[38,39]"],
    ["+experiment=demo", "+sweep.grid.lr=[1e-5,2e-5]", "train.method=lora", "resume=auto"],
    ["task=text", "task.path=corpus", "model=tiny-gpt2", "storage.data_dir=data", "out_dir=runs/x"],
])
def test_load_settings_are_the_commands_settings(overrides):
    """The same overrides give the Settings the command checks and runs with, and the same composed config
    (the parent run's params)."""
    ours = sweep.load_settings(*overrides)
    [commands] = check_command_line(plain_experiment(overrides))  # as the command's main() does
    assert ours == commands and ours.composed == commands.composed
    assert isinstance(ours, sweep.Settings) and ours.composed["model"]["name"] == ours.model.name


def test_out_dir_is_the_override_and_paths_are_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    odd = "runs/a b,c=d's"  # spaces, Hydra's , and = and a quote: one value
    keyword = sweep.load_settings("experiment=demo", "storage.data_dir=data", out_dir=Path(odd))
    assert keyword.out_dir == str(tmp_path / odd) and keyword.storage.data_dir == str(tmp_path / "data")
    assert keyword.composed["out_dir"] == odd  # as written, as the command logs it
    assert keyword == sweep.load_settings("experiment=demo", "storage.data_dir=data", "out_dir='runs/a b,c=d\\'s'")


@pytest.mark.parametrize("argv", [
    ["train.precision=fp8"],
    ["sweep.scheduler=fast"],
    ["resume=maybe"],
    ["model=nosuch"],
    ["train.lr=[1"],
    ["model.nosuch=1"],
    ["sweep.grid.lr=[1e-5,2e-5]"],
    ["experiment=demo", "train.max_seq_length=600"],
])
def test_a_mistake_is_the_commands_one_line(argv):
    with pytest.raises(ConfigError) as ours:
        sweep.load_settings(*argv)
    with pytest.raises(ConfigError) as commands:
        check_command_line(argv)
    assert str(ours.value) == str(commands.value) and "\n" not in str(ours.value)


def test_the_command_prints_the_same_line_with_exit_2(tmp_path):
    with pytest.raises(ConfigError) as e:
        sweep.load_settings("train.method=fast")
    assert str(e.value) == "train.method: got 'fast', allowed: full, lora, qlora"
    r = subprocess.run([sys.executable, "-m", "sweep", "train.method=fast"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert (r.returncode, r.stderr) == (2, f"error: {e.value}\n")
    assert list(tmp_path.iterdir()) == []


def loaded_after(code: str) -> list[str]:
    """The heavy top-level packages a fresh interpreter holds after ``code``."""
    probe = (f"import sys\n{code}\nprint(__import__('json').dumps(sorted({{m.split('.')[0] for m in sys.modules}} & "
             "{'torch', 'transformers', 'ray', 'hydra', 'omegaconf', 'mlflow', 'datasets'})))")
    r = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


def test_import_sweep_loads_nothing_heavy():
    assert loaded_after("import sweep") == []
    assert loaded_after("import sweep\nsweep.Settings, sweep.ConfigError") == ["omegaconf"]  # the schema's
    assert loaded_after("import sweep\nsweep.load_settings('experiment=demo')") == ["hydra", "omegaconf"]
    assert "ray" not in loaded_after("from sweep import run") and "torch" not in loaded_after("import sweep\nsweep.run")


def test_the_public_names():
    from sweep.app import tracked_config
    from sweep.config.load import load_settings
    from sweep.config.settings import Settings
    from sweep.results.records import TaskSummary

    assert (sweep.Settings, sweep.load_settings, sweep.TaskSummary) == (Settings, load_settings, TaskSummary)
    assert sweep.run.__module__ == "sweep.app" and sweep.run.__name__ == "run"
    assert typing.get_type_hints(sweep.run)["return"] == list[TaskSummary]
    assert set(sweep.__all__) <= set(dir(sweep))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        sweep.nothing  # noqa: B018
    assert callable(tracked_config)


# ---- each choice has one home: its Literal in settings.py ---------------------------------------------

def test_the_choices_are_the_literals():
    from sweep.config import settings as s
    from sweep.config.validate import CHOICES, RESUME_CHOICES

    homes = {"train.precision": (s.TrainConfig, "precision"), "train.padding": (s.TrainConfig, "padding"),
             "train.method": (s.TrainConfig, "method"), "sweep.keep_checkpoints": (s.SweepConfig, "keep_checkpoints"),
             "sweep.scheduler": (s.SweepConfig, "scheduler"), "sweep.search_alg": (s.SweepConfig, "search_alg"),
             "sweep.aggregate": (s.SweepConfig, "aggregate"), "storage.kind": (s.StorageConfig, "kind"),
             "tracking.kind": (s.TrackingConfig, "kind"), "model.builder.arch": (s.BuilderConfig, "arch")}
    for key, (schema, name) in homes.items():
        literal = typing.get_type_hints(schema)[name]
        assert typing.get_origin(literal) is typing.Literal and CHOICES[key] == typing.get_args(literal), key
    assert set(CHOICES) == {*homes, "sweep.search.dist"}
    assert CHOICES["sweep.search.dist"] == typing.get_args(s.SearchDist)
    assert s.METHODS == typing.get_args(s.Method) and set(s.DEFAULT_LR) == set(s.METHODS)
    assert list(RESUME_CHOICES) == list(typing.get_args(s.Resume)) and RESUME_CHOICES["auto"] is True


def test_validate_gives_the_settings_classes_themselves():
    """OmegaConf checks a copy of each schema whose Literals are str; validate hands back the real classes."""
    from sweep.config.settings import BuilderConfig, ModelConfig, TrainConfig

    settings = validate(compose("experiment=demo", "train.precision=bf16"))
    assert type(settings.train) is TrainConfig and type(settings.model) is ModelConfig
    assert type(settings.model.builder) is BuilderConfig and settings.train.precision == "bf16"
    with pytest.raises(ConfigError, match=r"^model.builder.arch: got 'lstm', allowed: roberta, bert, gpt2$"):
        validate(compose("experiment=demo", "model.builder.arch=lstm"))
    with pytest.raises(ConfigError, match=r"^train.method: Cannot convert 'ListConfig' to string"):  # as a str field's
        validate(compose("train.method=[a]"))


# ---- the settings are made once: what a run finds travels beside them --------------------------------

def test_a_changed_copy_is_logged_from_its_own_values():
    from sweep.app import tracked_config

    settings = sweep.load_settings("experiment=demo", "tracking=none")
    assert tracked_config(settings) == settings.composed and settings.composed["train"]["lr"] == 5e-3
    changed = dataclasses.replace(settings, train=dataclasses.replace(settings.train, lr=1e-4))
    assert changed.composed == {} and tracked_config(changed)["train"]["lr"] == 1e-4
    assert tracked_config(changed)["model"]["name"] == "tiny-roberta" and "composed" not in tracked_config(changed)


def test_run_folder_is_the_argument_then_the_settings_then_a_new_one(tmp_path, monkeypatch):
    import sweep.app as app

    monkeypatch.chdir(tmp_path)
    settings = sweep.load_settings("experiment=demo", out_dir="runs/x")
    assert app.run_folder(settings, "elsewhere") == tmp_path / "elsewhere"
    assert app.run_folder(settings) == tmp_path / "runs" / "x"
    fresh = app.run_folder(sweep.load_settings("experiment=demo"))
    assert fresh.parent.parent == tmp_path / "outputs" and not fresh.exists()


def _model_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "roberta", "max_position_embeddings": 514}))
    return path


def test_a_nodes_shipped_copies_leave_the_settings_as_they_were(tmp_path, monkeypatch):
    """storage=local on a node without the driver's folders: ensure_local finds this node's shipped copies
    (a value of their own), and the settings still name the driver's folders."""
    from sweep.storage.shipping import copy_of, folders_here, pack, unpack
    from sweep.storage.staging import NODE_CACHE_ENV, ensure_local

    monkeypatch.delenv(NODE_CACHE_ENV, raising=False)
    cache = tmp_path / "cache"
    data, model = tmp_path / "driver" / "data", _model_folder(tmp_path / "driver" / "model")
    (data / "glue_data").mkdir(parents=True)
    gone_data, gone_model = str(tmp_path / "gone" / "data"), str(tmp_path / "gone" / "model")  # the driver's own
    unpack(pack(str(data)), cache, gone_data, 2**30)
    unpack(pack(str(model)), cache, gone_model, 2**30)
    settings = validate(compose("experiment=demo", "tracking=none", f"storage.cache_dir={cache}",
                                f"storage.data_dir={gone_data}", f"model.path={gone_model}"))
    before = copy.deepcopy(settings)
    sources = ensure_local(settings)
    assert (sources.data_dir, sources.model_dir) == (copy_of(cache, gone_data), copy_of(cache, gone_model))
    assert settings == before and settings.composed == before.composed
    assert (settings.storage.data_dir, settings.model.path) == (gone_data, gone_model)
    folders = folders_here(settings, cache)
    with pytest.raises(dataclasses.FrozenInstanceError):
        folders.data_dir = "elsewhere"  # type: ignore[misc]
    assert folders.model_dir is None and folders.model_path == str(copy_of(cache, gone_model))


def test_a_node_that_sees_the_driver_folders_uses_them(tmp_path):
    from sweep.storage.shipping import folders_here

    model = _model_folder(tmp_path / "model")
    settings = validate(compose("experiment=demo", f"storage.data_dir={tmp_path}", f"model.path={model}"))
    folders = folders_here(settings, tmp_path / "cache")
    assert (folders.data_dir, folders.model_path) == (str(tmp_path), str(model))
