"""JSON-able views of the policy: ``describe`` for ``gangflow cluster``, ``queues`` for ``gangflow queues show``.

Only plain str / int / float / bool / None / list / dict values, so ``json.dumps`` takes them as they are.
Both are O(gangs): they answer queries, never run per event; ``describe_node`` is one node's row of ``describe``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.scheduling.flavors import describe_flavors
from engine.scheduling.tenancy import RESOURCES
from engine.scheduling.units import cpus_of
from engine.scheduling.users import take_turns

if TYPE_CHECKING:
    from engine.scheduling.inventory import Node
    from engine.scheduling.policy import Policy
    from engine.scheduling.state import Queued

__all__ = ["describe", "describe_node", "queues"]


def _resources(values: tuple[int | None, ...]) -> dict[str, int | float | None]:
    gpu, cpu, mem = values
    return {"gpu": gpu, "cpu": None if cpu is None else cpus_of(cpu), "mem": mem}


def _finite(share: float) -> float | None:
    # JSON has no infinity: a weight-0 tenant above its quota (infinite share) shows null
    return round(share, 6) if share != float("inf") else None


def _decayed(values: tuple[float, float, float]) -> dict[str, float]:
    # resource-seconds: GPU-seconds, CPU-seconds (not millicore-seconds, as ``cpu`` is CPUs everywhere here),
    # byte-seconds
    gpu, cpu, mem = values
    return {"gpu": round(gpu, 3), "cpu": round(cpu / 1000, 3), "mem": round(mem)}


def queues(policy: Policy) -> dict[str, Any]:
    """Per tenant: nominal quota, used, borrowed, lent, pending gangs and fair share; per cohort its members.
    With ``policy.usage_half_life`` also ``decayed_usage``: what the tenant used above its nominal quota,
    decayed (``engine.scheduling.usage_decay``), in GPU-, CPU- and byte-seconds."""
    tenancy = policy.tenancy
    pending: dict[str, int] = {}
    waiting: dict[tuple[str, str], int] = {}  # per tenant and user (a gang naming one)
    for queued in policy.pending.values():
        request = queued.request
        pending[request.tenant] = pending.get(request.tenant, 0) + 1
        if request.user:
            waiting[request.tenant, request.user] = waiting.get((request.tenant, request.user), 0) + 1
    lent = tenancy.lent()
    if policy.config.flavors:
        return _queues_by_flavor(policy, pending, waiting, lent)
    names = [t.name for t in policy.config.tenants]
    # a tenant removed from the configuration still shows while its gangs hold GPUs
    names += sorted(name for name in tenancy.tenants if name not in names and any(tenancy.used(name)))
    tenants: dict[str, dict[str, Any]] = {
        name: {
            "cohort": policy.config.root_cohort(name),
            "weight": tenancy.tenants[name].weight,
            **_ledger_row(policy, name, lent),
            "pending": pending.get(name, 0),
            "share": _finite(tenancy.share(name, policy.inventory.capacity)),
        }
        for name in names
    }
    for name, entry in tenants.items():
        decayed = tenancy.decayed(name)
        if decayed is not None:
            entry["decayed_usage"] = _decayed(decayed)
        _user_rows(policy, name, entry, waiting)
    cohorts = {
        c.name: {"parent": c.parent, "tenants": [t.name for t in policy.config.tenants if t.cohort == c.name]}
        for c in policy.config.cohorts
    }
    return {"tenants": tenants, "cohorts": cohorts, "resources": list(RESOURCES)}


def _user_rows(policy: Policy, tenant: str, entry: dict[str, Any], waiting: dict[tuple[str, str], int]) -> None:
    """``users`` of a tenant's row, only where its gangs name users (``engine.scheduling.users``): per user what
    it holds, its share inside the tenant and, with a half-life, its decayed usage; its gangs waiting."""
    users = policy.tenancy.users
    pending = {user: n for (owner, user), n in waiting.items() if owner == tenant}
    rows = users.rows(tenant)
    names = sorted(set(rows) | set(pending))
    if not names:
        return
    capacity = policy.inventory.capacity
    entry["users"] = {}
    for user in names:
        row = rows.get(user, {"used": (0, 0, 0)})
        out: dict[str, Any] = {
            "used": _resources(row["used"]),
            "pending": pending.get(user, 0),
            "share": _finite(users.share(tenant, user, capacity)),
        }
        if "decayed" in row:
            out["decayed_usage"] = _decayed(row["decayed"])
        entry["users"][user] = out


def _ledger_row(policy: Policy, key: str, lent: dict[str, tuple[int, int, int]]) -> dict[str, Any]:
    """One ledger entry's quota and usage (a tenant's without flavors, a tenant's on one flavor with them)."""
    tenancy = policy.tenancy
    return {
        "nominal": _resources(tenancy.nominal(key)),
        "used": _resources(tenancy.used(key)),
        "borrowed": _resources(tenancy.borrowed(key)),
        "lent": _resources(lent.get(key, (0, 0, 0))),
    }


def _sum(rows: list[dict[str, Any]], field: str) -> dict[str, Any]:
    # a tenant's figure over its flavors; a quota one flavor leaves unlimited is unlimited in all
    return {
        r: None if any(row[field][r] is None for row in rows) else sum(row[field][r] for row in rows) for r in RESOURCES
    }


def _queues_by_flavor(
    policy: Policy, pending: dict[str, int], waiting: dict[tuple[str, str], int], lent: dict[str, tuple[int, int, int]]
) -> dict[str, Any]:
    """``queues`` with flavors: per tenant its figures summed over its flavors, and ``flavors``, per flavor
    its quota, usage and share there; its ``share`` is the largest of them (``engine.scheduling.flavors``)."""
    tenancy, config = policy.tenancy, policy.config
    tenants: dict[str, dict[str, Any]] = {}
    names = [t.name for t in config.tenants]
    gone = sorted({k.partition("/")[0] for k in tenancy.tenants if any(tenancy.used(k))} - set(names))
    for name in names + gone:  # a tenant removed from the configuration still shows while its gangs hold GPUs
        keys = tenancy.keys.get(name) or [k for k in tenancy.tenants if k.partition("/")[0] == name]
        rows = {k.partition("/")[2]: _ledger_row(policy, k, lent) for k in keys}
        for k, row in zip(keys, rows.values(), strict=True):
            row["share"] = _finite(tenancy.share(k, policy.inventory.capacity))
        entry = tenants[name] = {
            "cohort": config.root_cohort(name),
            "weight": tenancy.tenants[keys[0]].weight if keys else 1.0,
            **{field: _sum(list(rows.values()), field) for field in ("nominal", "used", "borrowed", "lent")},
            "pending": pending.get(name, 0),
            "share": _finite(tenancy.tenant_share(name, policy.inventory.capacity)),
            "flavors": rows,
        }
        decayed = [d for d in map(tenancy.decayed, keys) if d is not None]
        if decayed:
            entry["decayed_usage"] = _decayed(
                (sum(d[0] for d in decayed), sum(d[1] for d in decayed), sum(d[2] for d in decayed))
            )
        _user_rows(policy, name, entry, waiting)
    cohorts = {
        c.name: {"parent": c.parent, "tenants": [t.name for t in config.tenants if t.cohort == c.name]}
        for c in config.cohorts
    }
    return {"tenants": tenants, "cohorts": cohorts, "resources": list(RESOURCES), "flavors": describe_flavors(policy)}


def _node_row(node_id: str, node: Node) -> dict[str, Any]:
    """One node's entry in ``describe`` (and the whole answer of ``describe_node``)."""
    spec = node.spec
    offered = node.offered
    held_gpus = sorted(i for hold in node.held.values() for i in hold.gpu_ids)
    return {
        "node_id": node_id,
        "address": spec.address,
        "sandboxed": spec.sandboxed,
        "alive": node.alive,
        "drained": node.drained,
        "drain_reason": node.drain_reason,
        "gpus_total": spec.gpus,
        "gpus_free": len(node.free_gpus) if offered else 0,
        "free_gpu_ids": list(node.free_gpus) if offered else [],
        "used_gpu_ids": held_gpus,
        "cpus_total": spec.cpus,
        "cpus_free": cpus_of(node.free_mc) if offered else 0,
        "mem_total": spec.mem,
        "mem_free": node.free_mem if offered or node.free_mem is None else 0,
        "gangs": sorted(node.held),
        # only when there is something to say: a row of a cluster without labels is as before them
        **({"labels": dict(spec.labels)} if spec.labels else {}),
        **({"flavor": node.flavor} if node.flavor is not None else {}),
    }


def describe_node(policy: Policy, node_id: str) -> dict[str, Any] | None:
    """``node_id``'s entry of ``describe``, or None for a node never registered: what an agent asks when it
    starts (its own drain), O(1) where ``describe`` is O(cluster): a thousand agents starting at once must
    not each have the whole cluster's view built, sent and parsed."""
    node = policy.inventory.nodes.get(node_id)
    return None if node is None else _node_row(node_id, node)


def _user_places(policy: Policy, tenant: str, gangs: list[Queued]) -> dict[str, int] | None:
    """Where a tenant's waiting gangs stand in the order when they name users, as the admission cycle takes
    their heads (``engine.scheduling.cycle.user_heads``): per priority, the gangs' own numbers handed out again
    by their users' shares, the lowest first, then in submission order. None: none names a user."""
    if not policy._user_gangs.get(tenant):
        return None
    shares = policy.tenancy.users.shares(tenant, (q.request.user for q in gangs), policy.inventory.capacity)
    turns = ((q.prio, (shares[q.request.user], q.seq), q.seq, q.request.gang_id) for q in gangs)
    return dict(take_turns(turns))


def describe(policy: Policy) -> dict[str, Any]:
    """Nodes (sorted by id) with capacity, whether they are drained and the gangs on them, running gangs
    (with the preemption in progress, if any), and the queue in order."""
    default_class = policy.config.priority(None).name
    nodes = [_node_row(node_id, node) for node_id, node in sorted(policy.inventory.nodes.items())]
    running = []
    for gang_id, entry in sorted(policy.running.items()):
        request = entry.request
        notice = entry.preemption
        running.append(
            {
                "gang_id": gang_id,
                "tenant": request.tenant,
                **({"user": request.user} if request.user else {}),  # its run's user, where it names one
                "priority": request.priority or default_class,
                "preemptible": entry.preemptible,
                "backfill": entry.backfill,
                "preempting": notice is not None,
                "preempted_for": entry.preempted_for,
                # a preemption decided and not released yet: for whom (a gang of a tenant, or a node being
                # drained), since when (the Scheduler's clock, epoch s) and with how much grace
                "preempted": None
                if notice is None
                else {
                    "by": notice.by,
                    "by_tenant": notice.by_tenant,
                    "cause": notice.cause,
                    "since": notice.since,
                    "grace_s": notice.grace_s,
                    "cost_gpu_s": notice.cost_gpu_s,  # the work it is expected to lose (lost_work)
                },
                # its attempt's last checkpoint as its gang reported it (None: none reported)
                "checkpoint": None
                if entry.checkpoint is None
                else {"step": entry.checkpoint.step, "at": entry.checkpoint.at, "save_s": entry.checkpoint.save_s},
                "admitted_at": entry.admitted_at,
                **({"flavor": entry.flavor} if entry.flavor is not None else {}),  # none without flavors
                "nnodes": request.nnodes,
                "gpus_per_node": request.gpus_per_node,
                "cpus_per_node": request.cpus_per_node,
                "mem_per_node": request.mem_per_node,
                "nodes": [
                    {"node_id": a.node_id, "address": a.address, "node_rank": a.node_rank, "gpu_ids": list(a.gpu_ids)}
                    for a in entry.placement.nodes
                ],
            }
        )
    by_tenant: dict[str, list[Any]] = {}
    for q in policy.pending.values():
        by_tenant.setdefault(q.request.tenant, []).append(q)
    tiers = {tenant: policy.tiers(tenant, gangs) for tenant, gangs in by_tenant.items()}

    # a tenant's gangs naming users take turns by their users' shares on the places its gangs hold
    places = {tenant: _user_places(policy, tenant, gangs) for tenant, gangs in by_tenant.items()}

    def rank(q: Any) -> tuple[bool, int, float, int]:
        borrows, share = tiers[q.request.tenant][-q.prio]
        mine = places[q.request.tenant]
        place = q.seq if mine is None else mine[q.request.gang_id]
        return (borrows, -q.prio, share, place)  # the admission cycle's order (engine.scheduling.cycle)

    order = sorted(policy.pending.values(), key=rank)
    pending = [
        {
            "position": position + 1,
            "gang_id": q.request.gang_id,
            "tenant": q.request.tenant,
            **({"user": q.request.user} if q.request.user else {}),
            "priority": q.request.priority or default_class,
            "nnodes": q.request.nnodes,
            "gpus_per_node": q.request.gpus_per_node,
            "cpus_per_node": q.request.cpus_per_node,
            "mem_per_node": q.request.mem_per_node,
            "reason": q.reason,
            "preempting": sorted(q.victims),
            "preempting_cost_gpu_s": q.victims_cost if q.victims else None,
            **({"flavors": list(q.candidates)} if q.flavor is not None else {}),  # none without flavors
        }
        for position, q in enumerate(order)
    ]
    offered_nodes = [n for n in policy.inventory.nodes.values() if n.offered]
    totals = {
        "nodes": len(nodes),
        "alive_nodes": sum(1 for n in policy.inventory.nodes.values() if n.alive),
        "gpus_total": sum(n.spec.gpus for n in offered_nodes),
        "gpus_free": sum(entry["gpus_free"] for entry in nodes),
        "running": len(running),
        "pending": len(pending),
    }
    return {
        "totals": totals,
        "nodes": nodes,
        "running": running,
        "pending": pending,
        "tenants": queues(policy)["tenants"],
        "drained": sorted(n.spec.node_id for n in policy.inventory.nodes.values() if n.drained),
        "counters": policy.counters.rows(),  # admissions and preemptions so far (engine.scheduling.counters)
        "flavors": describe_flavors(policy),  # empty without flavors
    }
