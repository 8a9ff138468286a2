"""The Temporal adapter: worker assembly, the task activity, code loading, the embedded dev server.

The facade is lazy: ``import engine.runtime`` (or a submodule such as ``engine.runtime.connection``, which
the client uses) must not build worker machinery, so it loads neither ``temporalio.worker`` nor the
workflows; each name below is imported on first use. Shared constants are not here but in
``engine.core.protocol``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.artifacts.loader import LOADER, CodeLoader
    from engine.executor.ports import free_port
    from engine.runtime.connection import Endpoint, connect, ensure_search_attributes
    from engine.runtime.devserver import DevServer, find_temporal_binary
    from engine.runtime.worker import build_worker, preload

__all__ = [
    "LOADER",
    "CodeLoader",
    "DevServer",
    "Endpoint",
    "build_worker",
    "connect",
    "ensure_search_attributes",
    "find_temporal_binary",
    "free_port",
    "preload",
]

_HOMES = {
    "LOADER": "engine.artifacts.loader",
    "CodeLoader": "engine.artifacts.loader",
    "free_port": "engine.executor.ports",
    "Endpoint": "engine.runtime.connection",
    "connect": "engine.runtime.connection",
    "ensure_search_attributes": "engine.runtime.connection",
    "DevServer": "engine.runtime.devserver",
    "find_temporal_binary": "engine.runtime.devserver",
    "build_worker": "engine.runtime.worker",
    "preload": "engine.runtime.worker",
}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'engine.runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next lookup is a plain module attribute
    return value
