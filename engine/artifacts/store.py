"""The artifact store: content-addressed blobs, files and directories behind any fsspec URI.

Layout under the root: ``cas/<sha[:2]>/<sha>`` for content-addressed data (files as they are,
directories as deterministic tar archives, code bundles as zips) and ``logs/<run>/...`` for task logs.
Readers keep a local cache keyed by sha256 (``$GANGFLOW_CACHE`` or ``~/.cache/gangflow``), so a value
read twice is downloaded once. A local directory is the default root; ``s3://``, ``gs://`` and the
other fsspec protocols work when their fsspec driver is installed.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec

from engine.atomic import publishing
from engine.types.files import Artifact, Directory

__all__ = ["ArtifactStore", "cache_dir", "default_artifact_root"]

_CHUNK = 1 << 20


def cache_dir() -> Path:
    root = Path(os.environ.get("GANGFLOW_CACHE") or Path.home() / ".cache" / "gangflow")
    root.mkdir(parents=True, exist_ok=True)
    return root


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
        object (the remote stores' counterpart of engine.atomic)."""
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
        """A local path holding the artifact's content, downloaded once per sha256 into the cache."""
        assert art.uri and art.sha256
        target = cache_dir() / "artifacts" / art.sha256[:2] / art.sha256 / art.name
        if target.exists():
            return str(target)
        with publishing(target) as staging:  # a concurrent fetch may win the race: its copy is the same
            if isinstance(art, Directory):
                with tarfile.open(fileobj=io.BytesIO(self.get_bytes(art.uri))) as tar:
                    tar.extractall(staging, filter="data")
            else:
                fs, path = fsspec.core.url_to_fs(art.uri)
                fs.get_file(path, str(staging))
                sha, _ = _sha256_file(str(staging))
                if sha != art.sha256:
                    raise OSError(f"artifact {art.uri} is corrupt: sha256 {sha} != {art.sha256}")
        return str(target)

    def context(self, *, upload: bool = True, fetch: bool = True) -> dict[str, Any]:
        """The pydantic context that lets File / Directory values upload and download through this store."""
        ctx: dict[str, Any] = {}
        if upload:
            ctx["upload"] = self.upload
        if fetch:
            ctx["fetch"] = self.fetch
        return ctx
