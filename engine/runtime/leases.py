"""Both ends of a node's lease (workflows.node_lease): the agent that holds it, the Scheduler that re-learns it.

The node agent starts its lease (``start_lease``: a restart replaces the old one) and serves ``HOLD_LEASE``
on its own queue (``LeaseHolder.hold``): heartbeat every ``HEARTBEAT_EVERY`` until the worker stops (then
the lease is returned at once: the node is lost now, not a timeout later) or the lease is cancelled (it ended
while this agent could not heartbeat: it was stopped, or cut off, for longer than the lease's timeout).
``LeaseHolder.lapsed`` says when the agent should start a new one.

``leased_nodes`` is the Scheduler's local activity when it starts afresh (no carried state): the specs in the
memos of the running leases, from visibility (one paginated list, whatever the cluster's size).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy

from engine.core.protocol import HOLD_LEASE, KIND_LEASE, LEASED_NODES, NODE_LEASE_TYPE, NODE_MEMO, lease_id
from engine.runtime.connection import kind_attributes

__all__ = ["HEARTBEAT_EVERY", "LeaseHolder", "leased_nodes", "start_lease"]

#: the agent heartbeats its lease this often: four chances within the lease's 20 s timeout
HEARTBEAT_EVERY = 5.0
#: a lease started this long ago that this agent still does not hold (the activity never came: the lease
#: timed out waiting for it) is started again
PICKUP_GRACE_S = 30.0


async def start_lease(client: Client, spec: dict[str, Any], task_queue: str) -> None:
    """Start the node's lease (``spec``: its NodeSpec as a dict), replacing the one a previous agent of this
    node left (that one never reports the node lost: this one registers it again)."""
    await client.start_workflow(
        NODE_LEASE_TYPE,
        spec,
        id=lease_id(str(spec["node_id"])),
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.TERMINATE_EXISTING,
        memo={NODE_MEMO: spec},
        search_attributes=kind_attributes(KIND_LEASE),
        static_summary=f"lease of node {spec['node_id']}",
    )


class LeaseHolder:
    """The agent's side: the ``HOLD_LEASE`` activity and whether this agent holds its lease now."""

    def __init__(self, every: float = HEARTBEAT_EVERY) -> None:
        self.every = every
        # HOLD_LEASE activities running here now. Counted, not a flag: a lease the agent replaced (it was not
        # picked up in time) may come after all and end beside the new one's, and its end must not make the
        # agent think it holds none (it would replace the good one, and so on, under load)
        self.holding = 0
        self.started = 0.0  # time.monotonic() of the last start_lease

    @property
    def held(self) -> bool:
        return self.holding > 0

    def lapsed(self) -> bool:
        """True when no lease is held and the last one started has had time to come: start a new one."""
        return not self.held and time.monotonic() - self.started >= PICKUP_GRACE_S

    def ended(self) -> None:
        """The lease this agent held ended (it will start another at once, ``lapsed``)."""
        self.started = 0.0

    @activity.defn(name=HOLD_LEASE)
    async def hold(self, node_id: str) -> str:
        self.holding += 1
        shutdown = asyncio.ensure_future(activity.wait_for_worker_shutdown())
        try:
            while not shutdown.done():
                activity.heartbeat()
                # a cancel (the lease ended) arrives here as CancelledError: the lease is gone
                await asyncio.wait([shutdown], timeout=self.every)
            return "agent stopped"
        finally:
            self.holding -= 1
            if not self.holding:
                self.ended()
            shutdown.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await shutdown


@activity.defn(name=LEASED_NODES)
async def leased_nodes() -> list[dict[str, Any]]:
    """The specs of the nodes whose leases run now (each lease's memo)."""
    specs: list[dict[str, Any]] = []
    query = f"WorkflowType = '{NODE_LEASE_TYPE}' AND ExecutionStatus = 'Running'"
    async for execution in activity.client().list_workflows(query, page_size=1000):
        spec: Any = await execution.memo_value(NODE_MEMO, None)
        if isinstance(spec, dict):
            specs.append(spec)
    return specs
