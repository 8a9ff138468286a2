"""A JSON-able summary of the scheduler state for ``gangflow queue`` and the Scheduler's query handler."""

from __future__ import annotations

from typing import Any

from engine.scheduling.capacity import Ledger
from engine.scheduling.model import ClusterState
from engine.scheduling.policy import pending_reasons

__all__ = ["describe"]


def describe(state: ClusterState) -> dict[str, Any]:
    """Nodes (sorted by id) with capacity and the gangs on them, running gangs, and the queue in order.

    Pending reasons are recomputed from the state rather than read from it, so a state built by hand
    (tests, tools) is described just as ``step`` would explain it; after a ``step`` they are identical.
    Only plain str / int / float / bool / None / list / dict values, so ``json.dumps`` takes it as is.
    """
    ledger = Ledger(state.running)
    nodes: list[dict[str, Any]] = []
    for node_id, node in sorted(state.nodes.items()):
        use = ledger.usage(node)
        spec = node.spec
        nodes.append(
            {
                "node_id": node_id,
                "address": spec.address,
                "alive": node.alive,
                "gpus_total": spec.gpus,
                "gpus_free": len(use.free_gpu_ids),
                "free_gpu_ids": list(use.free_gpu_ids),
                "cpus_total": spec.cpus,
                "cpus_free": use.free_cpus,
                "mem_total": spec.mem,
                "mem_free": use.free_mem,
                "gangs": sorted(set(use.gangs)),
            }
        )
    running = [
        {
            "gang_id": gang_id,
            "tenant": alloc.request.tenant,
            "nnodes": alloc.request.nnodes,
            "gpus_per_node": alloc.request.gpus_per_node,
            "cpus_per_node": alloc.request.cpus_per_node,
            "mem_per_node": alloc.request.mem_per_node,
            "nodes": [
                {"node_id": a.node_id, "address": a.address, "node_rank": a.node_rank, "gpu_ids": list(a.gpu_ids)}
                for a in alloc.placement.nodes
            ],
        }
        for gang_id, alloc in sorted(state.running.items())
    ]
    reasons = pending_reasons(state)
    pending = [
        {
            "position": position + 1,
            "gang_id": q.request.gang_id,
            "tenant": q.request.tenant,
            "nnodes": q.request.nnodes,
            "gpus_per_node": q.request.gpus_per_node,
            "cpus_per_node": q.request.cpus_per_node,
            "mem_per_node": q.request.mem_per_node,
            "reason": reasons[q.request.gang_id],
        }
        for position, q in enumerate(state.queue)
    ]
    alive = [n for n in state.nodes.values() if n.alive]
    totals = {
        "nodes": len(state.nodes),
        "alive_nodes": len(alive),
        "gpus_total": sum(n.spec.gpus for n in alive),
        "gpus_free": sum(entry["gpus_free"] for entry in nodes),
        "running": len(running),
        "pending": len(pending),
    }
    return {"totals": totals, "nodes": nodes, "running": running, "pending": pending}
