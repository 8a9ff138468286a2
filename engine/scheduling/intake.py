"""What enters the queue: the requests rejected at once (``refusal``), and the queue taken again under a new
configuration (``reconfigure``, for ``ConfigApplied``).

They read and update ``engine.scheduling.policy.Policy``'s state, which stays that class's (as
``engine.scheduling.node_waits`` and ``engine.scheduling.preemption`` do).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.scheduling import flavors, node_waits, topology
from engine.scheduling.config import QueueConfig
from engine.scheduling.events import Decision, GangRejected
from engine.scheduling.model import GangRequest
from engine.scheduling.reasons import (
    class_not_allowed_reason,
    malformed_reason,
    max_pending_reason,
    never_fits_reason,
    quota_reason,
)
from engine.scheduling.tenancy import Tenancy, demand

if TYPE_CHECKING:
    from engine.scheduling.policy import Policy

__all__ = ["reconfigure", "refusal"]


def refusal(policy: Policy, request: GangRequest, *, arriving: bool) -> str | None:
    """Why the request is rejected at once, or None. ``arriving``: a new submission (not a queued gang
    looked at again under a new configuration), which ``max_pending`` counts unless it comes back from
    a preemption."""
    malformed = malformed_reason(request)
    if malformed is not None:
        return malformed
    placement = topology.refusal(policy.config, request)  # a topology level the queue file does not declare
    if placement is not None:
        return placement
    gang_id = request.gang_id
    if gang_id in policy.running:
        return f"rejected: gang id {gang_id!r} is already running; release it before submitting it again"
    if gang_id in policy.pending:
        return f"rejected: gang id {gang_id!r} is already queued"
    if not policy.config.tenant(request.tenant):
        known = ", ".join(t.name for t in policy.config.tenants)
        return f"rejected: unknown tenant {request.tenant!r} (tenants: {known})"
    try:
        cls = policy.config.priority(request.priority)
    except KeyError as exc:
        return f"rejected: {exc.args[0]}"
    if not policy.config.allows(request.tenant, request.priority):
        return class_not_allowed_reason(request, policy.config.tenant(request.tenant))
    on_flavors = flavors.refusal(policy, request)  # a flavor, taint or label no flavor of its tenant satisfies
    if on_flavors is not None:
        return on_flavors
    cap = policy.config.max_pending(request.tenant)
    if arriving and gang_id not in policy._requeue and policy._pending_counts.get(request.tenant, 0) >= cap:
        return max_pending_reason(request, cap, policy.config.tenant(request.tenant))
    if node_waits.fit(policy, request) == "never" and not policy.wait_for_nodes:
        return never_fits_reason(request, policy.inventory, count_lost=True)
    vec, protected = demand(request), not (cls.preemptible and request.preemptible)
    never = None
    for flavor in flavors.candidates(policy.config, request):  # rejected if it never fits any of them
        blocked = policy.tenancy.blocked(flavors.key(request.tenant, flavor), vec, protected)
        if blocked is None or blocked.kind not in ("never", "never_protected"):
            return None
        never = never or quota_reason(request.tenant, blocked, None, request, False, flavor)
    return never


def reconfigure(policy: Policy, config: QueueConfig, decisions: list[Decision]) -> None:
    """A new configuration: rebuild the tenant ledger from the running gangs; pending gangs whose tenant
    or priority class is gone are rejected, the others are re-ranked under the new classes."""
    had_flavors, policy.config = bool(policy.config.flavors), config
    if config.flavors or had_flavors:  # the nodes' flavors under the new ones (none without)
        policy.inventory.reclassify(flavors.classifier(config))
    topology.declare(policy.inventory, config.topology)  # rebuilt when the levels changed
    policy._fits.clear()  # whether a shape fits reads the levels
    ledger, policy.tenancy = policy.tenancy, Tenancy(config)
    policy.tenancy.carry(ledger)  # its clock, and the decayed usage when both have a half-life
    policy._tier_cache.clear()
    policy._entries.clear()
    policy._quota_texts.clear()
    policy._prio_counts.clear()
    policy._by_tenant.clear()  # per ledger key, which a flavor gone changes
    for running in policy.running.values():
        try:  # a class made non-preemptible protects its running gangs too; a class gone keeps the old
            cls = config.priority(running.request.priority)
            running.prio, running.preemptible = cls.value, cls.preemptible and running.request.preemptible
        except KeyError:
            pass
        if not config.flavors:  # without flavors every gang is on the implicit one (a flavor gone stays)
            running.on(None)
        policy.tenancy.add(running.ledger, running.vec, protected=not running.preemptible, user=running.request.user)
        policy._by_tenant.setdefault(running.ledger, {})[running.request.gang_id] = running
        policy._count_prio(running, 1)
    old = sorted(policy.pending.values(), key=lambda q: q.seq)
    policy.pending, policy._queues = {}, {}
    policy._pending_counts.clear()
    policy._user_gangs.clear()
    policy.lenders.clear()
    policy._lost_waiters.clear()
    policy._reserved.clear()
    policy._retry.clear()
    policy._pversion += 1
    for queued in old:
        request = queued.request
        why = refusal(policy, request, arriving=False)
        if why is not None:
            decisions.append(GangRejected(gang_id=request.gang_id, reason=why))
            continue
        cls = config.priority(request.priority)
        queued.prio, queued.preemptible = cls.value, cls.preemptible and request.preemptible
        queued.victims.clear()
        queued.failed_search = queued.waited_for = None
        flavors.assign(config, queued)
        policy._enqueue(queued)
