"""Free capacity of each node, derived from the running allocations.

Nothing here is stored in the state: usage is recomputed from ``ClusterState.running`` (one pass over
the allocations per ``step``), so "free" can never disagree with "what the running gangs hold".

CPUs are accounted in integer millicores, as Kubernetes does: summing and subtracting floats such as
0.1 drifts (0.1 + 0.2 > 0.3), which would make a gang that exactly fills a node not fit. Requests finer
than a millicore are rounded to the nearest one.

A node re-registered with *less* capacity than its running gangs hold (an edge case: an operator shrank
it under load) keeps those allocations; its free amounts are clamped at zero and GPU ids above the new
count are simply not offered, so nothing new lands there until the old gangs release.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from engine.scheduling.model import Allocation, ClusterState, Frozen, GangRequest, NodeSpec, NodeState

__all__ = ["NodeUsage", "fits_idle_cluster", "millicores", "usage"]

MILLI = 1000


def millicores(cpus: float) -> int:
    """CPUs as integer millicores (exact accounting; see the module docstring)."""
    return round(cpus * MILLI)


class NodeUsage(Frozen):
    """A read-only view of one node: what the running gangs hold on it and what is left."""

    node_id: str
    gangs: tuple[str, ...]
    used_gpu_ids: tuple[int, ...]
    free_gpu_ids: tuple[int, ...]
    used_cpus: float
    free_cpus: float
    used_mem: int
    free_mem: int | None


@dataclass
class _Held:
    """Mutable tally for one node, private to a single ``Ledger`` (one ``step``)."""

    gpu_ids: set[int] = field(default_factory=set)
    millicores: int = 0
    mem: int = 0
    gangs: list[str] = field(default_factory=list)


class Ledger:
    """Usage of every node, built from the running allocations and updated as gangs are admitted.

    Lives only inside one ``step`` (or one ``describe``): it is the working copy that lets admission
    place several gangs in a row without rebuilding the state after each one.
    """

    def __init__(self, running: Mapping[str, Allocation]) -> None:
        self._held: dict[str, _Held] = {}
        for alloc in running.values():
            for assignment in alloc.placement.nodes:
                self.take(alloc.request, assignment.node_id, assignment.gpu_ids)

    def take(self, request: GangRequest, node_id: str, gpu_ids: tuple[int, ...]) -> None:
        held = self._held.setdefault(node_id, _Held())
        held.gpu_ids.update(gpu_ids)
        held.millicores += millicores(request.cpus_per_node)
        held.mem += request.mem_per_node or 0
        held.gangs.append(request.gang_id)

    def gangs_on(self, node_id: str) -> tuple[str, ...]:
        held = self._held.get(node_id)
        return tuple(held.gangs) if held else ()

    def used_gpu_ids(self, node_id: str) -> tuple[int, ...]:
        held = self._held.get(node_id)
        return tuple(sorted(held.gpu_ids)) if held else ()

    def used_millicores(self, node_id: str) -> int:
        held = self._held.get(node_id)
        return held.millicores if held else 0

    def used_mem(self, node_id: str) -> int:
        held = self._held.get(node_id)
        return held.mem if held else 0

    def free_gpu_ids(self, spec: NodeSpec) -> list[int]:
        held = self._held.get(spec.node_id)
        taken = held.gpu_ids if held else set()
        return [i for i in range(spec.gpus) if i not in taken]

    def free_millicores(self, spec: NodeSpec) -> int:
        return max(0, millicores(spec.cpus) - self.used_millicores(spec.node_id))

    def free_mem(self, spec: NodeSpec) -> int | None:
        return None if spec.mem is None else max(0, spec.mem - self.used_mem(spec.node_id))

    def shortfalls(self, spec: NodeSpec, request: GangRequest) -> list[str]:
        """Which resources this node lacks *now* for one node's share of the request (empty: it fits)."""
        short = []
        if len(self.free_gpu_ids(spec)) < request.gpus_per_node:
            short.append("GPUs")
        if self.free_millicores(spec) < millicores(request.cpus_per_node):
            short.append("CPUs")
        free_mem = self.free_mem(spec)
        if request.mem_per_node is not None and free_mem is not None and free_mem < request.mem_per_node:
            short.append("memory")
        return short

    def usage(self, node: NodeState) -> NodeUsage:
        spec = node.spec
        free_mem = self.free_mem(spec)
        # a lost node offers nothing, whatever its spec says
        offered = node.alive
        return NodeUsage(
            node_id=spec.node_id,
            gangs=self.gangs_on(spec.node_id),
            used_gpu_ids=self.used_gpu_ids(spec.node_id),
            free_gpu_ids=tuple(self.free_gpu_ids(spec)) if offered else (),
            used_cpus=self.used_millicores(spec.node_id) / MILLI,
            free_cpus=self.free_millicores(spec) / MILLI if offered else 0.0,
            used_mem=self.used_mem(spec.node_id),
            free_mem=free_mem if offered or free_mem is None else 0,
        )


def fits_idle(spec: NodeSpec, request: GangRequest) -> bool:
    """Whether one node's share of the request fits this node when nothing runs on it."""
    if spec.gpus < request.gpus_per_node or millicores(spec.cpus) < millicores(request.cpus_per_node):
        return False
    return request.mem_per_node is None or spec.mem is None or spec.mem >= request.mem_per_node


def fits_idle_cluster(request: GangRequest, nodes: Mapping[str, NodeState], *, count_lost: bool = False) -> bool:
    """Whether ``nnodes`` alive nodes (with ``count_lost``: registered nodes) could each hold one node's
    share of the request with nothing running on them."""
    big = sum(1 for node in nodes.values() if (node.alive or count_lost) and fits_idle(node.spec, request))
    return big >= request.nnodes


def usage(state: ClusterState) -> dict[str, NodeUsage]:
    """Usage and free capacity of every registered node (lost nodes show nothing free), by node id."""
    ledger = Ledger(state.running)
    return {node_id: ledger.usage(node) for node_id, node in sorted(state.nodes.items())}
