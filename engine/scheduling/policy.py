"""The scheduling policy: ``step(state, event) -> (state, decisions)``, pure and deterministic.

It runs inside the Scheduler workflow, so it uses no clocks, no randomness, no I/O and never mutates
its input; the same state and event always give the same answer, also after a continue-as-new.

Admission is **strict FIFO and all-or-nothing**. After each event the head of the queue is admitted
only if *all* of its nodes can be placed at once, and admission repeats while the new head fits. If
the head does not fit, nothing behind it starts, even a small gang that would fit: there is no
backfill. That is a deliberate choice: with backfill, a stream of small gangs can keep a big gang
waiting forever (it needs many nodes free at the same moment); without it, every gang starts after a
bounded wait, at the price of some idle capacity while the head waits. Quotas, priorities and
checkpoint-aware preemption will refine this order later.

A request is rejected only when it is submitted: malformed, a duplicate id, or too big for the *alive*
cluster even when idle. A queued gang is never rejected later: if node losses make it unfittable it
keeps waiting (the nodes may come back), its reason says so, and it holds the head of the queue
meanwhile; the GangRun that submitted it decides how long to wait and may release it.

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

from engine.scheduling.capacity import Ledger
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
from engine.scheduling.reasons import behind_reason, head_reason, malformed_reason, never_fits_reason

__all__ = ["pending_reasons", "place", "step"]


def step(state: ClusterState, event: Event) -> tuple[ClusterState, list[Decision]]:
    """Apply one event, then admit what fits; return the new state and the decisions to send."""
    # working copies: the input state (and its dicts) are never touched
    nodes = dict(state.nodes)
    queue = list(state.queue)
    running = dict(state.running)
    decisions: list[Decision] = []

    if isinstance(event, NodeRegistered):
        # a re-registration replaces the capacity and revives the node; its allocations stay in `running`
        nodes[event.spec.node_id] = NodeState(spec=event.spec, alive=True)
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

    ledger = Ledger(running)
    admitted = 0
    for queued in queue:
        placement = _place(queued.request, nodes, ledger)
        if placement is None:
            break  # strict FIFO: nothing overtakes a head that does not fit (see the module docstring)
        for assignment in placement.nodes:
            ledger.take(queued.request, assignment.node_id, assignment.gpu_ids)
        running[queued.request.gang_id] = Allocation(request=queued.request, placement=placement)
        decisions.append(Admitted(placement=placement))
        admitted += 1
    queue = queue[admitted:]

    still: list[QueuedGang] = []
    reasons = _pending_reasons([q.request for q in queue], nodes, ledger)
    for queued, reason in zip(queue, reasons, strict=True):
        if reason != queued.reason:
            decisions.append(Pending(gang_id=queued.request.gang_id, reason=reason))
            queued = queued.model_copy(update={"reason": reason})
        still.append(queued)

    return ClusterState(nodes=nodes, queue=tuple(still), running=running), decisions


def place(state: ClusterState, request: GangRequest) -> Placement | None:
    """Where ``request`` would go right now, ignoring the queue; None if it does not fit (a what-if)."""
    if malformed_reason(request) is not None:
        return None
    return _place(request, state.nodes, Ledger(state.running))


def pending_reasons(state: ClusterState) -> dict[str, str]:
    """Why each queued gang waits, in queue order (what ``step`` last sent as ``Pending``)."""
    requests = [q.request for q in state.queue]
    reasons = _pending_reasons(requests, state.nodes, Ledger(state.running))
    return {request.gang_id: reason for request, reason in zip(requests, reasons, strict=True)}


def _pending_reasons(requests: list[GangRequest], nodes: Mapping[str, NodeState], ledger: Ledger) -> list[str]:
    reasons = []
    for position, request in enumerate(requests):
        if position == 0:
            reasons.append(head_reason(request, nodes, ledger))
        else:
            fits_now = _place(request, nodes, ledger) is not None
            reasons.append(behind_reason(request, position, requests[0].gang_id, fits_now))
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
    return never_fits_reason(request, nodes)


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
