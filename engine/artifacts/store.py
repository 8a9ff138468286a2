"""The artifact store: content-addressed blobs, files and directories behind any fsspec URI.

Layout under the root: ``cas/<sha[:2]>/<sha>`` for content-addressed data (files as they are,
directories as deterministic tar archives, code bundles as zips) and ``logs/<run>/...`` for task logs.
Readers keep a local cache per store (under ``$GANGFLOW_CACHE`` or ``~/.cache/gangflow``, see :func:`cache_path`), so
a value read twice is downloaded once, and two stores (two tenants' roots) never share a cached copy, even of the
same content. What is read is checked: a reference must point into this store's ``cas/``
(not another store, not a path of its choosing), the downloaded bytes must have the reference's sha256 (files
and directory archives alike), and a cached copy is verified against that sha256 on first use in each process
(a file re-hashed, an extracted directory compared with its archive), so a copy changed since it was fetched (a
task writing into its input, a tenant planting a file) is fetched again rather than handed out. The cache is safe
for any number of concurrent fetchers and crash-safe, and owned by root where the agent is root
(engine.artifacts.node_cache); directory archives are unpacked with engine.artifacts.extract's checks and caps.
A local directory is the default root; ``s3://``, ``gs://`` and the
other fsspec protocols work when their fsspec driver is installed.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import stat
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import fsspec

from engine.artifacts.extract import ArchiveRefused, extract_tar, limits, tar_digests, tree_matches
from engine.artifacts.node_cache import Verified, discard, object_lock, publish, secure_dirs, sweep, temp_path
from engine.types.files import Artifact, Directory

__all__ = [
    "OUTBOX_ENV",
    "ArtifactStore",
    "CacheKind",
    "cache_dir",
    "cache_path",
    "default_artifact_root",
    "store_key",
]

_CHUNK = 1 << 20
#: set for a rank whose user may not write the store (a sandboxed rank, engine.executor.namespace): its File /
#: Directory outputs are written to this folder, one file named by its sha256 each, and the node agent publishes
#: them into the store once the attempt's processes are gone (:meth:`ArtifactStore.publish_outbox`)
OUTBOX_ENV = "GANGFLOW_OUTBOX"
_SHA = frozenset("0123456789abcdef")


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


def _archive_path(object_folder: Path) -> Path:
    """Where a directory's archive is cached: ``<sha>.tar`` beside the object's folder ``<sha>/`` (never a name in
    it: those are the artifacts' own names)."""
    return object_folder.with_name(f"{object_folder.name}.tar")


def _archive_cap() -> int:
    """The largest directory archive worth downloading: the extraction cap plus the tar headers of a full count
    of files (a larger one is refused before a byte is fetched)."""
    cap = limits()
    return cap.max_bytes + 2048 * cap.max_files


def _tree(folder: Path) -> list[Path]:
    """Every file, link and folder under ``folder``, in a stable order (what a later look compares)."""
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        found += [Path(dirpath, n) for n in sorted(filenames + dirnames)]
    return found


#: what this process verified by digest (engine.artifacts.node_cache)
_VERIFIED = Verified()


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
        #: where this process's uploads go instead of the store (see OUTBOX_ENV); None: into the store
        self.outbox: Path | None = None

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
        if self.outbox is not None:
            self._to_outbox(sha, lambda tmp: Path(tmp).write_bytes(data))
        elif not self.fs.exists(target):
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
        if self.outbox is not None:
            self._to_outbox(sha, lambda tmp: shutil.copyfile(path, tmp))
        elif not self.fs.exists(target):
            self._publish(target, lambda tmp: self.fs.put_file(path, tmp))
        return self._uri(target), sha, size

    def _to_outbox(self, sha: str, write: Callable[[str], object]) -> None:
        outbox = self.outbox
        if outbox is None:
            return
        outbox.mkdir(parents=True, exist_ok=True)
        if not (outbox / sha).exists():
            tmp = outbox / f".{sha}.{os.getpid()}-{os.urandom(4).hex()}"
            write(str(tmp))
            os.replace(tmp, outbox / sha)

    def publish_outbox(self, outbox: Path) -> int:
        """Publish what a rank left in ``outbox`` (see OUTBOX_ENV) into this store: each plain file whose content
        has the sha256 it is named by (a symlink, a folder, a misnamed or changed file is skipped: the reference
        the rank returned then names nothing, and reading it fails as a missing output would). Only once no
        process of the gang can change the files any more. Returns how many were published."""
        published = 0
        if not outbox.is_dir():
            return 0
        for item in sorted(outbox.iterdir()):
            if len(item.name) != 64 or not set(item.name) <= _SHA:
                continue
            try:
                fd = os.open(item, os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                continue
            with os.fdopen(fd, "rb") as handle:
                if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                    continue
                digest = hashlib.sha256()
                while chunk := handle.read(_CHUNK):
                    digest.update(chunk)
                if digest.hexdigest() != item.name:
                    continue
                target = self._cas_path(item.name)
                if not self.fs.exists(target):  # streamed from the very file just verified (no rename race)
                    source = f"/proc/self/fd/{handle.fileno()}"
                    self._publish(target, lambda tmp, source=source: self.fs.put_file(source, tmp))  # type: ignore[misc]
                published += 1
        return published

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
        again when the cached copy is no longer what the reference's sha256 names). Safe for any number of
        processes fetching at once (engine.artifacts.node_cache). Raises ValueError (never retried) for a
        reference outside this store, OSError when the content cannot be delivered."""
        if not art.uri or not art.sha256:
            raise ValueError(f"{art!r} is not an uploaded reference")
        self.check_reference(art.uri, art.sha256)
        target = self.cache_path("artifacts", art.sha256, art.name)
        directory = isinstance(art, Directory)
        if self._trusted(target, art.sha256, directory):  # the common case: no lock, no write
            return str(target)
        folder = target.parent  # the object's folder: one lock for every name its content is fetched under
        secure_dirs(folder, cache_dir())
        with object_lock(folder):
            if self._trusted(target, art.sha256, directory):  # another process fetched it while this one waited
                return str(target)
            sweep(target)  # what a writer killed mid-way left
            discard(target)  # there, but not what the sha256 names
            staged = temp_path(target)
            try:
                if directory:
                    if art.size is not None and art.size > _archive_cap():
                        raise ArchiveRefused(f"directory {art.uri} is {art.size} bytes: over the extraction cap")
                    extract_tar(self._archive(art.uri, art.sha256), staged, f"directory {art.uri}")
                else:
                    self._download(art.uri, art.sha256, staged)
                publish(staged, target)
            finally:
                if os.path.lexists(staged):
                    discard(staged)
            if not self._trusted(target, art.sha256, directory):
                raise OSError(f"artifact {art.uri}: the copy just fetched to {target} does not verify")
        return str(target)

    @staticmethod
    def _download(uri: str, sha: str, dest: Path) -> None:
        fs, path = fsspec.core.url_to_fs(uri)
        fs.get_file(path, str(dest))
        got, _ = _sha256_file(str(dest))
        if got != sha:
            raise OSError(f"artifact {uri} is corrupt: sha256 {got} != {sha}")

    def _archive(self, uri: str, sha: str) -> Path:
        """The cached copy of a directory's archive (verified, or downloaded again): what its extracted folder is
        checked against. Under the object's lock."""
        archive = _archive_path(self.cache_path("artifacts", sha))
        if archive.is_file() and not archive.is_symlink() and _sha256_file(str(archive))[0] == sha:
            return archive
        sweep(archive)
        discard(archive)
        staged = temp_path(archive)
        try:
            self._download(uri, sha, staged)
            publish(staged, archive)
        finally:
            staged.unlink(missing_ok=True)
        return archive

    def _trusted(self, target: Path, sha: str, directory: bool) -> bool:
        """``target`` holds what ``sha`` names: verified by digest on first use in this process (a file re-hashed,
        a folder compared with its archive, itself re-hashed), then by its files' inodes and times."""
        if not os.path.lexists(target):
            return False
        files = _tree(target) if directory else []
        if _VERIFIED.still(target, files):
            return True
        _VERIFIED.forget(target)
        try:
            if directory:
                if not stat.S_ISDIR(os.lstat(target).st_mode):
                    return False
                archive = _archive_path(self.cache_path("artifacts", sha))
                if not archive.is_file() or archive.is_symlink() or _sha256_file(str(archive))[0] != sha:
                    return False
                checked = tree_matches(target, tar_digests(archive, str(archive)), extras=False)
                if checked is None:
                    return False
            elif not stat.S_ISREG(os.lstat(target).st_mode) or _sha256_file(str(target))[0] != sha:
                return False
        except (OSError, ArchiveRefused):
            return False
        _VERIFIED.record(target, files)
        return True

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
