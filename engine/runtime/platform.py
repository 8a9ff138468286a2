"""The platform side of the isolated layout: the Nexus handler tenants' runs reach the gangs through, the
workers that serve it, the endpoints, and the orphan check for gangs whose caller was terminated.

The Scheduler's owner check (``engine.runtime.owners``) cancels the gangs whose caller is closed.

The handler trusts nothing a tenant sends about who it is: the tenant comes from the task queue its endpoint
targets (``gangs/<tenant>``, set by the operator), and the run's tenant and artifact root in the task's
envelope are overwritten with that tenant and the root the platform pins for it before the GangTask starts.
The same goes for ``view`` (a tenant's look at its gangs and queue rows): the gangs it reads are the endpoint
tenant's by their ids, and the Scheduler's answers are cut to that tenant's rows
(``engine.scheduling.tenant_view``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

import nexusrpc
from nexusrpc.handler import StartOperationContext, service_handler, sync_operation
from temporalio import nexus
from temporalio.api.nexus.v1 import EndpointSpec, EndpointTarget
from temporalio.api.operatorservice.v1 import CreateNexusEndpointRequest, ListNexusEndpointsRequest
from temporalio.client import Client
from temporalio.exceptions import TemporalError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

from engine.core.protocol import (
    DESCRIBE_QUERY,
    GANG_TYPE,
    KIND_GANG,
    PLATFORM_NAMESPACE,
    QUEUES_QUERY,
    SCHEDULER_ID,
    STATUS_QUERY,
    TASK_QUEUE,
    gang_endpoint,
    gangs_queue,
    tenant_namespace,
    tenant_of_queue,
)
from engine.core.wire import Envelope
from engine.errors import GangflowError
from engine.runtime.connection import kind_attributes
from engine.runtime.owners import CALLER_MEMO
from engine.scheduling.tenant_view import own_cluster, own_gang, own_queues
from workflows.platform import GangCall, GangService, ViewRequest

__all__ = [
    "GangServiceHandler",
    "artifacts_for",
    "build_gang_workers",
    "ensure_endpoints",
    "tenant_view",
]

#: each query of one look: the whole look answers within Nexus's 10 s for a sync operation
_LOOK_TIMEOUT = timedelta(seconds=4)


def artifacts_for(template: str) -> Callable[[str], str]:
    """``--tenant-artifacts '/srv/artifacts/{tenant}'``: each tenant's root, pinned by the platform."""
    if "{tenant}" not in template:
        raise GangflowError(f"--tenant-artifacts {template!r} must contain {{tenant}} (one root per tenant)")
    return lambda tenant: template.replace("{tenant}", tenant)


def _refuse(message: str) -> nexusrpc.OperationError:
    return nexusrpc.OperationError(message, state=nexusrpc.OperationErrorState.FAILED)


@service_handler(service=GangService)
class GangServiceHandler:
    def __init__(self, artifacts: Callable[[str], str], task_queue: str = TASK_QUEUE) -> None:
        self.artifacts = artifacts
        self.task_queue = task_queue

    @nexus.workflow_run_operation
    async def run_gang(self, ctx: nexus.WorkflowRunOperationContext, call: GangCall) -> nexus.WorkflowHandle[bytes]:
        tenant = tenant_of_queue(nexus.info().task_queue)
        if tenant is None:
            raise _refuse(f"task queue {nexus.info().task_queue!r} belongs to no tenant")
        try:
            envelope = Envelope.decode(call.blob())
        except (GangflowError, ValueError) as exc:
            raise _refuse(f"the task's envelope cannot be read: {exc}") from None
        run = envelope.run
        pinned = replace(run, tenant=tenant, artifacts=self.artifacts(tenant))
        blob = Envelope(envelope.code, envelope.inputs, pinned).encode(f"the inputs of task {call.spec.task!r}")
        spec = replace(call.spec, tenant=tenant)
        return await ctx.start_workflow(
            GANG_TYPE,
            args=[spec, blob],
            # the tenant first: two tenants' runs may have the same id, their gangs never do
            id=f"{tenant}:{call.caller_id}.{spec.call}",
            task_queue=self.task_queue,
            result_type=bytes,
            memo={
                "gangflow_task": spec.task,
                CALLER_MEMO: {
                    "namespace": tenant_namespace(tenant),
                    "workflow_id": call.caller_id,
                    "run_id": call.caller_run_id,
                },
            },
            static_summary=f"{tenant}: {spec.task}: {spec.shape.nnodes} node(s) × {spec.shape.nproc_per_node} rank(s)",
            search_attributes=kind_attributes(KIND_GANG, tenant),
        )

    @sync_operation
    async def view(self, ctx: StartOperationContext, request: ViewRequest) -> dict[str, Any]:
        tenant = tenant_of_queue(nexus.info().task_queue)
        if tenant is None:
            raise _refuse(f"task queue {nexus.info().task_queue!r} belongs to no tenant")
        return await tenant_view(nexus.client(), tenant, request)


async def _query(client: Client, workflow_id: str, name: str) -> tuple[dict[str, Any] | None, str | None]:
    """(answer, None), or (None, why not): ``"absent"`` for no such workflow, else the error."""
    try:
        answer = await client.get_workflow_handle(workflow_id).query(name, rpc_timeout=_LOOK_TIMEOUT)
    except RPCError as exc:
        return None, "absent" if exc.status == RPCStatusCode.NOT_FOUND else exc.message
    except TemporalError as exc:
        return None, str(exc)
    return (answer, None) if isinstance(answer, dict) else (None, f"an answer of type {type(answer).__name__}")


async def tenant_view(client: Client, tenant: str, request: ViewRequest) -> dict[str, Any]:
    """What the platform holds of ``tenant`` (taken from the endpoint by the caller of this), as
    ``{"tenant", "namespace", "scheduler": None | why it did not answer, "cluster"?, "queues"?, "gangs":
    {call: own_gang(...)}}``. A gang of the run that the platform does not hold is left out of ``gangs``."""
    calls = list(dict.fromkeys(request.calls))
    looks = [_query(client, SCHEDULER_ID, DESCRIBE_QUERY)]
    looks += [_query(client, f"{tenant}:{request.run_id}.{call}", STATUS_QUERY) for call in calls]
    if request.queues:
        looks.append(_query(client, SCHEDULER_ID, QUEUES_QUERY))
    answers = await asyncio.gather(*looks)
    (described, why), gangs = answers[0], answers[1 : 1 + len(calls)]
    out: dict[str, Any] = {"tenant": tenant, "namespace": PLATFORM_NAMESPACE, "scheduler": None}
    if described is None:
        out["scheduler"] = "no Scheduler is running yet" if why == "absent" else f"the Scheduler did not answer: {why}"
    tenants = set((described or {}).get("tenants") or {})
    if request.cluster and described is not None:
        out["cluster"] = own_cluster(described, tenant)
    if request.queues:
        queues, _ = answers[-1]
        out["queues"] = own_queues(queues, tenant) if queues is not None else None
    out["gangs"] = {
        call: own_gang(status, tenant, tenants) for call, (status, _) in zip(calls, gangs, strict=True) if status
    }
    return out


def build_gang_workers(client: Client, tenants: Sequence[str], artifacts: Callable[[str], str]) -> list[Worker]:
    """One worker per tenant's queue (a worker polls one queue), all sharing one handler."""
    handler = GangServiceHandler(artifacts)
    return [Worker(client, task_queue=gangs_queue(t), nexus_service_handlers=[handler]) for t in tenants]


async def ensure_endpoints(client: Client, tenants: Sequence[str]) -> None:
    """Create each tenant's endpoint (``gf-<tenant>-gangs`` → ``gangs/<tenant>`` in the platform namespace)
    unless it exists. The dev stack calls this; in production the operator does (docs/security.md)."""
    existing = await client.operator_service.list_nexus_endpoints(ListNexusEndpointsRequest(page_size=1000))
    names = {e.spec.name for e in existing.endpoints}
    for tenant in tenants:
        if gang_endpoint(tenant) in names:
            continue
        target = EndpointTarget(
            worker=EndpointTarget.Worker(namespace=PLATFORM_NAMESPACE, task_queue=gangs_queue(tenant))
        )
        await client.operator_service.create_nexus_endpoint(
            CreateNexusEndpointRequest(spec=EndpointSpec(name=gang_endpoint(tenant), target=target))
        )
