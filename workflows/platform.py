"""The platform's Nexus service: how a tenant's runs reach the Scheduler and the gangs in the platform namespace.

In the isolated layout every tenant has its own Temporal namespace (``gf-<tenant>``) and the Scheduler, the
GangRuns and the node agents' queues live in the platform namespace (``gangflow-system``), which tenants'
credentials cannot reach. A tenant's run starts a distributed task through *its own* Nexus endpoint
(``gf-<tenant>-gangs``), whose target is the task queue ``gangs/<tenant>`` in the platform namespace. The
handler takes the tenant from that task queue, the one thing a caller cannot choose: caller links and headers
are forgeable, the endpoint's target is set by the operator who created it.

This module holds the contract both sides share (names, the operation's input); the handler is
``engine.runtime.platform``, the caller the user-workflow shell.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass

import nexusrpc

from workflows.gang import GangSpec

__all__ = [
    "GANGS_QUEUE_PREFIX",
    "GANGS_SERVICE",
    "PLATFORM_NAMESPACE",
    "GangCall",
    "GangService",
    "TenantRoute",
    "gang_endpoint",
    "gangs_queue",
    "tenant_namespace",
    "tenant_of_queue",
]

GANGS_SERVICE = "gangflow.Gangs"
GANGS_QUEUE_PREFIX = "gangs/"
#: where the Scheduler, the gangs and the node agents' queues live (DESIGN.md, "Sharing a cluster")
PLATFORM_NAMESPACE = "gangflow-system"
_TENANT = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def tenant_namespace(tenant: str) -> str:
    """The Temporal namespace of a tenant (its name, as in a queue configuration, checked)."""
    if not _TENANT.fullmatch(tenant) or len(tenant) > 60:
        raise ValueError(f"tenant {tenant!r}: lowercase letters, digits and '-' only (as in a queue configuration)")
    return f"gf-{tenant}"


def gang_endpoint(tenant: str) -> str:
    """The tenant's Nexus endpoint (the dev gateway lets namespace ``gf-<tenant>`` use this one only)."""
    return f"gf-{tenant}-gangs"


def gangs_queue(tenant: str) -> str:
    """The platform task queue the tenant's endpoint targets: the handler's only source for the tenant."""
    return f"{GANGS_QUEUE_PREFIX}{tenant}"


def tenant_of_queue(task_queue: str) -> str | None:
    tenant = task_queue.removeprefix(GANGS_QUEUE_PREFIX)
    return tenant if task_queue.startswith(GANGS_QUEUE_PREFIX) and tenant else None


@dataclass(frozen=True)
class TenantRoute:
    """A tenant worker's configuration (``gangflow worker --tenant``), pinned over what a client declares:
    the run's tenant and artifact root, and the endpoint its gangs go through."""

    tenant: str
    artifacts: str

    @property
    def endpoint(self) -> str:
        return gang_endpoint(self.tenant)


@dataclass(frozen=True)
class GangCall:
    """``run_gang``'s input: what the shell would hand a GangRun child, plus who is calling (for the
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


@nexusrpc.service(name=GANGS_SERVICE)
class GangService:
    #: places and runs one distributed task call as a GangRun; its result is rank 0's encoded result
    run_gang: nexusrpc.Operation[GangCall, bytes]
