"""What the scheduler is told (events) and what it answers (decisions).

Both are tagged unions (``kind``) of frozen models, so the Scheduler workflow can carry them as JSON in
signals, updates and history, and ``pydantic.TypeAdapter(Event)`` / ``TypeAdapter(Decision)`` parse
them back into the right class.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import Field

from engine.scheduling.config import QueueConfig
from engine.scheduling.model import Frozen, GangRequest, NodeSpec, Placement

__all__ = [
    "DRAIN_REASON_MAX",
    "Admitted",
    "ConfigApplied",
    "Decision",
    "Event",
    "GangCheckpointed",
    "GangRejected",
    "GangReleased",
    "GangSubmitted",
    "NodeDrained",
    "NodeLost",
    "NodeRegistered",
    "Pending",
    "Preempted",
    "Tick",
    "drain_request",
]

#: the longest drain reason taken: it is shown in one-line pending reasons and attempt lists
DRAIN_REASON_MAX = 200


class NodeRegistered(Frozen):
    """A node agent (re)registered: a new node, or a known id with possibly new capacity, now alive.

    A known node keeps its running allocations: the gangs on it own them until they release them.
    """

    kind: Literal["node_registered"] = "node_registered"
    spec: NodeSpec


class NodeLost(Frozen):
    """A node stopped heartbeating: it gets no new work until it registers again.

    Its allocations stay: the gang's own workflow notices the failure and releases them, so the
    scheduler never frees GPUs that a half-dead rank may still be using.
    """

    kind: Literal["node_lost"] = "node_lost"
    node_id: str


class NodeDrained(Frozen):
    """An operator drains a node (``drained``: it takes no new gangs; its preemptible gangs are preempted,
    its others run to their end) or brings it back (``drained=False``). ``reason`` is the operator's words,
    shown with the node and in the reasons of the gangs it affects. Unknown ids are a no-op.

    The flag outlives the node's re-registrations and losses: only another ``NodeDrained`` changes it."""

    kind: Literal["node_drained"] = "node_drained"
    node_id: str
    drained: bool
    reason: str = ""


def drain_request(payload: Any) -> NodeDrained:
    """The Scheduler's ``drain_node`` payload, ``{"node_id": str, "drained": bool, "reason": str}``
    (``reason`` optional), as an event; ValueError naming what is wrong. Checked on both sides: by the
    client before it asks, and by the Scheduler's validator before the update enters history."""
    if not isinstance(payload, Mapping):
        raise ValueError(f"a drain request is an object with node_id, drained and reason, got {payload!r}")
    unknown = sorted(str(k) for k in payload if k not in ("node_id", "drained", "reason"))
    if unknown:
        raise ValueError(f"a drain request has no field {', '.join(unknown)} (fields: node_id, drained, reason)")
    node_id, drained, reason = payload.get("node_id"), payload.get("drained"), payload.get("reason", "")
    if not isinstance(node_id, str) or not node_id.strip():
        raise ValueError(f"node_id must be a node's id (a non-empty string), got {node_id!r}")
    if not isinstance(drained, bool):
        raise ValueError(f"drained must be true or false, got {drained!r}")
    if not isinstance(reason, str):
        raise ValueError(f"reason must be a string, got {reason!r}")
    reason = reason.strip()
    if "\n" in reason or "\r" in reason:
        raise ValueError(f"reason must be one line, got {reason!r}")
    if len(reason) > DRAIN_REASON_MAX:
        raise ValueError(f"reason must be at most {DRAIN_REASON_MAX} characters, got {len(reason)}")
    if reason and not drained:
        raise ValueError("an undrain takes no reason (the node is offered again)")
    return NodeDrained(node_id=node_id, drained=drained, reason=reason)


class GangSubmitted(Frozen):
    """A distributed task attempt asks for a placement."""

    kind: Literal["gang_submitted"] = "gang_submitted"
    request: GangRequest


class GangReleased(Frozen):
    """A gang is done with its placement, or withdraws its pending request. Unknown ids are a no-op."""

    kind: Literal["gang_released"] = "gang_released"
    gang_id: str


class GangCheckpointed(Frozen):
    """A running gang's attempt saved a new durable checkpoint (its GangTask tells each one once): what
    preempting it would destroy starts again from here (``engine.scheduling.lost_work``). Unknown or
    waiting gangs are a no-op; it changes no decision by itself, only which victims later ones choose."""

    kind: Literal["gang_checkpointed"] = "gang_checkpointed"
    gang_id: str
    step: int
    #: when it was saved, seconds since the epoch
    at: float
    #: what the save took
    save_s: float = Field(default=0.0, ge=0)
    #: measured on an attempt that resumed: its start (placement) to its first new step; None: not known
    restore_s: float | None = Field(default=None, ge=0)
    #: measured: this attempt's start (placement) to its first step; None: not known
    relaunch_s: float | None = Field(default=None, ge=0)


class Tick(Frozen):
    """Time passed: nothing happened but a deadline (a node's registration, a gang's wait for lost nodes)
    may have expired. The Scheduler sends it when its ticker finds ``next_deadline`` passed."""

    kind: Literal["tick"] = "tick"


class ConfigApplied(Frozen):
    """A new queue configuration (tenants, cohorts, quotas, priority classes, policy knobs), already validated.

    Running gangs keep running whatever the new quotas say (a quota shrunk under load is reclaimed by
    the usual preemption rules, never by killing); pending gangs of a tenant that is gone are rejected."""

    kind: Literal["config_applied"] = "config_applied"
    config: QueueConfig


Event: TypeAlias = Annotated[
    NodeRegistered | NodeLost | NodeDrained | GangSubmitted | GangReleased | Tick | ConfigApplied | GangCheckpointed,
    Field(discriminator="kind"),
]


class Admitted(Frozen):
    """The gang got all of its nodes at once and may start."""

    kind: Literal["admitted"] = "admitted"
    placement: Placement
    #: the flavor it was admitted on (None: the queue file names no flavors)
    flavor: str | None = None

    @property
    def gang_id(self) -> str:
        return self.placement.gang_id


class GangRejected(Frozen):
    """The gang request is malformed, a duplicate, or can never fit the alive cluster; it is not queued.

    Its tag on the wire stays ``"rejected"`` (decisions in outboxes and histories carry it): only the class
    name changed, away from ``engine.Rejected`` (an approval rejected)."""

    kind: Literal["rejected"] = "rejected"
    gang_id: str
    reason: str


#: the old name of ``GangRejected``, kept for code that imports it
Rejected = GangRejected


class Pending(Frozen):
    """The request is queued; ``reason`` tells the user why it is not running (sent when it changes)."""

    kind: Literal["pending"] = "pending"
    gang_id: str
    reason: str


class Preempted(Frozen):
    """A running gang must make room: its GangTask stops it (with ``grace_s`` to checkpoint), releases its
    placement and queues again at its own priority. ``by`` is the gang it makes room for (of ``by_tenant``),
    or for ``cause="drain"`` the node being drained (``by_tenant`` empty). ``cost_gpu_s``: the GPU-seconds
    of work it is expected to lose (``engine.scheduling.lost_work``; None: decided by code from before it)."""

    kind: Literal["preempted"] = "preempted"
    gang_id: str
    by: str
    by_tenant: str
    cause: Literal["reclaim", "priority", "backfill", "defrag", "drain"]
    reason: str
    grace_s: float
    cost_gpu_s: float | None = None


Decision: TypeAlias = Annotated[Admitted | GangRejected | Pending | Preempted, Field(discriminator="kind")]
