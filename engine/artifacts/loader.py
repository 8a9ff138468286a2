"""Loading user code by reference: content-addressed bundles, cached by hash, or importable modules.

Each bundle is extracted once into the local cache of the store it was read from (``stores/<key>/bundles/<sha>``,
see :func:`engine.artifacts.store.cache_path`: one cache per tenant) and imported under a private package name
(``_gangflow_bundle_<sha16>``), so two versions of the same project (a run started before an edit and one started
after) live side by side in one worker process, each run using its own. A bundle sha names the same content
whatever the store, so a process imports it once; the files on disk (a rank's working folder, the configs a task
reads next to its module) are each store's own.

What is taken from the cache is checked. Extraction writes a manifest (:data:`MANIFEST`, hidden, so never a
bundle's own file) of every extracted file's sha256 into the folder before it is published; the first use of a
cached folder in a process re-hashes those files, and a folder whose files were changed, removed or whose manifest
is missing is extracted again from the store (a task writing into its working folder, or an earlier process killed
mid-way). Later uses in the same process compare the files' sizes and change times only. Top-level names come
from the manifest and modules are compiled from their source, never from a ``__pycache__`` found in the folder, so
a file added to the folder later is never imported in the bundle's name.

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
import io
import json
import os
import re
import shutil
import sys
import threading
import types
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec

from engine.artifacts.bundle import EXECUTABLE
from engine.artifacts.store import ArtifactStore
from engine.core.atomic import publishing
from engine.core.definitions import TaskDefinition, WorkflowDefinition, definition_of, source_file
from engine.core.wire import CodeRef
from engine.errors import GangflowError

__all__ = [
    "BUNDLE_PREFIX",
    "FRAMEWORK_PACKAGES",
    "LOADER",
    "MANIFEST",
    "CodeLoader",
    "CodeNotFoundError",
    "install_bundle",
]

BUNDLE_PREFIX = "_gangflow_bundle_"
#: the file in an extracted bundle's folder listing each extracted file's sha256
MANIFEST = ".gangflow-manifest.json"
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


def _hash_files(folder: Path) -> dict[str, str]:
    """Each regular file under ``folder`` (relative POSIX path) and its sha256, the manifest left out."""
    files = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_file() and not path.is_symlink() and rel != MANIFEST:
            files[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return files


def _read_manifest(folder: Path, sha: str) -> dict[str, str] | None:
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("sha256") != sha or not isinstance(manifest.get("files"), dict):
        return None
    return {str(k): str(v) for k, v in manifest["files"].items()}


def _stat_files(folder: Path, files: Mapping[str, str]) -> list[tuple[int, int]] | None:
    """The size and change time of each listed file (None when one is gone): a rewrite changes the ctime."""
    out = []
    for rel in files:
        try:
            info = os.lstat(folder / rel)
        except OSError:
            return None
        out.append((info.st_size, info.st_ctime_ns))
    return out


def _unpack(uri: str, sha: str, data: bytes, target: Path) -> Path:
    """Check ``data`` (read from ``uri``) against ``sha`` and extract it to ``target`` with its manifest,
    atomically."""
    if hashlib.sha256(data).hexdigest() != sha:
        raise CodeNotFoundError(f"code bundle {uri} does not match its sha256 {sha}")
    with publishing(target) as staging:  # a concurrent extraction may win the race: its copy is the same
        archive = zipfile.ZipFile(io.BytesIO(data))
        archive.extractall(staging)
        for info in archive.infolist():  # zipfile drops file modes: give an executable back its exec bit
            if (info.external_attr >> 16) & 0o111:
                (staging / info.filename).chmod(EXECUTABLE)
        manifest = {"sha256": sha, "files": _hash_files(staging)}
        (staging / MANIFEST).write_text(json.dumps(manifest, sort_keys=True))
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
    if target.exists():
        shutil.rmtree(target)
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
        #: folders checked in this process, with their files' stats then (see the module docstring)
        self._checked: dict[Path, list[tuple[int, int]]] = {}

    def _intact(self, folder: Path, sha: str) -> dict[str, str] | None:
        """The manifest of a cached folder whose files are as extracted, else None."""
        files = _read_manifest(folder, sha)
        if files is None:
            return None
        stats = _stat_files(folder, files)
        if stats is not None and self._checked.get(folder) == stats:
            return files
        current = {rel: digest for rel, digest in _hash_files(folder).items() if rel in files}
        if current != files:
            return None
        self._checked[folder] = _stat_files(folder, files) or []
        return files

    def _extract(self, uri: str, sha: str, store: ArtifactStore) -> tuple[Path, dict[str, str]]:
        """The store's extracted copy of the bundle, checked, and its manifest; fetched and extracted again
        when missing or changed."""
        target = store.cache_path("bundles", sha)
        with _lock:
            data: bytes | None = None
            for _ in range(3):  # another process may replace a changed copy at the same time as this one
                if target.exists():
                    files = self._intact(target, sha)
                    if files is not None:
                        return target, files
                    shutil.rmtree(target, ignore_errors=True)  # changed since it was extracted: extract it again
                if data is None:
                    with fsspec.open(uri, "rb") as handle:
                        data = handle.read()
                _unpack(uri, sha, data, target)
            raise CodeNotFoundError(f"code bundle {uri} keeps changing while it is extracted to {target}")

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
                bundle = _Bundle(name, uri, sha, folder, namespace)
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
