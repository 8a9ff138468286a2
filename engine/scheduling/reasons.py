"""The words users see: why a gang is rejected, still pending, or preempted.

"Why is my job pending?" is the most common question about any batch queue, so a reason says what the
gang needs and what stops it, in tenant terms ("team-a is at its quota of 8 GPUs and cannot borrow").
A pending reason is sent to the gang only when it changes, so it carries *what* blocks the gang and
never counters that move with every event (queue position, free GPU counts): the live position comes
from ``gangflow cluster``. Texts are deterministic (sorted, no clocks): they are part of the policy's
output.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.scheduling.config import TenantConfig
from engine.scheduling.inventory import MILLI, Inventory, millicores
from engine.scheduling.model import GangRequest
from engine.scheduling.tenancy import Blocked

__all__ = [
    "MAX_USER",
    "amount",
    "behind_reason",
    "capacity_reason",
    "class_not_allowed_reason",
    "drained_wait_reason",
    "draining",
    "draining_reason",
    "lender_waiting_reason",
    "lost_wait_expired_reason",
    "lost_wait_reason",
    "malformed_reason",
    "max_pending_reason",
    "needs",
    "never_fits_reason",
    "node_wait_expired_reason",
    "node_wait_reason",
    "nominated_reason",
    "queued_reason",
    "quota_reason",
    "topology_wait_reason",
    "waiting_note_text",
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


def amount(resource: int, value: int) -> str:
    """``(0, 8)`` → ``"8 GPUs"``; ``(1, 500)`` → ``"0.5 CPUs"``; ``(2, 2**30)`` → ``"1 GiB"`` of memory."""
    if resource == 0:
        return _count(value, "GPU")
    if resource == 1:
        return _count(value / MILLI, "CPU")
    return f"{_bytes(value)} of memory"


def _ids(ids: Sequence[str]) -> str:
    shown = ", ".join(ids[:_LIST_LIMIT])
    return shown if len(ids) <= _LIST_LIMIT else f"{shown} and {len(ids) - _LIST_LIMIT} more"


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


#: the longest run's user a gang request may name (``GangRequest.user``: a token's subject, a login name)
MAX_USER = 256


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
    if len(request.user) > MAX_USER:  # it names the user in every view and snapshot: a name, not a payload
        problems.append(f"user is {len(request.user)} characters long, at most {MAX_USER}")
    return f"rejected: malformed request: {'; '.join(problems)}" if problems else None


def _lost(inventory: Inventory) -> list[str]:
    return sorted(node_id for node_id, node in inventory.nodes.items() if not node.alive)


def _big_enough(request: GangRequest, inventory: Inventory, *, lost: bool) -> list[str]:
    """Ids of the offered nodes (``lost``: of the lost ones) that could hold one node's share when idle."""
    mc = millicores(request.cpus_per_node)
    return sorted(
        node_id
        for node_id, node in inventory.nodes.items()
        if (node.offered if not lost else not node.alive and not node.drained)
        and node.fits_idle(request.gpus_per_node, mc, request.mem_per_node)
    )


def never_fits_reason(request: GangRequest, inventory: Inventory, count_lost: bool = False) -> str | None:
    """Why the request cannot fit the offered nodes (with ``count_lost``: every registered node, the lost
    and the drained ones too) even with nothing running, or None if it could."""
    big = inventory.count_fitting_idle(request, count_lost=count_lost, count_drained=count_lost)
    level = request.topology_required
    if big >= request.nnodes and (index := inventory.domains_of(level)) is not None:
        most = index.fit_counts(inventory, request)[3 if count_lost else 0]
        if most < request.nnodes:
            return (
                f"rejected: needs {_count(request.nnodes, 'node')} in one {level} ({per_node(request)} per node); "
                f"no {level} has that many that big even when idle (the most in one {level}: {most}; nodes "
                f"without a {level!r} label are in no {level})"
            )
    if big >= request.nnodes:
        return None
    counted = [n.spec for _, n in sorted(inventory.nodes.items()) if n.offered or count_lost]
    lost = _lost(inventory)
    drained = sorted(node_id for node_id, node in inventory.nodes.items() if node.drained)
    if count_lost and (lost or drained):
        out = [f"{len(lost)} of them lost"] if lost else []
        out += [f"{len(drained)} drained"] if drained else []
        of, tail = f"{_count(len(counted), 'registered node')} ({', '.join(out)})", ""
    else:
        of = _count(len(counted), "alive node")
        tail = f"; {_count(len(lost), 'lost node')} not counted: {_ids(lost)}" if lost else ""
        tail += f"; {_count(len(drained), 'drained node')} not counted: {_ids(drained)}" if drained else ""
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


def lost_wait_reason(request: GangRequest, inventory: Inventory) -> str:
    """Why a gang that only lost nodes could hold waits (it does not hold up the queue meanwhile)."""
    lost = _big_enough(request, inventory, lost=True)
    alive = len(_big_enough(request, inventory, lost=False))
    return (
        f"pending: needs {needs(request)}; only {alive} alive {'node is' if alive == 1 else 'nodes are'} big enough "
        f"even when idle: waiting for lost {'node' if len(lost) == 1 else 'nodes'} {_ids(lost)} to come back "
        f"(up to {_num(request.lost_node_wait_s)} s; gangs behind it may start meanwhile)"
    )


def node_wait_reason(request: GangRequest, inventory: Inventory) -> str:
    """Why a gang that no registered node can hold waits: for one to register (a cluster coming up, a node
    pool scaling out), up to its ``lost_node_wait_s``; it does not hold up the queue meanwhile."""
    why = (never_fits_reason(request, inventory, count_lost=True) or "").removeprefix("rejected: ")
    return (
        f"pending: {why}: waiting up to {_num(request.lost_node_wait_s)} s for a node that can hold it to register "
        "(gangs behind it may start meanwhile)"
    )


def node_wait_expired_reason(request: GangRequest, inventory: Inventory) -> str:
    why = (never_fits_reason(request, inventory, count_lost=True) or "").removeprefix("rejected: ")
    return f"unschedulable: {why}; no node that can hold it registered within {_num(request.lost_node_wait_s)} s"


def draining(node_id: str, reason: str) -> str:
    """``"node-1 is drained (maintenance)"``, or without the parenthesis when the operator gave no reason."""
    return f"{node_id} is drained ({reason})" if reason else f"{node_id} is drained"


def draining_reason(node_id: str, reason: str) -> str:
    """Why a gang on a node being drained is preempted: ``"node node-1 is draining (maintenance)"``."""
    return f"node {node_id} is draining ({reason})" if reason else f"node {node_id} is draining"


def drained_wait_reason(request: GangRequest, inventory: Inventory) -> str:
    """Why a gang that only drained nodes could hold waits: for an operator to undrain them (no deadline;
    it does not hold up the queue meanwhile). Names the drained nodes big enough and the operator's reasons."""
    mc = millicores(request.cpus_per_node)
    big = [
        (node_id, node)
        for node_id, node in sorted(inventory.nodes.items())
        if node.fits_idle(request.gpus_per_node, mc, request.mem_per_node)
    ]
    offered = sum(1 for _, node in big if node.offered)
    drained = [
        draining(node_id, node.drain_reason) + ("" if node.alive else " and lost")
        for node_id, node in big
        if node.drained
    ]
    alive = sum(1 for _, node in big if node.alive)
    them = "it" if len(drained) == 1 else "them"
    text = (
        f"pending: needs {needs(request)}; only {offered} offered {'node is' if offered == 1 else 'nodes are'} big "
        f"enough even when idle, and {_ids(drained)}: waiting for an operator to undrain {them}"
    )
    if alive < request.nnodes:  # lost nodes are needed too
        lost = [node_id for node_id, node in big if not node.alive and not node.drained]
        if lost:
            text += f" and for lost {'node' if len(lost) == 1 else 'nodes'} {_ids(lost)} to come back"
    return text + " (gangs behind it may start meanwhile)"


def lost_wait_expired_reason(request: GangRequest, inventory: Inventory) -> str:
    lost = _big_enough(request, inventory, lost=True)
    return (
        f"unschedulable: needs {needs(request)}; waited {_num(request.lost_node_wait_s)} s for lost "
        f"{'node' if len(lost) == 1 else 'nodes'} {_ids(lost)} to come back, and they did not"
    )


def quota_reason(
    tenant: str,
    blocked: Blocked,
    cohort: str | None,
    request: GangRequest,
    reclaiming: bool,
    flavor: str | None = None,
) -> str:
    """Why the tenant cannot take the gang now, e.g. "team-a is at its quota of 8 GPUs and cannot borrow:
    cohort research has 0 GPUs idle"; with flavors, on which ("team-a is at its h100 quota of 8 GPUs...")."""
    if flavor is not None:
        text = quota_reason(tenant, blocked, _pool(cohort), request, reclaiming)
        return _on_flavor(text, flavor, request)
    r = blocked.resource
    quota = amount(r, blocked.nominal or 0)
    tail = f"; needs {needs(request)}"
    if blocked.kind == "never":
        return (
            f"rejected: needs {needs(request)}, more than tenant {tenant} may ever hold "
            f"({amount(r, blocked.limit or 0)}: its quota of {quota} plus what it may borrow)"
        )
    if blocked.kind == "never_protected":
        return (
            f"rejected: needs {needs(request)}, more than the nominal quota of tenant {tenant} ({quota}), and "
            "the gang is not preemptible: only preemptible gangs may borrow beyond the nominal quota (make it "
            "preemptible, or ask for a bigger quota)"
        )
    if blocked.kind == "protected":
        held = amount(r, (blocked.nominal or 0) - blocked.idle)
        return (
            f"pending: {tenant}'s gangs that are not preemptible hold {held} of its quota of {quota}, and this "
            "one is not preemptible either: only preemptible gangs may borrow beyond the nominal quota, so it "
            f"waits for them to finish{tail}"
        )
    if blocked.kind == "quota":
        return f"pending: {tenant} is at its quota of {quota} and has no cohort to borrow from{tail}"
    if blocked.kind == "borrowing_limit":
        return (
            f"pending: {tenant} is at its quota of {quota} and its borrowing limit of "
            f"{amount(r, blocked.limit or 0)}{tail}"
        )
    idle = amount(r, blocked.idle)
    if blocked.within_nominal:
        # not reclaimable: the borrowers' gangs are not preemptible, of higher priority, or the policy says never
        then = "reclaiming it"
        if not reclaiming:
            then = "waiting for it to be returned (no gang holding it may be preempted for this one)"
        return f"pending: {tenant} is within its quota of {quota}, but cohort {cohort} lent it out: {then}{tail}"
    return f"pending: {tenant} is at its quota of {quota} and cannot borrow: cohort {cohort} has {idle} idle{tail}"


def _pool(cohort: str | None) -> str | None:
    # a cohort's pool on a flavor is keyed ``research/h100`` (engine.scheduling.tenancy.ledgers): say it in words
    return cohort if cohort is None or "/" not in cohort else "{} (on {})".format(*cohort.split("/", 1))


def _on_flavor(text: str, flavor: str, request: GangRequest) -> str:
    """A quota reason said on one flavor: "its h100 quota", and whether the gang could go elsewhere."""
    text = text.replace("its quota of", f"its {flavor} quota of").replace("its nominal quota", f"its {flavor} quota")
    if text.startswith("pending:") and len(request.flavors) == 1:
        text += f"; the gang asks for {flavor} only"
    return text


def capacity_reason(
    request: GangRequest, backfill: bool, inventory: Inventory | None = None, flavor: str | None = None
) -> str:
    """Why a gang the tenant's quota allows does not fit the nodes now; names the drained nodes that could
    hold it (an operator may want to know what a drain costs). O(drained nodes). With flavors, the nodes
    are its flavor's ("no h100 node has")."""
    kind = f"{flavor} " if flavor is not None else ""
    labels = ", ".join(f"{k}={v}" for k, v in sorted(request.node_selector.items()))
    with_labels = f" with {labels}" if labels else ""
    n = request.nnodes
    where = f"no {kind}node{with_labels} has" if n == 1 else f"fewer than {n} {kind}nodes{with_labels} have"
    reason = f"pending: waiting for capacity: needs {needs(request)}; {where} {per_node(request)} free"
    level = request.topology_required
    index = None if inventory is None else inventory.domains_of(level)
    if index is not None:
        most, domain = index.largest_free(request)
        where = f"the largest {level} ({level}={domain}) has {most}" if domain else f"no {level} has any"
        reason = (
            f"pending: waiting for capacity: needs {_count(request.nnodes, 'node')} in one {level} "
            f"({per_node(request)} per node); {where} free"
        )
    if backfill and request.gpus_per_node:
        reason += " (smaller gangs may use the idle GPUs meanwhile, preemptibly, until this gang fits)"
    if inventory is not None and inventory.drained:
        mc = millicores(request.cpus_per_node)
        nodes = [(node_id, inventory.nodes[node_id]) for node_id in sorted(inventory.drained)]
        big = [
            draining(i, n.drain_reason)
            for i, n in nodes
            if n.fits_idle(request.gpus_per_node, mc, request.mem_per_node)
        ]
        if big:
            reason += f"; {_ids(big)}"
    return reason


def topology_wait_reason(request: GangRequest) -> str:
    """Why a gang preferring a level with a wait (``Topology(wait=...)``) does not start over several domains."""
    level = request.topology_preferred
    return (
        f"pending: waiting for one {level}: needs {_count(request.nnodes, 'node')} ({per_node(request)} per node) "
        f"and could start over several {level}s now, but prefers one and waits for it up to "
        f"{_num(float(request.topology_wait_s or 0.0))} s from when it could first start, then takes several"
    )


def behind_reason(request: GangRequest, blocker: GangRequest, why: str) -> str:
    """Why a gang that might fit waits: a gang ranked before it is waiting (``why`` says for what)."""
    return (
        f"pending: behind gang {blocker.gang_id!r} of {blocker.tenant}, which goes first (within its quota before "
        f"borrowing, then priority, then fair share, then submission order) and {why}; needs {needs(request)}"
    )


def nominated_reason(request: GangRequest, victims: Sequence[str], cause: str, cost: str | None = None) -> str:
    """``cost``: what preempting them costs, as ``engine.scheduling.lost_work.gpu_minutes`` says it."""
    costs = f", which costs {cost}" if cost else ""
    return (
        f"pending: preempting {_count(len(victims), 'gang')} ({cause}) to make room{costs}: waiting for "
        f"{_ids(sorted(victims))} to release; needs {needs(request)}"
    )


def waiting_note_text(gang_id: str, tenant: str, why: str) -> str:
    """What the reason of a gang whose victim search waits for a victim (gang ``gang_id`` of ``tenant``)
    adds: ``why`` "checkpoint" (``policy.checkpoint_wait``) or "min_runtime" (too young to go yet)."""
    if why == "checkpoint":
        return (
            f"; it waits for gang {gang_id!r} of {tenant} to save its next checkpoint before preempting it "
            "(policy.checkpoint_wait)"
        )
    return f"; it may preempt gang {gang_id!r} of {tenant} once that gang has run policy.min_runtime"


def lender_waiting_reason(request: GangRequest, cohort: str | None) -> str:
    """Why a gang that would borrow waits although idle capacity is there: a lender of its cohort waits for
    what it lent, and gets it first."""
    return (
        f"pending: {request.tenant} would borrow from cohort {cohort}, and a gang within its own nominal quota "
        f"waits there for lent capacity to be given back: it goes first; needs {needs(request)}"
    )


def class_not_allowed_reason(request: GangRequest, tenant: TenantConfig | None) -> str:
    """A gang naming a priority class its tenant may not use (``tenants[].priority_classes``)."""
    allowed = ", ".join(tenant.priority_classes or ()) if tenant is not None else ""
    return (
        f"rejected: tenant {request.tenant} may not use priority class {request.priority!r} "
        f"(its priority classes: {allowed or 'none; a gang that names no class gets the default'})"
    )


def max_pending_reason(request: GangRequest, cap: int, tenant: TenantConfig | None) -> str:
    """A gang beyond its tenant's cap on gangs waiting at once."""
    own = tenant is not None and tenant.max_pending is not None
    where = f"the max_pending of tenant {request.tenant}" if own else "policy.max_pending"
    return (
        f"rejected: tenant {request.tenant} already has {_count(cap, 'gang')} waiting, its cap ({where}); "
        "submit it again once some have started, or raise the cap in the queue configuration"
    )


def queued_reason(request: GangRequest) -> str:
    """A new gang behind earlier gangs of its tenant with the same priority and shape."""
    return f"pending: queued behind earlier gangs of {request.tenant} (first in, first out); needs {needs(request)}"
