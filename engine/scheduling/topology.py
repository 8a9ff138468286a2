"""Topology-aware placement: gangs whose nodes must share (or should share) one topology domain.

The queue file declares the levels, outermost first (``topology: [block, rack]``), each a node label key;
nodes with the same value of a level's label are one *topology domain* of it (one rack). The node itself is
the innermost level, ``host`` (``engine.core.placement.HOST_LEVEL``): implicit, never declared. **A node
without a level's label is in no domain of that level**: a gang requiring the level never runs there, and
a gang preferring it uses such nodes only after every domain (each counts as a domain of its own).

A gang request names at most one level (``topology_required`` or ``topology_preferred``):

- **required**: all its nodes in ONE domain of the level, or it waits, with a reason naming the level and
  the most nodes any domain has free for it ("needs 4 nodes in one rack; the largest rack has 3 free").
  Among the domains that can hold it, the tightest (the fewest nodes that fit, then the domain's label
  value) — best fit, so the emptier domains stay whole for bigger gangs. Best fit within it, as today.
- **preferred**: as few domains as the policy finds now: the tightest domain that holds it all; else,
  greedily, the domain with the most fitting nodes first (best fit within), and at each step the tightest
  domain that holds the rest when one does. It never waits longer than an unconstrained gang would, unless
  it asks for a wait (``topology_wait_s``, ``Topology(wait=...)``): from the first time it could start over
  several domains, it waits up to that long for one (``holds_out``), placed meanwhile as a required gang.
- unconstrained (neither): today's placement (``Inventory.place``), exactly, whatever is declared.

**Index.** ``DomainIndex`` keeps, per level and domain, the offered nodes bucketed by free GPUs and sorted by
(free millicores, node id), as ``Inventory`` does for the whole cluster, updated on every take and release
(``Inventory._index`` / ``_unindex`` call it), with each domain's count of nodes per number of GPUs free or
more (``fitting``): a required placement reads those counts (an upper bound of the nodes that fit), then
walks the candidate domains' nodes in best-fit order, tightest first, until one holds the gang —
O(domains + nodes looked at), never a pass over every node. An inventory without declared levels has no
index and pays nothing.

**Defragmentation** (``chooser``): a required gang that would fit one domain if some gangs moved searches
the ``DOMAINS_LOOKED_AT`` domains that could hold it when idle with the most nodes free for it, for the
victims that free each (``preemption.choose_victims``
restricted to that domain's nodes, under the same rules: preemptible victims only, ``min_runtime``, no
cycles, moved gangs must fit elsewhere at once) and takes the domain whose victims lose the least work:
the fewest expected lost GPU-seconds (``engine.scheduling.lost_work``: since each victim's last checkpoint
with its save and restore, or since its admission where none was reported), then the fewest victims, then the
domain's label value. A preferred gang that must move gangs to start at all (the first in line, as any
gang) searches topology-blind and, where that finds victims, the same way per domain, keeping the blind
victims only where none of those domains can be freed: moving gangs anyway, it moves them out of one domain
(``Policy.defrag_preferred``; Schedulers recorded before chose its victims topology-blind).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from engine.core.placement import HOST_LEVEL, label_key_problem
from engine.scheduling.inventory import Inventory, Node, _placement, millicores
from engine.scheduling.lost_work import lost_gpu_s
from engine.scheduling.model import GangRequest, Placement
from engine.scheduling.state import shape_tag

if TYPE_CHECKING:
    from engine.scheduling.config import QueueConfig

__all__ = [
    "DOMAINS_LOOKED_AT",
    "DomainIndex",
    "as_placed",
    "chooser",
    "declare",
    "holds_out",
    "level_of",
    "refusal",
    "requiring",
    "wait_ends",
    "waiting_for_one",
]

Buckets = dict[int, list[tuple[int, str]]]  # free GPUs -> sorted (free millicores, node id)
#: the nodes a gang may use (its flavor's, with its node selector: ``engine.scheduling.flavors.admits``); None: any
Admits = Callable[[Node], bool] | None
#: how many domains a required gang's defragmentation searches (those with the most nodes free for it first)
DOMAINS_LOOKED_AT = 4


def level_of(request: GangRequest) -> str | None:
    """The level the request names (required or preferred), or None."""
    return request.topology_required or request.topology_preferred


def refusal(config: QueueConfig, request: GangRequest) -> str | None:
    """Why the request's topology can never be met (rejected at once), or None."""
    required, preferred = request.topology_required, request.topology_preferred
    if required is None and preferred is None:
        return None
    if required is not None and preferred is not None:
        return (
            f"rejected: asks for topology_required {required!r} and topology_preferred {preferred!r}; "
            "a gang names at most one topology level"
        )
    wait = request.topology_wait_s
    if wait is not None and (required is not None or not wait > 0):
        return (
            f"rejected: topology_wait_s {wait!r} needs topology_preferred and a positive number of seconds "
            "(how long a gang preferring one domain waits for it)"
        )
    level = required if required is not None else str(preferred)
    problem = label_key_problem(level)
    if problem is not None:
        return f"rejected: topology level {problem}"
    declared = config.topology
    if level != HOST_LEVEL and level not in declared:
        known = ", ".join(declared) if declared else "none are declared"
        return (
            f"rejected: topology level {level!r} is not declared in the queue file (topology: {known}; "
            f"and {HOST_LEVEL!r}, the node itself)"
        )
    if level == HOST_LEVEL and required is not None and request.nnodes > 1:
        return f"rejected: needs {request.nnodes} nodes in one {HOST_LEVEL}, and a {HOST_LEVEL} is one node"
    return None


def declare(inventory: Inventory, levels: tuple[str, ...]) -> Inventory:
    """Give ``inventory`` a domain index of ``levels`` (none: no index, no cost), rebuilt from its offered
    nodes when the levels changed (a new configuration); returns it."""
    current = inventory.domains.levels if inventory.domains is not None else ()
    if tuple(levels) != current:
        inventory.domains = DomainIndex(tuple(levels), inventory.offered_nodes()) if levels else None
    return inventory


class DomainIndex:
    """Per level and domain, the offered nodes by free GPUs (see the module docstring)."""

    def __init__(self, levels: tuple[str, ...], nodes: Iterable[Node] = ()) -> None:
        self.levels = levels
        self.buckets: dict[str, dict[str, Buckets]] = {level: {} for level in levels}
        #: per shape (gangs of one shape fit alike), the most nodes one domain had free for it at its last failed
        #: required placement: what its reason names (a shape the policy skips in a cycle reads its first try's)
        self.largest: dict[tuple[Any, ...], tuple[int, str]] = {}
        #: per level, GPUs and domain, the nodes with at least that many GPUs free: kept as nodes change, so a
        #: placement (a victim search places a gang again after each move) reads each domain's bound at once
        self.fitting: dict[str, dict[int, dict[str, int]]] = {level: {} for level in levels}
        for node in nodes:
            self.add(node)

    # -- kept on every change (Inventory._index / _unindex) -------------------------------------------
    def add(self, node: Node) -> None:
        labels, entry = node.spec.labels, (node.free_mc, node.spec.node_id)
        for level in self.levels:
            value = labels.get(level)
            if value is not None:
                bucket = self.buckets[level].setdefault(value, {}).setdefault(len(node.free_gpus), [])
                bisect.insort(bucket, entry)
                _count(self.fitting[level], value, len(node.free_gpus), 1)

    def remove(self, node: Node) -> None:
        labels, entry = node.spec.labels, (node.free_mc, node.spec.node_id)
        for level in self.levels:
            value = labels.get(level)
            if value is None:
                continue
            domain = self.buckets[level][value]
            bucket = domain[len(node.free_gpus)]
            del bucket[bisect.bisect_left(bucket, entry)]
            if not bucket:  # keep only non-empty buckets: a placement reads their sizes
                del domain[len(node.free_gpus)]
            _count(self.fitting[level], value, len(node.free_gpus), -1)

    # -- placement -------------------------------------------------------------------------------------
    def place(
        self, inventory: Inventory, request: GangRequest, exclude: frozenset[str], admits: Admits = None
    ) -> Placement | None:
        """``request``'s placement on its level's domains (module docstring), on the nodes ``admits`` says yes
        to (its flavor's: ``Inventory.place``), or None."""
        if request.topology_required:
            chosen = self._in_one(inventory, request, request.topology_required, exclude, admits)
        else:
            chosen = self._fewest(inventory, request, str(request.topology_preferred), exclude, admits)
        return None if chosen is None else _placement(request.gang_id, chosen, request.gpus_per_node)

    def _in_one(
        self, inventory: Inventory, request: GangRequest, level: str, exclude: frozenset[str], admits: Admits
    ) -> list[Node] | None:
        n, gpus = request.nnodes, request.gpus_per_node
        domains = self.buckets[level]
        # an upper bound per domain (its nodes with the GPUs free), then the tightest candidates walked first
        bounds = self.fitting[level].get(gpus, {})
        walked = (0, "")
        for _, value in sorted((bound, value) for value, bound in bounds.items() if bound >= n):
            found = self._walk(inventory, domains[value], request, exclude, n, admits)
            if len(found) == n:
                self.largest.pop(_key(request), None)
                return found
            walked = max(walked, (len(found), value))
        # what the reason names: the walked domains' exact counts, the others' nodes with the GPUs free
        best = max([walked] + [(b, v) for v in domains if (b := bounds.get(v, 0)) < n])
        self.largest[_key(request)] = best
        if len(self.largest) > 10_000:  # a cache for reasons only: bounded
            self.largest.clear()
        return None

    def _fewest(
        self, inventory: Inventory, request: GangRequest, level: str, exclude: frozenset[str], admits: Admits
    ) -> list[Node] | None:
        one = self._in_one(inventory, request, level, exclude, admits)
        if one is not None:
            return one
        self.largest.pop(_key(request), None)
        n = request.nnodes
        fitting = {}  # the domains with nodes that fit now: an empty one adds nothing to a placement
        for value, domain in self.buckets[level].items():
            nodes = self._walk(inventory, domain, request, exclude, n, admits)
            if nodes:
                fitting[value] = nodes
        chosen: list[Node] = []
        while len(chosen) < n and fitting:
            rest = n - len(chosen)
            holds = [(len(nodes), v) for v, nodes in fitting.items() if len(nodes) >= rest]
            if holds:
                value = min(holds)[1]  # the tightest domain that holds the rest
                chosen += fitting[value][:rest]
                break
            value = max((len(nodes), v) for v, nodes in fitting.items())[1] if fitting else ""
            chosen += fitting.pop(value)
        if len(chosen) < n:  # then nodes in no domain of the level, best fit
            taken = {node.spec.node_id for node in chosen}
            for node in _best_fit(inventory, inventory._buckets, request, exclude, admits):
                if node.spec.node_id not in taken and level not in node.spec.labels:
                    chosen.append(node)
                    if len(chosen) == n:
                        break
        return chosen if len(chosen) == n else None

    def _walk(
        self,
        inventory: Inventory,
        domain: Buckets,
        request: GangRequest,
        exclude: frozenset[str],
        limit: int,
        admits: Admits,
    ) -> list[Node]:
        found: list[Node] = []
        for node in _best_fit(inventory, domain, request, exclude, admits):
            found.append(node)
            if len(found) == limit:
                break
        return found

    def most_free_first(self, inventory: Inventory, level: str, value: str) -> Iterator[Node]:
        """A domain's nodes, the most free GPUs first (as ``Inventory.most_free_first``)."""
        domain = self.buckets[level].get(value, {})
        for size in sorted(domain, reverse=True):
            for _, node_id in domain[size]:
                yield inventory.nodes[node_id]

    # -- what a gang waits for -------------------------------------------------------------------------
    def fit_counts(
        self, inventory: Inventory, request: GangRequest, admits: Admits = None
    ) -> tuple[int, int, int, int]:
        """``Inventory.fit_counts`` for a required gang: per way of counting, the most nodes ONE domain has
        that could hold one node's share when idle. O(registered nodes), cached by the policy per shape."""
        level = str(request.topology_required)
        mc = millicores(request.cpus_per_node)
        counts: dict[str, list[int]] = {}
        for node in inventory.nodes.values():
            value = node.spec.labels.get(level)
            if value is None or not node.fits_idle(request.gpus_per_node, mc, request.mem_per_node):
                continue
            if admits is not None and not admits(node):
                continue
            row = counts.setdefault(value, [0, 0, 0, 0])
            row[3] += 1
            row[0] += node.alive and not node.drained
            row[1] += node.alive
            row[2] += not node.drained
        most = [max((row[i] for row in counts.values()), default=0) for i in range(4)]
        return most[0], most[1], most[2], most[3]

    def said(self, request: GangRequest) -> tuple[int, str] | None:
        """What a required gang's capacity reason names beyond its shape (``largest_free``), so the policy
        builds the reason again when that moves; None for any other gang."""
        return self.largest_free(request) if request.topology_required in self.levels else None

    def largest_free(self, request: GangRequest) -> tuple[int, str]:
        """(nodes, domain): the most nodes one domain had free for the gang when it last failed to be placed
        in one (``(0, "")``: none, or not looked at)."""
        return self.largest.get(_key(request), (0, ""))


def _domain(inventory: Inventory, node_id: str, level: str) -> str:
    """The node's domain of ``level`` (a node in none is one of its own)."""
    return inventory.nodes[node_id].spec.labels.get(level, "\0" + node_id)


def _count(fitting: dict[int, dict[str, int]], value: str, free: int, step: int) -> None:
    """Count a node with ``free`` GPUs free in or out of domain ``value``'s ``DomainIndex.fitting``."""
    for gpus in range(free + 1):
        counts = fitting.setdefault(gpus, {})
        counts[value] = counts.get(value, 0) + step


def _key(request: GangRequest) -> tuple[Any, ...]:
    return (request.nnodes, request.gpus_per_node, request.cpus_per_node, request.mem_per_node, shape_tag(request))


def _best_fit(
    inventory: Inventory, buckets: Buckets, request: GangRequest, exclude: frozenset[str], admits: Admits = None
) -> Iterator[Node]:
    """The nodes of ``buckets`` that hold one node's share now, in best-fit order (``Inventory.place``'s)."""
    gpus, mc, mem = request.gpus_per_node, millicores(request.cpus_per_node), request.mem_per_node
    for size in sorted(k for k in buckets if k >= gpus):
        bucket = buckets[size]
        for i in range(bisect.bisect_left(bucket, (mc, "")), len(bucket)):
            node = inventory.nodes[bucket[i][1]]
            if exclude and node.spec.node_id in exclude:
                continue
            if mem is not None and node.free_mem is not None and node.free_mem < mem:
                continue
            if admits is not None and not admits(node):
                continue
            yield node


# -- a preferred gang's wait for one domain ---------------------------------------------------------------
def holds_out(
    inventory: Inventory, request: GangRequest, placement: Placement, waits: dict[str, float], now: float
) -> bool:
    """Whether a gang preferring a level with a wait (``topology_wait_s``), placed over several domains of it,
    waits for one instead: up to its wait from the first time it could have started over several, which
    ``waits`` keeps per gang (a node in no domain of the level is one of its own). A level the inventory has
    no domains of (``host``: every node is its own) never holds it out: it could wait only for a wait's end."""
    level = str(request.topology_preferred)
    if inventory.domains_of(level) is None:
        return False
    if len({_domain(inventory, a.node_id, level) for a in placement.nodes}) < 2:
        return False
    waits.setdefault(request.gang_id, now)
    return waiting_for_one(waits, request, now)


def waiting_for_one(waits: dict[str, float], request: GangRequest, now: float) -> bool:
    """Whether the gang is within its wait for one domain (``holds_out``): it moves gangs for one domain only."""
    end = wait_ends(waits, request)
    return end is not None and now < end


def as_placed(inventory: Inventory, waits: dict[str, float], request: GangRequest, now: float) -> GangRequest:
    """The request as a flavor choice asks whether it fits now: a gang preferring a level with a wait that has
    not run out fits where one domain holds it (it would wait for one elsewhere, ``holds_out``)."""
    if request.topology_wait_s is None or inventory.domains_of(request.topology_preferred) is None:
        return request
    end = wait_ends(waits, request)
    return request if end is not None and now >= end else requiring(request)


def requiring(request: GangRequest) -> GangRequest:
    """A gang preferring a level, as one requiring it."""
    return request.model_copy(update={"topology_required": request.topology_preferred, "topology_preferred": None})


def wait_ends(waits: dict[str, float], request: GangRequest) -> float | None:
    """When the gang's wait for one domain runs out (None: it has not started waiting)."""
    since = waits.get(request.gang_id)
    return None if since is None else since + float(request.topology_wait_s or 0.0)


# -- defragmentation ---------------------------------------------------------------------------------------
def chooser(
    choose: Callable[..., Any],
    inventory: Inventory,
    request: GangRequest,
    now: float,
    *,
    preferred: bool = True,
    one: bool = False,
) -> Callable[..., Any]:
    """``choose`` (``preemption.choose_victims``) as it is for a gang asking no level; for one requiring a
    level, the same search per domain that could hold it when idle, keeping the domain that loses the least
    work; for one preferring a level (with ``preferred``), ``choose`` first and, where it finds victims, the
    search per domain, keeping ``choose``'s victims where no domain looked at can be freed; with ``one`` (it
    waits for one domain: ``waiting_for_one``), the search per domain only (module docstring)."""
    level = request.topology_required or (request.topology_preferred if preferred else None)
    index = inventory.domains_of(level)
    if level is None or index is None:
        return choose

    def in_one_domain(*args: Any, **kwargs: Any) -> Any:
        anywhere = None
        if not request.topology_required:
            if not one:
                # it prefers the level: victims anywhere will do where no domain can be freed, and where there
                # are none (most searches of a gang first in line) no domain is searched (each costs as much)
                anywhere = choose(*args, **kwargs)
                if anywhere is None or len({_domain(inventory, n, level) for n in anywhere[1]}) == 1:
                    return anywhere  # none anywhere, or the cheapest victims free one domain already
            # a search per domain checks whether the gang fits (without a victim, once they are gone) in one
            # domain, not over several: as a gang requiring it (and at the cost of one, not of a preferred one)
            args = (*args[:2], requiring(request), *args[3:])
        gpus, mc, mem = request.gpus_per_node, millicores(request.cpus_per_node), request.mem_per_node
        best: tuple[tuple[float, int, str], Any] | None = None
        # the domains with the most nodes that have the GPUs free first (the fewest victims), at most
        # DOMAINS_LOOKED_AT of them: a search costs O(that), not O(domains)
        bounds = index.fitting[level].get(gpus, {})
        free = sorted((-bounds.get(value, 0), value) for value in index.buckets[level])
        looked = 0
        admits = kwargs.get("admits")  # its flavor's nodes (engine.scheduling.flavors); None: any
        for _, value in free:
            if looked == DOMAINS_LOOKED_AT:
                break
            nodes = [n for n in index.most_free_first(inventory, level, value) if admits is None or admits(n)]
            if sum(node.fits_idle(gpus, mc, mem) for node in nodes) < request.nnodes:
                continue  # not even idle could it hold the gang
            looked += 1
            found = choose(*args, among=nodes, **kwargs)
            if found is None:
                continue
            cost = (sum(lost_gpu_s(v, now) for v in found[0]), len(found[0]), value)
            if best is None or cost < best[0]:
                best = (cost, found)
        return anywhere if best is None else best[1]

    return in_one_domain
