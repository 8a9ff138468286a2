"""The platform's Nexus service: how a tenant's runs reach the Scheduler and the gangs in the platform namespace.

In the isolated layout every tenant has its own Temporal namespace (``gf-<tenant>``) and the Scheduler, the
GangTasks and the node agents' queues live in the platform namespace (``gangflow-system``), which tenants'
credentials cannot reach. A tenant's run starts a distributed task through *its own* Nexus endpoint
(``gf-<tenant>-gangs``), whose target is the task queue ``gangs/<tenant>`` in the platform namespace. The
handler takes the tenant from that task queue, the one thing a caller cannot choose: caller links and headers
are forgeable, the endpoint's target is set by the operator who created it.

This module holds the operation's types (its names are in ``engine.core.protocol``); the handler is
``engine.runtime.platform``, the caller the user-workflow shell.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

import nexusrpc

from engine.core.protocol import GANGS_SERVICE
from workflows.gang_spec import GangSpec

__all__ = ["GangCall", "GangService"]


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


@nexusrpc.service(name=GANGS_SERVICE)
class GangService:
    #: places and runs one distributed task call as a GangTask; its result is rank 0's encoded result
    run_gang: nexusrpc.Operation[GangCall, bytes]
