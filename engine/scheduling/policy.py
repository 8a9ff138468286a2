"""The scheduling policy: ``step(state, event, now) -> (state, decisions)``, pure and deterministic.

It runs inside the Scheduler workflow, so it reads no clock (time comes in as ``now``, the workflow's
own deterministic clock), uses no randomness, no I/O and never mutates its input; the same state,
event and ``now`` always give the same answer, also after a continue-as-new.

Admission is **strict FIFO and all-or-nothing**. After each event the head of the queue is admitted
only if *all* of its nodes can be placed at once, and admission repeats while the new head fits. If
the head does not fit, nothing behind it starts, even a small gang that would fit: there is no
backfill. That is a deliberate choice: with backfill, a stream of small gangs can keep a big gang
waiting forever (it needs many nodes free at the same moment); without it, every gang starts after a
bounded wait, at the price of some idle capacity while the head waits. Quotas, priorities and
checkpoint-aware preemption will refine this order later.

A request is rejected when it is submitted if it is malformed, a duplicate id, or too big for every
*registered* node even when idle (lost nodes count: after a whole-cluster restart the nodes are expected
back). A gang that only lost nodes could hold **waits for them** without holding the head of the queue
(it cannot start anyway, so reserving for it would only block everyone behind it), and is rejected once
it waited ``request.lost_node_wait_s`` for them. A node that has not re-registered for
``state.node_ttl_s`` is lost, whether or not a gang runs on it; its next registration revives it.

Placement is **best fit**: one node's share goes to each of ``nnodes`` distinct alive nodes that have
room, preferring the nodes with the fewest free GPUs, then the fewest free CPUs, then the lowest node
id, so small gangs fill partly used nodes and leave whole nodes for big gangs. Each node gets its
lowest free GPU ids. Node ranks are then numbered in node-id order (rank 0, which hosts the
rendezvous, is the lowest id), so a user reading the placement can predict the ranks.

Decisions, in order: the ``Rejected`` the event itself caused, ``Admitted`` in queue order, then one
``Pending`` for every queued gang whose reason text changed (a newly queued gang always gets one).
Reasons mention the free capacity and the queue position, so they change as other gangs come and go;
a gang does not get the same reason twice in a row.
"""

from __future__ import annotations

from collections.abc import Mapping

from engine.scheduling.capacity import Ledger, fits_idle_cluster
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
)
from engine.scheduling.model import (
    Allocation,
    ClusterState,
    GangRequest,
    NodeAssignment,
    NodeState,
    Placement,
    QueuedGang,
)
from engine.scheduling.reasons import (
    behind_reason,
    head_reason,
    lost_wait_expired_reason,
    lost_wait_reason,
    malformed_reason,
    never_fits_reason,
)

__all__ = ["next_deadline", "pending_reasons", "place", "step"]


def step(state: ClusterState, event: Event, now: float | None = None) -> tuple[ClusterState, list[Decision]]:
    """Apply one event, then admit what fits; return the new state and the decisions to send.

    ``now`` (seconds on the Scheduler's workflow clock) drives the time-based rules: node expiry and
    the bounded wait for lost nodes. Without it (unit tests of the pure rules) no deadline fires.
    """
    # working copies: the input state (and its dicts) are never touched
    nodes = dict(state.nodes)
    queue = list(state.queue)
    running = dict(state.running)
    decisions: list[Decision] = []

    if isinstance(event, NodeRegistered):
        # a re-registration replaces the capacity and revives the node; its allocations stay in `running`
        nodes[event.spec.node_id] = NodeState(spec=event.spec, alive=True, last_seen=now or 0.0)
    elif isinstance(event, NodeLost):
        node = nodes.get(event.node_id)
        if node is not None and node.alive:
            nodes[event.node_id] = node.model_copy(update={"alive": False})
    elif isinstance(event, GangSubmitted):
        refusal = _refusal(event.request, nodes, queue, running)
        if refusal is None:
            queue.append(QueuedGang(request=event.request))
        else:
            decisions.append(Rejected(gang_id=event.request.gang_id, reason=refusal))
    elif isinstance(event, GangReleased):
        running.pop(event.gang_id, None)
        queue = [q for q in queue if q.request.gang_id != event.gang_id]
    if now is not None:
        _expire_silent_nodes(nodes, state.node_ttl_s, now)

    # gangs that only lost nodes could hold: they wait for them without holding the queue (nodes do not
    # change below, so this is decided once per step)
    lost_waiters = {q.request.gang_id for q in queue if not fits_idle_cluster(q.request, nodes)}
    ledger = Ledger(running)
    admitted: set[str] = set()
    for queued in queue:
        if queued.request.gang_id in lost_waiters:
            continue  # holding the queue for lost nodes could block everyone for good
        placement = _place(queued.request, nodes, ledger)
        if placement is None:
            break  # strict FIFO: nothing overtakes a head that does not fit (see the module docstring)
        for assignment in placement.nodes:
            ledger.take(queued.request, assignment.node_id, assignment.gpu_ids)
        running[queued.request.gang_id] = Allocation(request=queued.request, placement=placement)
        decisions.append(Admitted(placement=placement))
        admitted.add(queued.request.gang_id)

    waiting: list[QueuedGang] = []
    for queued in queue:
        gang_id = queued.request.gang_id
        if gang_id in admitted:
            continue
        since = None
        if gang_id in lost_waiters:
            since = queued.lost_wait_since if queued.lost_wait_since is not None else now
            if since is not None and now is not None and now - since >= queued.request.lost_node_wait_s:
                decisions.append(Rejected(gang_id=gang_id, reason=lost_wait_expired_reason(queued.request, nodes)))
                continue
        waiting.append(
            queued if since == queued.lost_wait_since else queued.model_copy(update={"lost_wait_since": since})
        )

    still: list[QueuedGang] = []
    reasons = _pending_reasons([q.request for q in waiting], nodes, ledger, lost_waiters)
    for queued, reason in zip(waiting, reasons, strict=True):
        if reason != queued.reason:
            decisions.append(Pending(gang_id=queued.request.gang_id, reason=reason))
            queued = queued.model_copy(update={"reason": reason})
        still.append(queued)

    return state.model_copy(update={"nodes": nodes, "queue": tuple(still), "running": running}), decisions


def next_deadline(state: ClusterState) -> float | None:
    """When ``step`` would next change something on its own (a node expiring, a lost-node wait running
    out): the Scheduler sleeps until then and sends a ``Tick``. None: no deadline pending."""
    deadlines = [node.last_seen + state.node_ttl_s for node in state.nodes.values() if node.alive]
    deadlines += [q.lost_wait_since + q.request.lost_node_wait_s for q in state.queue if q.lost_wait_since is not None]
    return min(deadlines) if deadlines else None


def _expire_silent_nodes(nodes: dict[str, NodeState], ttl: float, now: float) -> None:
    for node_id, node in list(nodes.items()):
        if node.alive and now - node.last_seen > ttl:
            nodes[node_id] = node.model_copy(update={"alive": False})


def place(state: ClusterState, request: GangRequest) -> Placement | None:
    """Where ``request`` would go right now, ignoring the queue; None if it does not fit (a what-if)."""
    if malformed_reason(request) is not None:
        return None
    return _place(request, state.nodes, Ledger(state.running))


def pending_reasons(state: ClusterState) -> dict[str, str]:
    """Why each queued gang waits, in queue order (what ``step`` last sent as ``Pending``)."""
    requests = [q.request for q in state.queue]
    lost_waiters = {r.gang_id for r in requests if not fits_idle_cluster(r, state.nodes)}
    reasons = _pending_reasons(requests, state.nodes, Ledger(state.running), lost_waiters)
    return {request.gang_id: reason for request, reason in zip(requests, reasons, strict=True)}


def _pending_reasons(
    requests: list[GangRequest], nodes: Mapping[str, NodeState], ledger: Ledger, lost_waiters: set[str]
) -> list[str]:
    reasons = []
    head: GangRequest | None = None
    ahead = 0
    for request in requests:
        if request.gang_id in lost_waiters:
            reasons.append(lost_wait_reason(request, nodes))
        elif head is None:
            head = request
            reasons.append(head_reason(request, nodes, ledger))
            ahead = 1
        else:
            fits_now = _place(request, nodes, ledger) is not None
            reasons.append(behind_reason(request, ahead, head.gang_id, fits_now))
            ahead += 1
    return reasons


def _refusal(
    request: GangRequest,
    nodes: Mapping[str, NodeState],
    queue: list[QueuedGang],
    running: Mapping[str, Allocation],
) -> str | None:
    malformed = malformed_reason(request)
    if malformed is not None:
        return malformed
    if request.gang_id in running:
        return f"rejected: gang id {request.gang_id!r} is already running; release it before submitting it again"
    if any(q.request.gang_id == request.gang_id for q in queue):
        return f"rejected: gang id {request.gang_id!r} is already queued"
    return never_fits_reason(request, nodes, count_lost=True)


def _place(request: GangRequest, nodes: Mapping[str, NodeState], ledger: Ledger) -> Placement | None:
    candidates = [node.spec for node in nodes.values() if node.alive and not ledger.shortfalls(node.spec, request)]
    if len(candidates) < request.nnodes:
        return None
    # best fit: the tightest nodes first, so whole nodes stay free for big gangs
    candidates.sort(key=lambda s: (len(ledger.free_gpu_ids(s)), ledger.free_millicores(s), s.node_id))
    chosen = sorted(candidates[: request.nnodes], key=lambda s: s.node_id)
    return Placement(
        gang_id=request.gang_id,
        nodes=tuple(
            NodeAssignment(
                node_id=spec.node_id,
                address=spec.address,
                node_rank=rank,
                gpu_ids=tuple(ledger.free_gpu_ids(spec)[: request.gpus_per_node]),
            )
            for rank, spec in enumerate(chosen)
        ),
    )
