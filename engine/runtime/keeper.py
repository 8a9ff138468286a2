"""The Scheduler is kept running by the platform's worker, never by whoever happens to come first.

It used to start with the first node agent's registration: a gang submitted before any agent registered
(the first seconds of ``gangflow dev --nodes 2``, a CI script, a cluster whose platform worker restarted)
found no Scheduler and failed for good. Now the worker that serves the Scheduler's queue starts it before it
polls and checks every few seconds that it still runs (an operator may terminate it; a start is idempotent:
Temporal's USE_EXISTING conflict policy returns the running one). ``queues apply`` still starts it the same
way; node agents no longer do: their leases (workflows.node_lease) run on the platform worker, which starts
it before it polls, and a thousand agents each starting the one Scheduler made its execution "busy".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError

from engine.core.protocol import KIND_SCHEDULER, SCHEDULER_ID, SCHEDULER_TYPE, TASK_QUEUE, scheduler_input
from engine.runtime.connection import kind_attributes

__all__ = ["KEEP_EVERY_S", "keep_scheduler", "kept_scheduler", "start_scheduler"]

log = logging.getLogger("gangflow.worker")
#: how often the platform worker checks that the Scheduler runs (a start of a running one is a no-op)
KEEP_EVERY_S = 10.0


async def start_scheduler(
    client: Client, task_queue: str = TASK_QUEUE, *, signal: str | None = None, signal_args: Sequence[Any] = ()
) -> None:
    """Start the Scheduler on ``task_queue`` unless it runs; ``signal`` is delivered to it either way (a node
    agent's registration: signal-with-start, one call)."""
    extra: dict[str, Any] = {"start_signal": signal, "start_signal_args": list(signal_args)} if signal else {}
    await client.start_workflow(
        SCHEDULER_TYPE,
        scheduler_input(),
        id=SCHEDULER_ID,
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        search_attributes=kind_attributes(KIND_SCHEDULER),  # continue-as-new keeps them
        **extra,
    )


async def keep_scheduler(client: Client, task_queue: str = TASK_QUEUE, every: float = KEEP_EVERY_S) -> None:
    """Until cancelled: start the Scheduler whenever it is not running. A failed check is logged and tried
    again (Temporal restarting is no reason for the worker to stop)."""
    failing = False
    while True:
        try:
            await start_scheduler(client, task_queue)
            failing = False
        except RPCError as exc:
            if not failing:
                log.warning("cannot check that the Scheduler runs (%s); trying again every %.0f s", exc, every)
            failing = True
        await asyncio.sleep(every)


@contextlib.asynccontextmanager
async def kept_scheduler(client: Client, task_queue: str = TASK_QUEUE) -> AsyncIterator[None]:
    """While inside: the Scheduler runs (started before the worker polls, then kept). Every process that
    serves the Scheduler's queue uses it (``gangflow worker``/``dev``, the demo's in-process worker): with no
    agent starting the Scheduler, a worker without it leaves every lease unregistered."""
    await start_scheduler(client, task_queue)
    keeper = asyncio.create_task(keep_scheduler(client, task_queue))
    try:
        yield
    finally:
        keeper.cancel()
