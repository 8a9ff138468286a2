"""The task cache's entries in the artifact store: ``<root>/cache/<tenant>/<task>/<key>.json``.

An entry holds a successful call's encoded result (the msgpack of its wire form, base64), the run and task call
that produced it, when, and the File / Directory references the result contains. It lives in the run's artifact
store, so every worker and machine of the tenant sees it, and under the tenant's name, so two tenants that share
a root never read each other's entries. The artifacts themselves stay where they are (``cas/``): an entry only
refers to them, and :func:`lookup` checks each is still there with its sha256 before handing the entry out
(a cached result whose model file was deleted or damaged is a miss, never returned).

Writes are atomic (a reader sees a whole entry or none): ``engine.core.atomic`` on a local root, the store's own
publish (a temporary object moved into place) on a remote one.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from engine.artifacts.store import ArtifactStore
from engine.core.atomic import write_atomic

__all__ = [
    "CacheEntry",
    "artifact_refs",
    "clear",
    "entry_path",
    "list_entries",
    "lookup",
    "now_iso",
    "read_entry",
    "record",
]

_FORMAT = 1
_KEY = re.compile(r"^[0-9a-f]{64}$")
#: a tenant or task name as a path component: what their own checks allow, nothing that walks out of the folder
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class CacheEntry:
    task: str
    version: str
    key: str
    run_id: str
    call: str
    created: str  # ISO 8601, UTC
    result: bytes  # the msgpack of the result's wire form
    artifacts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def size(self) -> int:
        """Bytes the entry stands for: its encoded result and the artifacts it refers to."""
        return len(self.result) + sum(int(a.get("size") or 0) for a in self.artifacts)

    def to_json(self) -> bytes:
        data = {
            "format": _FORMAT,
            "task": self.task,
            "version": self.version,
            "key": self.key,
            "run_id": self.run_id,
            "call": self.call,
            "created": self.created,
            "result": base64.b64encode(self.result).decode(),
            "artifacts": self.artifacts,
        }
        return json.dumps(data, sort_keys=True).encode()

    @classmethod
    def from_json(cls, blob: bytes) -> CacheEntry:
        data = json.loads(blob)
        if data.get("format") != _FORMAT:
            raise ValueError(f"unknown cache entry format {data.get('format')!r}")
        return cls(
            task=str(data["task"]),
            version=str(data["version"]),
            key=str(data["key"]),
            run_id=str(data["run_id"]),
            call=str(data["call"]),
            created=str(data["created"]),
            result=base64.b64decode(data["result"]),
            artifacts=list(data.get("artifacts") or []),
        )

    def summary(self) -> dict[str, Any]:
        """What ``gangflow cache list`` shows (the result itself left out)."""
        return {
            "task": self.task,
            "version": self.version,
            "key": self.key,
            "run_id": self.run_id,
            "call": self.call,
            "created": self.created,
            "size": self.size,
            "artifacts": len(self.artifacts),
        }


def _checked(what: str, value: str, pattern: re.Pattern[str]) -> str:
    if not pattern.match(value):
        raise ValueError(f"refusing a cache {what} {value!r}: not a plain name")
    return value


def _base(store: ArtifactStore, tenant: str) -> str:
    return f"{store.root}/cache/{_checked('tenant', tenant, _NAME)}"


def entry_path(store: ArtifactStore, tenant: str, task: str, key: str) -> str:
    return f"{_base(store, tenant)}/{_checked('task', task, _NAME)}/{_checked('key', key, _KEY)}.json"


def artifact_refs(wire: Any) -> list[dict[str, Any]]:
    """The File / Directory references in a wire value, each once (by sha256), in the order found."""
    found: dict[str, dict[str, Any]] = {}

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if value.get("kind") in ("file", "dir") and isinstance(value.get("sha256"), str) and "uri" in value:
                found.setdefault(value["sha256"], dict(value))
                return
            for item in value.values():
                walk(item)
        elif isinstance(value, list | tuple):
            for item in value:
                walk(item)

    walk(wire)
    return list(found.values())


def record(store: ArtifactStore, tenant: str, entry: CacheEntry) -> None:
    """Write (or replace) an entry atomically."""
    target = entry_path(store, tenant, entry.task, entry.key)
    data = entry.to_json()
    if store.local:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(target, data)
    else:
        store._publish(target, lambda tmp: store.fs.pipe_file(tmp, data))


def read_entry(store: ArtifactStore, tenant: str, task: str, key: str) -> CacheEntry | None:
    """The entry as stored, unchecked; None when there is none (or it cannot be read: a miss, not an error)."""
    try:
        return CacheEntry.from_json(store.fs.cat_file(entry_path(store, tenant, task, key)))
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def _intact(store: ArtifactStore, ref: dict[str, Any]) -> bool:
    """The referenced object is in this store with its content. A local store rehashes it (a disk read) and removes
    a damaged object; a remote one compares its size only, so a hit does not download a model to check it (a
    damaged remote object is still caught when a task fetches it: the store checks the sha256 of what it
    downloads)."""
    try:
        sha = str(ref["sha256"])
        store.check_reference(str(ref["uri"]), sha)
        path = store._cas_path(sha)
        if not store.fs.exists(path):
            return False
        if not store.local:
            return ref.get("size") is None or int(store.fs.size(path)) == int(ref["size"])
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
        if digest.hexdigest() == sha:
            return True
        # damaged: remove it, or the recomputed task's upload would find an object there and keep the damage
        Path(path).unlink(missing_ok=True)
        return False
    except (OSError, ValueError, KeyError):
        return False


def lookup(store: ArtifactStore, tenant: str, task: str, key: str) -> CacheEntry | None:
    """The entry for ``key`` when there is one whose every artifact is intact; else None (a miss)."""
    entry = read_entry(store, tenant, task, key)
    if entry is None or entry.task != task or entry.key != key:
        return None
    return entry if all(_intact(store, ref) for ref in entry.artifacts) else None


def _entry_files(store: ArtifactStore, tenant: str, task: str | None) -> list[str]:
    pattern = f"{_base(store, tenant)}/{_checked('task', task, _NAME) if task else '*'}/*.json"
    return sorted(str(p) for p in store.fs.glob(pattern))


def list_entries(store: ArtifactStore, tenant: str, task: str | None = None) -> list[CacheEntry]:
    """The tenant's entries (of one task, when given), oldest first; unreadable files are left out."""
    entries = []
    for path in _entry_files(store, tenant, task):
        try:
            entries.append(CacheEntry.from_json(store.fs.cat_file(path)))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(entries, key=lambda e: (e.created, e.task, e.key))


def clear(store: ArtifactStore, tenant: str, task: str | None = None) -> int:
    """Remove the tenant's entries (of one task, when given); returns how many. The artifacts they refer to
    stay (another entry or run may share them)."""
    files = _entry_files(store, tenant, task)
    for path in files:
        store.fs.rm_file(path)
    return len(files)


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
