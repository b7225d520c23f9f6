"""How many token positions the sweep's model holds, and the train lengths checked against it.

A sequence longer than the model's position table fails inside every trial (an index error in the
embeddings), so ``train.max_seq_length`` (classification/regression tasks) and ``train.block_size``
(causal LM tasks), with every value a sweep tries for them, are checked before any Ray resource is
asked for. The positions come from the model's own config: its ``builder`` params, or the
``config.json`` of the folder it resolves to (as ``sweep.models.local_folder.resolve_model_dir`` finds it,
without importing torch). A model that comes from S3 is checked on each node when it is staged.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from sweep.config.settings import BuilderConfig, Settings
from sweep.errors import ConfigError

# Model types whose position ids start after padding_idx (transformers' RobertaEmbeddings: position
# ids are padding_idx + 1 + index), so pad_token_id + 1 rows of the table are never usable.
PADDING_OFFSET_TYPES = ("roberta", "xlm-roberta", "camembert")
ROBERTA_BUILDER_PAD_ID = 1  # sweep.models.tiny.ROBERTA_SPECIALS: <s>, <pad>, ...


def position_offset(model_type: str, pad_token_id: int | None) -> int:
    """Rows of the position table a token can never use: RoBERTa numbers positions from padding_idx + 1."""
    return (pad_token_id or 0) + 1 if model_type in PADDING_OFFSET_TYPES else 0


def usable_positions(config: Mapping[str, Any] | Any) -> int | None:
    """Tokens one sequence can hold, from a model's config: its config.json as a dict, or the loaded
    config object (anything with attributes; no transformers import here). GPT-2: n_positions;
    others: max_position_embeddings, less RoBERTa's offset. None when the config does not say."""
    if isinstance(config, Mapping):
        get = config.get
    else:
        def get(key: str) -> Any:
            return getattr(config, key, None)
    total = get("n_positions") or get("max_position_embeddings")
    if not isinstance(total, int):
        return None
    return total - position_offset(str(get("model_type") or ""), get("pad_token_id"))


def too_long(where: str, value: Any, model: str, positions: int) -> str:
    """The one message for a train length longer than the model holds (checked here and in each trial)."""
    return f"{where}: {value} is more than {model} holds ({positions} positions); use at most {positions}"


def folder_positions(model_dir: str | Path) -> int | None:
    """usable_positions of a model folder's config.json (None: no readable config there)."""
    path = Path(model_dir) / "config.json"
    try:
        return usable_positions(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def builder_positions(builder: BuilderConfig) -> int:
    """A tiny model built here: its max_positions, less RoBERTa's offset (sweep.models builds pad id 1)."""
    return builder.max_positions - position_offset(builder.arch, ROBERTA_BUILDER_PAD_ID)


def known_positions(settings: Settings) -> int | None:
    """The model's usable positions where they are known before staging: the same order of sources
    as resolve_model_dir (model.path, storage.model_dir/<name>, builder, package); None otherwise
    (an S3 object, a hub model with no local copy: the staging step checks or fails on those)."""
    model, storage = settings.model, settings.storage
    if model.path:
        return folder_positions(Path(os.path.expanduser(model.path)))
    if storage.kind != "local":
        return None
    if storage.model_dir:
        staged = Path(os.path.expanduser(storage.model_dir)) / model.name
        if staged.exists():
            return folder_positions(staged)
    if model.builder is not None:
        return builder_positions(model.builder)
    if model.package:
        spec = importlib.util.find_spec(model.package)  # finds the folder; imports nothing
        if spec is not None and spec.submodule_search_locations:
            return folder_positions(Path(spec.submodule_search_locations[0]) / "model")
    return None


def _tried_values(settings: Settings, key: str) -> Iterable[tuple[str, Any]]:
    """(where, value) of every length the sweep trains with for train.<key>: its grid or search
    values when the sweep varies it, else the train value."""
    grid, search = settings.sweep.grid.get(key), settings.sweep.search.get(key)
    if grid is None and search is None:
        yield f"train.{key}", getattr(settings.train, key)
    for value in grid or ():
        yield f"sweep.grid.{key}", value
    if isinstance(search, Mapping):
        values = search.get("values") if search.get("dist") == "choice" else [search.get("high")]
        for value in values or ():
            yield f"sweep.search.{key}", value


def check_fits(settings: Settings, positions: int | None) -> None:
    """Every sequence length the sweep trains with fits ``positions``; a ConfigError naming the key otherwise."""
    if positions is None:
        return
    kinds = {spec.kind for spec in settings.tasks}
    keys = (["max_seq_length"] if kinds - {"causal_lm"} else []) + (["block_size"] if "causal_lm" in kinds else [])
    for key in keys:
        for where, value in _tried_values(settings, key):
            if isinstance(value, (int, float)) and value > positions:
                raise ConfigError(too_long(where, value, settings.model.name, positions))


def check_lengths(settings: Settings) -> None:
    """Before any staging (the CLI, after validate): against the positions known without staging."""
    check_fits(settings, known_positions(settings))


def check_model_folder(settings: Settings, model_dir: str | Path) -> None:
    """On the machine that staged the model (an S3 node, or the driver): its own config.json."""
    check_fits(settings, folder_positions(model_dir))
