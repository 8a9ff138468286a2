"""The task cache on the workflow side: key, lookup, hit, record, for calls of ``@task(cache=True)``.

Only calls of cached tasks come here (``_TemporalDispatcher.run_task``), so runs of other tasks replay as they
did before caching existed. The key is computed here (engine.core.cache_key is pure and deterministic); the
lookup and the record are I/O on the artifact store and run as local activities on the worker
(engine.runtime.caching). A hit is marked by a third, empty local activity whose id names the task and the run
that produced the result: that is what ``gangflow status`` reads back from history ("cached (from run X)"), and
its summary is what the Web UI shows.

Modes (``RunContext.cache``): "use" looks up and records; "skip" (``gangflow run --no-cache``) neither reads nor
writes; "overwrite" (``--overwrite-cache``) does not read, runs the task and replaces the entry on success.
A failed call is never recorded. A store that cannot be read or written makes the call a miss (logged), never a
failed run: the cache only saves time.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, is_cancelled_exception

from engine.core.cache_key import cache_key
from engine.core.definitions import TaskDefinition
from engine.core.protocol import CACHE_HIT, CACHE_LOOKUP, CACHE_RECORD, hit_id
from engine.core.wire import RunContext
from engine.types.codec import pack, unpack

__all__ = ["cached_call"]


#: a lookup rehashes the entry's artifacts on a local store: leave room for a large model
_IO_TIMEOUT = timedelta(minutes=10)
_IO_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=3)


def _kind(task: TaskDefinition) -> str:
    return "gang" if task.gang is not None else "lightweight" if task.lightweight else "task"


async def _local(name: str, request: dict[str, Any], summary: str, activity_id: str | None = None) -> bytes:
    return await workflow.execute_local_activity(  # type: ignore[no-any-return]
        name,
        pack(request),
        result_type=bytes,
        start_to_close_timeout=_IO_TIMEOUT,
        retry_policy=_IO_RETRY,
        summary=summary,
        activity_id=activity_id,
    )


async def _lookup(run: RunContext, task: TaskDefinition, key: str) -> dict[str, Any] | None:
    request = {"root": run.artifacts, "tenant": run.tenant, "task": task.name, "key": key}
    try:
        found = await _local(CACHE_LOOKUP, request, f"{task.name}: cache lookup ({key[:12]})")
    except ActivityError as err:
        if is_cancelled_exception(err):
            raise
        workflow.logger.warning("cache lookup of task %s failed (running it): %s", task.name, err)
        return None
    if not found:
        return None
    entry = unpack(found)
    return entry if isinstance(entry, dict) and isinstance(entry.get("result"), bytes) else None


async def _record(run: RunContext, task: TaskDefinition, key: str, call: str, result: bytes) -> None:
    request = {
        "root": run.artifacts,
        "tenant": run.tenant,
        "task": task.name,
        "version": task.cache_version or "0",
        "key": key,
        "run_id": run.run_id,
        "call": call,
        "result": result,
    }
    try:
        await _local(CACHE_RECORD, request, f"{task.name}: cache record ({key[:12]})")
    except ActivityError as err:
        if is_cancelled_exception(err):
            raise
        workflow.logger.warning("could not record task %s in the cache: %s", task.name, err)


async def cached_call(
    run: RunContext,
    task: TaskDefinition,
    wire_inputs: dict[str, Any],
    next_call: Callable[[], str],
    execute: Callable[[], Awaitable[bytes]],
) -> bytes:
    """The packed result of one call of a cached task: from the cache on a hit, else from ``execute()``,
    recorded on success. ``next_call()`` names the call ``execute`` is about to make."""
    if run.cache == "skip":
        return await execute()
    key = cache_key(task.name, task.cache_version or "0", task.interface, wire_inputs)
    if run.cache == "use":
        entry = await _lookup(run, task, key)
        if entry is not None:
            source = str(entry.get("run_id") or "?")
            await _local(
                CACHE_HIT,
                {"task": task.name, "key": key, "run_id": source},
                f"{task.name}: cached (from run {source})",
                hit_id(_kind(task), task.name, source),
            )
            return entry["result"]  # type: ignore[no-any-return]
    call = next_call()
    result = await execute()  # a failure propagates: nothing is recorded
    await _record(run, task, key, call, result)
    return result
