"""A sweep's Hub sources: which repos it reads (the model's, each task's dataset), pinned on the driver,
fetched on each node, and laid out as the data folder the readers know.

The driver pins (``hub_pins``): the model when no local source names it (``models.local_folder``), and each
task's dataset when there is no ``storage.data_dir`` (GLUE: ``nyu-mll/glue``, one repo whose configs are the
tasks' folders; WikiText: ``Salesforce/wikitext``; ``task=hub``: the user's). The pins travel down as a value;
a node fetches them (``fetch_all``) and builds the data folder from them (``sweep.storage.hub_data``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from sweep.config.settings import Settings
from sweep.config.tasks import TaskSpec
from sweep.errors import StagingError
from sweep.storage import hub_files
from sweep.storage.hub import Fetched, HubNotReachable, HubPin, fetch, resolve

MODEL_HINT = "give a local copy: model.path=DIR (a save_pretrained folder) or storage.model_dir=DIR"
DATA_HINT = "give the data as a folder: storage.data_dir=DIR"


@dataclass(frozen=True)
class HubPins:
    """What the driver pinned on the Hub: every node fetches exactly these commits."""

    model: HubPin | None = None
    data: tuple[HubPin, ...] = ()  # one per dataset repo (every GLUE task is in nyu-mll/glue)

    def __bool__(self) -> bool:
        return self.model is not None or bool(self.data)

    def all(self) -> list[HubPin]:
        return [p for p in (self.model, *self.data) if p is not None]

    def data_for(self, spec: TaskSpec) -> HubPin:
        return next(p for p in self.data if (p.repo_id, p.revision) == (spec.hf.repo, spec.hf.revision))

    def commits(self) -> dict[str, str]:
        """``model:roberta-base@main`` -> its commit: what a resumed sweep pins again (``hub_pins(saved=)``)."""
        return {_key(p.repo_type, p.repo_id, p.revision): p.sha for p in self.all()}


def _key(repo_type: str, repo_id: str, revision: str) -> str:
    return f"{repo_type}:{repo_id}@{revision}"


def model_on_hub(settings: Settings) -> bool:
    """Whether the model comes from the Hub: no model.path, staged copy, builder or package names it."""
    from sweep.models.local_folder import HUB, model_source

    if settings.storage.kind != "local":
        return False
    staged = Path(os.path.expanduser(settings.storage.model_dir)) if settings.storage.model_dir else None
    return model_source(asdict(settings.model), staged) == HUB


def data_on_hub(settings: Settings) -> list[TaskSpec]:
    """The tasks whose data comes from the Hub: no storage.data_dir, no synthetic data, and not a text
    task given its own folder (task.path)."""
    storage = settings.storage
    if storage.kind != "local" or storage.data_dir is not None or storage.synthetic:
        return []
    on_hub = [spec for spec in settings.tasks if spec.path is None]
    lacking = [spec.name for spec in on_hub if spec.hf is None]
    if lacking:
        raise StagingError(
            f"task {lacking[0]}: no data: storage.data_dir is unset and the task names no Hub dataset (hf.repo); "
            f"{DATA_HINT}, or storage.synthetic_data=true for generated rows (a smoke test, never a result)")
    return on_hub


def hub_pins(settings: Settings, saved: Mapping[str, str] | None = None) -> HubPins:
    """On the driver, before Ray starts: every Hub source resolved to a commit and its files checked (one
    line each for a missing repo, revision or file; offline, the cache's copy or the one line). ``saved``:
    the commits a sweep pinned before (``HubPins.commits``): a resumed sweep trains on the same ones."""
    saved = saved or {}
    model = None
    if model_on_hub(settings):
        hub_id, revision = settings.model.hub_id, settings.model.revision
        model = resolve(hub_id, "model", revision, "model.hub_id", hub_files.model_files, hub_files.model_lacks,
                        MODEL_HINT, at=saved.get(_key("model", hub_id, revision)))
    repos: dict[tuple[str, str], list[TaskSpec]] = {}
    for spec in data_on_hub(settings):
        repos.setdefault((spec.hf.repo, spec.hf.revision), []).append(spec)
    data = tuple(_dataset_pin(repo, revision, specs, saved.get(_key("dataset", repo, revision)))
                 for (repo, revision), specs in repos.items())
    return HubPins(model, data)


def _dataset_pin(repo: str, revision: str, specs: list[TaskSpec], at: str | None) -> HubPin:
    wanted = [(spec.hf.config, split) for spec in specs for split in _hub_splits(spec)]
    setting = f"task.{specs[0].name}" if len(specs) == 1 else "task (" + ", ".join(s.name for s in specs) + ")"

    def lacks(selected: list[str]) -> list[str]:
        return [f"{spec.hf.config}/{split}-*.parquet (task {spec.name})" for spec in specs
                for split in _hub_splits(spec) if not hub_files.split_files(selected, spec.hf.config, split)]

    return resolve(repo, "dataset", revision, setting, lambda files: hub_files.dataset_files(files, wanted),
                   lacks, DATA_HINT, at=at)


def _hub_splits(spec: TaskSpec) -> list[str]:
    """The repo's split names a task reads (train, validation, MNLI's validation_matched); a corpus chosen by
    split names (WikiText: task.wikitext-2.train_split=valid) gets every split its hf.splits maps."""
    from sweep.data.task_files import hub_split

    if spec.kind == "causal_lm" and spec.split_file and spec.hf.splits:
        return list(spec.hf.splits.values())
    return [hub_split(spec, split) for split in ("train", *spec.eval_files)]


Fallback = Callable[[HubPin, HubNotReachable], None]  # fills this node's cache from elsewhere (the driver)


@dataclass(frozen=True)
class HubHere:
    model_dir: Path | None
    data_dir: Path | None
    downloaded: int  # bytes fetched from the Hub by this call


def fetch_all(settings: Settings, pins: HubPins, cache: Path, fallback: Fallback | None = None) -> HubHere:
    """Every pin in this node's Hugging Face cache (once per node), and the data folder built from them.
    A pin this node cannot fetch (no network, no token) comes through ``fallback`` when there is one."""
    from sweep.storage.hub_data import hub_data_dir

    fetched: dict[HubPin, Fetched] = {}
    for pin in pins.all():
        try:
            fetched[pin] = fetch(pin)
        except HubNotReachable as e:
            if fallback is None:
                raise
            fallback(pin, e)
            fetched[pin] = fetch(pin)  # the driver's copy is in the cache now: no request
    model_dir = fetched[pins.model].path if pins.model is not None else None
    data_dir = None
    if pins.data:
        tasks = [(spec, pins.data_for(spec), fetched[pins.data_for(spec)].path) for spec in data_on_hub(settings)]
        data_dir = hub_data_dir(tasks, cache)
    return HubHere(model_dir, data_dir, sum(f.downloaded for f in fetched.values()))
