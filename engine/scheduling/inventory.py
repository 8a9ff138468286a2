"""Nodes and what is free on them, kept up to date one change at a time.

Each node keeps what every gang holds on it (GPU ids, millicores, bytes) and the free amounts derived
from them, updated on every take and release, so nothing is ever recomputed over all gangs. Offered
nodes (alive, not drained) are indexed by their number of free GPUs, each bucket sorted by
(free millicores, node id): best-fit placement walks the buckets from the smallest that can hold a
node's share and stops at the first ``nnodes`` nodes that fit, so a placement costs O(nodes it looks
at), not O(cluster).

CPUs are integer millicores, as in Kubernetes: summing floats such as 0.1 drifts (0.1 + 0.2 > 0.3),
which would make a gang that exactly fills a node not fit. A node re-registered with *less* capacity
than its gangs hold keeps those allocations; its free amounts are clamped at zero and GPU ids above the
new count are not offered until the old gangs release.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.scheduling.model import GangRequest, NodeAssignment, NodeSpec, Placement
from engine.scheduling.units import MILLI

if TYPE_CHECKING:
    from engine.scheduling.topology import DomainIndex

__all__ = ["MILLI", "Hold", "Inventory", "Node", "millicores"]


def millicores(cpus: float) -> int:
    """CPUs as integer millicores (exact accounting; see the module docstring)."""
    return round(cpus * MILLI)


@dataclass(frozen=True, slots=True)
class Hold:
    """What one gang holds on one node."""

    gpu_ids: tuple[int, ...]
    millicores: int
    mem: int


@dataclass(slots=True)
class Node:
    spec: NodeSpec
    alive: bool = True
    last_seen: float = 0.0
    drained: bool = False
    drain_reason: str = ""  # the operator's words, while drained
    held: dict[str, Hold] = field(default_factory=dict)
    free_gpus: list[int] = field(default_factory=list)
    free_mc: int = 0
    free_mem: int | None = None
    #: the flavor its labels put it in (``engine.scheduling.flavors``); None: no flavors, or it matches none
    flavor: str | None = None

    @property
    def offered(self) -> bool:
        return self.alive and not self.drained

    def recompute(self) -> None:
        taken = {i for hold in self.held.values() for i in hold.gpu_ids}
        self.free_gpus = [i for i in range(self.spec.gpus) if i not in taken]
        self.free_mc = max(0, millicores(self.spec.cpus) - sum(h.millicores for h in self.held.values()))
        mem = self.spec.mem
        self.free_mem = None if mem is None else max(0, mem - sum(h.mem for h in self.held.values()))

    def fits(self, gpus: int, mc: int, mem: int | None) -> bool:
        """Whether one node's share fits in what is free now."""
        if len(self.free_gpus) < gpus or self.free_mc < mc:
            return False
        return mem is None or self.free_mem is None or self.free_mem >= mem

    def fits_idle(self, gpus: int, mc: int, mem: int | None) -> bool:
        """Whether one node's share fits this node when nothing runs on it."""
        spec = self.spec
        if spec.gpus < gpus or millicores(spec.cpus) < mc:
            return False
        return mem is None or spec.mem is None or spec.mem >= mem


class Inventory:
    """All registered nodes, their holds and the free-capacity index."""

    def __init__(self, node_ttl_s: float) -> None:
        self.nodes: dict[str, Node] = {}
        self.node_ttl_s = node_ttl_s
        #: bumps whenever the set of nodes, their capacity or whether they are offered changes (not on
        #: take/release): what was decided about "could this shape ever fit" stays valid until it does
        self.topology = 0
        self._buckets: dict[int, list[tuple[int, str]]] = {}
        self._expiry: list[tuple[float, str]] = []  # (deadline, node id), stale entries skipped lazily
        #: totals of the offered nodes (gpu, millicores, bytes): the denominators of fair share
        self.capacity = [0, 0, 0]
        self.free_gpus = 0  # free GPUs on the offered nodes
        self.free_by_flavor: dict[str, int] = {}  # the same per flavor (with flavors only)
        self.drained: set[str] = set()  # ids of the drained nodes
        #: bumps whenever a node is drained or undrained or its drain reason changes (reasons quote them)
        self.drain_changes = 0
        #: a node's flavor from its spec (``engine.scheduling.flavors.classifier``); none without flavors
        self.classify: Callable[[NodeSpec], str | None] = _no_flavor
        #: free capacity per topology domain, when the queue file declares levels (``engine.scheduling.topology``)
        self.domains: DomainIndex | None = None
        #: bumps on every change of what is free or offered (``can_place`` remembers its answers until it does)
        self.changes = 0
        self._placeable: dict[Hashable, bool] = {}
        self._placeable_at = 0

    def reclassify(self, classify: Callable[[NodeSpec], str | None]) -> None:
        """A new configuration's flavors: every node's flavor again (what fits where may change)."""
        self.classify = classify
        for node in self.nodes.values():
            self._unindex(node)
            node.flavor = classify(node.spec)
            self._index(node)
        self.topology += 1

    # -- the index -------------------------------------------------------------------------------
    def _unindex(self, node: Node) -> None:
        if not node.offered:
            return
        self.changes += 1
        bucket = self._buckets[len(node.free_gpus)]
        del bucket[bisect.bisect_left(bucket, (node.free_mc, node.spec.node_id))]
        if self.domains is not None:
            self.domains.remove(node)
        self.free_gpus -= len(node.free_gpus)
        if node.flavor is not None:  # kept only with flavors (a full flavor is skipped without a placement)
            self.free_by_flavor[node.flavor] = self.free_by_flavor.get(node.flavor, 0) - len(node.free_gpus)
        self.capacity[0] -= node.spec.gpus
        self.capacity[1] -= millicores(node.spec.cpus)
        self.capacity[2] -= node.spec.mem or 0

    def _index(self, node: Node) -> None:
        if not node.offered:
            return
        self.changes += 1
        bisect.insort(self._buckets.setdefault(len(node.free_gpus), []), (node.free_mc, node.spec.node_id))
        if self.domains is not None:
            self.domains.add(node)
        self.free_gpus += len(node.free_gpus)
        if node.flavor is not None:
            self.free_by_flavor[node.flavor] = self.free_by_flavor.get(node.flavor, 0) + len(node.free_gpus)
        self.capacity[0] += node.spec.gpus
        self.capacity[1] += millicores(node.spec.cpus)
        self.capacity[2] += node.spec.mem or 0

    # -- node events -----------------------------------------------------------------------------
    def register(self, spec: NodeSpec, now: float) -> bool:
        """A node (re)registered; True when that changed what it offers (new, revived, other capacity)."""
        node = self.nodes.get(spec.node_id)
        if not spec.leased:  # a leased node is declared lost by its lease (NodeLost), never by a missed deadline
            heapq.heappush(self._expiry, (now + self.node_ttl_s, spec.node_id))
        if node is not None and node.alive and node.spec == spec:
            node.last_seen = now
            return False
        if node is None:
            node = self.nodes[spec.node_id] = Node(spec=spec, alive=False)
        self._unindex(node)
        node.spec, node.alive, node.last_seen = spec, True, now
        node.flavor = self.classify(spec)  # unindexed above: its free GPUs move to its (new) flavor's count
        node.recompute()
        self._index(node)
        self.topology += 1
        return True

    def set_offered(
        self, node_id: str, *, alive: bool | None = None, drained: bool | None = None, reason: str | None = None
    ) -> bool:
        """Mark a node lost / revived or drained / undrained (``reason``: why it is drained; an undrained node
        has none); True when that changed anything, the drain reason included (reasons quote it)."""
        node = self.nodes.get(node_id)
        if node is None:
            return False
        new_alive = node.alive if alive is None else alive
        new_drained = node.drained if drained is None else drained
        new_reason = "" if not new_drained else node.drain_reason if reason is None else reason
        if (new_alive, new_drained, new_reason) == (node.alive, node.drained, node.drain_reason):
            return False
        if (new_drained, new_reason) != (node.drained, node.drain_reason):
            self.drain_changes += 1
            (self.drained.add if new_drained else self.drained.discard)(node_id)
        self._unindex(node)
        node.alive, node.drained, node.drain_reason = new_alive, new_drained, new_reason
        self._index(node)
        self.topology += 1
        return True

    def expire(self, now: float) -> list[str]:
        """Declare lost the unleased nodes that have not re-registered for ``node_ttl_s``."""
        lost = []
        while self._expiry and self._expiry[0][0] < now:
            _, node_id = heapq.heappop(self._expiry)
            node = self.nodes.get(node_id)
            if node is not None and node.alive and not node.spec.leased and now - node.last_seen > self.node_ttl_s:
                self.set_offered(node_id, alive=False)
                lost.append(node_id)
        return lost

    def next_expiry(self) -> float | None:
        while self._expiry:
            deadline, node_id = self._expiry[0]
            node = self.nodes.get(node_id)
            if (
                node is not None
                and node.alive
                and not node.spec.leased
                and node.last_seen + self.node_ttl_s == deadline
            ):
                return deadline
            heapq.heappop(self._expiry)  # a later registration superseded it, or the node is lost already
        return None

    # -- gangs -------------------------------------------------------------------------------------
    def take(self, request: GangRequest, placement: Placement) -> None:
        mc, mem = millicores(request.cpus_per_node), request.mem_per_node or 0
        for assignment in placement.nodes:
            node = self.nodes[assignment.node_id]
            self._unindex(node)
            node.held[request.gang_id] = Hold(assignment.gpu_ids, mc, mem)
            taken = set(assignment.gpu_ids)
            node.free_gpus = [i for i in node.free_gpus if i not in taken]
            node.free_mc = max(0, node.free_mc - mc)
            if node.free_mem is not None:
                node.free_mem = max(0, node.free_mem - mem)
            self._index(node)

    def release(self, gang_id: str, placement: Placement) -> None:
        for assignment in placement.nodes:
            node = self.nodes.get(assignment.node_id)
            if node is None or gang_id not in node.held:
                continue
            self._unindex(node)
            del node.held[gang_id]
            node.recompute()  # exact, and clamps a node that shrank while the gang ran
            self._index(node)

    def domains_of(self, level: str | None) -> DomainIndex | None:
        """The domain index where it has domains of ``level`` (a declared level: not ``host``, not None), else
        None (a gang naming no such level is placed as any other)."""
        domains = self.domains
        return domains if domains is not None and level in domains.levels else None

    def place(
        self,
        request: GangRequest,
        exclude: frozenset[str] = frozenset(),
        admits: Callable[[Node], bool] | None = None,
    ) -> Placement | None:
        """Best fit for ``request`` on what is free now, off the ``exclude``d nodes and on the nodes ``admits``
        says yes to (its flavor's, with its node selector; None: any), or None (see the module docstring); a
        gang naming a declared topology level is placed by ``engine.scheduling.topology``."""
        index = self.domains_of(request.topology_required or request.topology_preferred)
        if index is not None:
            return index.place(self, request, exclude, admits)
        return self._best_fit_placement(request, exclude, admits)

    def can_place(
        self,
        request: GangRequest,
        key: Hashable,
        exclude: frozenset[str] = frozenset(),
        admits: Callable[[Node], bool] | None = None,
    ) -> bool:
        """Whether ``place`` would find a placement now, remembered per ``key`` (what the answer depends on
        beyond the inventory: the request's shape, its nodes' filter, ``exclude``) until the free capacity
        changes: a flavor choice asks it for every waiting head at every event. A gang that only prefers a
        level fits where it fits topology-blind (its placement falls back to any nodes); one that requires a
        level is placed each time (its failed placement names the largest domain in its reason)."""
        index = self.domains_of(request.topology_required)
        if index is not None:
            return index.place(self, request, exclude, admits) is not None
        if self._placeable_at != self.changes:
            self._placeable_at = self.changes
            self._placeable.clear()
        found = self._placeable.get(key)
        if found is None:
            found = self._placeable[key] = self._best_fit_placement(request, exclude, admits) is not None
        return found

    def _best_fit_placement(
        self, request: GangRequest, exclude: frozenset[str], admits: Callable[[Node], bool] | None
    ) -> Placement | None:
        gpus, mc, mem = request.gpus_per_node, millicores(request.cpus_per_node), request.mem_per_node
        n = request.nnodes
        sizes = sorted(k for k in self._buckets if k >= gpus)
        if sum(len(self._buckets[k]) for k in sizes) < n:
            return None  # not even enough nodes with the GPUs free: no need to look at any of them
        chosen: list[Node] = []
        for size in sizes:
            bucket = self._buckets[size]
            for i in range(bisect.bisect_left(bucket, (mc, "")), len(bucket)):
                node = self.nodes[bucket[i][1]]
                if exclude and node.spec.node_id in exclude:
                    continue
                if mem is not None and node.free_mem is not None and node.free_mem < mem:
                    continue
                if admits is not None and not admits(node):
                    continue
                chosen.append(node)
                if len(chosen) == n:
                    return _placement(request.gang_id, chosen, gpus)
        return None

    def most_free_first(self) -> Iterator[Node]:
        """The offered nodes, the most free GPUs first (then the least free millicores, then node id)."""
        for size in sorted(self._buckets, reverse=True):
            for _, node_id in self._buckets[size]:
                yield self.nodes[node_id]

    def offered_nodes(self) -> Iterator[Node]:
        return (node for node in self.nodes.values() if node.offered)

    def count_fitting_idle(self, request: GangRequest, *, count_lost: bool, count_drained: bool = False) -> int:
        """How many nodes could hold one node's share of the request when idle: the offered ones, with
        ``count_lost`` the lost ones too, with ``count_drained`` the drained ones too (out until an operator
        undrains them, but not gone)."""
        mc = millicores(request.cpus_per_node)
        return sum(
            1
            for node in self.nodes.values()
            if (node.alive or count_lost)
            and (count_drained or not node.drained)
            and node.fits_idle(request.gpus_per_node, mc, request.mem_per_node)
        )

    def fit_counts(
        self, request: GangRequest, admits: Callable[[Node], bool] | None = None
    ) -> tuple[int, int, int, int]:
        """``count_fitting_idle`` four ways in one pass over the nodes (those ``admits`` says yes to): (offered,
        alive with the drained ones, not drained with the lost ones, every registered node); for a gang
        requiring a topology level, the most nodes of ONE domain of it (``engine.scheduling.topology``)."""
        index = self.domains_of(request.topology_required)
        if index is not None:
            return index.fit_counts(self, request, admits)
        mc = millicores(request.cpus_per_node)
        counts = [0, 0, 0, 0]
        for node in self.nodes.values():
            if admits is not None and not admits(node):
                continue
            if node.fits_idle(request.gpus_per_node, mc, request.mem_per_node):
                counts[3] += 1
                counts[0] += node.alive and not node.drained
                counts[1] += node.alive
                counts[2] += not node.drained
        return counts[0], counts[1], counts[2], counts[3]


def _no_flavor(spec: NodeSpec) -> str | None:
    return None


def _placement(gang_id: str, chosen: list[Node], gpus: int) -> Placement:
    # node rank 0 (the rendezvous host) is the lowest node id, so a user reading a placement can predict ranks
    ordered = sorted(chosen, key=lambda node: node.spec.node_id)
    return Placement(
        gang_id=gang_id,
        nodes=tuple(
            NodeAssignment(
                node_id=node.spec.node_id,
                address=node.spec.address,
                node_rank=rank,
                gpu_ids=tuple(node.free_gpus[:gpus]),
            )
            for rank, node in enumerate(ordered)
        ),
    )
