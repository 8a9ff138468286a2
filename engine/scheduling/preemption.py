"""Choosing victims: few whole gangs whose removal lets a waiting gang start, at a bounded cost.

The policy says which running gangs the waiting gang may preempt and how much it prefers each
(``rank``: lower is preferred; None: not a candidate). Its preference: gangs of borrowing tenants first,
then the lowest priority, then the most recently admitted.

1. Nodes are looked at from the one with the most free GPUs down (they need the fewest victims), at most
   ``NODES_LOOKED_AT`` beyond what the gang needs: a search costs O(that), not O(cluster). On each node,
   the shortest prefix of its candidates in preference order that frees one node's share. The gang's
   ``nnodes`` cheapest nodes (fewest victims, then the most preferable worst victim, then node id) win.
2. If the tenant's quota still blocks it (a cohort pool lent out), ``more`` candidates, in preference
   order, are added until it does not.
3. Reverse prune (as Kueue does): each victim, last chosen first, is given back if the gang still fits
   without it. What remains is minimal: no victim can be spared.

Everything is tried on the live inventory and tenancy, then undone: nothing changes until the policy
acts on the answer, and the answer is deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from engine.scheduling.inventory import Inventory, millicores
from engine.scheduling.model import GangRequest, Placement
from engine.scheduling.tenancy import Tenancy, Vec

__all__ = ["NODES_LOOKED_AT", "Victim", "choose_victims"]

#: how many nodes beyond the gang's own ``nnodes`` a search looks at (the ones with the most free GPUs)
NODES_LOOKED_AT = 8


class Victim(Protocol):
    @property
    def request(self) -> GangRequest: ...
    @property
    def placement(self) -> Placement: ...
    @property
    def vec(self) -> Vec: ...


def choose_victims(
    inventory: Inventory,
    tenancy: Tenancy,
    request: GangRequest,
    vec: Vec,
    running: Mapping[str, Victim],
    rank: Callable[[str], Any],
    more: Callable[[], Iterable[str]],
) -> tuple[list[Victim], frozenset[str]] | None:
    """The victims to preempt so that ``request`` fits and the nodes it will take once they are gone, or
    None when none are found."""
    gpus, mc, mem = request.gpus_per_node, millicores(request.cpus_per_node), request.mem_per_node
    ranks: dict[str, Any] = {}

    def ranked(gang_id: str) -> Any:
        if gang_id not in ranks:
            ranks[gang_id] = rank(gang_id)
        return ranks[gang_id]

    options: list[tuple[int, Any, str, list[str]]] = []  # (victims, worst victim's rank, node id, victims)
    budget = request.nnodes + NODES_LOOKED_AT
    for node in inventory.most_free_first():
        if budget == 0:
            break
        budget -= 1
        node_id = node.spec.node_id
        if node.fits(gpus, mc, mem):
            options.append((0, (), node_id, []))
            continue
        if not node.fits_idle(gpus, mc, mem):
            continue
        held = sorted((r, g) for g in node.held if (r := ranked(g)) is not None)
        free_gpus, free_mc, free_mem = len(node.free_gpus), node.free_mc, node.free_mem
        chosen: list[str] = []
        for r, gang_id in held:
            hold = node.held[gang_id]
            free_gpus += len(hold.gpu_ids)
            free_mc += hold.millicores
            free_mem = None if free_mem is None else free_mem + hold.mem
            chosen.append(gang_id)
            if free_gpus >= gpus and free_mc >= mc and (mem is None or free_mem is None or free_mem >= mem):
                options.append((len(chosen), r, node_id, chosen))
                break
    if len(options) < request.nnodes:
        return None
    options.sort(key=lambda o: (o[0], o[1], o[2]))
    picked = sorted({g for _, _, _, chosen in options[: request.nnodes] for g in chosen}, key=ranked)

    removed: list[str] = []
    try:
        for gang_id in picked:
            _remove(inventory, tenancy, running[gang_id])
            removed.append(gang_id)
        if tenancy.blocked(request.tenant, vec) is not None:
            for gang_id in more():  # the quota still blocks it: free more of the cohort, by preference
                if gang_id not in removed and ranked(gang_id) is not None:
                    _remove(inventory, tenancy, running[gang_id])
                    removed.append(gang_id)
                    if tenancy.blocked(request.tenant, vec) is None:
                        break
        if tenancy.blocked(request.tenant, vec) is not None or inventory.place(request) is None:
            return None
        needed: list[str] = []
        for gang_id in reversed(removed):  # reverse prune
            _restore(inventory, tenancy, running[gang_id])
            if tenancy.blocked(request.tenant, vec) is None and inventory.place(request) is not None:
                continue  # spared: the gang fits without preempting it
            _remove(inventory, tenancy, running[gang_id])
            needed.append(gang_id)
        removed = needed
        placement = inventory.place(request)
        nodes = frozenset(a.node_id for a in placement.nodes) if placement is not None else frozenset[str]()
        return [running[g] for g in sorted(needed, key=ranked)], nodes
    finally:
        for gang_id in removed:
            _restore(inventory, tenancy, running[gang_id])


def _remove(inventory: Inventory, tenancy: Tenancy, c: Victim) -> None:
    inventory.release(c.request.gang_id, c.placement)
    tenancy.add(c.request.tenant, c.vec, -1)


def _restore(inventory: Inventory, tenancy: Tenancy, c: Victim) -> None:
    inventory.take(c.request, c.placement)
    tenancy.add(c.request.tenant, c.vec, 1)
