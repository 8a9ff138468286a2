"""``engine.map``: one task over a list of items, results in input order (Flyte's ``map_task``).

The rule for items: a task with **one** parameter takes each item as that argument (``map(square, [1, 2])``);
a task with **several** takes each item as a dict of its arguments by name (``map(scale, [{"x": 1, "by": 2}])``,
defaults filled in as in a call). Every item is checked against the task's interface before anything runs, and
a wrong one raises :class:`~engine.InputError` naming its index.

A failed item (after its task's own retries) does not fail the map at once: every item runs, then if the share
that succeeded is below ``min_success_ratio`` the map raises :class:`MapFailedError` naming the failed items
and their errors (the first few); otherwise the failed slots are ``None`` (so with ``min_success_ratio < 1`` the
result type is effectively ``list[T | None]``).

Where the items run is the current dispatcher's business (``Dispatcher.map_task``): in-process dispatchers use
:func:`map_in_process` below; on Temporal, ``workflows/mapping.py`` runs them in chunks of child workflows.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from engine.core.definitions import TaskDefinition, definition_of
from engine.core.dispatch import DirectDispatcher, current_dispatcher
from engine.errors import GangflowError, InputError, TypeMismatchError

if TYPE_CHECKING:
    from engine.core.dispatch import Dispatcher

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "LISTED_FAILURES",
    "MapFailedError",
    "check_options",
    "item_inputs",
    "map",
    "map_in_process",
    "settle",
]

#: items per child workflow on Temporal: ~3 history events per item plus workflow tasks stays far below
#: Temporal's 10 K event warning (and 50 K limit), and small results stay well under the 2 MB payload limit
DEFAULT_CHUNK_SIZE = 1000
#: how many failed items a failure message spells out
LISTED_FAILURES = 5


class MapFailedError(GangflowError):
    """Fewer items of an ``engine.map`` succeeded than its ``min_success_ratio`` asks for."""

    kind = "MapFailed"


def _plain(task: Any) -> TaskDefinition:
    defn = definition_of(task)
    if not isinstance(defn, TaskDefinition):
        raise InputError(f"engine.map expects a @task, got {task!r}")
    if defn.gang is not None:
        raise InputError(f"engine.map takes plain tasks; task {defn.name!r} is distributed (plugin=)")
    if not defn.interface.params:
        raise InputError(f"engine.map: task {defn.name!r} takes no inputs, so there is nothing to map over")
    return defn


def check_options(task: TaskDefinition, concurrency: Any, min_success_ratio: Any, chunk_size: Any) -> None:
    where = f"engine.map({task.name})"
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise InputError(f"{where}: concurrency must be an int >= 1, got {concurrency!r}")
    ratio_ok = isinstance(min_success_ratio, int | float) and not isinstance(min_success_ratio, bool)
    if not ratio_ok or not 0.0 <= min_success_ratio <= 1.0:
        raise InputError(f"{where}: min_success_ratio must be a number from 0 to 1, got {min_success_ratio!r}")
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1):
        raise InputError(f"{where}: chunk_size must be an int >= 1, got {chunk_size!r}")


def item_inputs(task: TaskDefinition, items: Any) -> list[dict[str, Any]]:
    """Each item as the task's inputs by name, checked against its interface (InputError names the item)."""
    where = f"engine.map({task.name})"
    if not isinstance(items, list | tuple):
        raise InputError(f"{where}: items must be a list, got {type(items).__name__}")
    names = task.interface.names
    single = len(names) == 1
    out: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        if single:
            inputs = {names[0]: item}
        elif isinstance(item, dict):
            inputs = dict(item)
        else:
            raise InputError(
                f"{where}: item {index} must be a dict of the task's inputs ({', '.join(names)}), "
                f"got {type(item).__name__}: {item!r:.80}"
            )
        try:
            task.interface.validate_inputs(inputs)
        except TypeMismatchError as exc:
            raise InputError(f"{where}: item {index}: {exc}") from None
        out.append(inputs)
    return out


def settle(task: str, results: list[Any], failures: Sequence[tuple[int, str]], min_success_ratio: float) -> list[Any]:
    """The map's result (failed slots None) or MapFailedError when too few items succeeded."""
    total = len(results)
    failed = sorted(failures)
    succeeded = total - len(failed)
    # a small tolerance so that 0.9 of 50 items asks for 45, not 46 (0.9 * 50 = 45.000000000000004)
    required = math.ceil(min_success_ratio * total - 1e-9)
    if succeeded >= required:
        for index, _ in failed:
            results[index] = None
        return results
    listed = "; ".join(f"item {index}: {error}" for index, error in failed[:LISTED_FAILURES])
    more = f"; and {len(failed) - LISTED_FAILURES} more" if len(failed) > LISTED_FAILURES else ""
    indexes = ", ".join(str(index) for index, _ in failed[: LISTED_FAILURES * 4])
    indexes += ", ..." if len(failed) > LISTED_FAILURES * 4 else ""
    raise MapFailedError(
        f"engine.map({task}): {len(failed)} of {total} items failed (item{'s' if len(failed) > 1 else ''} {indexes}); "
        f"{succeeded} succeeded, below min_success_ratio={min_success_ratio:g} (needs {required}). {listed}{more}"
    )


async def map_in_process(
    run_task: Callable[[TaskDefinition, dict[str, Any]], Awaitable[Any]],
    task: TaskDefinition,
    items: list[dict[str, Any]],
    concurrency: int,
    min_success_ratio: float,
) -> list[Any]:
    """The map for dispatchers that run tasks in this process: ``concurrency`` workers take the next item."""
    results: list[Any] = [None] * len(items)
    failures: list[tuple[int, str]] = []
    pending = iter(range(len(items)))

    async def worker() -> None:
        for index in pending:  # one shared iterator: each item goes to exactly one worker
            try:
                results[index] = await run_task(task, items[index])
            except Exception as exc:  # a failed item is a None slot or part of the summary, not a crash
                failures.append((index, f"{type(exc).__name__}: {exc}"))

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(items)))))
    return settle(task.name, results, failures, min_success_ratio)


async def map(  # engine.map: the public name (Flyte: map_task), shadowing the builtin here only
    task: Callable[..., Any],
    items: Sequence[Any],
    concurrency: int = 16,
    min_success_ratio: float = 1.0,
    *,
    chunk_size: int | None = None,
) -> list[Any]:
    """Run ``task`` once per item, at most ``concurrency`` at a time; the results in input order.

    ``chunk_size``: items per child workflow on Temporal (default 1000); lower it when items' inputs or
    results are large (a chunk's inputs and its results must each fit in one 2 MB payload). Ignored elsewhere.
    """
    defn = _plain(task)
    check_options(defn, concurrency, min_success_ratio, chunk_size)
    inputs = item_inputs(defn, items)
    dispatcher: Dispatcher = current_dispatcher() or DirectDispatcher()
    return await dispatcher.map_task(defn, inputs, concurrency, float(min_success_ratio), chunk_size)
