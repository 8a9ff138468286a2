"""The artifact store: content-addressed blobs, files and directories behind any fsspec URI.

Layout under the root: ``cas/<sha[:2]>/<sha>`` for content-addressed data (files as they are,
directories as deterministic tar archives, code bundles as zips) and ``logs/<run>/...`` for task logs.
Readers keep a local cache per store (under ``$GANGFLOW_CACHE`` or ``~/.cache/gangflow``, see :func:`cache_path`), so
a value read twice is downloaded once, and two stores (two tenants' roots) never share a cached copy, even of the
same content. What is read is checked: a reference must point into this store's ``cas/``
(not another store, not a path of its choosing), the downloaded bytes must have the reference's sha256 (files
and directory archives alike), and a cached copy changed since it was fetched (a task writing into its input,
say) is fetched again rather than handed out. A local directory is the default root; ``s3://``, ``gs://`` and the
other fsspec protocols work when their fsspec driver is installed.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import fsspec

from engine.core.atomic import publishing, write_atomic
from engine.types.files import Artifact, Directory

__all__ = ["ArtifactStore", "CacheKind", "cache_dir", "cache_path", "default_artifact_root", "store_key"]

_CHUNK = 1 << 20


#: what a store's local cache holds: fetched files and directories, extracted code bundles
CacheKind = Literal["artifacts", "bundles"]


def cache_dir() -> Path:
    """The machine's cache folder (``$GANGFLOW_CACHE`` or ``~/.cache/gangflow``): each store's cache lives under
    it (:func:`cache_path`), a node agent's working folders too."""
    root = Path(os.environ.get("GANGFLOW_CACHE") or Path.home() / ".cache" / "gangflow")
    root.mkdir(parents=True, exist_ok=True)
    return root


def store_key(root: str) -> str:
    """The name of a store's cache folder: the first 16 hex digits of the sha256 of its root URI (as
    ``ArtifactStore.uri_root`` spells it)."""
    return hashlib.sha256(root.encode()).hexdigest()[:16]


def cache_path(root: str, kind: CacheKind, sha: str, name: str = "") -> Path:
    """Where the store rooted at ``root`` keeps its local copy of an object: the one home of the cache layout.

    ``stores/<key>/artifacts/<sha[:2]>/<sha>/<name>`` for a fetched file or directory, ``stores/<key>/bundles/<sha>``
    for an extracted code bundle. Keyed by the store, not only by content: each tenant has its own root, so each
    has its own cache, and a copy one tenant's code changed (or planted) is never handed to another tenant even
    when both hold the same sha256. ``sha`` and ``name`` must already be checked (64 hex digits, a plain name).
    """
    base = cache_dir() / "stores" / store_key(root) / kind
    return base / sha[:2] / sha / name if kind == "artifacts" else base / sha


def default_artifact_root() -> str:
    """``$GANGFLOW_ARTIFACTS``, else ``.gangflow/artifacts`` under the current directory (what
    ``gangflow dev`` uses with its default state dir)."""
    env = os.environ.get("GANGFLOW_ARTIFACTS")
    return env if env else str(Path(".gangflow", "artifacts").resolve())


def _sha256_file(path: str) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _tar_directory(path: str) -> bytes:
    """A byte-for-byte reproducible tar of a directory: sorted names, zeroed times and owners."""
    buffer = io.BytesIO()

    def normalize(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
        return info

    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames.sort()
            for name in sorted(filenames):
                full = os.path.join(dirpath, name)
                tar.add(full, arcname=os.path.relpath(full, path), recursive=False, filter=normalize)
            for name in dirnames:
                full = os.path.join(dirpath, name)
                if not os.listdir(full):  # keep empty directories
                    tar.add(full, arcname=os.path.relpath(full, path), recursive=False, filter=normalize)
    return buffer.getvalue()


def _stamp_path(target: Path) -> Path:
    return target.with_name(f".{target.name}.stamp")


def _stamp(target: Path) -> list[list[Any]]:
    """What a cached copy looks like: each file's relative path, size, mtime and ctime (a change to any of them,
    e.g. a task writing into its input, means the copy is no longer what was fetched)."""
    paths = [target] if target.is_file() else sorted(p for p in target.rglob("*") if p.is_file())
    out: list[list[Any]] = []
    for path in paths:
        info = path.stat()
        out.append(
            [str(path.relative_to(target)) if path != target else "", info.st_size, info.st_mtime_ns, info.st_ctime_ns]
        )
    return out


def _read_stamp(target: Path) -> Any:
    try:
        return json.loads(_stamp_path(target).read_text())
    except (OSError, ValueError):
        return None  # none (fetched before stamps existed, or a concurrent fetch not done): fetch again


def _remove(target: Path) -> None:
    if target.is_dir():
        shutil.rmtree(target, ignore_errors=True)
    else:
        target.unlink(missing_ok=True)
    _stamp_path(target).unlink(missing_ok=True)


class ArtifactStore:
    """Content-addressed storage rooted at a URI or local path."""

    def __init__(self, root: str) -> None:
        if "://" not in root:
            root = os.path.abspath(root)
        self.fs, self.root = fsspec.core.url_to_fs(root)
        self.uri_root = root.rstrip("/")
        self.local = "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,))

    # -- addressing --------------------------------------------------------------------------------
    def _cas_path(self, sha: str) -> str:
        return f"{self.root}/cas/{sha[:2]}/{sha}"

    def _uri(self, path: str) -> str:
        return path if self.local else self.fs.unstrip_protocol(path)

    def object_uri(self, sha: str) -> str:
        """The URI of this store's object for a sha256 (what a reference to it must say)."""
        return self._uri(self._cas_path(sha))

    def cache_path(self, kind: CacheKind, sha: str, name: str = "") -> Path:
        """This store's local copy of an object (see :func:`cache_path`)."""
        return cache_path(self.uri_root, kind, sha, name)

    def log_path(self, *parts: str) -> str:
        return "/".join([self.root, "logs", *parts])

    # -- writing -----------------------------------------------------------------------------------
    def put_bytes(self, data: bytes) -> tuple[str, str]:
        """Store bytes; returns (uri, sha256). Storing the same content twice is a no-op."""
        sha = hashlib.sha256(data).hexdigest()
        target = self._cas_path(sha)
        if not self.fs.exists(target):
            self._publish(target, lambda tmp: self.fs.pipe_file(tmp, data))
        return self._uri(target), sha

    def _publish(self, target: str, write: Callable[[str], object]) -> None:
        """``write`` a temporary object beside ``target``, then move it there: a reader never sees half an
        object (the remote stores' counterpart of engine.core.atomic)."""
        self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
        tmp = f"{target}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
        write(tmp)
        self.fs.mv(tmp, target)

    def put_file(self, path: str) -> tuple[str, str, int]:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"File {path!r} does not exist (or is not a regular file)")
        sha, size = _sha256_file(path)
        target = self._cas_path(sha)
        if not self.fs.exists(target):
            self._publish(target, lambda tmp: self.fs.put_file(path, tmp))
        return self._uri(target), sha, size

    def upload(self, art: Artifact) -> None:
        """Upload a local File / Directory and fill in its reference (uri, sha256, size)."""
        if isinstance(art, Directory):
            if not os.path.isdir(art.path):
                raise FileNotFoundError(f"Directory {art.path!r} does not exist")
            data = _tar_directory(art.path)
            art.uri, art.sha256 = self.put_bytes(data)
            art.size = len(data)
        else:
            art.uri, art.sha256, art.size = self.put_file(art.path)

    # -- reading -----------------------------------------------------------------------------------
    def get_bytes(self, uri: str) -> bytes:
        with fsspec.open(uri, "rb") as handle:
            return handle.read()  # type: ignore[no-any-return]

    def fetch(self, art: Artifact) -> str:
        """A local path holding the artifact's content, downloaded once per sha256 into this store's cache (and
        again when the cached copy was changed). Raises ValueError (never retried) for a reference outside this
        store."""
        if not art.uri or not art.sha256:
            raise ValueError(f"{art!r} is not an uploaded reference")
        self.check_reference(art.uri, art.sha256)
        target = self.cache_path("artifacts", art.sha256, art.name)
        if target.exists():
            if _stamp(target) == _read_stamp(target):
                return str(target)
            _remove(target)  # changed since it was fetched: fetch it again
        with publishing(target) as staging:  # a concurrent fetch may win the race: its copy is the same
            if isinstance(art, Directory):
                data = self.get_bytes(art.uri)
                if hashlib.sha256(data).hexdigest() != art.sha256:
                    raise OSError(f"artifact {art.uri} is corrupt: its sha256 is not {art.sha256}")
                with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                    tar.extractall(staging, filter="data")
            else:
                fs, path = fsspec.core.url_to_fs(art.uri)
                fs.get_file(path, str(staging))
                sha, _ = _sha256_file(str(staging))
                if sha != art.sha256:
                    raise OSError(f"artifact {art.uri} is corrupt: sha256 {sha} != {art.sha256}")
        write_atomic(_stamp_path(target), json.dumps(_stamp(target)).encode(), durable=False)
        return str(target)

    def check_reference(self, uri: str, sha: str) -> None:
        """The reference must name this store's object for its sha256: not another store's (another tenant's),
        not a path of the sender's choosing. Raises ValueError (never retried) otherwise."""
        expected = self.object_uri(sha)
        given = os.path.normpath(uri) if self.local and "://" not in uri else uri
        if given != expected:
            raise ValueError(f"refusing an artifact reference outside this run's store ({self.uri_root}): {uri}")

    def context(self, *, upload: bool = True, fetch: bool = True) -> dict[str, Any]:
        """The pydantic context that lets File / Directory values upload and download through this store."""
        ctx: dict[str, Any] = {}
        if upload:
            ctx["upload"] = self.upload
        if fetch:
            ctx["fetch"] = self.fetch
        return ctx
