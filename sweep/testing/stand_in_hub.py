"""A stand-in Hugging Face Hub on 127.0.0.1 for tests: the routes huggingface_hub (2.4), datasets' HfFileSystem
and transformers use to look up and download a repo, answered from files held in memory.

A process reaches it with ``HF_ENDPOINT=<StandInHub.start()>`` in its environment, set before it imports
huggingface_hub (which reads the variable once, into ``huggingface_hub.constants.ENDPOINT``). Routes:

- ``GET /api/{models|datasets}/{repo}[/revision/{rev}]``:  the repo's info (``?blobs=true``: with sizes and LFS)
- ``GET /api/{models|datasets}/{repo}/tree/{rev}[/{path}]``: a folder's entries (``?recursive=true``: all below)
- ``POST /api/{models|datasets}/{repo}/paths-info/{rev}``:  the entries of the form's ``paths`` that exist
- ``HEAD|GET /[datasets/]{repo}/resolve/{rev}/{path}``:     a file's bytes (``Range`` honoured), with its ETag
- ``GET /api/agent-harnesses``:                            no AI-agent harnesses (the library's User-Agent asks)

Errors carry ``X-Error-Code`` and ``X-Error-Message`` as the Hub's do: huggingface_hub's ``hf_raise_for_status``
turns them into RepositoryNotFoundError, GatedRepoError, RevisionNotFoundError and EntryNotFoundError.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from urllib.parse import parse_qs, unquote, urlsplit

# Files the Hub keeps in LFS (by their name, as a repo's .gitattributes would): their ETag is the sha256.
LFS_SUFFIXES = (".safetensors", ".bin", ".parquet", ".h5", ".msgpack", ".onnx")
REPO_TYPES = {"models": "model", "datasets": "dataset"}
API_ROUTES = ("revision", "tree", "paths-info")
# What would point a process elsewhere than the stand-in and its own HF_HOME, or lend it a token or offline mode
FOREIGN_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE",
               "HF_DATASETS_CACHE", "HF_XET_CACHE", "HF_ASSETS_CACHE", "TRANSFORMERS_CACHE", "HF_DATASETS_OFFLINE",
               "TRANSFORMERS_OFFLINE")
DATE = "2024-01-01T00:00:00.000Z"  # lastModified/createdAt: the library parses them when present


def git_blob_sha(data: bytes) -> str:
    """The sha1 git gives ``data`` as a blob: the Hub's ETag and oid of a file kept in git."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass(frozen=True)
class HubFile:
    """One file of a repo, with the hashes the Hub reports for it."""

    path: str
    data: bytes

    @property
    def lfs(self) -> bool:
        return self.path.endswith(LFS_SUFFIXES)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def pointer(self) -> bytes:
        """The LFS pointer git holds in the file's place (its blob is the file's oid on the Hub)."""
        return f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {len(self.data)}\n".encode()

    @property
    def blob_id(self) -> str:
        return git_blob_sha(self.pointer if self.lfs else self.data)

    @property
    def etag(self) -> str:
        # What the library keys its cache on: the sha256 of an LFS file, the git blob sha1 of any other
        return self.sha256 if self.lfs else self.blob_id

    def tree_entry(self) -> dict:
        entry: dict = {"type": "file", "oid": self.blob_id, "size": len(self.data), "path": self.path}
        if self.lfs:
            entry["lfs"] = {"oid": self.sha256, "size": len(self.data), "pointerSize": len(self.pointer)}
        return entry

    def sibling(self, blobs: bool) -> dict:
        entry: dict = {"rfilename": self.path}
        if blobs:
            entry |= {"size": len(self.data), "blobId": self.blob_id}
            if self.lfs:
                entry["lfs"] = {"sha256": self.sha256, "size": len(self.data), "pointerSize": len(self.pointer)}
        return entry


@dataclass
class HubRepo:
    """A repo whose ``main`` is one commit (``sha``) of ``files``."""

    repo_type: str
    repo_id: str
    files: dict[str, HubFile]
    sha: str
    token: str | None = None
    gated: bool = False
    folders: set[str] = field(default_factory=set)

    def revision_ok(self, revision: str) -> bool:
        return revision in ("main", self.sha)

    def info(self, blobs: bool) -> dict:
        namespace = self.repo_id.rpartition("/")[0]
        return {
            "_id": self.sha[:24], "id": self.repo_id, "author": namespace or None, "sha": self.sha,
            "private": self.token is not None and not self.gated, "gated": "manual" if self.gated else False,
            "disabled": False, "lastModified": DATE, "createdAt": DATE, "tags": [], "downloads": 0, "likes": 0,
            "siblings": [self.files[p].sibling(blobs) for p in sorted(self.files)],
        }

    def folder_entry(self, path: str) -> dict:
        inside = sorted((p, f.blob_id) for p, f in self.files.items() if p.startswith(path + "/"))
        return {"type": "directory", "oid": hashlib.sha1(repr(inside).encode()).hexdigest(), "size": 0, "path": path}

    def entry(self, path: str) -> dict | None:
        if path in self.files:
            return self.files[path].tree_entry()
        return self.folder_entry(path) if path in self.folders else None

    def tree(self, folder: str, recursive: bool) -> list[dict]:
        """The folder's entries as the Hub lists them: folders, then files; all below it when ``recursive``."""
        prefix = folder + "/" if folder else ""

        def listed(path: str) -> bool:
            return path.startswith(prefix) and (recursive or "/" not in path[len(prefix):])

        return ([self.folder_entry(p) for p in sorted(self.folders) if listed(p)]
                + [self.files[p].tree_entry() for p in sorted(self.files) if listed(p)])


class HubError(Exception):
    """An error answer: status, X-Error-Code (None: no code) and X-Error-Message; X-Repo-Commit when known."""

    def __init__(self, status: int, code: str | None, message: str, commit: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.commit = status, code, message, commit


class StandInHub:
    """Repos held in memory and served over HTTP on 127.0.0.1 as the Hugging Face Hub serves them.

    ``file_gets`` counts GETs of each file's bytes by ``(repo_type, repo_id, path)`` (a Range GET counts, a HEAD
    does not), ``bytes_served`` sums their bodies, and ``requests`` logs "METHOD path?query" of every request.
    """

    def __init__(self) -> None:
        self.repos: dict[tuple[str, str], HubRepo] = {}
        self.file_gets: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.bytes_served = 0
        self.requests: list[str] = []
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def add_repo(self, repo_id: str, files: dict[str, bytes], repo_type: str = "model",
                 token: str | None = None, gated: bool = False) -> str:
        """Hold a repo whose ``main`` is one commit of ``files``; returns the commit sha (40 hex, derived from the
        files alone, so equal files give equal shas).

        ``token``: the repo is private and only a request with ``Authorization: Bearer <token>`` sees it; any other
        gets what the Hub answers for a private repo (401 without a token, 404 with another, both RepoNotFound).
        ``gated``: as on the Hub, its info and listings are public but its files answer 401 (no token) or 403
        (another token) with GatedRepo to a request without ``token`` (None: to every request).
        """
        if repo_type not in REPO_TYPES.values():
            raise ValueError(f"repo_type must be one of {sorted(REPO_TYPES.values())}, not {repo_type!r}")
        held = {path: HubFile(path, data) for path, data in files.items()}
        sha = hashlib.sha1(b"".join(f"{p}\0{held[p].blob_id}\n".encode() for p in sorted(held))).hexdigest()
        folders = {p.rsplit("/", 1)[0] for p in held if "/" in p}
        folders |= {f.rsplit("/", i)[0] for f in folders for i in range(1, f.count("/") + 1)}
        with self._lock:
            self.repos[(repo_type, repo_id)] = HubRepo(repo_type, repo_id, held, sha, token, gated, folders)
        return sha

    def start(self) -> str:
        """Serve on a free port of 127.0.0.1 from a daemon thread; returns the endpoint, ``http://127.0.0.1:PORT``."""
        if self._server is not None:
            raise RuntimeError("the stand-in hub is already serving")
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.hub = self
        self._thread = threading.Thread(target=self._server.serve_forever, name="stand-in-hub", daemon=True)
        self._thread.start()
        return self.endpoint

    @property
    def endpoint(self) -> str:
        if self._server is None:
            raise RuntimeError("the stand-in hub is not serving")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def env(self, hf_home: str | Path, token: str | None = None) -> dict[str, str]:
        """This process's environment for a child that uses the stand-in: its HF_ENDPOINT, online, ``hf_home`` as
        its only cache, ``token`` (if any) as HF_TOKEN, no Xet (the stand-in serves none) or progress bars, and
        none of FOREIGN_ENV it would otherwise inherit."""
        env = {k: v for k, v in os.environ.items() if k not in FOREIGN_ENV}
        env |= {"HF_ENDPOINT": self.endpoint, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "0",
                "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
        if token is not None:
            env["HF_TOKEN"] = token
        return env

    def stop(self) -> None:
        """Stop serving and close the port (a connection to it is refused after)."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server, self._thread = None, None

    def __enter__(self) -> StandInHub:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def repo(self, repo_type: str, repo_id: str, authorization: str | None, file: bool = False) -> HubRepo:
        """The repo a request may see, or the HubError the Hub answers it with."""
        repo = self.repos.get((repo_type, repo_id))
        if repo is None:
            raise HubError(404, "RepoNotFound", "Repository not found")
        granted = repo.token is not None and authorization == f"Bearer {repo.token}"
        if repo.gated and file and not granted:
            # The Hub's 401 for an anonymous request and 403 for a user not on the list; both say GatedRepo
            status = 401 if authorization is None else 403
            raise HubError(status, "GatedRepo", f"Access to {repo_type} {repo_id} is restricted. You must have "
                           "access to it and be authenticated to access it. Please log in.")
        if repo.token is not None and not repo.gated and not granted:
            raise HubError(401 if authorization is None else 404, "RepoNotFound", "Repository not found")
        return repo


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a handler left running never holds the test process open
    hub: StandInHub


def _flag(query: dict[str, list[str]], name: str) -> bool:
    return query.get(name, ["false"])[-1].lower() in ("true", "1")


def _split_repo(parts: list[str], keywords: tuple[str, ...]) -> tuple[str, str, list[str]]:
    """(repo_id, keyword, what follows it) of raw path segments ``repo...`` `keyword` ``rest...``: a repo id is one
    segment ("roberta-base", or "nyu-mll%2Fglue" quoted) or two ("nyu-mll/glue")."""
    for size in (1, 2):
        if len(parts) > size and parts[size] in keywords:
            return unquote("/".join(parts[:size])), parts[size], parts[size + 1:]
    if keywords == API_ROUTES and 1 <= len(parts) <= 2:  # /api/models/{repo}: the info of main
        return unquote("/".join(parts)), "revision", ["main"]
    raise HubError(404, None, "Sorry, we can't find the page you are looking for.")


class _Handler(BaseHTTPRequestHandler):
    """One request (HTTP/1.0: the connection closes after it, so none outlives ``stop()``)."""

    server: _Server
    server_version = "StandInHub/1.0"

    def log_message(self, format: str, *args: object) -> None:
        pass  # `requests` is the log; stderr stays quiet

    def do_HEAD(self) -> None:
        self._answer("HEAD")

    def do_GET(self) -> None:
        self._answer("GET")

    def do_POST(self) -> None:
        self._answer("POST")

    def _answer(self, method: str) -> None:
        hub = self.server.hub
        with hub._lock:
            hub.requests.append(f"{method} {self.path}")
        url = urlsplit(self.path)
        query = parse_qs(url.query, keep_blank_values=True)
        parts = [p for p in url.path.split("/") if p]
        try:
            if parts == ["api", "agent-harnesses"]:
                # huggingface_hub's agent detection asks once a day (for its User-Agent): no harness known here
                self._json({"standardEnvVars": [], "harnesses": {}})
            elif len(parts) >= 2 and parts[0] == "api" and parts[1] in REPO_TYPES:
                self._api(method, REPO_TYPES[parts[1]], parts[2:], query)
            else:
                repo_type = "dataset" if parts[:1] == ["datasets"] else "model"
                self._resolve(method, repo_type, parts[1:] if repo_type == "dataset" else parts)
        except HubError as e:
            self._error(method, e)

    def _check_revision(self, repo: HubRepo, raw: str) -> None:
        revision = unquote(raw)  # quoted whole by the library ("refs%2Fpr%2F1")
        if not repo.revision_ok(revision):
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")

    def _api(self, method: str, repo_type: str, parts: list[str], query: dict[str, list[str]]) -> None:
        repo_id, route, rest = _split_repo(parts, API_ROUTES)
        if not rest or (method, route) not in (("GET", "revision"), ("GET", "tree"), ("POST", "paths-info")):
            raise HubError(404, None, "Sorry, we can't find the page you are looking for.")
        repo = self.server.hub.repo(repo_type, repo_id, self.headers.get("Authorization"))
        self._check_revision(repo, rest[0])
        if route == "revision":
            self._json(repo.info(blobs=_flag(query, "blobs")))
        elif route == "tree":
            folder = unquote("/".join(rest[1:])).strip("/")
            if folder and folder not in repo.folders:
                raise HubError(404, "EntryNotFound", f"{folder} does not exist on \"{rest[0]}\"", repo.sha)
            self._json(repo.tree(folder, recursive=_flag(query, "recursive")))
        else:
            length = int(self.headers.get("Content-Length") or 0)
            form = parse_qs(self.rfile.read(length).decode(), keep_blank_values=True)
            entries = [repo.entry(p.strip("/")) for p in form.get("paths", [])]
            self._json([e for e in entries if e is not None])

    def _resolve(self, method: str, repo_type: str, parts: list[str]) -> None:
        if method not in ("GET", "HEAD"):
            raise HubError(405, None, "Method not allowed")
        repo_id, _, rest = _split_repo(parts, ("resolve",))
        hub = self.server.hub
        repo = hub.repo(repo_type, repo_id, self.headers.get("Authorization"), file=True)
        if not rest:
            raise HubError(404, None, "Sorry, we can't find the page you are looking for.")
        self._check_revision(repo, rest[0])
        path = unquote("/".join(rest[1:]))
        file = repo.files.get(path)
        if file is None:
            raise HubError(404, "EntryNotFound", "Entry not found", repo.sha)
        size = len(file.data)
        start, end = 0, size  # the body: data[start:end]
        status = 200
        headers = {"Content-Type": "application/octet-stream", "Accept-Ranges": "bytes", "ETag": f'"{file.etag}"',
                   "X-Repo-Commit": repo.sha}
        if file.lfs:
            # What the Hub's redirect to its CDN carries; the library prefers them to ETag and Content-Length
            headers |= {"X-Linked-Etag": f'"{file.sha256}"', "X-Linked-Size": str(size)}
        span = _byte_range(self.headers.get("Range") or "", size) if method == "GET" else None
        if span is not None:
            start, end = span
            if start >= end:
                raise HubError(416, None, "Requested Range Not Satisfiable", repo.sha)
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        body = file.data[start:end] if method == "GET" else b""
        headers["Content-Length"] = str(end - start)
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        if method == "GET":
            # Counted before the body goes out: the client may read it and look at the counts at once
            with hub._lock:
                hub.file_gets[(repo_type, repo_id, path)] += 1
                hub.bytes_served += len(body)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, payload: object) -> None:
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, method: str, error: HubError) -> None:
        body = json.dumps({"error": error.message}).encode()
        self.send_response(error.status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("X-Error-Message", error.message)
        if error.code is not None:
            self.send_header("X-Error-Code", error.code)
        if error.commit is not None:
            # The library records a missing file under this commit (.no_exist/) so it asks once
            self.send_header("X-Repo-Commit", error.commit)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(body)


def _byte_range(header: str, size: int) -> tuple[int, int] | None:
    """[start, end) of a single ``bytes=a-b``, ``bytes=a-`` or ``bytes=-n`` range of a file of ``size`` bytes (empty
    when it is unsatisfiable); None, so the whole file, for no header or one the Hub's CDN would ignore too."""
    unit, _, spec = header.partition("=")
    first, dash, last = spec.strip().partition("-")
    if unit.strip().lower() != "bytes" or not dash or "," in spec:
        return None
    try:
        if not first:  # the last n bytes
            return (max(size - int(last), 0), size) if int(last) > 0 else (size, size)
        start, end = int(first), (int(last) + 1 if last else size)
    except ValueError:
        return None
    if start >= size:
        return size, size  # past the end: 416, which HfFileSystem reads as the end of the file
    return (start, min(end, size)) if start < end else None
