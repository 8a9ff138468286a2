"""The cluster half of the client: the Scheduler's view (nodes, gangs, queue configuration) and the operators'
commands on it (apply a queue configuration, drain a node, release a gang). ``Client`` inherits it, so one
connection answers both halves.

In the isolated layout a tenant's namespace (``gf-<tenant>``) holds no Scheduler, and the tenant's
credentials cannot read the platform namespace that does: ``queue()``, ``queues()`` and ``Client.status``
then look through the tenant's Nexus endpoint (``tenant_view``), which answers with the tenant's own rows."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.client import Client as TemporalClient
from temporalio.client import (
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.exceptions import ApplicationError, NexusOperationError, TemporalError
from temporalio.exceptions import TimeoutError as TemporalTimeoutError
from temporalio.service import RPCError, RPCStatusCode

from engine.core.protocol import (
    APPLY_QUEUES_UPDATE,
    DESCRIBE_QUERY,
    DRAIN_NODE_UPDATE,
    KIND_VIEW,
    PLATFORM_NAMESPACE,
    QUEUES_QUERY,
    RELEASE_SIGNAL,
    RUN_RANKS,
    SCHEDULER_ID,
    STATUS_QUERY,
    TENANT_VIEW_PREFIX,
    TENANT_VIEW_TYPE,
    gang_endpoint,
    tenant_of_namespace,
)
from engine.errors import GangflowError, InputError, NodeNotFoundError
from engine.runtime.connection import call_refused, kind_attributes
from engine.runtime.keeper import start_scheduler
from engine.scheduling.config import QueueConfig, QueueConfigError, dump_queue_config, load_queue_config
from engine.scheduling.events import drain_request

__all__ = ["ClusterClient", "NoScheduler"]

#: how long a look through the tenant's endpoint may take (a workflow task, a Nexus call, the queries)
_VIEW_TIMEOUT = timedelta(seconds=15)
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
        """The Scheduler's view: nodes, free and used GPUs, running gangs, the pending queue. In a tenant's
        namespace of the isolated layout, the tenant's part of it (``tenant_view``: its gangs and its row, no
        nodes, ``"tenant_view": TENANT``); NoScheduler when the platform runs none, GangflowError when the
        look gets no answer."""
        handle = self.temporal.get_workflow_handle(SCHEDULER_ID)
        try:
            described: dict[str, Any] = await handle.query(DESCRIBE_QUERY)
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND or self.tenant() is None:
                raise
            view = await self.tenant_view(cluster=True)
            _scheduler_answered(view)
            described = view["cluster"]
        return described

    def tenant(self) -> str | None:
        """The tenant whose namespace this client is in (``gf-team-a`` → ``team-a``), else None."""
        return tenant_of_namespace(self.temporal.namespace)

    async def tenant_view(
        self,
        *,
        run_id: str = "",
        calls: list[str] | None = None,
        cluster: bool = False,
        queues: bool = False,
        timeout: timedelta = _VIEW_TIMEOUT,
    ) -> dict[str, Any]:
        """What the platform holds of this namespace's tenant, read through the tenant's Nexus endpoint (the
        isolated layout): ``{"tenant", "namespace", "scheduler": None or why it did not answer, "cluster"``
        (with ``cluster``: ``queue()``'s shape, the tenant's rows only)``, "queues"`` (with ``queues``)``,
        "gangs": {call: status}}``, ``gangs`` for the calls of ``run_id`` the platform holds (each the
        GangTask's status query answer, with ``state``: "waiting" or "running").

        Only a workflow calls Nexus here, so this starts one (``GangflowTenantView``) in the tenant's
        namespace, which the tenant's worker runs: it takes the tenant's write role, and some 0.1 to 0.5 s.
        GangflowError with the truth when the look gets no answer: the credentials may not read the platform
        namespace, and what stopped the look (no tenant worker, a platform without this operation)."""
        tenant = self.tenant()
        if tenant is None:
            raise GangflowError(
                f"namespace {self.temporal.namespace!r} is no tenant's (gf-<tenant>): its Scheduler is asked directly"
            )
        out_of_reach = (
            f"{tenant}'s credentials may not read the platform namespace ({PLATFORM_NAMESPACE}), and its look "
            f"through its Nexus endpoint {gang_endpoint(tenant)} got no answer"
        )
        payload = {"run_id": run_id, "calls": list(calls or []), "cluster": cluster, "queues": queues}
        try:
            handle = await self.temporal.start_workflow(
                TENANT_VIEW_TYPE,
                payload,
                id=f"{TENANT_VIEW_PREFIX}{uuid.uuid4().hex}",
                task_queue=self.task_queue,
                search_attributes=kind_attributes(KIND_VIEW, tenant),
                execution_timeout=timeout,
                result_type=dict,
            )
            answer: dict[str, Any] = await handle.result()
        except WorkflowFailureError as exc:
            raise GangflowError(f"{out_of_reach}: {_view_failure(exc, tenant, self.task_queue, timeout)}") from None
        except RPCError as exc:
            if exc.status == RPCStatusCode.PERMISSION_DENIED:
                raise GangflowError(
                    f"{out_of_reach}: Temporal refused to start the look in {self.temporal.namespace} "
                    f"({exc.message}; it needs the write role there); ask the platform operator"
                ) from None
            raise GangflowError(f"{out_of_reach}: {exc.message}") from None
        return answer

    async def _scheduler_query(self, name: str) -> dict[str, Any]:
        """A query to the Scheduler; NoScheduler when none runs here (or it predates the query),
        GangflowError when it does not answer, the RPCError when Temporal refuses the credentials."""
        try:
            answer: dict[str, Any] = await self.temporal.get_workflow_handle(SCHEDULER_ID).query(
                name, rpc_timeout=_SCHEDULER_RPC_TIMEOUT
            )
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                raise NoScheduler(_NO_SCHEDULER) from None
            if call_refused(exc):
                raise  # the credentials' fault, not the Scheduler's: the caller says so
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
        (``{"tenants": {NAME: {...}}, "config": {...}}``, the Scheduler's "queues" query); in a tenant's
        namespace of the isolated layout, that tenant's row alone (``tenant_view``). Raises GangflowError when
        no Scheduler runs or answers."""
        try:
            return await self._scheduler_query(QUEUES_QUERY)
        except NoScheduler:
            if self.tenant() is None:
                raise
        view = await self.tenant_view(queues=True)
        _scheduler_answered(view)
        queues: dict[str, Any] | None = view.get("queues")
        if queues is None:
            raise GangflowError(f"the Scheduler in {PLATFORM_NAMESPACE} did not answer {self.tenant()}'s look")
        return queues

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


def _scheduler_answered(view: Mapping[str, Any]) -> None:
    """NoScheduler when the platform's look found no Scheduler answering (its reason)."""
    if view.get("scheduler"):
        raise NoScheduler(f"the platform namespace ({PLATFORM_NAMESPACE}) says: {view['scheduler']}")


def _view_failure(exc: WorkflowFailureError, tenant: str, task_queue: str, timeout: timedelta) -> str:
    """Why a look failed, in the user's terms."""
    cause = exc.cause
    if isinstance(cause, TemporalTimeoutError):
        return (
            f"no worker of {tenant} took it within {timeout.total_seconds():g} s (is 'gangflow worker "
            f"--tenant {tenant}' running on queue {task_queue!r}, and recent enough to know "
            f"{TENANT_VIEW_TYPE}?); ask the platform operator"
        )
    if isinstance(cause, NexusOperationError):
        why = str(cause.cause or cause)
        return f"the platform's endpoint failed it ({why}); ask the platform operator"
    if isinstance(cause, ApplicationError):
        return cause.message
    return str(cause or exc)


#: how long ``apply_queues`` waits for the Scheduler to take a configuration (its worker may be starting)
_APPLY_TIMEOUT = timedelta(seconds=30)


def _held(state: Mapping[str, Any], gang_id: str) -> dict[str, Any] | None:
    """The Scheduler's entry for a gang (``describe``'s shape), with ``state``: running or pending."""
    for where in ("running", "pending"):
        for entry in state.get(where, []):
            if entry.get("gang_id") == gang_id:
                return {"state": where, **entry}
    return None
