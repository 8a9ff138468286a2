"""The policy's records of one gang: waiting (``Queued``), running (``Running``) and being preempted (``Notice``).

Mutable and private to the scheduling package: ``engine.scheduling.policy`` keeps them, and its helpers
(``snapshot`` for continue-as-new, ``preemption`` for the victim search, ``node_waits`` for lost and drained
nodes) read and update them. What crosses the scheduler's boundary is ``engine.scheduling.model``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from engine.scheduling.inventory import millicores
from engine.scheduling.model import GangRequest, Placement
from engine.scheduling.tenancy import Vec
from engine.scheduling.tenancy import key as ledger_key

__all__ = ["Cause", "Checkpoint", "Fit", "Notice", "QueueKey", "Queued", "Running", "Shape", "shape_of", "shape_tag"]

#: nnodes, GPUs, millicores and bytes per node; for a gang naming a topology level then "required:rack" (or
#: "preferred:rack", "preferred:rack@600" with a wait: ``shape_tag``); with flavors or a node selector, then the
#: gang's candidate flavors and its selector (``engine.scheduling.flavors.shape``): gangs of one shape are placed
#: alike
Shape = tuple[Any, ...]
#: (-priority value, shape, preemptible), and its run's user where it names one: one FIFO queue per key, and only its
#: head is looked at, so a gang that may backfill never waits behind one of its shape that may not (it would never
#: get past it), and a user's gang never waits behind another user's of its shape (``engine.scheduling.users``)
QueueKey = tuple[Any, ...]
Cause = Literal["reclaim", "priority", "backfill", "defrag"]
#: whether a shape fits the offered nodes when idle ("now"), else what it waits for: lost nodes to come back
#: ("lost", up to the gang's ``lost_node_wait_s``) or drained nodes to be undrained ("drained": an operator's
#: decision, no deadline); "never": not even every registered node could hold it
Fit = Literal["now", "lost", "drained", "never"]


@dataclass(slots=True)
class Queued:
    request: GangRequest
    seq: int
    prio: int
    preemptible: bool
    vec: Vec
    shape: Shape
    reason: str = ""
    lost_wait_since: float | None = None
    victims: set[str] = field(default_factory=set)  # preempted for this gang and not released yet
    cause: str = ""
    #: the last victim search found nothing: (policy version then, when a too-young victim comes of age)
    failed_search: tuple[int, float] | None = None
    #: a victim that search waits for (gang, tenant, why): "checkpoint", to save its next checkpoint
    #: (``policy.checkpoint_wait``), or "min_runtime", to have run that long (``preemption.waiting_note``)
    waited_for: tuple[str, str, str] | None = None
    #: what preempting its victims costs, expected lost GPU-seconds (``engine.scheduling.lost_work``)
    victims_cost: float | None = None
    #: the flavors it may use, in order, and the one it is looked at on now (``engine.scheduling.flavors``);
    #: (None,) and None without flavors
    candidates: tuple[str | None, ...] = (None,)
    flavor: str | None = None
    #: its tenant's key in the tenancy ledger on that flavor (the tenant's name without flavors), and its shape
    #: on it (what placement tries, and fails, alike within a cycle): kept by ``on``, read on every look
    ledger: str = ""
    placed_shape: tuple[Shape, str | None] = ((), None)

    def __post_init__(self) -> None:
        self.on(self.flavor)

    def on(self, flavor: str | None) -> None:
        """Look at it on ``flavor`` (``engine.scheduling.flavors``)."""
        tenant = self.request.tenant
        self.flavor = flavor
        self.ledger = ledger_key(tenant, flavor)
        self.placed_shape = (self.shape, flavor)

    @property
    def key(self) -> QueueKey:
        user = self.request.user
        return (-self.prio, self.shape, self.preemptible, user) if user else (-self.prio, self.shape, self.preemptible)


@dataclass(frozen=True, slots=True)
class Notice:
    """A preemption decided for a running gang that has not released yet (``describe`` shows it)."""

    cause: str
    by: str  # the gang it makes room for, or the node being drained
    by_tenant: str
    since: float
    grace_s: float
    cost_gpu_s: float | None = None  # what the victim was expected to lose (``Preempted.cost_gpu_s``)

    def row(self) -> list[Any]:
        cost = [] if self.cost_gpu_s is None else [self.cost_gpu_s]  # rows grow at their end, only when set
        return [self.cause, self.by, self.by_tenant, self.since, self.grace_s, *cost]


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A running gang's last durable checkpoint, as its GangTask reported it (``GangCheckpointed``)."""

    step: int
    at: float  # when it was saved (seconds since the epoch, as the Scheduler's clock)
    save_s: float  # what the save took
    restore_s: float | None  # measured: a resumed attempt's start to its first new step (None: not yet known)
    relaunch_s: float | None  # measured: this attempt's start to its first step (None: not yet known)
    #: the time between this attempt's last two checkpoints, its interval (None: one reported so far)
    every_s: float | None = None

    def row(self) -> list[Any]:
        row = [self.step, self.at, self.save_s, self.restore_s, self.relaunch_s]
        return row if self.every_s is None else [*row, self.every_s]  # rows from before it have five items


@dataclass(slots=True)
class Running:
    request: GangRequest
    placement: Placement
    seq: int  # its place in the order (kept when a preempted gang comes back)
    admit_seq: int
    admitted_at: float
    prio: int
    preemptible: bool
    vec: Vec
    backfill: bool
    preempted_for: str | None = None  # the pending gang it makes room for (a drain names no gang)
    #: set once the gang is preempted (for a gang or a drain): it is never chosen again, and it comes back
    #: at its place in the order when it releases
    preemption: Notice | None = None
    checkpoint: Checkpoint | None = None  # its attempt's last durable checkpoint, None: none reported
    flavor: str | None = None  # the flavor it was admitted on (None without flavors)
    ledger: str = ""  # its tenant's key in the tenancy ledger (``Queued.ledger``), kept by ``on``

    def __post_init__(self) -> None:
        self.on(self.flavor)

    def on(self, flavor: str | None) -> None:
        tenant = self.request.tenant
        self.flavor = flavor
        self.ledger = ledger_key(tenant, flavor)


def shape_of(request: GangRequest) -> Shape:
    shape = (request.nnodes, request.gpus_per_node, millicores(request.cpus_per_node), request.mem_per_node)
    tag = shape_tag(request)
    return shape if tag is None else (*shape, tag)


def shape_tag(request: GangRequest) -> str | None:
    """What a constrained request adds to its shape (gangs of one shape are placed alike), else None."""
    if request.topology_required:
        return f"required:{request.topology_required}"
    if request.topology_preferred:
        wait = request.topology_wait_s
        return f"preferred:{request.topology_preferred}" + (f"@{wait:g}" if wait is not None else "")
    return None
