"""``engine.report(step=..., **metrics)``: a rank's one-line progress report.

Inside a rank of a distributed task it records the latest step and metrics in a small file the node
agent watches: the agent puts them into its heartbeat details (the Web UI and ``gangflow status`` show
them) and, when the task sets ``hang_timeout``, treats a rank that has stopped reporting as hung.
Writes are throttled (at most one every ``_MIN_INTERVAL`` seconds: fifty small writes a second at most), so
calling it on every step costs nothing measurable. A report the throttle holds back is not lost: a writer
thread writes the newest one when the interval ends, and :func:`flush` writes it at once (at interpreter
exit, and for a runner that leaves with ``os._exit``), so the last report, usually the final step, is the
one the file keeps and ``gangflow status`` shows. Each report also names the first step this rank reported
(``first_step``): where this attempt started, which ``gangflow status`` lists per attempt, and the seconds
this rank paused between reports so far (``idle_s``: engine.rank.pace, a few float operations per report).
Outside a rank it does nothing.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from typing import Any

from engine.core.atomic import write_atomic
from engine.rank.pace import Pace

__all__ = ["checkpointed", "flush", "report"]

#: short, so that a held-back final report is written before a rank that returns soon after it has exited
_MIN_INTERVAL = 0.02
_last_write = 0.0
#: the newest report the throttle held back: (path, step, metrics, time)
_pending: tuple[str, int, dict[str, Any], float] | None = None
_lock = threading.Lock()
_due = threading.Event()  # set while a report is held back: wakes the writer thread
_writer: threading.Thread | None = None
#: the first step reported into each progress file by this process (one rank's one attempt), and when
_first: dict[str, int] = {}
_since: dict[str, float] = {}
#: this process's checkpoints (``checkpointed``): the last one's step and time, and the seconds all of them
#: took: what the goodput ledger (engine.runtime.ledger) splits an attempt's GPU-seconds by
_checkpoints: dict[str, float] = {}
_last: tuple[int, dict[str, Any]] | None = None  # the latest report's step and metrics (``checkpointed``)
_paces: dict[str, Pace] = {}  # each progress file's step pace: its pauses between reports (``idle_s``)


def _write(path: str, step: int, metrics: dict[str, Any], when: float) -> None:
    """Write one report (the caller holds ``_lock``)."""
    global _last_write
    _last_write = time.monotonic()
    clean = {k: (v if isinstance(v, int | float | str | bool) or v is None else str(v)) for k, v in metrics.items()}
    fields = {"step": step, "time": when, "pid": os.getpid(), "first_step": _first[path], "since": _since[path]}
    fields["idle_s"] = round(_paces[path].idle_s, 3)
    line = json.dumps({**clean, **fields, **_checkpoints})
    # rewritten many times a second and stale after a crash anyway: no fsync
    write_atomic(path, line.encode(), durable=False)


def flush() -> None:
    """Write the report the throttle held back, if any (safe to call at any time, from any thread)."""
    global _pending
    with _lock:
        pending, _pending = _pending, None
        if pending is not None:
            _write(*pending)


def _write_held_back() -> None:
    while True:
        _due.wait()
        time.sleep(max(0.0, _MIN_INTERVAL - (time.monotonic() - _last_write)))
        _due.clear()  # before the flush: a report held back from now on sets it again
        flush()


def report(step: int, *, force: bool = False, **metrics: Any) -> None:
    global _pending, _writer, _last
    path = os.environ.get("GANGFLOW_PROGRESS_FILE")
    if not path:
        return
    _last = (int(step), metrics)
    now = time.monotonic()
    with _lock:
        _first.setdefault(path, int(step))
        _since.setdefault(path, time.time())
        _paces.setdefault(path, Pace()).step(int(step), now)
        if not force and _last_write and now - _last_write < _MIN_INTERVAL:
            _pending = (path, int(step), metrics, time.time())
            if _writer is None:
                _writer = threading.Thread(target=_write_held_back, name="gangflow-report", daemon=True)
                _writer.start()
            _due.set()
            return
        _pending = None  # this report is newer than the one held back
        _write(path, int(step), metrics, time.time())


def checkpointed(step: int, seconds: float) -> None:
    """A checkpoint of ``step`` was saved, taking ``seconds`` (``engine.checkpoint.save`` says so): the next
    report carries it (``ckpt_step``, ``ckpt_time``, ``ckpt_s`` in all), and the last report is written again
    with it at once, so a rank killed right after still shows its checkpoint."""
    pace = _paces.get(os.environ.get("GANGFLOW_PROGRESS_FILE") or "")
    with _lock:
        if pace is not None:
            pace.saved(seconds)  # not a pause: the ledger counts it as checkpoint
            _checkpoints["ckpt_idle_s"] = round(pace.idle_s, 3)  # the pauses before it: kept work's, not lost
        _checkpoints["ckpt_step"] = int(step)
        _checkpoints["ckpt_time"] = time.time()
        _checkpoints["ckpt_s"] = round(_checkpoints.get("ckpt_s", 0.0) + max(0.0, seconds), 6)
    report_again = _last
    if report_again is not None:
        report(report_again[0], force=True, **report_again[1])


atexit.register(flush)
