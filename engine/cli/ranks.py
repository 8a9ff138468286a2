"""The per-rank view of ``gangflow status``: for each distributed task call of a run, its ranks' node, pid,
last ``engine.report`` (step and metrics) and the age of that report.

A running gang's ranks come from its node agents' heartbeats (``Client.gang``); a finished one's from the
details its agents saved when its last attempt ended (``engine.runtime.ranks``). Nothing here fails the
status command: a gang that cannot be asked (gone, or in a namespace this caller cannot read) just has
no rank view.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from temporalio.exceptions import TemporalError
from temporalio.service import RPCError

from engine.artifacts.store import ArtifactStore
from engine.client import Client, RunInfo
from engine.rank.view import rank_rows
from engine.runtime.ranks import last_attempt_ranks

__all__ = ["RankView", "rank_views", "with_ranks"]

#: a task's rank view: {"gang_id", "attempt", "live", "ranks": [engine.rank.view rows]}
RankView = dict[str, Any]


async def rank_views(client: Client, info: RunInfo, now: float | None = None) -> dict[int, RankView]:
    """The rank view of each distributed task call of ``info`` that has one, by its index in ``info.tasks``."""
    now = time.time() if now is None else now
    views: dict[int, RankView] = {}
    store: ArtifactStore | None = None
    for index, record in enumerate(info.tasks):
        # a cache hit launched no gang; ``call`` (engine.runtime.history) also names the gang of a tenant in the
        # isolated layout: a Nexus operation with no child id here, its GangTask in the platform's namespace
        # (unreadable to the tenant), its agents' saved details in the tenant's store
        if record.kind != "gang" or record.call is None:
            continue
        gang_id = record.child_id or f"{info.run_id}.{record.call}"
        if record.child_id and record.status in ("scheduled", "running"):
            with contextlib.suppress(RPCError, TemporalError):
                gang = await client.gang(gang_id)
                rows = rank_rows(gang.get("nodes") or [], now)
                if rows:
                    attempts = gang.get("attempts") or gang.get("failed_attempts") or []
                    attempt = attempts[-1]["attempt"] if gang.get("attempts") else len(attempts)
                    views[index] = {"gang_id": gang_id, "attempt": attempt, "live": True, "ranks": rows}
                    continue
        store = store or ArtifactStore(info.artifacts or client.artifacts)
        with contextlib.suppress(OSError, ValueError):
            saved = last_attempt_ranks(store, info.run_id, record.call)
            if saved is not None:
                attempt, nodes = saved
                live = record.child_id is None and record.status == "running"  # saved every few seconds
                views[index] = {"gang_id": gang_id, "attempt": attempt, "live": live, "ranks": rank_rows(nodes, now)}
    return views


def with_ranks(data: dict[str, Any], views: dict[int, RankView]) -> dict[str, Any]:
    """``run_json``'s object with each distributed task's rank view under its task (``"ranks"``)."""
    for index, task in enumerate(data.get("tasks") or []):
        if index in views:
            task["ranks"] = views[index]
    return data
