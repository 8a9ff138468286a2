"""Loading user code by reference: content-addressed bundles, cached by hash, or importable modules.

Each bundle is extracted once under the cache (``bundles/<sha>``) and imported under a private package
name (``_gangflow_bundle_<sha16>``), so two versions of the same project (a run started before an edit
and one started after) live side by side in one worker process, each run using its own.

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
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import io
import sys
import threading
import types
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec

from engine.artifacts.store import cache_dir
from engine.atomic import publishing
from engine.core.definitions import TaskDefinition, WorkflowDefinition, definition_of, source_file
from engine.core.wire import CodeRef

__all__ = ["BUNDLE_PREFIX", "FRAMEWORK_PACKAGES", "LOADER", "CodeLoader", "CodeNotFoundError"]

BUNDLE_PREFIX = "_gangflow_bundle_"
#: top-level names a bundle never provides: they are the worker's own gangflow
FRAMEWORK_PACKAGES = frozenset({"engine", "workflows", "plugins"})


class CodeNotFoundError(LookupError):
    pass


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


def _top_level_names(folder: Path) -> frozenset[str]:
    """What ``import X`` may mean inside the bundle: its top-level modules and packages (a folder with an
    ``__init__.py`` or with modules of its own: a namespace package)."""
    names = set()
    for entry in folder.iterdir():
        if entry.is_file() and entry.suffix == ".py" and entry.stem.isidentifier():
            names.add(entry.stem)
        elif entry.is_dir() and entry.name.isidentifier() and any(entry.glob("*.py")):
            names.add(entry.name)
    return frozenset(names - FRAMEWORK_PACKAGES)


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
    """Process-wide (imports are process-wide): resolves CodeRefs and builds them for definitions."""

    def _extract(self, uri: str, sha: str) -> Path:
        target = cache_dir() / "bundles" / sha
        if target.exists():
            return target
        with fsspec.open(uri, "rb") as handle:
            data = handle.read()
        if hashlib.sha256(data).hexdigest() != sha:
            raise CodeNotFoundError(f"code bundle {uri} does not match its sha256 {sha}")
        with publishing(target) as staging:  # a concurrent extraction may win the race: its copy is the same
            zipfile.ZipFile(io.BytesIO(data)).extractall(staging)
        return target

    def _bundle_for(self, uri: str, sha: str) -> _Bundle:
        name = BUNDLE_PREFIX + sha[:16]
        bundle = _bundles.get(name)
        if bundle is not None and name in sys.modules:
            return bundle
        with _lock:
            bundle = _bundles.get(name)
            if bundle is None:
                folder = self._extract(uri, sha)
                namespace = dict(vars(builtins))
                namespace["__import__"] = _BundleImport(name, _top_level_names(folder))
                bundle = _Bundle(name, uri, sha, folder, namespace)
                _bundles[name] = bundle
            # Before the path finder, which would load the bundle's modules with the normal builtins.
            if _finder not in sys.meta_path:
                sys.meta_path.insert(0, _finder)
            # Published last: another thread imports the bundle's modules as soon as the package is there.
            if name not in sys.modules:
                sys.modules[name] = _package(bundle)
        return bundle

    def import_module(self, ref: CodeRef) -> types.ModuleType:
        if ref.bundle and ref.bundle_sha:
            package = self._bundle_for(ref.bundle, ref.bundle_sha).package
            return importlib.import_module(f"{package}.{ref.module}")
        return importlib.import_module(ref.module)

    def folder_for(self, ref: CodeRef) -> Path | None:
        """Where a bundle's files were extracted (None for code that is not from a bundle)."""
        if not (ref.bundle and ref.bundle_sha):
            return None
        return self._bundle_for(ref.bundle, ref.bundle_sha).folder

    def load(self, ref: CodeRef) -> TaskDefinition | WorkflowDefinition:
        try:
            obj: object = self.import_module(ref)
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

    def ref_for(self, defn: TaskDefinition | WorkflowDefinition) -> CodeRef:
        module = defn.module
        if module.startswith(BUNDLE_PREFIX):
            package, _, inner = module.partition(".")
            bundle = _bundles[package]
            return CodeRef(inner, defn.qualname, bundle.uri, bundle.sha)
        # A module imported by its plain name from inside an extracted bundle (a rank process runs with
        # the bundle folder as its working directory) still belongs to that bundle.
        origin = source_file(defn)
        if origin:
            for bundle in list(_bundles.values()):
                if Path(origin).is_relative_to(bundle.folder):
                    return CodeRef(module, defn.qualname, bundle.uri, bundle.sha)
        return CodeRef(module, defn.qualname)


LOADER = CodeLoader()
