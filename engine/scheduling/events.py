"""What the scheduler is told (events) and what it answers (decisions).

Both are tagged unions (``kind``) of frozen models, so the Scheduler workflow can carry them as JSON in
signals, updates and history, and ``pydantic.TypeAdapter(Event)`` / ``TypeAdapter(Decision)`` parse
them back into the right class.
"""

from __future__ import annotations

from typing import Annotated, Literal, TypeAlias

from pydantic import Field

from engine.scheduling.model import Frozen, GangRequest, NodeSpec, Placement

__all__ = [
    "Admitted",
    "Decision",
    "Event",
    "GangReleased",
    "GangSubmitted",
    "NodeLost",
    "NodeRegistered",
    "Pending",
    "Rejected",
    "Tick",
]


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


class GangSubmitted(Frozen):
    """A distributed task attempt asks for a placement."""

    kind: Literal["gang_submitted"] = "gang_submitted"
    request: GangRequest


class GangReleased(Frozen):
    """A gang is done with its placement, or withdraws its pending request. Unknown ids are a no-op."""

    kind: Literal["gang_released"] = "gang_released"
    gang_id: str


class Tick(Frozen):
    """Time passed: nothing happened but a deadline (a node's registration, a gang's wait for lost nodes)
    may have expired. The Scheduler sends it when its ticker finds ``next_deadline`` passed."""

    kind: Literal["tick"] = "tick"


Event: TypeAlias = Annotated[
    NodeRegistered | NodeLost | GangSubmitted | GangReleased | Tick, Field(discriminator="kind")
]


class Admitted(Frozen):
    """The gang got all of its nodes at once and may start."""

    kind: Literal["admitted"] = "admitted"
    placement: Placement

    @property
    def gang_id(self) -> str:
        return self.placement.gang_id


class Rejected(Frozen):
    """The request is malformed, a duplicate, or can never fit the alive cluster; it is not queued."""

    kind: Literal["rejected"] = "rejected"
    gang_id: str
    reason: str


class Pending(Frozen):
    """The request is queued; ``reason`` tells the user why it is not running (sent when it changes)."""

    kind: Literal["pending"] = "pending"
    gang_id: str
    reason: str


Decision: TypeAlias = Annotated[Admitted | Rejected | Pending, Field(discriminator="kind")]
