"""The task cache's local activities: look an entry up (checking its artifacts), record one, mark a hit.

Run by the workflow worker for workflows/caching.py; the entries' layout is engine.artifacts.cache_index. Each
request is one msgpack blob (the workflow packs it with engine.types.codec). File reads and hashing run in a
thread, so the worker's event loop (which also runs workflows) never waits on the store.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import activity

from engine.artifacts import cache_index
from engine.core.protocol import CACHE_HIT, CACHE_LOOKUP, CACHE_RECORD
from engine.runtime.activities import store_for
from engine.types.codec import pack, unpack

__all__ = ["CACHE_ACTIVITIES", "cache_hit", "cache_lookup", "cache_record"]


def _request(blob: bytes) -> dict[str, Any]:
    data = unpack(blob)
    if not isinstance(data, dict):
        raise ValueError("a cache request must be a map")
    return data


def _lookup(data: dict[str, Any]) -> bytes:
    store = store_for(str(data["root"]))
    entry = cache_index.lookup(store, str(data["tenant"]), str(data["task"]), str(data["key"]))
    if entry is None:
        return b""
    return pack({"run_id": entry.run_id, "call": entry.call, "created": entry.created, "result": entry.result})


def _record(data: dict[str, Any]) -> None:
    result = data["result"]
    entry = cache_index.CacheEntry(
        task=str(data["task"]),
        version=str(data["version"]),
        key=str(data["key"]),
        run_id=str(data["run_id"]),
        call=str(data["call"]),
        created=cache_index.now_iso(),
        result=result,
        artifacts=cache_index.artifact_refs(unpack(result)),
    )
    cache_index.record(store_for(str(data["root"])), str(data["tenant"]), entry)


@activity.defn(name=CACHE_LOOKUP)
async def cache_lookup(request: bytes) -> bytes:
    """The entry's run, call and packed result when there is an intact one; empty bytes for a miss."""
    return await asyncio.to_thread(_lookup, _request(request))


@activity.defn(name=CACHE_RECORD)
async def cache_record(request: bytes) -> bytes:
    await asyncio.to_thread(_record, _request(request))
    return b""


@activity.defn(name=CACHE_HIT)
async def cache_hit(request: bytes) -> bytes:
    """Nothing to do: the call marks a hit in history (its id names the task and the run that produced the
    result), which ``gangflow status`` reads, and its summary is what the Web UI shows."""
    return b""


CACHE_ACTIVITIES = (cache_lookup, cache_record, cache_hit)
