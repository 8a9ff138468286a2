"""What crosses the scheduler's boundary: node capacity, gang requests and placements.

Frozen pydantic models: they travel as JSON in signals, updates and histories, and nobody can change a
request or a placement after it was made. The policy's own working state is mutable and private
(``engine.scheduling.policy``); it crosses a continue-as-new as ``Policy.snapshot()``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from engine.core.protocol import DEFAULT_TENANT

__all__ = [
    "DEFAULT_LOST_NODE_WAIT_S",
    "DEFAULT_NODE_TTL_S",
    "Frozen",
    "GangRequest",
    "NodeAssignment",
    "NodeSpec",
    "Placement",
]


#: a node is lost after this long without a sign of life: its lease's heartbeat timeout (workflows.node_lease),
#: and for agents from before leases, which re-register every 5 s, three missed registrations and a margin
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
    ``sandboxed``: the agent confines its gangs' ranks (their own user and cgroup: engine.executor.sandbox);
    agents that do not say so (older ones, or not running as root) do not.
    ``leased``: the node's liveness is its lease (workflows.node_lease), which tells the Scheduler when the
    node is lost; the Scheduler never expires it itself. Agents from before leases re-register every 5 s and
    expire after ``DEFAULT_NODE_TTL_S`` without one.
    """

    node_id: str = Field(min_length=1)
    address: str
    gpus: int = Field(ge=0)
    cpus: float = Field(ge=0)
    mem: int | None = Field(default=None, ge=0)
    sandboxed: bool = False
    leased: bool = False
    #: the node's labels (``gangflow node --labels gpu=h100,zone=a`` plus what the agent detects, e.g. the GPU
    #: model): flavors and node selectors match them, topology levels (``block``, ``rack``) are read from them
    labels: dict[str, str] = Field(default_factory=dict)


class GangRequest(Frozen):
    """One distributed task attempt: ``nnodes`` distinct nodes, each offering the per-node amounts.

    Deliberately *not* range-checked here: the request comes from a GangTask workflow that waits for a
    decision, so a malformed one must turn into a ``GangRejected`` with a reason (``step`` does that), not
    into a validation error inside the Scheduler workflow. ``mem_per_node=None`` means "don't care".
    ``tenant`` and ``priority`` (a priority class name; None = the configuration's default) are resolved
    against the queue configuration when the request arrives. ``preemptible=False`` (a task's own
    ``@task(gang=Gang(preemptible=False))``) protects it even in a preemptible priority class.
    """

    gang_id: str
    nnodes: int
    gpus_per_node: int = 0
    cpus_per_node: float = 1.0
    mem_per_node: int | None = None
    tenant: str = DEFAULT_TENANT
    priority: str | None = None
    preemptible: bool = True
    #: how long the gang may wait for lost nodes to come back when only they could hold it; then rejected
    lost_node_wait_s: float = DEFAULT_LOST_NODE_WAIT_S
    #: the flavors the gang may run on, tried in this order (``Resources(flavor=...)``); empty: any of its tenant's
    flavors: tuple[str, ...] = ()
    #: node labels every node of the gang must carry (``Resources(node_selector=...)``)
    node_selector: dict[str, str] = Field(default_factory=dict)
    #: the taints (of flavors) the gang tolerates (``Resources(tolerations=[...])``)
    tolerations: tuple[str, ...] = ()
    #: topology level (a node label the queue file's ``topology`` declares) all its nodes must share, or it waits
    topology_required: str | None = None
    #: topology level whose domains the gang should span as few of as the policy can find now
    topology_preferred: str | None = None
    #: with ``topology_preferred``: how long (s) it waits for one domain once it could start over several
    #: (``Topology(wait=...)``); None: it never waits for one
    topology_wait_s: float | None = None
    #: who started the run (the token's ``sub`` where the gateway stamps it, else the client's login name):
    #: fair share orders a tenant's gangs by their users' usage (``engine.scheduling.users``); "": no user
    user: str = ""


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
