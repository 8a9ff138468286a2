"""Time, randomness, ids and timers a workflow body may use: ``engine.now()``, ``engine.random()``,
``engine.uuid4()``, ``engine.sleep()``.

A workflow body is replayed from history after a worker restart, so it must compute the same values
every time. These functions answer through the current dispatcher: inside a run on Temporal they come
from the run's history (``workflow.now()``, a generator seeded per run, a durable timer), so a replay
sees exactly what the first execution saw; under ``engine.run_local`` and in plain Python they use the
real clock and the standard library. Task bodies are not replayed and may use anything.
"""

from __future__ import annotations

import math
import random as stdlib_random
import uuid as stdlib_uuid
from datetime import datetime, timedelta

from engine.core.dispatch import Dispatcher, RealClock, current_dispatcher
from engine.errors import InputError

__all__ = ["now", "random", "sleep", "uuid4"]

_REAL_CLOCK = RealClock()


def _clock() -> Dispatcher | RealClock:
    """The current dispatcher, or the real clock outside any (plain Python, a task body)."""
    dispatcher = current_dispatcher()
    return dispatcher if dispatcher is not None else _REAL_CLOCK


def now() -> datetime:
    """The current time as a timezone-aware UTC datetime (in a workflow: the time of the workflow task
    being processed, the same on every replay)."""
    return _clock().now()


def random() -> stdlib_random.Random:
    """A ``random.Random``: in a workflow, one seeded per run so it yields the same numbers on replay
    (keep it, or call ``engine.random()`` again: it is the same generator); elsewhere the standard
    library's own generator (what ``random.random()`` uses)."""
    return _clock().random()


def uuid4() -> stdlib_uuid.UUID:
    """A random UUID (version 4), the same on every replay when called in a workflow."""
    return _clock().uuid4()


def _seconds(duration: object) -> float:
    if isinstance(duration, timedelta):
        seconds = duration.total_seconds()
    elif isinstance(duration, int | float) and not isinstance(duration, bool):
        seconds = float(duration)
    else:
        raise InputError(f"engine.sleep() takes seconds (a number) or a timedelta, got {duration!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise InputError(f"engine.sleep() needs a finite duration >= 0, got {duration!r}")
    return seconds


async def sleep(duration: float | timedelta) -> None:
    """Wait ``duration`` (seconds or a timedelta). In a workflow this is a durable timer: the run may
    sleep for days, through worker restarts, and costs nothing while it waits."""
    await _clock().sleep(_seconds(duration))
