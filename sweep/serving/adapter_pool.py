"""Many LoRA adapters on one base model: ``sweep serve model=BASE adapters=...`` (one process, the base loaded once).

``model=`` is the base's folder (or ``models:/``, ``s3://``), or the name the sweep knew it by: a model config
(``conf/model/<name>.yaml``, e.g. ``minilm``), found as the sweep finds it (its package, its tiny build, its path).

A LoRA sweep exports per task ``best/<TASK>/`` (the merged model) and ``best/<TASK>/adapter/`` (PEFT's
``adapter_config.json`` + ``adapter_model.safetensors``, the task's head inside). ``adapters=`` is a
comma-separated list; each entry is one of:

- ``NAME=DIR``: the adapter in DIR (an adapter folder, or an export ``best/<TASK>/`` holding ``adapter/``),
  served as NAME;
- ``DIR``: the same, served under the name its merged export is served under (``<model>-<task>``, from the
  export's ``sweep_made_by.json``; else the folder's name), so clients keep their model names;
- ``FOLDER``: a sweep's output folder (or its ``best/``): every ``best/<TASK>/adapter/`` in it, each named so.

Every adapter is its own model on every route: ``/v2/models/NAME/infer`` (REST and gRPC), and for causal LMs
``/openai/v1/completions`` and ``/chat/completions`` with ``"model": NAME``; ``/v1/models`` and
``/openai/v1/models`` list them. PEFT holds them all on the one base (``PeftModel.from_pretrained`` for the
first, ``load_adapter`` for the rest); a classifier adapter brings its own head (PEFT's ``modules_to_save``).

Requests of different adapters never share a forward pass: each adapter's model has its own micro-batcher
(its own queue: batches of one adapter's requests), and a forward pass runs under one lock that first makes
its adapter the active one (``set_adapter``), so the adapters' passes take turns on the shared base.

Every mistake is one ``ServeError`` line, found before any weight is read: a folder without an adapter, a
name given twice, adapters of different kinds or head sizes, an adapter whose layers or shapes are not the
base's (the base built on the meta device), a ``model=`` that is itself an adapter or a merged LoRA export.
"""

from __future__ import annotations

import functools
import json
import re
import threading
import warnings
from collections.abc import Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweep.config.defaults import default_cache_dir
from sweep.results.export_layout import ADAPTER_FOLDER, MADE_BY, registry_name
from sweep.serving.cpu_budget import ServerWork, set_server_threads
from sweep.serving.model_location import made_by, task_inputs
from sweep.serving.protocol import TaskInputs
from sweep.serving.server import Loader, Served, ServeError, ServeOptions, bound_output_tokens, serve

ADAPTER_CONFIG = "adapter_config.json"  # PEFT's; a folder holding it is an adapter, not a model
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
SEQ_CLS, CAUSAL_LM = "SEQ_CLS", "CAUSAL_LM"  # PEFT's task types the server answers
_NAME = re.compile(r"^[A-Za-z0-9][\w.\-]*$")  # a model name in a URL path (/v2/models/NAME/infer)
_PEFT_PREFIX = "base_model.model."  # how PEFT's saved keys begin


@dataclass(frozen=True)
class Adapter:
    """One adapter to serve: its name, its folder and what its ``adapter_config.json`` says."""

    name: str
    folder: Path
    task_type: str
    base_model: str | None  # base_model_name_or_path: the folder (or hub id) it was trained on
    labels: tuple[str, ...] | None  # the export's id2label (best/<TASK>/config.json), when beside it
    inputs: TaskInputs | None = None  # what its task takes (text, or text and text_pair), when its export says


# -- adapters= -> the adapters ------------------------------------------------------------------------------


def _adapter_folder(path: Path, entry: str) -> Path:
    """The folder holding ``adapter_config.json``: ``path`` itself, or its ``adapter/`` (an export)."""
    if not path.exists():
        raise ServeError(f"adapters: {entry}: {path} does not exist")
    for folder in (path, path / ADAPTER_FOLDER):
        if (folder / ADAPTER_CONFIG).is_file():
            return folder
    raise ServeError(f"adapters: {entry}: {path} holds no {ADAPTER_CONFIG} (not a PEFT adapter); give an adapter "
                     f"folder, a LoRA export best/<TASK>/ (with {ADAPTER_FOLDER}/) or a sweep's output folder")


def _exports(path: Path) -> list[Path]:
    """The LoRA exports under a sweep's output folder (or its ``best/``): ``best/<TASK>/`` with ``adapter/``."""
    best = path / "best" if (path / "best").is_dir() else path
    return sorted(p for p in best.iterdir() if (p / ADAPTER_FOLDER / ADAPTER_CONFIG).is_file()) \
        if best.is_dir() else []


def _export_of(folder: Path) -> Path:
    """The LoRA export an adapter folder belongs to (``best/<TASK>/`` for its ``adapter/``), else the folder."""
    return folder.parent if folder.name == ADAPTER_FOLDER else folder


def _default_name(folder: Path) -> str:
    """The name the merged export beside the adapter is served under: ``<model>-<task>``, else the folder's."""
    export = _export_of(folder)
    info = made_by(export)
    if info.get("model") and info.get("task"):
        return registry_name(info["model"], info["task"])
    return registry_name(export.resolve().name)


def _labels(folder: Path) -> tuple[str, ...] | None:
    """The task's label names from the merged export's config beside the adapter (``best/<TASK>/config.json``)."""
    for config in (folder / "config.json", folder.parent / "config.json"):
        try:
            id2label = json.loads(config.read_text()).get("id2label") or {}
        except (OSError, json.JSONDecodeError, AttributeError):
            continue
        if id2label:
            return tuple(id2label[k] for k in sorted(id2label, key=int))
    return None


def _read_adapter(name: str, folder: Path, entry: str) -> Adapter:
    try:
        config = json.loads((folder / ADAPTER_CONFIG).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ServeError(f"adapters: {entry}: cannot read {folder / ADAPTER_CONFIG}: {e}") from None
    if not any((folder / w).is_file() for w in ADAPTER_WEIGHTS):
        raise ServeError(f"adapters: {entry}: {folder} has {ADAPTER_CONFIG} but no {ADAPTER_WEIGHTS[0]}")
    task_type = config.get("task_type")
    if task_type not in (SEQ_CLS, CAUSAL_LM):
        raise ServeError(f"adapters: {entry}: {folder} is a {task_type or 'task-less'} adapter; this server "
                         f"serves {SEQ_CLS} (a classifier's) and {CAUSAL_LM} (a language model's) adapters")
    if not _NAME.match(name):
        raise ServeError(f"adapters: {entry}: {name!r} is not a model name (letters, digits, '_', '-', '.')")
    return Adapter(name, folder, task_type, config.get("base_model_name_or_path"), _labels(folder),
                   task_inputs(_export_of(folder)))


def find_adapters(value: str) -> list[Adapter]:
    """``adapters=`` (see the module docstring) as the adapters to serve, in order; every mistake a ServeError."""
    found: list[Adapter] = []
    for entry in (e.strip() for e in value.split(",")):
        if not entry:
            raise ServeError(f"adapters: an empty entry in {value!r}; give NAME=DIR,NAME=DIR or a sweep's output "
                             "folder")
        name, sep, where = entry.partition("=")
        if sep and not Path(entry).expanduser().exists():  # a folder may have "=" in its name (Hydra's multirun)
            if not name or not where:
                raise ServeError(f"adapters: {entry}: expected NAME=DIR")
            found.append(_read_adapter(name, _adapter_folder(Path(where).expanduser(), entry), entry))
            continue
        path = Path(entry).expanduser()
        exports = _exports(path) if path.is_dir() and not (path / ADAPTER_CONFIG).is_file() \
            and not (path / ADAPTER_FOLDER / ADAPTER_CONFIG).is_file() else []
        if path.is_dir() and exports:
            found += [_read_adapter(_default_name(e), e / ADAPTER_FOLDER, entry) for e in exports]
            continue
        folder = _adapter_folder(path, entry)
        found.append(_read_adapter(_default_name(folder), folder, entry))
    seen: dict[str, Adapter] = {}
    for adapter in found:
        if adapter.name in seen:
            raise ServeError(f"adapters: the name {adapter.name} is given twice ({seen[adapter.name].folder} and "
                             f"{adapter.folder}); name them apart: NAME=DIR")
        seen[adapter.name] = adapter
    kinds = {a.task_type for a in found}
    if len(kinds) > 1:
        by_kind = "; ".join(f"{k}: {', '.join(a.name for a in found if a.task_type == k)}" for k in sorted(kinds))
        raise ServeError(f"adapters: one base serves one kind of adapter, got classifier and language-model "
                         f"adapters ({by_kind}); serve each kind from its own server")
    return found


# -- the base against the adapters (no weight read) -----------------------------------------------------------


def _saved_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """The adapter's saved tensors' shapes (safetensors' header; no tensor read), keys without PEFT's prefix."""
    weights = folder / ADAPTER_WEIGHTS[0]
    if not weights.is_file():
        import torch

        state = torch.load(folder / ADAPTER_WEIGHTS[1], map_location="meta", weights_only=True)
        return {k.removeprefix(_PEFT_PREFIX): tuple(v.shape) for k, v in state.items()}
    from safetensors import safe_open

    with safe_open(weights, "pt") as f:
        return {k.removeprefix(_PEFT_PREFIX): tuple(f.get_slice(k).get_shape()) for k in f.keys()}


def resolve_base(options: ServeOptions) -> Path:
    """``model=`` as a local folder: a folder or URI (as a plain server resolves it), or a model config's name
    (``minilm``: as the sweep resolves it). An adapter there is the first mistake."""
    from sweep.errors import ModelSourceError, StagingError
    from sweep.serving.model_location import resolve_model_config, resolve_model_source

    local = Path(options.model).expanduser()
    if "://" not in options.model and (local / ADAPTER_CONFIG).is_file():
        raise ServeError(f"model={options.model}: is an adapter, not a base model; give the base it was trained "
                         f"on ({_base_hint(local)}) and the adapter in adapters=")
    try:
        cache_dir = Path(options.cache_dir).expanduser() if options.cache_dir else Path(default_cache_dir())
        if "://" in options.model or local.exists():  # a folder of that name wins over a config's
            return resolve_model_source(options.model, cache_dir, options.tracking_uri)
        return resolve_model_config(options.model, cache_dir)
    except (ModelSourceError, StagingError) as e:
        raise ServeError(str(e)) from None


def check_base(model_dir: Path, model: str, adapters: Sequence[Adapter]) -> int | None:
    """Every adapter fits the base (its layers, their shapes, its head's); returns the classifiers' label count.

    The base is built on the meta device, so this reads no weights; a mismatch is one ServeError line."""
    if (model_dir / ADAPTER_CONFIG).is_file():
        raise ServeError(f"model={model}: is an adapter, not a base model; give the base it was trained on "
                         f"({_base_hint(model_dir)}) and the adapter in adapters=")
    if (model_dir / ADAPTER_FOLDER / ADAPTER_CONFIG).is_file():
        raise ServeError(f"model={model}: is a merged LoRA export (its adapter is already in its weights); give "
                         f"the base the sweep fine-tuned ({_base_hint(model_dir / ADAPTER_FOLDER)})")
    if (model_dir / MADE_BY).is_file() and not any(_is_folder(a.base_model, model_dir) for a in adapters):
        raise ServeError(f"model={model}: is a model a sweep fine-tuned ({model_dir / MADE_BY}), not the base the "
                         f"adapters were trained on ({adapters[0].base_model}); give that base")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification
    from transformers.pytorch_utils import Conv1D

    from sweep.models.quiet import quiet_transformers

    try:
        with quiet_transformers():
            config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ServeError(f"model={model}: cannot read the base model's config: {' '.join(str(e).split())}") from None
    for adapter in adapters:
        _check_same_base(adapter, config, model)
    shapes = {a.name: _saved_shapes(a.folder) for a in adapters}
    classifier = adapters[0].task_type == SEQ_CLS
    num_labels = _head_size(model, config, shapes, adapters) if classifier else None
    if num_labels is not None:
        config.num_labels = num_labels
    auto = AutoModelForSequenceClassification if classifier else AutoModelForCausalLM
    try:
        with quiet_transformers(), torch.device("meta"):
            base = auto.from_config(config)
    except ValueError as e:
        raise ServeError(f"model={model}: a {config.model_type} model cannot take "
                         f"{'classifier' if classifier else 'language-model'} adapters: {e}") from None
    modules = dict(base.named_modules())
    params = {k: tuple(v.shape) for k, v in base.named_parameters()}
    for adapter in adapters:
        for key, shape in sorted(shapes[adapter.name].items(), key=lambda kv: ".lora_" not in kv[0]):  # LoRA's first
            problem = _mismatch(key, shape, modules, params, Conv1D)
            if problem:
                raise ServeError(f"adapters: {adapter.name} ({adapter.folder}) does not fit model={model} "
                                 f"({config.model_type}, hidden size {getattr(config, 'hidden_size', '?')}): "
                                 f"{problem}; was it trained on another base ({adapter.base_model})?")
    return num_labels


def _is_folder(recorded: str | None, folder: Path) -> bool:
    """Whether an adapter's recorded base is ``folder`` (the same folder, however named)."""
    try:
        return recorded is not None and Path(recorded).expanduser().resolve() == folder.resolve()
    except OSError:
        return False


def _base_hint(folder: Path) -> str:
    try:
        recorded = json.loads((folder / ADAPTER_CONFIG).read_text())["base_model_name_or_path"]
        return f"base_model_name_or_path: {recorded}"
    except (OSError, ValueError, KeyError, TypeError):
        return f"see its {ADAPTER_CONFIG}"


def _head_size(model: str, config: Any, shapes: dict[str, dict[str, tuple[int, ...]]],
               adapters: Sequence[Adapter]) -> int:
    """The classifiers' label count: the first dimension of the last weight of each adapter's saved head."""
    import torch
    from transformers import AutoModelForSequenceClassification

    with torch.device("meta"):
        probe = AutoModelForSequenceClassification.from_config(config)
    head = [n for n, _ in probe.named_parameters() if n.startswith(("classifier.", "score.")) and n.endswith("weight")]
    sizes: dict[int, list[str]] = {}
    for adapter in adapters:
        saved = shapes[adapter.name].get(head[-1]) if head else None
        if saved is None:
            wanted = head[-1] if head else "task head"
            raise ServeError(f"adapters: {adapter.name} ({adapter.folder}) does not fit model={model} "
                             f"({config.model_type}): it holds no {wanted} (the base's head); "
                             f"was it trained on another base ({adapter.base_model})?")
        sizes.setdefault(saved[0], []).append(adapter.name)
    if len(sizes) > 1:
        each = "; ".join(f"{n} label(s): {', '.join(names)}" for n, names in sorted(sizes.items()))
        raise ServeError(f"adapters: the classifiers on one base share one head shape, these differ ({each}); "
                         "serve each group from its own server")
    return next(iter(sizes))


def _check_same_base(adapter: Adapter, config: Any, model: str) -> None:
    """Where the adapter's recorded base is a local folder: its architecture is the base's."""
    recorded = Path(adapter.base_model).expanduser() if adapter.base_model else None
    if recorded is None or not (recorded / "config.json").is_file():
        return
    try:
        theirs = json.loads((recorded / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return
    for key in ("model_type", "hidden_size", "num_hidden_layers", "vocab_size", "n_embd", "n_layer"):
        if key in theirs and getattr(config, key, theirs[key]) != theirs[key]:
            raise ServeError(f"adapters: {adapter.name} was trained on {recorded} ({key} {theirs[key]}), "
                             f"model={model} has {key} {getattr(config, key)}: not its base")


def _mismatch(key: str, shape: tuple[int, ...], modules: dict[str, Any], params: dict[str, tuple[int, ...]],
              conv1d: type) -> str | None:
    """Why the saved tensor ``key`` cannot go into the base, or None."""
    match = re.match(r"^(?P<module>.+)\.lora_(?P<part>[AB])(?:\.[^.]+)?\.weight$", key)
    if match is None:  # a saved module (the task head): the base's own parameter of that name
        if ".lora_" in key:  # another part of a LoRA layer (DoRA's magnitudes, embeddings' A/B): PEFT checks it
            return None
        if key not in params:
            return f"the base has no {key}"
        return None if params[key] == shape else f"{key} is {list(shape)} in the adapter, {list(params[key])} here"
    layer = modules.get(match["module"])
    if layer is None:
        return f"the base has no layer {match['module']}"
    weight = tuple(layer.weight.shape)
    in_features, out_features = (weight[0], weight[1]) if isinstance(layer, conv1d) else (weight[1], weight[0])
    got, want = (shape[1], in_features) if match["part"] == "A" else (shape[0], out_features)
    if got != want:
        return f"{key} is {list(shape)}: made for {got} features where {match['module']} has {want}"
    return None


# -- serving -----------------------------------------------------------------------------------------------


class SharedBase:
    """The base with every adapter loaded into it, and the lock a forward pass holds with its adapter active."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self._lock = threading.Lock()

    @contextmanager
    def active(self, name: str) -> Iterator[None]:
        with self._lock:
            self.model.set_adapter(name, inference_mode=True)
            yield


def load_adapters(base: Any, adapters: Sequence[Adapter]) -> SharedBase:
    """PEFT's multi-adapter model: ``from_pretrained`` with the first adapter, ``load_adapter`` for the others."""
    from peft import PeftModel

    from sweep.models.quiet import quiet_transformers

    first, *rest = adapters
    with quiet_transformers(), warnings.catch_warnings():  # PEFT 0.21 reads a deprecated transformers property
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        model = PeftModel.from_pretrained(base, first.folder, adapter_name=first.name)
        for adapter in rest:
            model.load_adapter(adapter.folder, adapter_name=adapter.name)
    return SharedBase(model.eval())


class AdapterEngine:
    """One adapter as the engine its KServe model calls: the shared engine's attributes, and its forward
    passes (a classifier's ``classify``, a causal LM's ``generate``) run with this adapter active, under the lock.

    Tokenizing happens inside the pass too: the engine's tokenizer is shared by the adapters' batcher threads."""

    def __init__(self, engine: Any, shared: SharedBase, adapter: Adapter, labels: Sequence[str] | None = None) -> None:
        self._engine, self._shared, self.adapter = engine, shared, adapter
        self.inputs = adapter.inputs
        if labels is not None:
            self.labels = list(labels)

    def __getattr__(self, name: str) -> Any:  # what is not this adapter's own: the shared engine's
        return getattr(self._engine, name)

    def classify(self, key: Hashable | None, items: Sequence[tuple[str, str | None]]) -> list[Any]:
        with self._shared.active(self.adapter.name):
            results = self._engine.classify(key, items)
        if self._engine.regression:
            return results
        index = {label: i for i, label in enumerate(self._engine.labels)}  # the shared engine's names -> ours
        return [type(r)(self.labels[index[r.label]], r.score) for r in results]

    def generate(self, *args: Any, **kwargs: Any) -> list[Any]:
        with self._shared.active(self.adapter.name):
            return self._engine.generate(*args, **kwargs)

    def describe(self) -> dict[str, Any]:
        described = self._engine.describe()
        if "labels" in described and described["labels"] is not None:
            described["labels"] = self.labels
        return {**described, "adapter": str(self.adapter.folder)}


def _classifier_engine(model_dir: Path, num_labels: int, device: str) -> Any:
    """The base as the server's ``Classifier``, with a ``num_labels`` head (each adapter brings its own)."""
    from transformers import AutoModelForSequenceClassification

    from sweep.models.quiet import quiet_transformers
    from sweep.serving.engines import Classifier, context_length
    from sweep.train.loading import load_tokenizer, pick_device

    class BaseClassifier(Classifier):
        def __init__(self) -> None:  # Classifier's, but the head sized for the adapters (not the base's own)
            self.device = pick_device(device)
            self.tokenizer = load_tokenizer(model_dir)
            with quiet_transformers():
                self.model = AutoModelForSequenceClassification.from_pretrained(
                    model_dir, num_labels=num_labels, ignore_mismatched_sizes=True, local_files_only=True)
            self.model.config.pad_token_id = self.tokenizer.pad_token_id  # GPT-2 finds the last non-pad token
            self.model.to(self.device).eval()
            self.max_length = context_length(self.model.config, self.tokenizer.model_max_length)
            self.regression = num_labels == 1
            self.labels = [f"LABEL_{i}" for i in range(num_labels)]
            self.inputs = None  # the base is no task's: each adapter says its own

    return BaseClassifier()


def build_adapter_models(model_dir: Path, adapters: Sequence[Adapter], num_labels: int | None,
                         options: ServeOptions) -> list[Any]:
    """One KServe model per adapter, each with its own micro-batcher, all on one base loaded once."""
    from sweep.serving import server_metrics
    from sweep.serving.engines import Generator
    from sweep.serving.kserve_model import ClassifierModel, GeneratorModel

    set_server_threads(options.threads, ServerWork.CLASSIFIES if num_labels is not None else ServerWork.DECODES)

    def batcher_options(name: str) -> dict[str, Any]:
        return {"enabled": options.batching, "max_batch_size": options.max_batch_size,
                "max_latency_ms": options.max_latency_ms, "observe_batch": server_metrics.batch_observer(name)}

    if num_labels is not None:
        engine = _classifier_engine(model_dir, num_labels, options.device)
        shared = load_adapters(engine.model, adapters)
        engine.model = shared.model
        return [ClassifierModel(a.name, AdapterEngine(engine, shared, a, _label_names(a, engine.labels)),
                                batcher_options(a.name)) for a in adapters]
    engine = Generator(model_dir, options.device)
    shared = load_adapters(engine.model, adapters)
    engine.model = shared.model
    try:
        from sweep.serving.openai_model import OpenAIGeneratorModel as LmModel
    except ModuleNotFoundError:  # no vLLM protocol types: v2 only (serve.build_model says so for a plain model)
        LmModel = GeneratorModel
    return [LmModel(a.name, AdapterEngine(engine, shared, a), batcher_options(a.name)) for a in adapters]


def _label_names(adapter: Adapter, generic: Sequence[str]) -> list[str]:
    """The adapter's task's label names when its export says them (and they fit the head), else LABEL_i."""
    return list(adapter.labels) if adapter.labels and len(adapter.labels) == len(generic) else list(generic)


def serve_adapters(options: ServeOptions) -> None:
    """``sweep serve model=BASE adapters=...``: the one start-up (server.serve) with the adapters as its models."""
    serve(options, find_adapter_pool)


def find_adapter_pool(options: ServeOptions) -> Loader:
    """Every adapter found and checked against the base, before any weight is read; what loads them."""
    if options.name:
        raise ServeError("name: names the one model of a plain server; with adapters= each adapter has its own "
                         "name (NAME=DIR)")
    adapters = find_adapters(options.adapters or "")
    model_dir = resolve_base(options)
    num_labels = check_base(model_dir, options.model, adapters)
    return functools.partial(load_adapter_pool, model_dir, adapters, num_labels, options)


def load_adapter_pool(model_dir: Path, adapters: Sequence[Adapter], num_labels: int | None,
                      options: ServeOptions) -> Served:
    """The base loaded once with every adapter, each its own model; or a ``ServeError`` saying why not."""
    try:
        models = build_adapter_models(model_dir, adapters, num_labels, options)
        bound_output_tokens(models, options)
    except (OSError, ValueError, RuntimeError) as e:  # transformers' / PEFT's way of saying a folder is broken
        raise ServeError(f"model={options.model}: cannot load the base with its adapters: "
                         f"{' '.join(str(e).split())}") from None
    openai = hasattr(models[0], "create_completion")
    batching = f"batching per adapter {'on' if options.batching else 'off'}"
    if openai:  # transformers' continuous batch runs one set of weights: adapters' rows must not share a step
        batching += "; generation=batched per adapter (continuous batching serves one model, not adapters)"
    what = f"{len(adapters)} adapter(s) on {model_dir} ({models[0].engine.kind}): {', '.join(a.name for a in adapters)}"
    return Served(models, what, "<name>", batching)
