"""``engine.report(step=..., **metrics)``: a rank's one-line progress report.

Inside a rank of a distributed task it records the latest step and metrics in a small file the node
agent watches: the agent puts them into its heartbeat details (the Web UI and ``gangflow status`` show
them) and, when the task sets ``hang_timeout``, treats a rank that has stopped reporting as hung.
Writes are throttled (at most every ``_MIN_INTERVAL`` seconds, except the first), so calling it on
every step costs nothing measurable. Outside a rank it does nothing.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from engine.core.atomic import write_atomic

__all__ = ["report"]

_MIN_INTERVAL = 0.5
_last_write = 0.0


def report(step: int, *, force: bool = False, **metrics: Any) -> None:
    global _last_write
    path = os.environ.get("GANGFLOW_PROGRESS_FILE")
    if not path:
        return
    now = time.monotonic()
    if not force and _last_write and now - _last_write < _MIN_INTERVAL:
        return
    _last_write = now
    clean = {k: (v if isinstance(v, int | float | str | bool) or v is None else str(v)) for k, v in metrics.items()}
    line = json.dumps({"step": int(step), "time": time.time(), "pid": os.getpid(), **clean})
    # rewritten every half second and stale after a crash anyway: no fsync
    write_atomic(path, line.encode(), durable=False)
