"""The words users see: why a gang is rejected or still pending.

"Why is my job pending?" is the most common question about any batch queue, so a reason says what the
gang needs, what is free, what blocks it (which nodes, held by which gangs) and whether it can only
start after lost nodes come back. The texts are deterministic (sorted, no clocks) because they are part
of the policy's output and of the state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from engine.scheduling.capacity import MILLI, Ledger, fits_idle, fits_idle_cluster, millicores
from engine.scheduling.model import GangRequest, NodeSpec, NodeState

__all__ = [
    "behind_reason",
    "head_reason",
    "lost_wait_expired_reason",
    "lost_wait_reason",
    "malformed_reason",
    "needs",
    "never_fits_reason",
]

#: how many node or gang ids a reason lists before saying "and N more" (reasons stay one line)
_LIST_LIMIT = 4


def _num(x: float) -> str:
    # millicore precision: "1", "0.5", "0.125", never "1e+06" or "0.30000000000000004"
    return f"{x:.3f}".rstrip("0").rstrip(".")


def _count(n: float, word: str) -> str:
    return f"{_num(n)} {word}" if n == 1 else f"{_num(n)} {word}s"


def _bytes(n: int) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{_num(round(n / size, 1))} {unit}"
    return f"{n} B"


def _ids(ids: Sequence[str]) -> str:
    shown = ", ".join(ids[:_LIST_LIMIT])
    return shown if len(ids) <= _LIST_LIMIT else f"{shown} and {len(ids) - _LIST_LIMIT} more"


def _has(n: int) -> str:
    return f"{_count(n, 'node')} {'has' if n == 1 else 'have'}"


def per_node(request: GangRequest) -> str:
    """One node's share: ``"2 GPUs, 1 CPU, 8 GiB"``."""
    parts = [_count(request.gpus_per_node, "GPU")] if request.gpus_per_node else []
    parts.append(_count(millicores(request.cpus_per_node) / MILLI, "CPU"))
    if request.mem_per_node is not None:
        parts.append(_bytes(request.mem_per_node))
    return ", ".join(parts)


def needs(request: GangRequest) -> str:
    """The whole request: ``"4 GPUs on 2 nodes (2 GPUs, 1 CPU per node)"`` or ``"2 nodes (4 CPUs per node)"``."""
    shape = f"{per_node(request)} per node"
    if request.gpus_per_node:
        total = request.gpus_per_node * request.nnodes
        return f"{_count(total, 'GPU')} on {_count(request.nnodes, 'node')} ({shape})"
    return f"{_count(request.nnodes, 'node')} ({shape})"


def malformed_reason(request: GangRequest) -> str | None:
    """Why the request can never be valid, or None."""
    problems = []
    if not request.gang_id:
        problems.append("gang_id is empty")
    if request.nnodes < 1:
        problems.append(f"nnodes must be at least 1, got {request.nnodes}")
    if request.gpus_per_node < 0:
        problems.append(f"gpus_per_node must not be negative, got {request.gpus_per_node}")
    if request.cpus_per_node < 0:
        problems.append(f"cpus_per_node must not be negative, got {_num(request.cpus_per_node)}")
    if request.mem_per_node is not None and request.mem_per_node < 0:
        problems.append(f"mem_per_node must not be negative, got {request.mem_per_node}")
    return f"rejected: malformed request: {'; '.join(problems)}" if problems else None


def _lost(nodes: Mapping[str, NodeState]) -> list[str]:
    return sorted(node_id for node_id, node in nodes.items() if not node.alive)


def _big_enough(request: GangRequest, nodes: Mapping[str, NodeState], *, count_lost: bool) -> list[NodeSpec]:
    return [n.spec for _, n in sorted(nodes.items()) if (n.alive or count_lost) and fits_idle(n.spec, request)]


def never_fits_reason(request: GangRequest, nodes: Mapping[str, NodeState], count_lost: bool = False) -> str | None:
    """Why the request cannot fit the alive cluster (with ``count_lost``: every registered node) even with
    nothing running, or None if it could."""
    if fits_idle_cluster(request, nodes, count_lost=count_lost):
        return None
    counted = [node.spec for _, node in sorted(nodes.items()) if node.alive or count_lost]
    big = len(_big_enough(request, nodes, count_lost=count_lost))
    lost = _lost(nodes)
    if count_lost and lost:
        of, tail = f"{_count(len(counted), 'registered node')} ({len(lost)} of them lost)", ""
    else:
        of = _count(len(counted), "alive node")
        tail = f"; {_count(len(lost), 'lost node')} not counted: {_ids(lost)}" if lost else ""
    if not counted:
        return f"rejected: needs {needs(request)}; no alive node is registered{tail}"
    largest = [_count(max(s.gpus for s in counted), "GPU"), _count(max(s.cpus for s in counted), "CPU")]
    mems = [s.mem for s in counted if s.mem is not None]
    if request.mem_per_node is not None and mems:
        largest.append(_bytes(max(mems)))
    return (
        f"rejected: needs {needs(request)}; only {big} of {of} "
        f"{'is' if big == 1 else 'are'} that big even when idle (largest: {', '.join(largest)}){tail}"
    )


def lost_wait_reason(request: GangRequest, nodes: Mapping[str, NodeState]) -> str:
    """Why a gang that only lost nodes could hold waits (it does not hold up the queue meanwhile)."""
    lost = [s.node_id for s in _big_enough(request, nodes, count_lost=True) if not nodes[s.node_id].alive]
    alive = len(_big_enough(request, nodes, count_lost=False))
    return (
        f"pending: needs {needs(request)}; only {alive} alive {'node is' if alive == 1 else 'nodes are'} big enough "
        f"even when idle: waiting for lost {'node' if len(lost) == 1 else 'nodes'} {_ids(lost)} to come back "
        f"(up to {_num(request.lost_node_wait_s)} s; gangs behind it may start meanwhile)"
    )


def lost_wait_expired_reason(request: GangRequest, nodes: Mapping[str, NodeState]) -> str:
    lost = [s.node_id for s in _big_enough(request, nodes, count_lost=True) if not nodes[s.node_id].alive]
    return (
        f"unschedulable: needs {needs(request)}; waited {_num(request.lost_node_wait_s)} s for lost "
        f"{'node' if len(lost) == 1 else 'nodes'} {_ids(lost)} to come back, and they did not"
    )


def head_reason(request: GangRequest, nodes: Mapping[str, NodeState], ledger: Ledger) -> str:
    """Why the head of the queue does not fit now: what it needs, what is free, who holds the rest."""
    alive = [node.spec for _, node in sorted(nodes.items()) if node.alive]
    parts = [f"pending: needs {needs(request)}"]
    if not alive:
        parts.append("no alive node is registered")
    elif request.gpus_per_node:
        free = [len(ledger.free_gpu_ids(spec)) for spec in alive]
        with_free = sum(1 for f in free if f)
        parts.append(f"{_count(sum(free), 'GPU')} free on {with_free} of {_count(len(alive), 'alive node')}")
    else:
        free_mc = [ledger.free_millicores(spec) for spec in alive]
        with_free = sum(1 for f in free_mc if f)
        parts.append(f"{_count(sum(free_mc) / MILLI, 'CPU')} free on {with_free} of {_count(len(alive), 'alive node')}")
    if alive:
        fit = sum(1 for spec in alive if not ledger.shortfalls(spec, request))
        share = per_node(request)
        if fit == 0:
            parts.append(f"no node has {share} free, {request.nnodes} needed")
        else:
            parts.append(f"only {_has(fit)} {share} free, {request.nnodes} needed")
        busy = []
        for spec in alive:
            short = ledger.shortfalls(spec, request)
            if short and fits_idle(spec, request):
                gangs = sorted(set(ledger.gangs_on(spec.node_id)))
                held = f" (held by {_ids(gangs)})" if gangs else ""
                busy.append(f"{spec.node_id} short of {'/'.join(short)}{held}")
        if busy:
            parts.append(f"busy: {_ids(busy)}")
    lost = _lost(nodes)
    if lost:
        parts.append(f"{_count(len(lost), 'lost node')} not offered: {_ids(lost)}")
    return "; ".join(parts)


def behind_reason(request: GangRequest, ahead: int, head_id: str, fits_now: bool) -> str:
    """Why a gang behind the head waits: strict FIFO (no backfill), whatever is free. ``ahead`` counts
    the gangs ahead of it that hold the queue (gangs waiting for lost nodes do not)."""
    reason = (
        f"pending: {_count(ahead, 'gang')} ahead in the queue, head {head_id!r} "
        f"(strict FIFO: gangs start in submission order); needs {needs(request)}"
    )
    return f"{reason}; it would fit now" if fits_now else reason
