"""Loading user code by reference: content-addressed bundles, cached by hash, or importable modules.

Each bundle is extracted once into the local cache of the store it was read from (``stores/<key>/bundles/<sha>``,
see :func:`engine.artifacts.store.cache_path`: one cache per tenant) and imported under a private package name
(``_gangflow_bundle_<sha16>``), so two versions of the same project (a run started before an edit and one started
after) live side by side in one worker process, each run using its own. A bundle sha names the same content
whatever the store, so a process imports it once; the files on disk (a rank's working folder, the configs a task
reads next to its module) are each store's own.

What is taken from the cache is checked against the sha256 the run's reference names, never against anything
kept beside the files. The bundle's zip is cached too (``bundles/<sha>.zip``, beside the folder); the first use of
a cached folder in a process re-hashes the zip (it must have the reference's sha256) and every file the zip lists
(each must hold that member's content), and a folder that does not match (a file changed or removed, a tenant's
planted code, an earlier process killed mid-way) is extracted again from the store, under the object's lock
(engine.artifacts.node_cache: safe for concurrent processes, root-owned and read-only to ranks where the agent is
root). Later uses in the same process compare the zip's and the files' inodes, sizes and change times only.
Extraction refuses unsafe names, links and archives over the caps before it writes anything
(engine.artifacts.extract). Top-level names come from the zip's member list, modules are compiled from their
source, never from a ``__pycache__`` found in the folder, and only files the zip lists are imported in the
bundle's name (a file added to the folder later, a rank's output say, is refused by the finder).

How a bundle's modules find each other. A workflow file imports its siblings by absolute name
(``import helpers``, ``from lib import sub``), as it does when run as a script. Those names must resolve
*per bundle*: putting the bundle folder on ``sys.path`` would cache ``helpers`` once per process under
its plain name, and every later run would execute the first version it saw. A meta-path finder cannot
tell which bundle is importing (``import helpers`` looks the same from every bundle), but the importing
module's builtins can: every module loaded from a bundle gets a ``__builtins__`` dict of its own whose
``__import__`` rewrites absolute imports of that bundle's top-level names (``helpers`` →
``_gangflow_bundle_<sha16>.helpers``) and hands everything else to the normal import unchanged. The
finder below only swaps the loader of the bundle's source files for one that installs those builtins
before executing the module. (A process-wide ``builtins.__import__`` that looks at the importer's
globals would work too, but it would sit in the path of every import of every library in the worker;
per-module builtins leave all code that is not from a bundle untouched.) Hence:

- relative imports, ``from X import Y``, ``import pkg.sub [as s]`` and ``importlib.import_module`` of
  a full bundle name behave as usual, and every function defined in a bundle module keeps its bundle's
  ``__import__`` (CPython binds builtins when a function is created);
- third-party and standard-library modules never see the rewrite (their builtins are the normal ones),
  so a bundle's ``helpers.py`` shadows nothing outside its bundle (inside it, a bundle's module named
  like a standard one wins, as it does when the file runs as a script);
- nothing is added to ``sys.path``, and no bundle module enters ``sys.modules`` under its plain name;
- gangflow's own top-level packages (:data:`FRAMEWORK_PACKAGES`) are never taken from a bundle, even a
  bundle packed from a folder that holds a copy of them: user code must share the worker's engine.

Not covered: ``importlib.import_module("helpers")`` called *by user code* (it bypasses ``__import__``);
``importlib.import_module(".helpers", __package__)`` works. The builtins dict is a copy taken when the
bundle is first loaded, so a builtin replaced later in ``builtins`` is not seen by bundle code (gangflow
itself does not replace builtins).

Thread-safe: tasks load code from several threads at once; registering a bundle is serialized by a
lock, and the import system's per-module locks serialize the imports themselves.
"""

from __future__ import annotations

import builtins
import functools
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import os
import re
import sys
import threading
import types
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec

from engine.artifacts.extract import ArchiveRefused, extract_zip, tree_matches, zip_digests
from engine.artifacts.node_cache import Verified, discard, object_lock, publish, secure_dirs, sweep, temp_path
from engine.artifacts.store import ArtifactStore, cache_dir
from engine.core.definitions import TaskDefinition, WorkflowDefinition, definition_of, source_file
from engine.core.wire import CodeRef
from engine.errors import GangflowError

__all__ = [
    "BUNDLE_PREFIX",
    "FRAMEWORK_PACKAGES",
    "LOADER",
    "CodeLoader",
    "CodeNotFoundError",
    "install_bundle",
]

BUNDLE_PREFIX = "_gangflow_bundle_"
_SHA256 = re.compile(r"[0-9a-f]{64}")
#: top-level names a bundle never provides: they are the worker's own gangflow
FRAMEWORK_PACKAGES = frozenset({"engine", "workflows", "plugins"})


class CodeNotFoundError(GangflowError, LookupError):
    """The code a run names cannot be loaded (a bad reference, a bundle that does not match, an import
    that fails, an object that is no @task or @workflow). Never retried."""

    kind = "CodeNotFound"


class _BundleImport:
    """The ``__import__`` of one bundle's modules (see the module docstring)."""

    __slots__ = ("names", "package")

    def __init__(self, package: str, names: frozenset[str]) -> None:
        self.package, self.names = package, names

    def __call__(
        self,
        name: str,
        globals: Mapping[str, object] | None = None,  # the names of builtins.__import__'s parameters
        locals: Mapping[str, object] | None = None,
        fromlist: Sequence[str] = (),  # None for a plain ``import x``
        level: int = 0,
    ) -> types.ModuleType:
        head = name.partition(".")[0]
        if level == 0 and head in self.names:
            module = builtins.__import__(f"{self.package}.{name}", globals, locals, fromlist, 0)
            # ``import helpers`` / ``import lib.sub`` bind the top-level name: return the bundle's module
            # of that name, not the bundle package that the rewritten import would return.
            return module if fromlist else sys.modules[f"{self.package}.{head}"]
        return builtins.__import__(name, globals, locals, fromlist, level)


@dataclass(frozen=True)
class _Bundle:
    package: str
    uri: str
    sha: str
    folder: Path
    builtins: dict[str, Any] = field(repr=False)
    #: the files the bundle's zip lists (relative POSIX names): the only ones imported in its name
    files: frozenset[str] = frozenset()


def _top_level_names(files: Mapping[str, str]) -> frozenset[str]:
    """What ``import X`` may mean inside the bundle: its top-level modules and packages (a folder with an
    ``__init__.py`` or with modules of its own: a namespace package), from the manifest's file list."""
    names = set()
    for rel in files:
        parts = rel.split("/")
        if len(parts) == 1 and parts[0].endswith(".py"):
            names.add(parts[0][:-3])
        elif len(parts) == 2 and parts[1].endswith(".py"):
            names.add(parts[0])
    return frozenset(n for n in names if n.isidentifier()) - FRAMEWORK_PACKAGES


def _zip_path(folder: Path) -> Path:
    """Where a bundle's zip is cached: ``bundles/<sha>.zip`` beside its extracted folder ``bundles/<sha>``."""
    return folder.with_name(f"{folder.name}.zip")


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _unpack(uri: str, sha: str, data: bytes, target: Path) -> Path:
    """Check ``data`` (read from ``uri``) against ``sha`` and publish it at ``target`` (its zip beside it), under
    the object's lock (the caller holds it). A copy already there is replaced: the caller found it damaged."""
    if hashlib.sha256(data).hexdigest() != sha:
        raise CodeNotFoundError(f"code bundle {uri} does not match its sha256 {sha}")
    archive = _zip_path(target)
    for path in (target, archive):
        sweep(path)  # what a process killed mid-way left
        discard(path)
    staged_zip, staged = temp_path(archive), temp_path(target)
    try:
        staged_zip.write_bytes(data)
        try:
            extract_zip(staged_zip, staged, f"code bundle {uri}")
        except (ArchiveRefused, zipfile.BadZipFile) as exc:
            raise CodeNotFoundError(f"code bundle {uri} is refused: {exc}") from exc
        publish(staged, target)
        publish(staged_zip, archive)
    finally:
        for path in (staged, staged_zip):
            if os.path.lexists(path):
                discard(path)
    return target


def _store_named_by(uri: str, sha: str) -> ArtifactStore:
    """The store a bundle reference points into (``<root>/cas/...``), for a caller that has none (the content is
    still checked against ``sha``)."""
    root, cas, _ = uri.rpartition("/cas/")
    if not (root and cas):
        raise CodeNotFoundError(f"code bundle {uri} (sha256 {sha}) is not in an artifact store (no /cas/ folder)")
    return _store(root)


@functools.lru_cache(maxsize=64)
def _store(root: str) -> ArtifactStore:
    return ArtifactStore(root)


def _bundle_store(uri: str, sha: str, store: ArtifactStore | None) -> ArtifactStore:
    """The store whose cache holds the bundle: ``store`` (the run's, which the reference must point into),
    else the one the reference names. CodeNotFoundError (never retried) for a bad reference."""
    if not _SHA256.fullmatch(sha):
        raise CodeNotFoundError(f"code bundle {uri}: its sha256 {sha!r} is not 64 hex digits")
    if store is None:
        return _store_named_by(uri, sha)
    try:
        store.check_reference(uri, sha)
    except ValueError as exc:
        raise CodeNotFoundError(f"code bundle: {exc}") from exc
    return store


def install_bundle(uri: str, data: bytes) -> Path:
    """Put a bundle's zip where the loader finds it extracted for a reference ``uri`` (the cache of the store
    ``uri`` points into): for replaying recorded runs whose store is gone. Returns the folder."""
    sha = hashlib.sha256(data).hexdigest()
    target = _bundle_store(uri, sha, None).cache_path("bundles", sha)
    secure_dirs(target.parent, cache_dir())
    with object_lock(target):
        return _unpack(uri, sha, data, target)


def _package(bundle: _Bundle) -> types.ModuleType:
    """The bundle's private top-level package: a namespace over the extracted folder."""
    package = types.ModuleType(bundle.package)
    package.__path__ = [str(bundle.folder)]
    package.__package__ = bundle.package
    spec = importlib.machinery.ModuleSpec(bundle.package, None, origin=str(bundle.folder), is_package=True)
    spec.submodule_search_locations = [str(bundle.folder)]
    package.__spec__ = spec
    return package


class _BundleSourceLoader(importlib.machinery.SourceFileLoader):
    """Executes a bundle's source file with the bundle's builtins."""

    def __init__(self, fullname: str, path: str, namespace: dict[str, Any]) -> None:
        super().__init__(fullname, path)
        self._builtins = namespace

    def exec_module(self, module: types.ModuleType) -> None:
        module.__dict__["__builtins__"] = self._builtins
        super().exec_module(module)

    def get_code(self, fullname: str) -> types.CodeType:
        # From the checked source, never from a ``__pycache__`` in the folder (its files are not in the manifest).
        return self.source_to_code(self.get_data(self.path), self.path)


class _BundleFinder(importlib.abc.MetaPathFinder):
    """Finds the modules of registered bundles (``_gangflow_bundle_<sha16>.<name>``) the way the path
    finder does, with a loader that gives them their bundle's builtins."""

    def __init__(self, bundles: Mapping[str, _Bundle]) -> None:
        self._bundles = bundles

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        package, dot, _ = fullname.partition(".")
        bundle = self._bundles.get(package) if dot else None
        if bundle is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.has_location and spec.origin:
            # the folder may hold files the zip does not (a rank's output, or a planted module): never run them
            try:
                rel = Path(spec.origin).relative_to(bundle.folder).as_posix()
            except ValueError:
                rel = ""
            if rel not in bundle.files:
                raise ModuleNotFoundError(f"{fullname}: {spec.origin} is not a file of the code bundle", name=fullname)
        if spec is not None and type(spec.loader) is importlib.machinery.SourceFileLoader and spec.origin:
            spec.loader = _BundleSourceLoader(fullname, spec.origin, bundle.builtins)
        return spec


# Imports are process-wide, so the bundle registry is too (shared by every CodeLoader).
_lock = threading.RLock()
_bundles: dict[str, _Bundle] = {}
_finder = _BundleFinder(_bundles)


class CodeLoader:
    """Process-wide (imports are process-wide): resolves CodeRefs and builds them for definitions.

    ``store``, where a caller passes it, is the run's artifact store: the bundle reference must point into it
    (else CodeNotFoundError) and the bundle is extracted into its cache. Without one, the store the reference
    names is used.
    """

    def __init__(self) -> None:
        #: what this process verified by digest (keyed by each bundle's cached zip), and each folder's file list
        self._verified = Verified()
        self._files: dict[Path, dict[str, str]] = {}

    def _intact(self, folder: Path, sha: str) -> dict[str, str] | None:
        """The files (name -> sha256) of a cached folder that holds what its zip lists, the zip having ``sha``;
        else None. Verified by digest on first use in this process, then by inodes and times."""
        archive = _zip_path(folder)
        known = self._files.get(folder)
        if known is not None and self._verified.still(archive, [folder / rel for rel in known]):
            return known
        self._verified.forget(archive)
        try:
            if folder.is_symlink() or not folder.is_dir() or archive.is_symlink() or _sha256_of(archive) != sha:
                return None
            files = zip_digests(archive, str(archive))
            checked = tree_matches(folder, files, extras=True)
        except (OSError, ArchiveRefused, zipfile.BadZipFile):
            return None
        if checked is None:
            return None
        self._files[folder] = files
        self._verified.record(archive, checked)
        return files

    def _extract(self, uri: str, sha: str, store: ArtifactStore) -> tuple[Path, dict[str, str]]:
        """The store's extracted copy of the bundle, verified, and its files; fetched and extracted again when
        missing or not what ``sha`` names."""
        target = store.cache_path("bundles", sha)
        with _lock:
            files = self._intact(target, sha)  # the common case: no lock, no write
            if files is not None:
                return target, files
            secure_dirs(target.parent, cache_dir())
            with object_lock(target):
                files = self._intact(target, sha)  # another process extracted it while this one waited
                if files is None:
                    with fsspec.open(uri, "rb") as handle:
                        data: bytes = handle.read()
                    _unpack(uri, sha, data, target)
                    files = self._intact(target, sha)
                if files is None:
                    raise CodeNotFoundError(f"code bundle {uri}: its copy just extracted to {target} does not verify")
            return target, files

    def _bundle_for(self, uri: str, sha: str, store: ArtifactStore | None = None) -> _Bundle:
        source = _bundle_store(uri, sha, store)  # checked on every call: the fast path below trusts the process
        name = BUNDLE_PREFIX + sha[:16]
        bundle = _bundles.get(name)
        if bundle is not None and name in sys.modules:
            return bundle
        with _lock:
            bundle = _bundles.get(name)
            if bundle is None:
                folder, files = self._extract(uri, sha, source)
                namespace = dict(vars(builtins))
                namespace["__import__"] = _BundleImport(name, _top_level_names(files))
                bundle = _Bundle(name, uri, sha, folder, namespace, frozenset(files))
                _bundles[name] = bundle
            # Before the path finder, which would load the bundle's modules with the normal builtins.
            if _finder not in sys.meta_path:
                sys.meta_path.insert(0, _finder)
            # Published last: another thread imports the bundle's modules as soon as the package is there.
            if name not in sys.modules:
                sys.modules[name] = _package(bundle)
        return bundle

    def import_module(self, ref: CodeRef, store: ArtifactStore | None = None) -> types.ModuleType:
        if ref.bundle and ref.bundle_sha:
            package = self._bundle_for(ref.bundle, ref.bundle_sha, store).package
            return importlib.import_module(f"{package}.{ref.module}")
        return importlib.import_module(ref.module)

    def folder_for(self, ref: CodeRef, store: ArtifactStore | None = None) -> Path | None:
        """Where the bundle's files are, in the store's own cache (checked; None for code that is not from a
        bundle). Not necessarily the folder this process imported the bundle from: that is the first store's."""
        if not (ref.bundle and ref.bundle_sha):
            return None
        self._bundle_for(ref.bundle, ref.bundle_sha, store)
        return self._extract(ref.bundle, ref.bundle_sha, _bundle_store(ref.bundle, ref.bundle_sha, store))[0]

    def load(self, ref: CodeRef, store: ArtifactStore | None = None) -> TaskDefinition | WorkflowDefinition:
        try:
            obj: object = self.import_module(ref, store)
        except ImportError as exc:
            raise CodeNotFoundError(f"cannot import {ref.module!r}: {exc}") from exc
        for part in ref.qualname.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                raise CodeNotFoundError(f"{ref.module}.{ref.qualname} not found")
        defn = definition_of(obj)
        if defn is None:
            raise CodeNotFoundError(f"{ref.module}.{ref.qualname} is not a @task or @workflow")
        return defn

    def ref_for(self, defn: TaskDefinition | WorkflowDefinition, store: ArtifactStore | None = None) -> CodeRef:
        """A reference to a definition's code; with ``store``, its bundle reference points into that store (a
        process that imported the bundle for another store's run would otherwise name that store's copy)."""
        module = defn.module
        if module.startswith(BUNDLE_PREFIX):
            package, _, inner = module.partition(".")
            bundle = _bundles[package]
            uri = store.object_uri(bundle.sha) if store is not None else bundle.uri
            return CodeRef(inner, defn.qualname, uri, bundle.sha)
        # A module imported by its plain name from inside an extracted bundle (a rank process runs with
        # the bundle folder as its working directory) still belongs to that bundle.
        origin = source_file(defn)
        if origin:
            for bundle in list(_bundles.values()):
                if Path(origin).is_relative_to(bundle.folder):
                    uri = store.object_uri(bundle.sha) if store is not None else bundle.uri
                    return CodeRef(module, defn.qualname, uri, bundle.sha)
        return CodeRef(module, defn.qualname)


LOADER = CodeLoader()
