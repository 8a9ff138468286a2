"""The scheduling policy: node inventory, a strict-FIFO gang queue, all-or-nothing admission, placement.

Pure and deterministic (standard library and pydantic only): the Scheduler workflow feeds it events and
sends out its decisions; tests and simulations drive it without Temporal. See ``policy`` for the rules.
"""

from engine.scheduling.capacity import NodeUsage, usage
from engine.scheduling.describe import describe
from engine.scheduling.events import (
    Admitted,
    Decision,
    Event,
    GangReleased,
    GangSubmitted,
    NodeLost,
    NodeRegistered,
    Pending,
    Rejected,
    Tick,
)
from engine.scheduling.model import (
    DEFAULT_LOST_NODE_WAIT_S,
    DEFAULT_NODE_TTL_S,
    Allocation,
    ClusterState,
    GangRequest,
    NodeAssignment,
    NodeSpec,
    NodeState,
    Placement,
    QueuedGang,
)
from engine.scheduling.policy import next_deadline, pending_reasons, place, step

__all__ = [
    "DEFAULT_LOST_NODE_WAIT_S",
    "DEFAULT_NODE_TTL_S",
    "Admitted",
    "Allocation",
    "ClusterState",
    "Decision",
    "Event",
    "GangReleased",
    "GangRequest",
    "GangSubmitted",
    "NodeAssignment",
    "NodeLost",
    "NodeRegistered",
    "NodeSpec",
    "NodeState",
    "NodeUsage",
    "Pending",
    "Placement",
    "QueuedGang",
    "Rejected",
    "Tick",
    "describe",
    "next_deadline",
    "pending_reasons",
    "place",
    "step",
    "usage",
]
