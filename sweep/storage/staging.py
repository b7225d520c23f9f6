"""Where a sweep's base model and data come from, made local on the machine that needs them.

``storage=local``: the data is a folder (``storage.data_dir``), else each task's dataset on the Hugging
Face Hub (``sweep.storage.hub_sources``), or, only when asked (``storage.synthetic_data=true``), synthetic
data in the GLUE layout generated once into the cache; the model is ``model.path``, a staged folder under
``storage.model_dir``, a tiny model built offline, a model shipped in a package, else the Hub's
``model.hub_id``. The Hub's revisions are pinned on the driver (``HubPins``) and travel down as the S3 pins do.

``storage=s3``: the model (``storage.model_key``, default the model's name) and the data
(``storage.data_key``, default ``glue_data``) are objects in ``storage.bucket``. The driver's
``preflight`` checks them and pins their versions (ETags) before any trial; the pins travel down
as a value (``DriverSources``, then ``run/stage_nodes.Staging``), each node stages each pinned
object once into its cache (``sweep.storage.node_cache``), and a trial's ``ensure_local`` is a no-op
that makes no request when its node already holds them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from filelock import FileLock

from sweep.config.settings import Settings, StorageConfig
from sweep.errors import StagingError
from sweep.files import atomic_folder, is_model_folder, write_json
from sweep.storage.hub_sources import Fallback, HubPins, fetch_all, hub_pins

__all__ = ["StagingError", "LocalSources", "SourcePins", "DriverSources", "ensure_local", "preflight", "cache_root",
           "check_local_files"]

SYNTHETIC_VERSION = "v3"  # bump when the generator changes, so old caches are not reused
NODE_CACHE_ENV = "SWEEP_NODE_CACHE_DIR"  # set on a node (pod spec, raylet env): its own cache folder
GiB = 2**30


@dataclass(frozen=True)
class LocalSources:
    model_dir: Path
    data_dir: Path
    downloaded: int = 0  # bytes this call fetched from S3


@dataclass(frozen=True)
class SourcePins:
    """The S3 object versions the driver saw; every node stages exactly these."""

    model: object | None  # sweep.storage.s3.RemoteSource (None: the model comes from model.path)
    data: object


@dataclass(frozen=True)
class DriverSources:
    """What the driver's check of the sources found (``app.check_sources``), passed down as a value
    to the staging on every node and to the plan: nothing below re-derives it."""

    pins: SourcePins | None = None  # storage=s3: the object versions every node stages
    local: LocalSources | None = None  # storage=local: the folders on the driver's machine
    hub: HubPins = field(default_factory=HubPins)  # the Hub's commits every node fetches (storage=local)
    synthetic: bool = False  # the data is generated rows (storage.synthetic_data): no result means anything
    local_origins: dict[str, str] = field(default_factory=dict)  # the sources that are folders here: which

    def provenance(self) -> dict[str, str]:
        """Where the model and the data came from, at which commit or version: the parent and trial runs'
        params (``sources.*``), results.csv and each export's sweep_made_by.json."""
        out: dict[str, str] = dict(self.local_origins)
        for role, pin in (("model", self.hub.model), *(("data", p) for p in self.hub.data)):
            if pin is not None:
                key = role if role == "model" or len(self.hub.data) == 1 else f"data.{pin.repo_id}"
                out.update({f"{key}.source": "hub", f"{key}.repo": pin.repo_id, f"{key}.revision": pin.revision,
                            f"{key}.sha": pin.sha})
        if self.pins is not None:
            for role, source in (("model", self.pins.model), ("data", self.pins.data)):
                if source is not None:
                    out.update({f"{role}.source": "s3", f"{role}.uri": source.uri, f"{role}.etag": source.etag})
        if self.synthetic:
            out["data.source"] = "synthetic"
        return out


def cache_root(storage: StorageConfig) -> Path:
    """This node's cache: ``$SWEEP_NODE_CACHE_DIR`` when the node sets it, else ``storage.cache_dir``.

    The override is for nodes that share one filesystem (an NFS home, or several raylets on one
    machine) but should each keep their own copy on a local disk.
    """
    return Path(os.path.expanduser(os.environ.get(NODE_CACHE_ENV) or storage.cache_dir))


def synthetic_data_dir(cache_dir: Path) -> Path:
    """GLUE-layout synthetic data for every task, generated once per machine (the demo's data)."""
    from sweep.data.synthetic import write_synthetic_glue, write_synthetic_wikitext

    target = cache_dir / f"synthetic-{SYNTHETIC_VERSION}"
    if (target / "glue_data").is_dir():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / "glue_data").is_dir():
            return target
        with atomic_folder(target) as tmp:  # a half-written folder is never seen as done
            write_synthetic_glue(tmp)
            write_synthetic_wikitext(tmp)
    return target


def local_data_dir(storage: StorageConfig, data_dir: str | None = None) -> Path:
    """``storage.data_dir`` (or ``data_dir``: where this node finds it) checked, or the synthetic data when
    asked for (storage.synthetic_data=true). Data from the Hub is ``hub_sources``'."""
    data_dir = data_dir or storage.data_dir
    if data_dir is None:
        if not storage.synthetic_data:
            raise ValueError("no storage.data_dir and no synthetic data asked for: the data comes from the Hub")
        return synthetic_data_dir(cache_root(storage))
    path = Path(os.path.expanduser(data_dir)).resolve()
    if not path.is_dir():
        raise StagingError(
            f"storage.data_dir: {path} is not a folder; point it at a folder holding "
            "glue_data/<TASK>/ (and wikitext-2/), or leave it unset to read each task's dataset from the Hub"
        )
    return path


# --- S3 ----------------------------------------------------------------------------------------


def s3_keys(settings: Settings) -> tuple[str | None, str]:
    """(model key or None when model.path is set, data key)."""
    storage = settings.storage
    model_key = None if settings.model.path else (storage.model_key or settings.model.name)
    return model_key, storage.data_key


def preflight(settings: Settings) -> SourcePins:
    """On the driver, before any trial or GPU: credentials, endpoint, bucket, every key — pinned."""
    from sweep.storage.s3 import check_bucket, check_credentials, describe, make_client

    storage = settings.storage
    check_credentials()
    # Few, short attempts: a wrong endpoint should fail in seconds, not after minutes of backoff.
    client = make_client(storage.endpoint, storage.region, attempts=2, connect_timeout=3)
    check_bucket(client, storage.bucket)
    model_key, data_key = s3_keys(settings)
    pins = SourcePins(
        model=describe(client, storage.bucket, model_key) if model_key else None,
        data=describe(client, storage.bucket, data_key),
    )
    check_output_bucket(storage, client)
    return pins


def check_output_bucket(storage: StorageConfig, client=None) -> None:
    """storage.output_prefix: outputs go there after the sweep, so a missing bucket fails now, not then."""
    if not storage.output_prefix:
        return
    from sweep.storage.s3 import check_bucket, check_credentials, make_client, parse_uri

    if client is None:
        check_credentials()
        client = make_client(storage.endpoint, storage.region, attempts=2, connect_timeout=3)
    check_bucket(client, parse_uri(storage.output_prefix)[0])


def staged_target(cache: Path, source) -> Path:
    return cache / "s3" / source.bucket / source.key.replace("/", "__")


def model_folder_in(folder: Path, label: str) -> Path:
    """The unpacked model: the folder itself, or its single sub-folder holding config.json."""
    if is_model_folder(folder):
        return folder
    found = sorted(p for p in folder.iterdir() if is_model_folder(p))
    if len(found) == 1:
        return found[0]
    raise StagingError(
        f"{label}: holds no model folder (no config.json at its top or in one sub-folder); upload the "
        "folder written by save_pretrained with `python -m sweep upload MODEL_DIR`"
    )


def _stage_s3(settings: Settings, pins: SourcePins, progress: Callable[[str], None] | None) -> LocalSources:
    from sweep.storage.node_cache import stage
    from sweep.storage.s3 import fetch, make_client, print_progress

    storage = settings.storage
    cache = cache_root(storage)
    limit = int(storage.max_unpack_gb * GiB)
    clients: list = []  # made on the first download: a node that holds everything makes no request

    def fetch_into(source):
        def run(tmp: Path) -> int:
            if not clients:
                clients.append(make_client(storage.endpoint, storage.region))
            return fetch(clients[0], source, tmp, limit, storage.progress_every_s, progress or print_progress)
        return run

    downloaded = 0
    staged = {}
    for role, source in (("model", pins.model), ("data", pins.data)):
        if source is not None:
            result = stage(staged_target(cache, source), source, fetch_into(source))
            downloaded += result.downloaded
            staged[role] = result.path
    if "model" in staged:
        model_dir = model_folder_in(staged["model"], pins.model.uri)
    else:  # model.path set: the model is local, only the data comes from S3
        from sweep.models.local_folder import resolve_model_dir

        model_dir = resolve_model_dir(asdict(settings.model), cache)
    return LocalSources(model_dir=model_dir, data_dir=staged["data"], downloaded=downloaded)


def check_tasks_here(settings: Settings, sources: LocalSources) -> None:
    """Every task's files on this machine, and lengths the model can hold (before any trial)."""
    from sweep.config.model_limits import check_model_folder
    from sweep.data.task_files import check_corpus, check_task_data

    for spec in settings.tasks:
        (check_corpus if spec.kind == "causal_lm" else check_task_data)(spec, sources.data_dir)
    check_model_folder(settings, sources.model_dir)  # every max_seq_length / block_size the sweep tries


def check_local_files(settings: Settings) -> None:
    """storage=local: the folders and files ``check_sources`` will read, checked without loading or building
    anything (torch-free: the command runs it before Hydra makes its run folder). S3 keys are the preflight's."""
    if settings.storage.kind != "local":
        return
    from sweep.data.task_files import check_corpus, check_task_data
    from sweep.models.local_folder import resolve_model_dir

    storage = settings.storage
    staged = Path(os.path.expanduser(storage.model_dir)) if storage.model_dir else None
    resolve_model_dir(asdict(settings.model), cache_root(storage), staged, build=False)
    hub_pins(settings)  # the Hub's repos, revisions and files (or the cache's, offline): resolved once, here
    data_dir = local_data_dir(storage) if storage.data_dir is not None else None  # None: the Hub's or synthetic
    for spec in settings.tasks:
        if spec.kind == "causal_lm" and (data_dir is not None or spec.path is not None):
            check_corpus(spec, data_dir or Path("."))  # a text task's own task.path needs no data_dir
        elif spec.kind != "causal_lm" and data_dir is not None:
            check_task_data(spec, data_dir)


def missing_folder_error(missing: dict[str, str], where: str) -> StagingError:
    """One line for the driver's folders (config key -> path) that node ``where`` does not see."""
    named = ", ".join(f"{key}={path}" for key, path in missing.items())
    return StagingError(
        f"{named}: a folder on the driver's machine, but not on {where} (a node of a cluster sees only its own "
        "disk); mount it on every node, or put the sources in S3 (storage=s3 storage.bucket=...)"
    )


def ensure_local(settings: Settings, pins: SourcePins | None = None,
                 progress: Callable[[str], None] | None = None, hub: HubPins | None = None,
                 fallback: Fallback | None = None) -> LocalSources:
    """The model and data folders on this machine (a no-op when they are already there).

    ``pins``: with storage=s3, the object versions to stage (the driver's preflight; a sweep always
    passes them). ``hub``: the Hub's commits the driver pinned (storage=local), fetched here once per
    node; ``fallback`` fills this node's cache from the driver where it cannot reach the Hub. A caller
    staging on its own (a script, ``storage=s3`` outside a sweep) passes none and the preflight (or the
    Hub's resolution) runs here first. ``progress`` gets a line now and then while a long S3
    download runs (default: printed).
    """
    if settings.storage.kind == "s3":
        return _stage_s3(settings, pins if pins is not None else preflight(settings), progress)
    from sweep.models.local_folder import resolve_model_dir  # transformers: only where a model is resolved
    from sweep.storage.shipping import folders_here

    cache = cache_root(settings.storage)
    fetched = fetch_all(settings, hub if hub is not None else hub_pins(settings), cache, fallback)
    if fetched.downloaded and progress is not None:
        progress(f"{fetched.downloaded / 2**20:.1f} MiB fetched from the Hub")
    folders = folders_here(settings, cache)  # the driver's folders this node lacks, as shipped here
    staged = Path(os.path.expanduser(folders.model_dir)) if folders.model_dir else None
    model_dir = resolve_model_dir({**asdict(settings.model), "path": folders.model_path}, cache, staged,
                                  hub_dir=fetched.model_dir)
    if fetched.data_dir is not None:
        data_dir = fetched.data_dir
    elif folders.data_dir or settings.storage.synthetic or any(spec.path is None for spec in settings.tasks):
        data_dir = local_data_dir(settings.storage, folders.data_dir)
    else:  # every task reads the folder its task.path names: no data folder is read
        data_dir = cache
    return LocalSources(model_dir=model_dir, data_dir=data_dir, downloaded=fetched.downloaded)


HUB_PINS = "hub-pins.json"  # in out_dir: the Hub commits a sweep trained on, pinned again by its resume


def check_sources(settings: Settings, out_dir: Path | None = None) -> DriverSources:
    """Every missing source before any trial or GPU is asked for; what was found travels down as a value.

    Local storage: the folders here, each task's files read, the Hub's revisions pinned (with ``out_dir``
    the pins are kept there, and a resumed sweep takes them again, whatever the revision's branch did since).
    S3: credentials, endpoint, bucket and every key checked, their versions pinned (the nodes stage them;
    the driver downloads nothing).
    """
    if settings.storage.kind == "s3":
        pins = preflight(settings)
        for source in (pins.model, pins.data):
            if source is not None:
                print(f"storage: {source.uri} ({source.form}, {source.size / 2**20:.1f} MiB, ETag {source.etag[:12]})")
        return DriverSources(pins=pins)
    kept = Path(out_dir) / HUB_PINS if out_dir is not None else None
    saved = json.loads(kept.read_text()) if kept is not None and settings.resume and kept.is_file() else None
    hub = hub_pins(settings, saved)
    if kept is not None and hub:
        write_json(kept, hub.commits(), key="out_dir", indent=1)
    for pin in hub.all():
        size = ", from the cache" if pin.cached else f", {pin.size / 2**20:.1f} MiB"
        print(f"{'model' if pin.repo_type == 'model' else 'data'}: {pin.uri} (revision {pin.revision}, "
              f"{len(pin.files)} files{size})", flush=True)
    synthetic = settings.storage.synthetic
    if synthetic:
        print("data: SYNTHETIC rows (storage.synthetic_data=true): generated, not real; the scores say nothing of "
              "the model, and it does not become champion", flush=True)
    local = ensure_local(settings, hub=hub, progress=lambda line: print(f"staging: {line}", flush=True))
    check_tasks_here(settings, local)  # every missing task file before any trial starts
    check_output_bucket(settings.storage)
    return DriverSources(local=local, hub=hub, synthetic=synthetic, local_origins=local_origins(settings, hub, local))


def local_origins(settings: Settings, hub: HubPins, local: LocalSources) -> dict[str, str]:
    """The sources that are not the Hub's, as provenance: ``model.source`` path | staged | builder | package
    with its folder, ``data.source`` folder with its path (the Hub's carry their commits instead)."""
    from sweep.models.local_folder import model_source

    out = {}
    if hub.model is None:
        staged = Path(os.path.expanduser(settings.storage.model_dir)) if settings.storage.model_dir else None
        out = {"model.source": model_source(asdict(settings.model), staged), "model.folder": str(local.model_dir)}
    if settings.storage.data_dir is not None:
        out |= {"data.source": "folder", "data.folder": str(local.data_dir)}
    return out
