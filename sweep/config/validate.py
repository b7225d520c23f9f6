"""Validation of the composed Hydra config into ``Settings``: every check written once.

OmegaConf checks types and unknown keys against the dataclasses of ``settings.py``; the range and
choice checks here add what types cannot say. Every failure is one ``ConfigError`` line that names
the key and what is allowed, raised before any data is read or any Ray resource is asked for.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Collection, Mapping
from dataclasses import asdict, replace
from typing import Any, Literal, get_args

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from sweep.config.metric_names import check_metrics
from sweep.config.paths import absolute_paths
from sweep.config.settings import (
    AUTO,
    DEFAULT_LR,
    METHODS,
    PBT_MUTABLE,
    SELECTION_KINDS,
    Aggregate,
    Arch,
    ClusterConfig,
    HalvingConfig,
    KeepCheckpoints,
    LoraConfig,
    ModelConfig,
    Padding,
    Precision,
    ResourcesConfig,
    Resume,
    Scheduler,
    SearchAlg,
    SearchDist,
    Settings,
    StorageConfig,
    StorageKind,
    SweepConfig,
    TrackingConfig,
    TrackingKind,
    TrainConfig,
)
from sweep.config.tasks import CONF_DIR, TaskConfigError, tasks_from_config
from sweep.errors import ConfigError
from sweep.failures import first_line
from sweep.secrets import secret_name

# Each choice's values come from its Literal in settings.py (their one home).
CHOICES: dict[str, tuple[str, ...]] = {
    "train.precision": get_args(Precision),
    "train.padding": get_args(Padding),
    "train.method": METHODS,
    "sweep.keep_checkpoints": get_args(KeepCheckpoints),
    "sweep.scheduler": get_args(Scheduler),
    "sweep.search_alg": get_args(SearchAlg),
    "sweep.aggregate": get_args(Aggregate),
    "sweep.search.dist": get_args(SearchDist),
    "storage.kind": get_args(StorageKind),
    "tracking.kind": get_args(TrackingKind),
    "model.builder.arch": get_args(Arch),
}
# What the checks below must know of a scheduler or searcher by its name: their one home (the policies in
# sweep/schedulers/policies.py, a layer above that validation cannot ask, take their answers from here).
PAUSING: tuple[Scheduler, ...] = ("seed_halving", "pbt")  # pause trials (resumed later from their checkpoint)
MUTATING: tuple[Scheduler, ...] = ("pbt",)  # change a trial's values mid-run: sweep.pbt is checked
LEARNING: tuple[SearchAlg, ...] = ("optuna",)  # learn from the scores: a space, a point over several seeds
_REAL: dict[type, type] = {}  # omegaconf_schema's copies -> the settings classes they stand for


def _has_literal(hint: Any) -> bool:
    if typing.get_origin(hint) is Literal:
        return True
    if dataclasses.is_dataclass(hint):
        return any(_has_literal(h) for h in typing.get_type_hints(hint).values())
    return any(_has_literal(a) for a in typing.get_args(hint))


def _plain(hint: Any) -> Any:
    """``hint`` as OmegaConf can check it: a Literal is a str (its value is checked against CHOICES)."""
    if not _has_literal(hint):
        return hint
    if typing.get_origin(hint) is Literal:
        return str
    if dataclasses.is_dataclass(hint):
        return omegaconf_schema(hint)
    return typing.get_origin(hint)[tuple(_plain(a) for a in typing.get_args(hint))]  # Optional[X], list[X]


@functools.cache
def omegaconf_schema(cls: type) -> type:
    """A settings dataclass as OmegaConf's schema: the same name, fields and defaults, Literals as str."""
    if not _has_literal(cls):
        return cls
    hints = typing.get_type_hints(cls)
    fields = [(f.name, _plain(hints[f.name]), dataclasses.field(default=f.default, default_factory=f.default_factory))
              for f in dataclasses.fields(cls)]
    schema = dataclasses.make_dataclass(cls.__name__, fields)
    _REAL[schema] = cls
    return schema


def _from_schema(value: Any) -> Any:
    """OmegaConf's object of an ``omegaconf_schema`` copy as the settings class it stands for."""
    if isinstance(value, list):
        return [_from_schema(v) for v in value]
    if isinstance(value, dict):
        return {k: _from_schema(v) for k, v in value.items()}
    real = _REAL.get(type(value))
    if real is None:
        return value
    return real(**{f.name: _from_schema(getattr(value, f.name)) for f in dataclasses.fields(value)})


def _typed(group: str, schema: type, node: Any) -> Any:
    """Merge a config node onto its dataclass schema: OmegaConf rejects wrong types and unknown keys."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(omegaconf_schema(schema)), node)
        return _from_schema(OmegaConf.to_object(merged))
    except OmegaConfBaseException as e:
        key = f"{group}.{e.full_key}" if getattr(e, "full_key", None) else group
        # OmegaConf's first line says what was wrong; keep it, drop its multi-line trailer.
        reason = first_line(e)
        if "not in" in reason:  # an unknown key: say which keys exist
            reason += f" (keys of {group}: {', '.join(schema.__dataclass_fields__)})"
        elif "is not a ListConfig" in reason:  # one value where a list goes: OmegaConf's words name its classes
            value = OmegaConf.select(node, str(e.full_key), default=None)
            reason = f"a list is expected, not {value!r}; write {key}=[{value}] (quoted in a shell: '{key}=[{value}]')"
        raise ConfigError(f"{key}: {reason}") from None


def _check(ok: bool, key: str, why: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {why}")


def _check_choice(key: str, value: Any) -> None:
    allowed = CHOICES[key]
    _check(value in allowed, key, f"got {value!r}, allowed: {', '.join(allowed)}")


def _check_seeds_per_point(sweep) -> None:
    k, n = sweep.seeds_per_point, len(sweep.seeds)
    _check(k >= 1, "sweep.seeds_per_point", f"must be >= 1, got {k}")
    _check_choice("sweep.aggregate", sweep.aggregate)
    if k == 1:
        return
    _check(sweep.search_alg in LEARNING, "sweep.seeds_per_point",
           f"{k} needs sweep.search_alg=optuna (random search draws a new point for every trial)")
    _check(n % k == 0, "sweep.seeds_per_point",
           f"{k} must divide the number of seeds ({n}): each point runs on {k} consecutive seeds; "
           f"give {n - n % k or k} or {n - n % k + k} seeds")


RESUME_CHOICES = {value: value is not False for value in get_args(Resume)}  # auto: the RayJob's; the same as true


def _resume(value: Any) -> bool:
    """``resume``: false, true or auto. true and auto continue the sweep's saved state (Tune's experiment
    under cluster.storage_path or out_dir) when there is one, else start it; bool("no") must not be True."""
    key = value.lower() if isinstance(value, str) else value
    _check(isinstance(key, (bool, str)) and key in RESUME_CHOICES, "resume",
           f"expected true, false or auto, got {value!r}")
    return RESUME_CHOICES[key]


def _check_ranges(s: Settings) -> None:
    every = s.tracking.copy_every_s
    _check(every > 0, "tracking.copy_every_s", f"must be > 0 (seconds), got {every}")
    t = s.train
    _check_method(t)
    _check(t.lr is not None and t.lr > 0, "train.lr", f"must be > 0, got {t.lr}")
    for key in ("batch_size", "eval_batch_size", "epochs", "max_seq_length", "block_size"):
        value = getattr(t, key)
        _check(value >= 1, f"train.{key}", f"must be a positive integer, got {value}")
    _check(0 <= t.warmup_ratio < 1, "train.warmup_ratio", f"must be in [0, 1), got {t.warmup_ratio}")
    _check(t.weight_decay >= 0, "train.weight_decay", f"must be >= 0, got {t.weight_decay}")
    _check(t.max_grad_norm > 0, "train.max_grad_norm", f"must be > 0, got {t.max_grad_norm}")
    _check(t.num_workers >= 0, "train.num_workers", f"must be >= 0, got {t.num_workers}")
    for key in ("max_train_samples", "max_eval_samples"):
        value = getattr(t, key)
        _check(value is None or value >= 1, f"train.{key}", f"must be null or >= 1, got {value}")
    _check(t.eval_every is None or t.eval_every >= 1, "train.eval_every",
           f"must be null or >= 1 (optimizer steps), got {t.eval_every}")
    _check(t.evals_per_epoch >= 1, "train.evals_per_epoch", f"must be >= 1, got {t.evals_per_epoch}")
    _check(t.eval_every is None or t.evals_per_epoch == 1, "train.eval_every",
           f"and train.evals_per_epoch={t.evals_per_epoch} are both set; choose one "
           "(train.eval_every=null or train.evals_per_epoch=1)")
    _check_choice("train.precision", t.precision)
    _check_choice("train.padding", t.padding)

    seeds = s.sweep.seeds
    _check(len(seeds) > 0, "sweep.seeds", "is empty; give at least one seed, e.g. sweep.seeds=[38,39]")
    _check(len(set(seeds)) == len(seeds), "sweep.seeds", f"has duplicates: {seeds}")
    _check_choice("sweep.keep_checkpoints", s.sweep.keep_checkpoints)
    _check_choice("sweep.scheduler", s.sweep.scheduler)
    _check_halving(s.sweep.halving)
    _check(s.sweep.num_samples >= 1, "sweep.num_samples", f"must be >= 1, got {s.sweep.num_samples}")
    _check_choice("sweep.search_alg", s.sweep.search_alg)
    _check(s.sweep.search_alg not in LEARNING or bool(s.sweep.search), "sweep.search_alg",
           "optuna needs a search space to learn over, e.g. '+sweep.search.lr={dist: loguniform, low: 1e-5, "
           "high: 1e-3}' sweep.num_samples=20")
    _check_seeds_per_point(s.sweep)
    _check_selection(s.sweep, s.tasks)
    _check_soup(s.sweep, s.train, s.tasks)
    _check_pbt(s)
    _check(s.sweep.max_failures >= 0, "sweep.max_failures", f"must be >= 0, got {s.sweep.max_failures}")
    _check_hparams(s)

    _check_resources(s)
    check_halving_trials(s)

    _check(s.cluster.scale_timeout_s > 0, "cluster.scale_timeout_s",
           f"must be > 0 seconds, got {s.cluster.scale_timeout_s}")
    _check_node_types(s.cluster.node_types)
    _check_storage(s.storage)
    _check_choice("tracking.kind", s.tracking.kind)
    if s.model.builder is not None:
        _check_choice("model.builder.arch", s.model.builder.arch)


def _check_selection(sweep, tasks) -> None:
    """sweep.selection: a built-in kind, or an eval split every task has beside at least one more to report on."""
    kind, fraction = sweep.selection, sweep.selection_fraction
    _check(0 < fraction <= 0.5, "sweep.selection_fraction",
           f"must be in (0, 0.5] (the share of the training rows that selects), got {fraction}")
    if kind in SELECTION_KINDS:
        return
    for spec in tasks:
        splits = list(spec.eval_files)
        _check(kind in splits, "sweep.selection",
               f"{kind!r} is neither train, dev_half, none nor an eval split of task {spec.name} "
               f"(its eval splits: {', '.join(splits)})")
        _check(len(splits) > 1, "sweep.selection",
               f"{kind!r} is task {spec.name}'s only eval split: nothing would be left to report on; "
               "use sweep.selection=train or dev_half")


def _check_soup(sweep, train: TrainConfig, tasks) -> None:
    """sweep.soup averages the seeds of a point: it needs two seeds a point, every one from the same start (a
    classification head drawn from each trial's seed is a different start), and a checkpoint per trial."""
    if not sweep.soup:
        return
    if sweep.search and sweep.search_alg not in LEARNING:
        _check(False, "sweep.soup", "averages the seeds of the best point, and random search draws a new point for "
               "every trial; use a grid (+sweep.grid.lr=[…]) or search_alg=optuna with sweep.seeds_per_point=2 or more")
    per_point = sweep.seeds_per_point if sweep.search_alg in LEARNING else len(sweep.seeds)
    _check(per_point >= 2, "sweep.soup",
           f"averages the seeds of the best point, and each point runs on {per_point} seed; give sweep.seeds "
           "two or more (with search_alg=optuna: sweep.seeds_per_point)")
    heads = [spec.name for spec in tasks if spec.kind != "causal_lm"]
    _check(train.init_seed is not None or not heads, "sweep.soup",
           f"the trials do not share a base: each seed draws its own new head for {', '.join(heads)} "
           "(train.init_seed=null), and heads from different starts do not average; add train.init_seed=0 "
           "so every seed starts from the same weights")


def _check_method(t: TrainConfig) -> None:
    _check_choice("train.method", t.method)
    lora = t.lora
    _check(lora.r >= 1, "train.lora.r", f"must be a positive integer (the adapters' rank, e.g. 8), got {lora.r}")
    _check(lora.alpha > 0, "train.lora.alpha", f"must be > 0 (scaling alpha / r; e.g. 8 or 16), got {lora.alpha}")
    _check(0 <= lora.dropout < 1, "train.lora.dropout", f"must be in [0, 1), got {lora.dropout}")
    _check(lora.target_modules is None or len(lora.target_modules) > 0, "train.lora.target_modules",
           "is empty; name modules (e.g. [query,value]) or null for the architecture's default")


def _with_method_lr(train: TrainConfig) -> TrainConfig:
    """train.lr=null is the method's own default learning rate (DEFAULT_LR)."""
    if train.lr is None and train.method in DEFAULT_LR:
        return replace(train, lr=DEFAULT_LR[train.method])
    return train


def _check_halving(h: HalvingConfig) -> None:
    _check(0 < h.at < 1, "sweep.halving.at", f"must be a fraction of training in (0, 1), e.g. 0.25; got {h.at}")
    _check(0 < h.keep < 1 or (h.keep >= 1 and float(h.keep).is_integer()), "sweep.halving.keep",
           f"must be a whole number of trials per task (>= 1) or a share in (0, 1), e.g. 2 or 0.5; got {h.keep}")


def check_halving_trials(s: Settings, gpus: Mapping[str, float | str] | None = None) -> None:
    """Seed halving (at its rung) and PBT (to exploit, to share slots) pause trials; a paused multi-GPU
    (DDP) trial would leave its Train worker group running. ``gpus``: each task's GPUs per trial; by
    default as configured (here, in validate: "auto" is not known yet), else as the plan chose them
    (the tuner, before any trial)."""
    if s.sweep.scheduler not in PAUSING:
        return
    shares = {t.name: s.resources.gpus_for(t.name) for t in s.tasks} if gpus is None else gpus
    ddp = [t.name for t in s.tasks  # more than 1 GPU: DDP workers (in the tasks' order)
           if isinstance(n := shares.get(t.name), (int, float)) and n > 1]
    _check(not ddp, "sweep.scheduler", f"{s.sweep.scheduler} cannot pause the multi-GPU (DDP) trials of "
           f"{', '.join(ddp)}; give them 1 GPU (resources.gpus_per_trial=1) or use sweep.scheduler=asha")


def _check_node_types(node_types: list[Any]) -> None:
    example = "e.g. cluster.node_types=[{name:gpu-workers,resources:{CPU:8,GPU:1},max_workers:4}]"
    for i, spec in enumerate(node_types):
        key = f"cluster.node_types[{i}]"
        _check(isinstance(spec, dict) and isinstance(spec.get("name"), str), key,
               f"must be a mapping with name, resources and max_workers; {example}")
        resources = spec.get("resources")
        _check(isinstance(resources, dict) and resources
               and all(isinstance(v, (int, float)) and v >= 0 for v in resources.values()),
               f"{key}.resources", f"must map resource names to numbers >= 0, got {resources!r}; {example}")
        most = spec.get("max_workers")
        _check(isinstance(most, int) and most >= 0, f"{key}.max_workers", f"must be a whole number >= 0, got {most!r}")
        unknown = set(spec) - {"name", "resources", "min_workers", "max_workers"}
        _check(not unknown, key, f"unknown keys {sorted(unknown)}; allowed: name, resources, min_workers, max_workers")


def _check_no_credentials(storage: Any) -> None:
    """Keys never belong in the config (it is logged and saved): refuse them, without echoing the value."""
    for key in (storage or {}):
        if secret_name(str(key)):
            raise ConfigError(
                f"storage.{key}: credentials are never read from the config; set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in the environment instead"
            )


def _check_storage(st: StorageConfig) -> None:
    _check_choice("storage.kind", st.kind)
    _check(st.max_unpack_gb > 0, "storage.max_unpack_gb", f"must be > 0, got {st.max_unpack_gb}")
    _check(st.progress_every_s >= 0, "storage.progress_every_s", f"must be >= 0, got {st.progress_every_s}")
    if st.kind == "s3":
        _check(bool(st.bucket), "storage.bucket", "is required with storage=s3, e.g. storage.bucket=my-bucket")
        _check(bool(st.data_key and st.data_key.strip("/")), "storage.data_key", "must name an object or prefix")
        if st.endpoint:
            _check(st.endpoint.startswith(("http://", "https://")), "storage.endpoint",
                   f"must be an http(s) URL, got {st.endpoint!r}")
    if st.output_prefix is not None:
        rest = st.output_prefix[5:] if st.output_prefix.startswith("s3://") else ""
        _check(bool(rest.split("/", 1)[0]) and "/" in rest.strip("/"), "storage.output_prefix",
               f"must look like s3://BUCKET/PREFIX, got {st.output_prefix!r}")


# train.method is not tunable: compare methods with a multirun (python -m sweep -m train.method=full,lora).
TUNABLE = tuple(k for k in TrainConfig.__dataclass_fields__ if k not in ("num_workers", "method", "lora")) + tuple(
    f"lora.{k}" for k in LoraConfig.__dataclass_fields__)


def flat_space(space: Mapping[str, Any], leaf: str | None = None) -> dict[str, Any]:
    """``{lora: {r: [4, 8]}}`` (what ``+sweep.grid.lora.r=[4,8]`` composes) as ``{"lora.r": [4, 8]}``.

    A search dimension is a dict itself: ``leaf`` names the key that marks one (``dist``)."""
    flat: dict[str, Any] = {}
    for key, value in space.items():
        if isinstance(value, Mapping) and (leaf is None or leaf not in value):
            flat |= {f"{key}.{k}": v for k, v in flat_space(value, leaf).items()}
        else:
            flat[key] = value
    return flat


def _check_hparams(s: Settings) -> None:
    """sweep.grid / sweep.search name train keys, with values the train schema accepts."""
    for kind, space in (("grid", s.sweep.grid), ("search", s.sweep.search)):
        for key, spec in space.items():
            _check(key != "method", f"sweep.{kind}.method", "train.method is one per sweep; compare methods with a "
                   "multirun: python -m sweep -m train.method=full,lora")
            _check(key in TUNABLE, f"sweep.{kind}.{key}", f"is not a train option; tunable: {', '.join(TUNABLE)}")
            if kind == "grid":
                _check(isinstance(spec, list) and len(spec) > 0, f"sweep.grid.{key}",
                       f"needs a non-empty list, got {spec!r}")
                for value in spec:  # each value must pass the train schema and its ranges
                    _check_ranges_of(s, key, value, f"sweep.grid.{key}")
            else:
                _check_dist(f"sweep.search.{key}", spec)


def _check_dist(where: str, spec: Any) -> None:
    """One dimension of ``sweep.search`` (or ``sweep.pbt.mutations``): {dist, low, high} or {dist: choice, values}."""
    dist = spec.get("dist") if isinstance(spec, Mapping) else None
    _check(dist in CHOICES["sweep.search.dist"], f"{where}.dist",
           f"got {dist!r}, allowed: {', '.join(CHOICES['sweep.search.dist'])}")
    if dist == "choice":
        _check(bool(spec.get("values")), f"{where}.values", "needs a non-empty list")
        return
    low, high = spec.get("low"), spec.get("high")
    loguniform = dist == "loguniform"
    numbers = isinstance(low, (int, float)) and isinstance(high, (int, float))
    _check(numbers and (0 < low < high if loguniform else low < high), where,
           f"needs numbers low < high{' (both > 0 for loguniform)' if loguniform else ''}, "
           f"got low={low!r} high={high!r}")


def _check_pbt(s: Settings) -> None:
    """sweep.scheduler=pbt: what to mutate, how often, and a population to clone from, per task."""
    if s.sweep.scheduler not in MUTATING:
        return
    pbt, sweep, t = s.sweep.pbt, s.sweep, s.train
    _check(bool(pbt.mutations), "sweep.pbt.mutations",
           "PBT needs at least one train key to mutate, e.g. "
           "'+sweep.pbt.mutations.lr={dist: loguniform, low: 1e-5, high: 1e-3}'")
    for key, spec in pbt.mutations.items():
        _check(key in PBT_MUTABLE, f"sweep.pbt.mutations.{key}",
               f"cannot change in the middle of a trial (an exploit goes on from another trial's checkpoint); "
               f"mutate {', '.join(PBT_MUTABLE)}")
        _check(key not in sweep.grid, f"sweep.pbt.mutations.{key}",
               "is also a sweep.grid key; a grid value names the trial: mutate it or grid it, not both")
        _check_dist(f"sweep.pbt.mutations.{key}", spec)
    _check(pbt.interval >= 1, "sweep.pbt.interval", f"must be >= 1 evaluation, got {pbt.interval}")
    evaluations = t.epochs * t.evals_per_epoch if t.eval_every is None else None
    _check(evaluations is None or pbt.interval < evaluations, "sweep.pbt.interval",
           f"{pbt.interval} evaluation(s), but a trial evaluates only {evaluations} time(s) "
           f"(train.epochs x train.evals_per_epoch), so no trial could ever exploit; lower it or raise "
           "train.evals_per_epoch")
    _check(0 < pbt.quantile <= 0.5, "sweep.pbt.quantile", f"must be in (0, 0.5], got {pbt.quantile}")
    _check(0 <= pbt.resample_probability <= 1, "sweep.pbt.resample_probability",
           f"must be in [0, 1], got {pbt.resample_probability}")
    _check(sweep.search_alg not in LEARNING, "sweep.search_alg",
           f"{sweep.search_alg} cannot drive sweep.scheduler=pbt: PBT searches by itself (exploit and mutate); "
           "use sweep.search_alg=random for its first population")
    population = len(sweep.seeds) * sweep.num_samples  # each grid point is a population of its own
    _check(population >= 2, "sweep.scheduler",
           f"pbt needs a population of at least 2 trials per task and grid point to clone from, got {population}; "
           "add seeds (sweep.seeds=[38,39,40,41]) or samples (sweep.num_samples=4)")

def _check_resources(s: Settings) -> None:
    r = s.resources
    _check_gpus("resources.gpus_per_trial", r.gpus_per_trial, auto_ok=True)
    _check_cpus("resources.cpus_per_trial", r.cpus_per_trial)
    # A preset may size every GLUE task and run a few: only a name no task has is a mistake (a typo).
    known = {t.name for t in s.tasks} | {p.stem for p in (CONF_DIR / "task").glob("*.yaml") if p.stem != "glue"}
    for name, own in r.tasks.items():
        key = f"resources.tasks.{name}"
        _check(name in known, key, f"there is no task {name!r} (tasks: {', '.join(sorted(known))})")
        if own.gpus_per_trial is not None:
            _check_gpus(f"{key}.gpus_per_trial", own.gpus_per_trial, auto_ok=False)
        if own.cpus_per_trial is not None:
            _check_cpus(f"{key}.cpus_per_trial", own.cpus_per_trial)


def _check_gpus(key: str, value: Any, auto_ok: bool) -> None:
    if auto_ok and value == AUTO:
        return
    what = "a number of GPUs" + (' or "auto"' if auto_ok else "")
    _check(isinstance(value, (int, float)) and not isinstance(value, bool), key, f"must be {what}, got {value!r}")
    _check(value >= 0, key, f"must be >= 0, got {value}")
    _check(value <= 1 or float(value).is_integer(), key,
           f"above 1 must be a whole number of GPUs (DDP workers), got {value}")


def _check_cpus(key: str, value: float) -> None:
    _check(value > 0, key, f"must be > 0, got {value}")


def _check_ranges_of(s: Settings, key: str, value: Any, where: str) -> None:
    try:
        node = OmegaConf.merge(OmegaConf.structured(omegaconf_schema(TrainConfig)), asdict(s.train))
        OmegaConf.update(node, key, value, merge=True)  # lora.r: the nested key
        train = _typed("train", TrainConfig, node)
        _check_ranges(replace(s, train=train, sweep=SweepConfig(seeds=s.sweep.seeds)))
    except ConfigError as e:
        raise ConfigError(f"{where}: value {value!r}: {e}") from None


def _flat_spaces(sweep: SweepConfig) -> SweepConfig:
    return replace(sweep, grid=flat_space(sweep.grid), search=flat_space(sweep.search, leaf="dist"))


def _no_credentials(storage: Any) -> Any:
    _check_no_credentials(storage)
    return storage


def _named_model(model: Any) -> Any:
    """model=hub: a Hub id is required, and the model's name is the id's last part unless one is given."""
    if OmegaConf.is_missing(model, "hub_id"):
        raise ConfigError("model.hub_id: model=hub needs the Hub repo, "
                          "e.g. model.hub_id=google/electra-small-discriminator")
    if model.get("name") is not None:
        return model
    _check(bool(model.get("hub_id")), "model.name", "is required (or model.hub_id, whose last part names it)")
    return OmegaConf.merge(model, {"name": str(model.hub_id).rstrip("/").rsplit("/", 1)[-1]})


def validate(cfg: DictConfig, metrics: Collection[str] = ()) -> Settings:
    """Validate a composed config and return it typed; raises ConfigError naming the bad key. ``metrics``:
    the names of the user's own metrics (``sweep.run(metrics=...)``), known beside the built-in ones."""
    missing = [k for k in ("task", "model", "train", "sweep") if k not in cfg]
    _check(not missing, "config", f"missing groups {missing}; compose from sweep/conf/config.yaml")
    try:
        tasks = tasks_from_config(cfg.task)
    except TaskConfigError as e:
        raise ConfigError(str(e)) from None
    check_metrics(tasks, metrics)  # a typo in a task's metric: now, not as a KeyError inside a trial
    settings = Settings(
        tasks=tasks,
        model=_typed("model", ModelConfig, _named_model(cfg.model)),
        train=_with_method_lr(_typed("train", TrainConfig, cfg.train)),
        sweep=_flat_spaces(_typed("sweep", SweepConfig, cfg.sweep)),
        resources=_typed("resources", ResourcesConfig, cfg.get("resources", {})),
        storage=_typed("storage", StorageConfig, _no_credentials(cfg.get("storage", {}))),
        tracking=_typed("tracking", TrackingConfig, cfg.get("tracking", {})),
        cluster=_typed("cluster", ClusterConfig, cfg.get("cluster", {})),
        out_dir=cfg.get("out_dir"),
        resume=_resume(cfg.get("resume", False)),
    )
    _check_ranges(settings)
    settings = absolute_paths(settings)  # trials run in Ray's own folders: a path means the user's folder
    settings.composed = OmegaConf.to_container(cfg, resolve=True)  # as written: the parent run's params
    return settings


def compose(*overrides: str) -> DictConfig:
    """The config that ``python -m sweep <overrides>`` runs with (for scripts and tests; Hydra's errors
    as they are: ``sweep.load_settings`` is the public way, each mistake one line)."""
    from hydra import compose as hydra_compose, initialize_config_dir

    from sweep.config.tasks import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose("config", overrides=list(overrides))


def compose_settings(*overrides: str) -> Settings:
    """``validate(compose(*overrides))``: the tests' settings (``sweep.load_settings`` adds the length checks)."""
    return validate(compose(*overrides))
