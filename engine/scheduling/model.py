"""The scheduler's data: node inventory, gang requests, placements and the cluster state.

Everything is a frozen pydantic model, for two reasons: the policy can never mutate what it was given
(``step`` returns a new state), and the state crosses a Temporal continue-as-new as plain JSON
(``ClusterState.model_dump(mode="json")`` → ``ClusterState.model_validate(...)``).

Only facts are stored: which nodes exist and whether they are alive, what is queued, what is running.
What is *free* on a node (GPU ids, CPUs, memory) is derived from the running allocations by
``engine.scheduling.capacity``, so it can never drift from them.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "DEFAULT_LOST_NODE_WAIT_S",
    "DEFAULT_NODE_TTL_S",
    "Allocation",
    "ClusterState",
    "GangRequest",
    "NodeAssignment",
    "NodeSpec",
    "NodeState",
    "Placement",
    "QueuedGang",
]


#: node agents re-register every 5 s; three missed registrations and a margin make a node lost
DEFAULT_NODE_TTL_S = 20.0
#: how long a gang waits for lost nodes (a cluster restarting after maintenance) before it is rejected
DEFAULT_LOST_NODE_WAIT_S = 600.0


class Frozen(BaseModel):
    """Base of every scheduling model: immutable, no unknown keys, no NaN/inf (they are not JSON)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class NodeSpec(Frozen):
    """The capacity a node agent registers. GPU slots are numbered ``0..gpus-1``.

    Validated on construction: the agent builds it from its own machine, so a bad value is the
    operator's mistake and should fail there, before it reaches the scheduler.
    ``mem`` is bytes; ``None`` means the agent does not report memory and memory is not checked on it.
    """

    node_id: str = Field(min_length=1)
    address: str
    gpus: int = Field(ge=0)
    cpus: float = Field(ge=0)
    mem: int | None = Field(default=None, ge=0)


class GangRequest(Frozen):
    """One distributed task attempt: ``nnodes`` distinct nodes, each offering the per-node amounts.

    Deliberately *not* range-checked here: the request comes from a GangRun workflow that waits for a
    decision, so a malformed one must turn into a ``Rejected`` with a reason (``step`` does that), not
    into a validation error inside the Scheduler workflow. ``mem_per_node=None`` means "don't care".
    ``tenant`` is carried for quotas and fair share (not enforced yet) and shown by ``describe``.
    """

    gang_id: str
    nnodes: int
    gpus_per_node: int = 0
    cpus_per_node: float = 1.0
    mem_per_node: int | None = None
    tenant: str = "default"
    #: how long the gang may wait for lost nodes to come back when only they could hold it; then rejected
    lost_node_wait_s: float = DEFAULT_LOST_NODE_WAIT_S


class NodeAssignment(Frozen):
    """One node of a placement: where its ranks run and which GPU ids they get (``CUDA_VISIBLE_DEVICES``)."""

    node_id: str
    address: str
    node_rank: int
    gpu_ids: tuple[int, ...]


class Placement(Frozen):
    """Where a whole gang runs; ``nodes`` is ordered by ``node_rank`` (0 first)."""

    gang_id: str
    nodes: tuple[NodeAssignment, ...]


class NodeState(Frozen):
    """A registered node. Its usage is derived from ``ClusterState.running`` (see ``capacity``).

    ``last_seen`` is when it last registered (seconds, the Scheduler's workflow clock): a node that
    stops re-registering is declared lost after ``ClusterState.node_ttl_s``, whether or not a gang
    runs on it.
    """

    spec: NodeSpec
    alive: bool = True
    last_seen: float = 0.0

    @property
    def node_id(self) -> str:
        return self.spec.node_id


class Allocation(Frozen):
    """A running gang: what it asked for and where it was put.

    The request is kept because it says how many CPUs and bytes of memory the gang took on each of its
    nodes; the placement says which GPU ids. Together they are everything the gang holds.
    """

    request: GangRequest
    placement: Placement


class QueuedGang(Frozen):
    """A pending request and the last pending reason sent for it (to send ``Pending`` only on change).

    ``lost_wait_since`` is set while the gang could only fit if lost nodes came back (after a
    whole-cluster restart, say): it then waits for them, without holding up the gangs behind it,
    until ``request.lost_node_wait_s`` has passed.
    """

    request: GangRequest
    reason: str = ""
    lost_wait_since: float | None = None


class ClusterState(Frozen):
    """The whole scheduler state: the input and output of ``step``.

    ``nodes`` and ``running`` are keyed by node id and gang id; ``queue`` is strict FIFO, head first.
    Dicts keep insertion order through JSON, but nothing relies on it: every choice the policy makes
    sorts explicitly, so a state that went through continue-as-new decides exactly as before.
    """

    nodes: dict[str, NodeState] = Field(default_factory=dict)
    queue: tuple[QueuedGang, ...] = ()
    running: dict[str, Allocation] = Field(default_factory=dict)
    #: a node not re-registered for this long is lost (agents re-register every few seconds)
    node_ttl_s: float = Field(default=DEFAULT_NODE_TTL_S, gt=0)

    @model_validator(mode="after")
    def _consistent(self) -> ClusterState:
        # cheap checks that catch a hand-edited or mis-merged state at the continue-as-new boundary
        for key, node in self.nodes.items():
            if key != node.spec.node_id:
                raise ValueError(f"node key {key!r} does not match its spec's node_id {node.spec.node_id!r}")
        for key, alloc in self.running.items():
            if not key == alloc.request.gang_id == alloc.placement.gang_id:
                raise ValueError(f"running key {key!r} does not match its request and placement gang ids")
        queued = [q.request.gang_id for q in self.queue]
        if len(set(queued)) != len(queued):
            raise ValueError("a gang id appears twice in the queue")
        both = set(queued) & self.running.keys()
        if both:
            raise ValueError(f"gang ids both queued and running: {sorted(both)}")
        return self

    def queued_ids(self) -> tuple[str, ...]:
        """Gang ids in queue order, head first."""
        return tuple(q.request.gang_id for q in self.queue)
