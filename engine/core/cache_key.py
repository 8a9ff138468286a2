"""The cache key of a task call: a pure function, so the workflow can compute it deterministically.

The key covers the task's name, its ``cache_version``, a hash of its typed interface (the names and types of its
inputs and of its output) and a canonical hash of the inputs in wire form. File and Directory references count by
their content sha256 only: the same content under another path or URI (another run's upload, a renamed file)
gives the same key. Dict keys are sorted, so neither the order of the keyword arguments nor that of a dict
input's keys matters.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Literal

from engine.core.interface import Interface
from engine.errors import InputError

__all__ = ["CACHE_MODES", "CacheMode", "cache_key", "canonical", "check_cache_mode", "interface_hash"]

#: ``use``: read the cache and write it on success; ``skip`` (``gangflow run --no-cache``): neither read nor
#: write; ``overwrite`` (``--overwrite-cache``): do not read, run, and replace the entry on success
CacheMode = Literal["use", "skip", "overwrite"]
CACHE_MODES: tuple[str, ...] = ("use", "skip", "overwrite")

#: bump when the key's recipe changes, so old entries are never read with a new meaning
_RECIPE = "gangflow-cache-1"
_ARTIFACT_KINDS = ("file", "dir")

#: id(interface) -> (interface, digest): an interface's hash is computed once per loaded task (the interface is
#: kept so its id is never reused by another object)
_INTERFACES: dict[int, tuple[Interface, str]] = {}


def check_cache_mode(mode: object) -> CacheMode:
    """A run's cache mode as given by a caller, refused (InputError) when it is not one of CACHE_MODES."""
    if mode not in CACHE_MODES:
        raise InputError(f"cache must be one of {', '.join(map(repr, CACHE_MODES))}, got {mode!r}")
    return mode  # type: ignore[return-value]


def _type_form(codec: Any) -> Any:
    """A type's structure where pydantic can describe it (a dataclass's fields and their types, not only its
    name), else its name (File, Directory and other custom types have no JSON schema)."""
    try:
        return codec.adapter.json_schema()
    except Exception:
        return codec.name


def interface_hash(interface: Interface) -> str:
    """sha256 of the interface's input names and types (in declaration order) and its output type."""
    known = _INTERFACES.get(id(interface))
    if known is not None and known[0] is interface:
        return known[1]
    form = {
        "inputs": [[p.name, _type_form(p.codec)] for p in interface.params],
        "output": _type_form(interface.output),
    }
    digest = hashlib.sha256(json.dumps(form, sort_keys=True, default=str).encode()).hexdigest()
    _INTERFACES[id(interface)] = (interface, digest)
    return digest


def canonical(value: Any) -> Any:
    """Wire data in a form whose JSON text depends only on its meaning: artifact references by content, dict
    items sorted by their canonical key, bytes tagged (so ``b"a"`` and ``"a"`` differ)."""
    if isinstance(value, Mapping):
        if value.get("kind") in _ARTIFACT_KINDS and isinstance(value.get("sha256"), str):
            return {"$artifact": [value["kind"], value["sha256"]]}
        items = [[canonical(k), canonical(v)] for k, v in value.items()]
        items.sort(key=lambda kv: json.dumps(kv[0], sort_keys=True))
        return {"$map": items}
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return {"$bytes": bytes(value).hex()}
    if isinstance(value, float) and value != value:  # NaN: JSON has no spelling of its own that is stable
        return {"$float": "nan"}
    return value


def cache_key(task: str, version: str, interface: Interface, wire_inputs: Mapping[str, Any]) -> str:
    """The 64-hex-digit cache key of a call of ``task`` with ``wire_inputs`` (its inputs as the call sends them,
    defaults filled in)."""
    form = [_RECIPE, task, version, interface_hash(interface), canonical(dict(wire_inputs))]
    text = json.dumps(form, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()
