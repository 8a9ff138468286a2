"""The Temporal adapter: worker assembly, the task activity, code loading, the embedded dev server."""

from engine.artifacts.loader import LOADER, CodeLoader
from engine.executor.ports import free_port
from engine.runtime.connection import TASK_QUEUE, Endpoint, connect, ensure_search_attributes
from engine.runtime.devserver import DevServer, find_temporal_binary
from engine.runtime.worker import build_worker, preload

__all__ = [
    "LOADER",
    "TASK_QUEUE",
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
