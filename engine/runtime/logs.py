"""Per-task capture of stdout / stderr in a worker process that runs many tasks at once.

``sys.stdout`` and ``sys.stderr`` are replaced once by streams that route each write to the log file of
the task whose thread wrote it (a context variable, copied into the thread that runs the task body),
and to the worker's own output as well. Anything written outside a task goes to the worker's output.
"""

from __future__ import annotations

import contextvars
import io
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol, TextIO

__all__ = ["LogSink", "capture", "install"]


class LogSink(Protocol):
    """Where one task's output goes: an open text file, or anything that writes like one."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


_current: contextvars.ContextVar[LogSink | None] = contextvars.ContextVar("gangflow_task_log", default=None)
_installed = threading.Lock()


class _RoutingStream(io.TextIOBase):
    def __init__(self, underlying: TextIO) -> None:
        self.underlying = underlying

    def write(self, text: str) -> int:
        target = _current.get()
        if target is not None:
            try:
                target.write(text)
                target.flush()
            except ValueError:  # the task finished and closed its log; keep the worker's copy
                pass
        return self.underlying.write(text)

    def flush(self) -> None:
        self.underlying.flush()

    def fileno(self) -> int:
        return self.underlying.fileno()

    def isatty(self) -> bool:
        return self.underlying.isatty()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.underlying, name)


def install() -> None:
    """Route stdout/stderr through the task-aware streams (idempotent)."""
    with _installed:
        if not isinstance(sys.stdout, _RoutingStream):
            sys.stdout = _RoutingStream(sys.stdout)
        if not isinstance(sys.stderr, _RoutingStream):
            sys.stderr = _RoutingStream(sys.stderr)


@contextmanager
def capture(handle: LogSink | None) -> Iterator[None]:
    """Within this block (and threads started from it with a copied context) output goes to ``handle``."""
    token = _current.set(handle)
    try:
        yield
    finally:
        _current.reset(token)
