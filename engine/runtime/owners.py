"""The Scheduler's owner check: which gangs no longer have a running workflow.

An allocation lives only as long as the GangRun that owns it. A GangRun releases its placement itself
when it ends or is cancelled; one terminated directly (an operator's ``temporal workflow terminate``) or
timed out never can. The Scheduler runs this as a local activity every few ticks and releases what the
closed owners held. Describe (not a visibility query) answers: visibility may lag behind a just-started
gang and would free a placement that is in use.
"""

from __future__ import annotations

import asyncio

from temporalio import activity
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from workflows.scheduler import CLOSED_OWNERS

__all__ = ["closed_owners"]

#: describes in flight at once: enough to check a thousand gangs in a second or two
_CONCURRENCY = 32


@activity.defn(name=CLOSED_OWNERS)
async def closed_owners(gang_ids: list[str]) -> list[str]:
    client = activity.client()
    limit = asyncio.Semaphore(_CONCURRENCY)

    async def closed(gang_id: str) -> bool:
        async with limit:
            try:
                described = await client.get_workflow_handle(gang_id).describe()
            except RPCError as exc:  # unknown: gone for good; anything else: ask again next time
                return exc.status == RPCStatusCode.NOT_FOUND
        return described.status != WorkflowExecutionStatus.RUNNING

    flags = await asyncio.gather(*(closed(gang_id) for gang_id in gang_ids))
    return [gang_id for gang_id, gone in zip(gang_ids, flags, strict=True) if gone]
