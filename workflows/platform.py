"""The platform's Nexus service: how a tenant's runs reach the Scheduler and the gangs in the platform namespace.

In the isolated layout every tenant has its own Temporal namespace (``gf-<tenant>``) and the Scheduler, the
GangTasks and the node agents' queues live in the platform namespace (``gangflow-system``), which tenants'
credentials cannot reach. A tenant's run starts a distributed task through *its own* Nexus endpoint
(``gf-<tenant>-gangs``), whose target is the task queue ``gangs/<tenant>`` in the platform namespace. The
handler takes the tenant from that task queue, the one thing a caller cannot choose: caller links and headers
are forgeable, the endpoint's target is set by the operator who created it.

The same endpoint answers the tenant's look at what the platform holds of it (``view``: its gangs' states
with the Scheduler's reasons, its queue rows): a tenant's client cannot call a Nexus operation itself
(standalone operations are experimental and off on the dev server), so it starts a :class:`TenantView`
workflow in its own namespace, which the tenant's worker runs and which calls ``view`` on the endpoint.

This module holds the operations' types and that workflow (its names are in ``engine.core.protocol``); the
handler is ``engine.runtime.platform``, the caller of ``run_gang`` the user-workflow shell.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import nexusrpc
from temporalio import workflow
from temporalio.exceptions import ApplicationError

from engine.core.protocol import GANGS_SERVICE, TENANT_VIEW_TYPE
from workflows.calls import route
from workflows.gang_spec import GangSpec

__all__ = ["VIEW_CALLS_MAX", "GangCall", "GangService", "TenantView", "ViewRequest"]

#: how many of a run's gang calls one look asks about (the handler answers within Nexus's 10 s)
VIEW_CALLS_MAX = 100


@dataclass(frozen=True)
class GangCall:
    """``run_gang``'s input: what the shell would hand a GangTask child, plus who is calling (for the
    platform's orphan check: a terminated caller never cancels its operations)."""

    spec: GangSpec
    envelope: str  # the task's encoded envelope, base64 (JSON payloads carry no bytes)
    caller_id: str
    caller_run_id: str

    @staticmethod
    def of(spec: GangSpec, blob: bytes, caller_id: str, caller_run_id: str) -> GangCall:
        return GangCall(spec, base64.b64encode(blob).decode("ascii"), caller_id, caller_run_id)

    def blob(self) -> bytes:
        return base64.b64decode(self.envelope)


@dataclass(frozen=True)
class ViewRequest:
    """``view``'s input: what to look at. ``run_id`` and ``calls`` name gangs of the tenant's run (``train-1``
    ...): the handler puts the endpoint's tenant in front of them, so they reach no other tenant's gang."""

    run_id: str = ""
    calls: list[str] = field(default_factory=list)
    cluster: bool = False  # the tenant's rows of the Scheduler's state (gangflow cluster)
    queues: bool = False  # the tenant's queue row (gangflow queues show)

    @staticmethod
    def of(payload: Any) -> ViewRequest:
        """From what a client sent (a mapping); ValueError naming what is wrong."""
        if not isinstance(payload, dict):
            raise ValueError(f"a look takes a mapping, not {type(payload).__name__}")
        run_id, calls = payload.get("run_id") or "", payload.get("calls") or []
        if not isinstance(run_id, str) or not isinstance(calls, list) or not all(isinstance(c, str) for c in calls):
            raise ValueError("run_id must be a string and calls a list of strings")
        if len(calls) > VIEW_CALLS_MAX:
            raise ValueError(f"at most {VIEW_CALLS_MAX} calls in one look, got {len(calls)}")
        return ViewRequest(run_id, list(calls), bool(payload.get("cluster")), bool(payload.get("queues")))


@nexusrpc.service(name=GANGS_SERVICE)
class GangService:
    #: places and runs one distributed task call as a GangTask; its result is rank 0's encoded result
    run_gang: nexusrpc.Operation[GangCall, bytes]
    #: what the platform holds of the endpoint's tenant: its gangs' states and reasons, its queue rows
    view: nexusrpc.Operation[ViewRequest, dict[str, Any]]


@workflow.defn(name=TENANT_VIEW_TYPE, sandboxed=False)
class TenantView:
    """One look, from the tenant's namespace through its endpoint (a workflow: only workflows call Nexus here).

    Runs on a tenant's worker (``gangflow worker --tenant``, which knows its endpoint); a worker of no
    tenant fails it with ``NotATenant``: there the Scheduler is in the namespace itself."""

    @workflow.run
    async def run(self, payload: Any) -> dict[str, Any]:
        tenant_route = route()
        if tenant_route is None:
            raise ApplicationError(
                "this namespace's worker serves no tenant (it runs without --tenant): ask the Scheduler here",
                type="NotATenant",
                non_retryable=True,
            )
        try:
            request = ViewRequest.of(payload)
        except ValueError as exc:
            raise ApplicationError(str(exc), type="BadRequest", non_retryable=True) from None
        nexus = workflow.create_nexus_client(service=GangService, endpoint=tenant_route.endpoint)
        return await nexus.execute_operation(GangService.view, request, schedule_to_close_timeout=timedelta(seconds=15))
