"""The cluster half of the client: the Scheduler's view (nodes, gangs, queue configuration) and the operators'
commands on it (apply a queue configuration, drain a node, release a gang). ``Client`` inherits it, so one
connection answers both halves."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.client import Client as TemporalClient
from temporalio.client import (
    WorkflowExecutionStatus,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.exceptions import ApplicationError, TemporalError
from temporalio.service import RPCError, RPCStatusCode

from engine.core.protocol import (
    APPLY_QUEUES_UPDATE,
    DESCRIBE_QUERY,
    DRAIN_NODE_UPDATE,
    QUEUES_QUERY,
    RELEASE_SIGNAL,
    RUN_RANKS,
    SCHEDULER_ID,
    STATUS_QUERY,
)
from engine.errors import GangflowError, InputError, NodeNotFoundError
from engine.runtime.keeper import start_scheduler
from engine.scheduling.config import QueueConfig, QueueConfigError, dump_queue_config, load_queue_config
from engine.scheduling.events import drain_request

__all__ = ["ClusterClient", "NoScheduler"]

#: how long a query to the Scheduler may take before it counts as not answering (no worker runs it)
_SCHEDULER_RPC_TIMEOUT = timedelta(seconds=10)


class ClusterClient:
    """The Scheduler's side of a connection: what ``gangflow cluster``, ``queues``, ``node drain`` and
    ``release`` read and do."""

    temporal: TemporalClient
    task_queue: str

    async def gang(self, gang_id: str) -> dict[str, Any]:
        """A distributed task call (its GangTask id, ``<run>.<task>-<n>``): phase, placement, failed
        attempts, and per node the rank pids and latest ``engine.report`` of each rank."""
        handle = self.temporal.get_workflow_handle(gang_id)
        info: dict[str, Any] = {}
        with contextlib.suppress(RPCError, TemporalError):
            info = await handle.query(STATUS_QUERY)
        nodes = []
        desc = await handle.describe()
        for pending in desc.raw_description.pending_activities:
            if pending.activity_type.name != RUN_RANKS or not pending.heartbeat_details.payloads:
                continue
            details = await self.temporal.data_converter.decode(pending.heartbeat_details.payloads)
            if details and isinstance(details[0], dict):
                nodes.append(details[0])
        info["nodes"] = nodes
        info["status"] = desc.status.name if desc.status else "UNKNOWN"
        return info

    async def queue(self) -> dict[str, Any]:
        """The Scheduler's view: nodes, free and used GPUs, running gangs, the pending queue."""
        handle = self.temporal.get_workflow_handle(SCHEDULER_ID)
        described: dict[str, Any] = await handle.query(DESCRIBE_QUERY)
        return described

    async def _scheduler_query(self, name: str) -> dict[str, Any]:
        """A query to the Scheduler; NoScheduler when none runs here (or it predates the query),
        GangflowError when it does not answer."""
        try:
            answer: dict[str, Any] = await self.temporal.get_workflow_handle(SCHEDULER_ID).query(
                name, rpc_timeout=_SCHEDULER_RPC_TIMEOUT
            )
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                raise NoScheduler(_NO_SCHEDULER) from None
            raise GangflowError(f"the Scheduler did not answer ({exc.message}); is a worker running?") from None
        except WorkflowQueryFailedError as exc:
            if "expected but not found" in str(exc):  # a Scheduler from before this query existed
                raise NoScheduler(
                    f"the Scheduler here has no query {name!r}: it predates queue configurations"
                ) from None
            raise GangflowError(f"the Scheduler failed to answer: {exc}") from None
        except TemporalError as exc:
            raise GangflowError(f"the Scheduler did not answer: {exc}") from None
        return answer

    async def queues(self) -> dict[str, Any]:
        """Per tenant: nominal quota, used, borrowed and lent resources, pending gangs and fair share
        (``{"tenants": {NAME: {...}}, "config": {...}}``, the Scheduler's "queues" query). Raises
        GangflowError when no Scheduler runs or answers."""
        return await self._scheduler_query(QUEUES_QUERY)

    async def apply_queues(
        self, config: QueueConfig | Mapping[str, Any] | str | Path, *, task_queue: str | None = None
    ) -> dict[str, Any]:
        """Validate a queue configuration here (a QueueConfig, a mapping, YAML text or a YAML file as a
        Path; QueueConfigError naming the field), start the Scheduler if none runs (on ``task_queue``,
        default this client's), and apply it there in one update: the Scheduler checks it again and
        applies all of it or none (QueueConfigError with its reason). Returns the resulting ``queues()``."""
        parsed = config if isinstance(config, QueueConfig) else load_queue_config(config)
        await start_scheduler(self.temporal, task_queue or self.task_queue)
        handle = self.temporal.get_workflow_handle(SCHEDULER_ID)
        try:
            applied: dict[str, Any] = await handle.execute_update(
                APPLY_QUEUES_UPDATE, dump_queue_config(parsed), result_type=dict, rpc_timeout=_APPLY_TIMEOUT
            )
        except WorkflowUpdateFailedError as exc:
            cause = exc.cause
            raise QueueConfigError(cause.message if isinstance(cause, ApplicationError) else str(cause)) from None
        except (WorkflowUpdateRPCTimeoutOrCancelledError, RPCError) as exc:
            raise GangflowError(
                f"the Scheduler did not take the configuration within {_APPLY_TIMEOUT.total_seconds():.0f} s ({exc}); "
                f"is a gangflow worker running on queue {task_queue or self.task_queue!r}?"
            ) from None
        return applied

    async def drain_node(self, node_id: str, reason: str = "", drained: bool = True) -> dict[str, Any]:
        """Operators: drain a node (it takes no new gangs; each of its preemptible gangs gets a preemption
        notice, checkpoints, and is placed elsewhere; the others run there to their end), or bring it back
        with ``drained=False``. The flag outlives the node agent's restarts and the Scheduler's.

        Returns the Scheduler's answer: ``node_id``, ``drained``, ``reason``, ``preempted`` (gangs preempted
        now), ``remaining`` (gangs still running there that are not preemptible) and ``leaving`` (gangs
        preempted earlier that have not released yet). Raises InputError for a malformed request (before
        anything is sent), NodeNotFoundError for a node the Scheduler does not know (its message lists the
        known ones), GangflowError when the Scheduler does not answer."""
        payload = {"node_id": node_id, "drained": drained, "reason": reason}
        try:
            drain_request(payload)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        handle = self.temporal.get_workflow_handle(SCHEDULER_ID)
        try:
            answer: dict[str, Any] = await handle.execute_update(
                DRAIN_NODE_UPDATE, payload, result_type=dict, rpc_timeout=_APPLY_TIMEOUT
            )
        except WorkflowUpdateFailedError as exc:
            cause = exc.cause
            message = cause.message if isinstance(cause, ApplicationError) else str(cause)
            kind = cause.type if isinstance(cause, ApplicationError) else None
            if kind == "UnknownNode":
                raise NodeNotFoundError(message) from None
            if kind == "BadRequest":
                raise InputError(message) from None
            raise GangflowError(f"the Scheduler refused to drain node {node_id!r}: {message}") from None
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                raise NodeNotFoundError(f"unknown node {node_id!r}: {_NO_SCHEDULER}") from None
            raise GangflowError(f"the Scheduler did not answer: {exc.message}") from None
        except WorkflowUpdateRPCTimeoutOrCancelledError:
            raise GangflowError(
                f"the Scheduler did not answer within {_APPLY_TIMEOUT.total_seconds():.0f} s; is a gangflow worker "
                "running?"
            ) from None
        return answer

    async def release(self, gang_id: str, *, force: bool = False, confirm_s: float = 10.0) -> dict[str, Any]:
        """Operators: make the Scheduler free a gang's placement, or withdraw its queued request, and wait
        until it has. Returns the Scheduler's entry for the gang as ``queue()`` showed it, plus ``state``
        (``"running"`` or ``"pending"``). Raises GangflowError when no Scheduler answers, when it holds no
        such gang, and (unless ``force``) when the gang's GangTask still runs: its ranks may be using the
        GPUs, and a placement given away under them would be handed to another gang."""
        scheduler = self.temporal.get_workflow_handle(SCHEDULER_ID)

        async def describe() -> dict[str, Any]:
            try:
                described: dict[str, Any] = await scheduler.query(DESCRIBE_QUERY, rpc_timeout=timedelta(seconds=10))
                return described
            except RPCError as exc:
                if exc.status == RPCStatusCode.NOT_FOUND:
                    raise GangflowError(_NO_SCHEDULER) from None
                raise GangflowError(f"the Scheduler did not answer: {exc.message}") from None
            except TemporalError as exc:
                raise GangflowError(f"the Scheduler did not answer: {exc}") from None

        state = await describe()
        entry = _held(state, gang_id)
        if entry is None:
            totals = state.get("totals", {})
            raise GangflowError(
                f"the Scheduler holds no gang {gang_id!r} ({totals.get('running', 0)} running, "
                f"{totals.get('pending', 0)} pending); 'gangflow cluster' lists them"
            )
        if not force:
            try:
                owner = await self.temporal.get_workflow_handle(gang_id).describe()
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND:  # not knowing is no reason to free GPUs in use
                    raise GangflowError(f"cannot tell whether gang {gang_id!r} is in use: {exc.message}") from None
            else:
                if owner.status == WorkflowExecutionStatus.RUNNING:
                    run = owner.parent_id or gang_id
                    raise GangflowError(
                        f"gang {gang_id!r} is still in use: its GangTask runs (run {run}), so its ranks may hold "
                        f"the GPUs; cancel the run instead (gangflow cancel {run}), or force the release (--force)"
                    )
        await scheduler.signal(RELEASE_SIGNAL, gang_id)
        deadline = asyncio.get_running_loop().time() + confirm_s
        while _held(await describe(), gang_id) is not None:
            if asyncio.get_running_loop().time() > deadline:
                raise GangflowError(
                    f"asked the Scheduler to release {gang_id!r}, but it still holds it after {confirm_s:g} s; "
                    "is a gangflow worker running?"
                )
            await asyncio.sleep(0.2)
        return entry


class NoScheduler(GangflowError):
    """No Scheduler runs here (or it has no such query): there is no queue configuration to read."""


_NO_SCHEDULER = (
    "no Scheduler is running here: the worker of this namespace starts it ('gangflow worker', 'gangflow dev'), "
    "and so do a node agent and gangflow queues apply FILE"
)
#: how long ``apply_queues`` waits for the Scheduler to take a configuration (its worker may be starting)
_APPLY_TIMEOUT = timedelta(seconds=30)


def _held(state: Mapping[str, Any], gang_id: str) -> dict[str, Any] | None:
    """The Scheduler's entry for a gang (``describe``'s shape), with ``state``: running or pending."""
    for where in ("running", "pending"):
        for entry in state.get(where, []):
            if entry.get("gang_id") == gang_id:
                return {"state": where, **entry}
    return None
