"""Loading user code by reference: content-addressed bundles, cached by hash, or importable modules.

Each bundle is extracted once under the cache (``bundles/<sha>``) and imported under a private package
name (``_gangflow_bundle_<sha16>``), so two versions of the same file (a run started before an edit and
one started after) live side by side in one worker process, each run using its own.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import os
import shutil
import sys
import tempfile
import threading
import types
import zipfile
from pathlib import Path

import fsspec

from engine.artifacts.store import cache_dir
from engine.core.definitions import TaskDefinition, WorkflowDefinition, definition_of
from engine.core.wire import CodeRef

__all__ = ["BUNDLE_PREFIX", "LOADER", "CodeLoader", "CodeNotFoundError"]

BUNDLE_PREFIX = "_gangflow_bundle_"


class CodeNotFoundError(LookupError):
    pass


class CodeLoader:
    """Process-wide (imports are process-wide): resolves CodeRefs and builds them for definitions."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._bundles: dict[str, tuple[str, str, Path]] = {}  # package name -> (uri, sha, folder)

    def _extract(self, uri: str, sha: str) -> Path:
        target = cache_dir() / "bundles" / sha
        if target.exists():
            return target
        with fsspec.open(uri, "rb") as handle:
            data = handle.read()
        if hashlib.sha256(data).hexdigest() != sha:
            raise CodeNotFoundError(f"code bundle {uri} does not match its sha256 {sha}")
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".partial-"))
        try:
            zipfile.ZipFile(io.BytesIO(data)).extractall(staging)
            try:
                os.replace(staging, target)
            except OSError:
                if not target.exists():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return target

    def _package_for(self, uri: str, sha: str) -> str:
        name = BUNDLE_PREFIX + sha[:16]
        with self._lock:
            if name not in sys.modules:
                folder = self._extract(uri, sha)
                package = types.ModuleType(name)
                package.__path__ = [str(folder)]
                package.__package__ = name
                sys.modules[name] = package
                self._bundles[name] = (uri, sha, folder)
                # Absolute imports between the bundle's own modules ("import helpers") resolve here.
                if str(folder) not in sys.path:
                    sys.path.append(str(folder))
        return name

    def import_module(self, ref: CodeRef) -> types.ModuleType:
        if ref.bundle and ref.bundle_sha:
            package = self._package_for(ref.bundle, ref.bundle_sha)
            return importlib.import_module(f"{package}.{ref.module}")
        return importlib.import_module(ref.module)

    def folder_for(self, ref: CodeRef) -> Path | None:
        """Where a bundle's files were extracted (None for code that is not from a bundle)."""
        if not (ref.bundle and ref.bundle_sha):
            return None
        return self._bundles[self._package_for(ref.bundle, ref.bundle_sha)][2]

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
            uri, sha, _ = self._bundles[package]
            return CodeRef(inner, defn.qualname, uri, sha)
        origin = getattr(sys.modules.get(module), "__file__", None)
        if origin:
            for uri, sha, folder in self._bundles.values():
                if Path(origin).is_relative_to(folder):
                    return CodeRef(module, defn.qualname, uri, sha)
        return CodeRef(module, defn.qualname)


LOADER = CodeLoader()
