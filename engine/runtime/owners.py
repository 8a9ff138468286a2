"""The Scheduler's owner check: which gangs no longer have a running workflow.

An allocation lives only as long as the GangTask that owns it. A GangTask releases its placement itself
when it ends or is cancelled; one terminated directly (an operator's ``temporal workflow terminate``) or
timed out never can. The Scheduler runs this as a local activity every few ticks and releases what the
closed owners held. Describe (not a visibility query) answers: visibility may lag behind a just-started
gang and would free a placement that is in use.

A gang a tenant's run started through Nexus (the isolated layout) has a second owner: that run, in the
tenant's namespace. Terminating a run cancels none of its Nexus operations (measured on this server: the
operation's workflow keeps running), so a running gang whose run is closed is cancelled here; cancelled, it
stops its ranks and frees its GPUs itself.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionDescription, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from engine.core.protocol import CLOSED_OWNERS

__all__ = ["CALLER_MEMO", "closed_owners"]

#: describes in flight at once: enough to check a thousand gangs in a second or two
_CONCURRENCY = 32
#: the GangTask's memo entry naming the tenant run that started it (namespace, workflow id, run id)
CALLER_MEMO = "gangflow_caller"


async def _closed(client: Client, workflow_id: str, run_id: str | None = None) -> bool:
    try:
        described = await client.get_workflow_handle(workflow_id, run_id=run_id).describe()
    except RPCError as exc:  # unknown: gone for good; anything else: ask again next time
        return exc.status == RPCStatusCode.NOT_FOUND
    return described.status != WorkflowExecutionStatus.RUNNING


async def _cancel_if_orphaned(
    client: Client, gang_id: str, described: WorkflowExecutionDescription, tenants: dict[str, Client]
) -> None:
    caller: Any = await described.memo_value(CALLER_MEMO, None)
    if not isinstance(caller, dict) or not caller.get("namespace") or not caller.get("workflow_id"):
        return  # a child of a run in this namespace: the run's close policy cancels it
    namespace = str(caller["namespace"])
    if namespace not in tenants:  # the same connection, another namespace
        tenants[namespace] = Client(client.service_client, namespace=namespace)
    if await _closed(tenants[namespace], str(caller["workflow_id"]), caller.get("run_id") or None):
        activity.logger.warning("gang %s: its run %s is closed; cancelling the gang", gang_id, caller["workflow_id"])
        await client.get_workflow_handle(gang_id).cancel()


@activity.defn(name=CLOSED_OWNERS)
async def closed_owners(gang_ids: list[str]) -> list[str]:
    client = activity.client()
    limit = asyncio.Semaphore(_CONCURRENCY)
    tenants: dict[str, Client] = {}

    async def closed(gang_id: str) -> bool:
        async with limit:
            try:
                described = await client.get_workflow_handle(gang_id).describe()
            except RPCError as exc:
                return exc.status == RPCStatusCode.NOT_FOUND
            if described.status != WorkflowExecutionStatus.RUNNING:
                return True
            try:
                await _cancel_if_orphaned(client, gang_id, described, tenants)
            except RPCError as exc:  # checked again next time
                activity.logger.warning("orphan check of gang %s failed: %s", gang_id, exc)
            return False

    flags = await asyncio.gather(*(closed(gang_id) for gang_id in gang_ids))
    return [gang_id for gang_id, gone in zip(gang_ids, flags, strict=True) if gone]
