"""Builders the scheduling policy's tests share: events (nodes, gangs, drains), driving a ``Policy``, and
reading its decisions and views.

Plain functions over ``engine.scheduling`` (pure: no Temporal), imported by test_scheduling.py,
test_scheduling_drain.py and test_scheduling_tenants.py. Defaults: a node has 2 GPUs and 16 CPUs, a gang
asks 1 node with 1 GPU and 1 CPU for tenant ``default``; a test that means other amounts says so.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable
from typing import Any

from engine.scheduling import (
    Admitted,
    Decision,
    Event,
    GangRejected,
    GangReleased,
    GangRequest,
    GangSubmitted,
    NodeDrained,
    NodeRegistered,
    NodeSpec,
    Pending,
    Policy,
    Preempted,
    QueueConfig,
    load_queue_config,
)

__all__ = [
    "FOREVER",
    "TWO_TEAMS",
    "admitted",
    "comes_back",
    "config",
    "drain",
    "gang",
    "gpus_of",
    "node",
    "node_view",
    "nodes_of",
    "only",
    "order",
    "preempted",
    "run",
    "run_last",
    "running_view",
    "undrain",
    "used_gpus",
]

#: nodes that never expire however far the clock moves (they re-register every few seconds in a real cluster)
FOREVER = 1e12

#: two tenants of one cohort, 2 GPUs of nominal quota each (tests add their own ``policy:``)
TWO_TEAMS = """\
cohorts: [{name: research}]
tenants:
  - {name: team-a, cohort: research, quota: {gpu: 2}}
  - {name: team-b, cohort: research, quota: {gpu: 2}}
"""


# ---------------------------------------------------------------- events


def config(text: str) -> QueueConfig:
    return load_queue_config(textwrap.dedent(text))


def node(node_id: str, gpus: int = 2, cpus: float = 16, mem: int | None = None) -> NodeRegistered:
    return NodeRegistered(spec=NodeSpec(node_id=node_id, address=f"{node_id}.local", gpus=gpus, cpus=cpus, mem=mem))


def gang(
    gang_id: str,
    tenant: str = "default",
    *,
    gpus: int = 1,
    nnodes: int = 1,
    cpus: float = 1.0,
    mem: int | None = None,
    **fields: Any,
) -> GangSubmitted:
    request = GangRequest(
        gang_id=gang_id,
        nnodes=nnodes,
        gpus_per_node=gpus,
        cpus_per_node=cpus,
        mem_per_node=mem,
        tenant=tenant,
        **fields,
    )
    return GangSubmitted(request=request)


def drain(node_id: str, reason: str = "") -> NodeDrained:
    return NodeDrained(node_id=node_id, drained=True, reason=reason)


def undrain(node_id: str) -> NodeDrained:
    return NodeDrained(node_id=node_id, drained=False)


# ---------------------------------------------------------------- driving a policy


def run(events: Iterable[Event], policy: Policy, now: float | None = None) -> list[Decision]:
    """Apply events in order; return all of their decisions."""
    decisions: list[Decision] = []
    for event in events:
        decisions += policy.step(event, now)
    return decisions


def run_last(
    events: Iterable[Event], policy: Policy | None = None, now: float | None = None
) -> tuple[Policy, list[Decision]]:
    """Apply events in order (to a fresh default policy unless given); return the policy and the decisions
    of the *last* event."""
    policy = policy or Policy()
    decisions: list[Decision] = []
    for event in events:
        decisions = policy.step(event, now)
    return policy, decisions


def comes_back(policy: Policy, gang_id: str, now: float | None = None) -> list[Decision]:
    """What a preempted gang's GangTask does once its ranks exit: release, then ask again for the same gang."""
    request = policy.running[gang_id].request
    return run([GangReleased(gang_id=gang_id), GangSubmitted(request=request)], policy, now)


# ---------------------------------------------------------------- reading decisions and views


def admitted(decisions: list[Decision]) -> list[str]:
    return [d.gang_id for d in decisions if isinstance(d, Admitted)]


def preempted(decisions: list[Decision]) -> list[tuple[str, str, str, str]]:
    """(victim, preemptor, preemptor's tenant, cause) for each preemption."""
    return [(d.gang_id, d.by, d.by_tenant, d.cause) for d in decisions if isinstance(d, Preempted)]


def only(decisions: list[Decision], kind: type[Pending] | type[GangRejected], gang_id: str) -> str:
    """The reason of the one ``kind`` decision about ``gang_id``."""
    reasons = [d.reason for d in decisions if isinstance(d, kind) and d.gang_id == gang_id]
    assert len(reasons) == 1, decisions
    return reasons[0]


def order(policy: Policy) -> list[str]:
    """The pending gangs in the order ``gangflow cluster`` shows them."""
    return [p["gang_id"] for p in policy.describe()["pending"]]


def gpus_of(policy: Policy, gang_id: str) -> dict[str, tuple[int, ...]]:
    return {a.node_id: a.gpu_ids for a in policy.running[gang_id].placement.nodes}


def nodes_of(policy: Policy, gang_id: str) -> set[str]:
    return {a.node_id for a in policy.running[gang_id].placement.nodes}


def node_view(policy: Policy, node_id: str) -> dict[str, Any]:
    return next(n for n in policy.describe()["nodes"] if n["node_id"] == node_id)


def running_view(policy: Policy, gang_id: str) -> dict[str, Any]:
    return next(r for r in policy.describe()["running"] if r["gang_id"] == gang_id)


def used_gpus(policy: Policy, tenant: str) -> int:
    return int(policy.queues()["tenants"][tenant]["used"]["gpu"])
