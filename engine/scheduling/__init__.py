"""The scheduling policy: node inventory, tenants with quotas and cohorts, priority classes, fair share,
all-or-nothing gang admission with backfill, placement and preemption decisions.

Pure and deterministic (standard library, pydantic and PyYAML only): the Scheduler workflow feeds it
events and sends out its decisions; tests and simulations drive it without Temporal. See ``policy`` for
the rules, ``tenancy`` for quotas and fair share, ``config`` for the YAML users write.
"""

from engine.scheduling import native

# before any module of the policy is imported: a fresh compiled build (``make native``) goes ahead of the sources
native.load(__path__)

from engine.scheduling.config import (
    DEFAULT_QUEUE_CONFIG,
    CohortConfig,
    PolicyConfig,
    PriorityClass,
    QueueConfig,
    QueueConfigError,
    ResourceAmounts,
    TenantConfig,
    dump_queue_config,
    load_queue_config,
)
from engine.scheduling.events import (
    Admitted,
    ConfigApplied,
    Decision,
    Event,
    GangCheckpointed,
    GangRejected,
    GangReleased,
    GangSubmitted,
    NodeDrained,
    NodeLost,
    NodeRegistered,
    Pending,
    Preempted,
    Tick,
    drain_request,
)
from engine.scheduling.events import Rejected as Rejected  # the old name of GangRejected, not in __all__
from engine.scheduling.model import (
    DEFAULT_LOST_NODE_WAIT_S,
    DEFAULT_NODE_TTL_S,
    GangRequest,
    NodeAssignment,
    NodeSpec,
    Placement,
)
from engine.scheduling.policy import Policy

__all__ = [
    "DEFAULT_LOST_NODE_WAIT_S",
    "DEFAULT_NODE_TTL_S",
    "DEFAULT_QUEUE_CONFIG",
    "Admitted",
    "CohortConfig",
    "ConfigApplied",
    "Decision",
    "Event",
    "GangCheckpointed",
    "GangRejected",
    "GangReleased",
    "GangRequest",
    "GangSubmitted",
    "NodeAssignment",
    "NodeDrained",
    "NodeLost",
    "NodeRegistered",
    "NodeSpec",
    "Pending",
    "Placement",
    "Policy",
    "PolicyConfig",
    "Preempted",
    "PriorityClass",
    "QueueConfig",
    "QueueConfigError",
    "ResourceAmounts",
    "TenantConfig",
    "Tick",
    "drain_request",
    "dump_queue_config",
    "load_queue_config",
]
