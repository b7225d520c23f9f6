"""The Hugging Face Hub as a source: a repo's revision resolved once, on the driver, to a commit sha (a pin);
its files fetched at most once per node into the standard Hugging Face cache (``HF_HOME`` / ``HF_HUB_CACHE``).

The driver resolves (``resolve``): one call for the repo's commit and file list, the files a sweep needs
picked (``hub_files``), every missing repo, revision or file one line before Ray starts. Offline
(``HF_HUB_OFFLINE=1``) or with the Hub unreachable, the revision is found in the cache instead, and a repo the
cache lacks is one line naming it and what to do. A node fetches a pin under a file lock (``fetch``): when
the cache holds every pinned file it makes no request at all. The token is huggingface_hub's own
(``HF_TOKEN``, or ``hf auth login``'s stored one): it is sent to the Hub and nowhere else.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from filelock import FileLock

from sweep.errors import StagingError
from sweep.secrets import scrub

COMMIT = re.compile(r"[0-9a-f]{40}")


class HubError(StagingError):
    """A Hub repo, revision or file a sweep names cannot be had; the message says which and what to do."""


@dataclass(frozen=True)
class HubPin:
    """One repo at one commit, and the files of it a sweep reads: what every node fetches."""

    repo_id: str
    repo_type: str  # model | dataset
    revision: str  # as the config asked (main, a tag, a sha)
    sha: str  # the commit it resolved to on the driver
    files: tuple[str, ...]
    size: int  # the files' bytes (0 where only the cache was read)
    setting: str  # the option that named it (model.hub_id, task.RTE): every line names it
    endpoint: str = ""  # the Hub the driver resolved it on (HF_ENDPOINT): every node fetches from the same one
    cached: bool = False  # resolved from the driver's cache (offline, or the Hub did not answer)

    @property
    def uri(self) -> str:
        kind = "datasets/" if self.repo_type == "dataset" else ""
        return f"hf://{kind}{self.repo_id}@{self.sha[:12]}"


Select = Callable[[list[str]], list[str]]  # the repo's files -> the files a sweep needs
Lacks = Callable[[list[str]], list[str]]  # the picked files -> what is missing for them to be usable


def quiet_http() -> None:
    """No line per HTTP request: huggingface_hub's client (httpx2) logs each at INFO, which Hydra's root logger
    prints; the download's own progress bar stays."""
    for name in ("httpx2", "httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)


def offline() -> bool:
    from huggingface_hub import constants

    return constants.HF_HUB_OFFLINE


def endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def cache_dir() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def has_token() -> bool:
    from huggingface_hub import get_token

    return get_token() is not None


def repo_folder(repo_id: str, repo_type: str) -> Path:
    from huggingface_hub.file_download import repo_folder_name

    return cache_dir() / repo_folder_name(repo_id=repo_id, repo_type=repo_type)


def snapshot_folder(pin: HubPin) -> Path:
    return repo_folder(pin.repo_id, pin.repo_type) / "snapshots" / pin.sha


# One resolution per driver process: the command's check before Hydra, then the sweep, see the same commit.
_RESOLVED: dict[tuple[str, str, str, str], HubPin] = {}


def resolve(repo_id: str, repo_type: str, revision: str, setting: str, select: Select, lacks: Lacks,
            hint: str, at: str | None = None) -> HubPin:
    """The repo at ``revision`` pinned to its commit, with the files ``select`` picks; ``hint``: what the user
    can give instead (model.path=DIR). ``at``: the commit a resumed sweep pinned before (``revision`` may have
    moved since). Resolved once per process: the sweep uses what the command checked."""
    key = (repo_id, repo_type, at or revision, endpoint())
    quiet_http()
    if key not in _RESOLVED:
        how = _from_cache if offline() else _from_hub
        pin = replace(how(repo_id, repo_type, at or revision, setting, select, hint), revision=revision)
        missing = lacks(list(pin.files))
        if missing:
            where = (f"the cached copy of {repo_id}@{pin.sha[:12]}" if pin.cached
                     else f"{repo_id}@{revision} on {endpoint()}")
            raise HubError(f"{setting}: {where} has no {', '.join(missing)}; {hint}")
        _RESOLVED[key] = pin
    return _RESOLVED[key]


def _from_hub(repo_id: str, repo_type: str, revision: str, setting: str, select: Select, hint: str) -> HubPin:
    import httpx2
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    try:
        info = HfApi().repo_info(repo_id, revision=revision, repo_type=repo_type, files_metadata=True)
    except (httpx2.ConnectError, httpx2.TimeoutException, OfflineModeIsEnabled) as e:
        # No network: what the cache holds is as good as a pin (the message says so), else the one line.
        pin = _from_cache(repo_id, repo_type, revision, setting, select, hint,
                          why=f"{endpoint()} is not reachable: {type(e).__name__}")
        print(f"warning: {setting}: the Hub ({endpoint()}) is not reachable ({type(e).__name__}); "
              f"using the cached {repo_id}@{pin.sha[:12]}", flush=True)
        return pin
    except HfHubHTTPError as e:
        raise refused(e, repo_id, repo_type, revision, setting, hint) from None
    if getattr(info, "gated", False) and not has_token():  # its files would be refused: say so before any trial
        raise refusal("gated", repo_id, repo_type, revision, setting, hint)
    sizes = {s.rfilename: s.size or 0 for s in info.siblings or []}
    files = select(sorted(sizes))
    return HubPin(repo_id, repo_type, revision, info.sha, tuple(files), sum(sizes[f] for f in files), setting,
                  endpoint())


def refused(e, repo_id: str, repo_type: str, revision: str, setting: str, hint: str) -> HubError:
    """The Hub's refusal (an HfHubHTTPError) as one line: which repo, why, what to do."""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    kind = ("gated" if isinstance(e, GatedRepoError) else "not found" if isinstance(e, RepositoryNotFoundError)
            else "revision" if isinstance(e, RevisionNotFoundError) else "other")
    status = getattr(getattr(e, "response", None), "status_code", "?")
    return refusal(kind, repo_id, repo_type, revision, setting, hint,
                   f"HTTP {status}: {scrub(str(e).splitlines()[0] if str(e) else '')}")


def refusal(kind: str, repo_id: str, repo_type: str, revision: str, setting: str, hint: str,
            detail: str = "") -> HubError:
    """One line for a repo the Hub refuses (``kind``: gated, not found, revision, other); the token is
    never part of it, only whether one was given."""
    where = f"{repo_type} repo {repo_id!r} on {endpoint()}"
    given = has_token()
    token = "the token given (HF_TOKEN or `hf auth login`)" if given else "no token was given"
    if kind == "gated":
        why = (f"is gated and {token} has no access: accept its terms on the Hub with that account" if given
               else f"is gated and {token}: accept its terms on the Hub, then set HF_TOKEN or run `hf auth login`")
    elif kind == "not found":
        why = (f"was not found, or is private and {token} has no access; check the name"
               + ("" if given else ", or set HF_TOKEN / run `hf auth login` for a private repo"))
    elif kind == "revision":
        why = f"has no revision {revision!r} (a branch, tag or commit sha); set {_revision_key(setting)}"
    else:
        why = f"answered {detail}"
    return HubError(f"{setting}: the {where} {why}; or {hint}")


def _revision_key(setting: str) -> str:
    return "model.revision=..." if setting.startswith("model") else f"{setting}.hf.revision=..."


def _from_cache(repo_id: str, repo_type: str, revision: str, setting: str, select: Select, hint: str,
                why: str = "HF_HUB_OFFLINE=1") -> HubPin:
    """The pin the cache holds for ``revision`` (a branch's ref, or a commit): offline, or the Hub unreachable."""
    folder = repo_folder(repo_id, repo_type)
    ref = folder / "refs" / revision
    sha = ref.read_text().strip() if ref.is_file() else revision if COMMIT.fullmatch(revision) else None
    snapshot = folder / "snapshots" / sha if sha else None
    if snapshot is None or not snapshot.is_dir():
        raise HubError(
            f"{setting}: {repo_type} repo {repo_id}@{revision} is not in the Hugging Face cache ({cache_dir()}) "
            f"and the Hub cannot be asked ({why}): run once where the Hub is reachable (HF_HUB_OFFLINE unset), "
            f"or {hint}")
    present = sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file())
    return HubPin(repo_id, repo_type, revision, sha, tuple(select(present)), 0, setting, endpoint(), cached=True)


@dataclass(frozen=True)
class Fetched:
    path: Path  # the snapshot folder holding the pinned files
    downloaded: int  # bytes this call fetched (0: every file was in the cache)


def fetch(pin: HubPin) -> Fetched:
    """The pinned files in this node's Hugging Face cache: fetched at most once per node, under a lock that
    the node's trials share; a cache that holds them makes no request."""
    snapshot = snapshot_folder(pin)
    if _complete(pin, snapshot):
        _record_ref(pin)
        return Fetched(snapshot, 0)
    quiet_http()
    locks = cache_dir() / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    with FileLock(str(locks / f"sweep-{pin.repo_type}-{pin.repo_id.replace('/', '--')}-{pin.sha}.lock")):
        missing = [f for f in pin.files if not (snapshot / f).is_file()]
        if not missing:
            return Fetched(snapshot, 0)
        before = _bytes(snapshot, pin.files)
        _download(pin)
        if not _complete(pin, snapshot):
            lost = [f for f in pin.files if not (snapshot / f).is_file()]
            raise HubError(f"{pin.setting}: {pin.uri}: {', '.join(lost)} missing after the download; run again")
        _record_ref(pin)
        return Fetched(snapshot, _bytes(snapshot, pin.files) - before)


def _record_ref(pin: HubPin) -> None:
    """The cache's ``refs/<revision>`` -> the pinned commit, as huggingface_hub writes it: an offline sweep
    (and ``from_pretrained``) finds ``main`` there. Fetched by its sha, the snapshot has no ref otherwise."""
    if pin.revision == pin.sha:
        return
    from sweep.files import write_text

    ref = repo_folder(pin.repo_id, pin.repo_type) / "refs" / pin.revision
    if not ref.is_file() or ref.read_text().strip() != pin.sha:
        write_text(ref, pin.sha)


def _complete(pin: HubPin, snapshot: Path) -> bool:
    return all((snapshot / f).is_file() for f in pin.files)


def _bytes(snapshot: Path, files: tuple[str, ...]) -> int:
    return sum((snapshot / f).stat().st_size for f in files if (snapshot / f).is_file())


def _download(pin: HubPin) -> None:
    import httpx2
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        snapshot_download(pin.repo_id, repo_type=pin.repo_type, revision=pin.sha, allow_patterns=list(pin.files),
                          endpoint=pin.endpoint or None)
    except HfHubHTTPError as e:
        raise refused(e, pin.repo_id, pin.repo_type, pin.sha, pin.setting, "stage the files instead") from None
    except (LocalEntryNotFoundError, httpx2.HTTPError, OSError) as e:
        raise HubNotReachable(
            f"{pin.setting}: {pin.uri} could not be fetched on this node ({type(e).__name__}: "
            f"{scrub(str(e).splitlines()[0] if str(e) else '')}); a node without the Hub gets the driver's copy "
            "with storage.ship_to_nodes=true") from None


class HubNotReachable(HubError):
    """This node cannot fetch a pin (no network, no token): a multi-node sweep takes the driver's copy."""


def pack_pin(pin: HubPin, snapshot: Path | None = None) -> bytes:
    """This machine's copy of a pin's files (``snapshot``: the folder the driver fetched them into, else this
    process's cache) as an uncompressed tar, the cache's links followed: what the driver sends a node that
    cannot reach the Hub."""
    import io
    import tarfile

    snapshot = Path(snapshot) if snapshot is not None else snapshot_folder(pin)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", dereference=True) as tar:
        for name in pin.files:
            tar.add(snapshot / name, arcname=name, recursive=False)  # the blob the link points at
    return buffer.getvalue()


def unpack_pin(blob: bytes, pin: HubPin, max_bytes: int) -> None:
    """A pin's files from the driver into this node's cache, where ``fetch`` finds them (safe extraction)."""
    import tempfile

    from sweep.storage.archive import extract_archive

    snapshot = snapshot_folder(pin)
    snapshot.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=snapshot.parent) as tmp:
        archive = Path(tmp) / "pin.tar"
        archive.write_bytes(blob)
        unpacked = Path(tmp) / "files"
        extract_archive(archive, unpacked, f"the driver's copy of {pin.uri}", max_bytes)
        for name in pin.files:
            (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(unpacked / name, snapshot / name)
