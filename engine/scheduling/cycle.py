"""The admission cycle: after an event, the heads of the pending queues in order, each admitted, nominating
its victims, or told why it waits (the rules are ``engine.scheduling.policy``'s docstring).

It reads and updates the policy's state (``Policy``), as the other rule modules do. Most of an event's cost
under a long backlog is here, so the walk skips what cannot have changed: a tenant's entries in the order
are rebuilt only for the tenants an event touched, a shape that failed to be placed is not placed again in
the cycle, a demand a tenant's quota refused stops the bigger ones of that tenant (a gang of several flavors
refused so on each of them does not choose among them), and a head its quota stopped last time for the same
reason (``Policy._quota_texts``, its *quota text*) takes a quick path that does only what such a look could
still change (a victim search that fails fast or is put off).
"""

from __future__ import annotations

import heapq
import itertools
from typing import TYPE_CHECKING, Any

from engine.scheduling import flavors, node_waits, preemption
from engine.scheduling.events import Decision
from engine.scheduling.reasons import (
    behind_reason,
    capacity_reason,
    lender_waiting_reason,
    quota_reason,
    topology_wait_reason,
)
from engine.scheduling.state import Queued, QueueKey, Shape
from engine.scheduling.tenancy import Blocked, Vec
from engine.scheduling.tenancy import key as ledger_key
from engine.scheduling.topology import holds_out
from engine.scheduling.users import take_turns

if TYPE_CHECKING:
    from engine.scheduling.policy import Policy

__all__ = ["QuotaText", "run", "user_heads"]

#: a head its quota stopped: (its pool's counter, a list whose first item moves with the pool's usage; that
#: item then; the inventory's ``topology`` then; its reason; whether it was stopped as a protected gang; the stop;
#: its reason without what its victim search waits for, ``preemption.waiting_note``)
QuotaText = tuple[list[int], int, int, str, bool, Blocked, str]


def run(policy: Policy, decisions: list[Decision], *, timed: bool, searches: int) -> None:
    """Admit (and preempt) what the order allows after an event (``Policy.step``), saying why the rest waits."""
    node_waits.revive_lost_waiters(policy)
    if not policy.pending:
        return
    # a tenant's entries in the order change with its pending gangs, its usage and the capacity only: most
    # events touch one tenant, and the others' entries are the same as at the last event
    tenancy, made_for = policy.tenancy, (policy.inventory.topology, policy.tenancy)
    if policy._entries_for != made_for:
        policy._entries.clear()
        policy._entries_for = made_for
        touched = set(policy._queues)
    else:
        touched = policy._touched | tenancy.touched
    policy._touched.clear()
    tenancy.touched.clear()
    for tenant in touched:
        queues = policy._queues.get(tenant)
        if queues is None:
            continue
        heads = []
        for key, heap in list(queues.items()):
            head = policy._head(heap)
            if head is None:
                del queues[key]
            else:
                heads.append((key, head))
        tiers = policy.tiers(tenant, [h for _, h in heads])
        if policy._user_gangs.get(tenant):
            looked = user_heads(policy, tenant, heads)
        else:
            looked = [(key, head, head.seq) for key, head in heads]
        entries = []
        for key, head, place in looked:
            borrows, share = tiers[key[0]]
            entries.append((borrows, key[0], share, place, 0, head.request.gang_id, tenant, key))
        policy._entries[tenant] = entries
    order: list[Any] = list(itertools.chain.from_iterable(policy._entries.values()))
    heapq.heapify(order)
    if policy.inventory.topology != policy._topology_seen:
        policy._topology_seen = policy.inventory.topology
        policy._pversion += 1
    for gang_id in [g for g, at in policy._retry.items() if at <= policy._now]:
        del policy._retry[gang_id]  # come of age: the gang's next look searches again
    policy._searches_left = searches  # victim searches per event are bounded: so is the cost of an event
    holds: list[preemption.Hold] = []  # what gangs waiting for their victims hold: undone however it ends
    try:
        _walk(policy, order, decisions, holds, timed=timed)
    finally:
        preemption.unhold(policy, holds)


def _walk(
    policy: Policy, order: list[Any], decisions: list[Decision], holds: list[preemption.Hold], *, timed: bool
) -> None:
    """The cycle's walk of the order (``run``): admit, nominate, or say why each head waits."""
    rules = policy.config.policy
    # ``changed`` counts admissions per tenant in this cycle: an entry ranked before the last one is ranked
    # again when it comes up (its tenant's share moved)
    changed: dict[str, int] = {}
    # per tenant, the demands its quota refused in this cycle: a bigger one is refused too (its reason
    # was set when it was first looked at, so it is not worked out again for every event)
    refused: dict[str, list[Vec]] = {}
    blocker: Queued | None = None
    blocker_why = ""
    failed_shapes: set[Shape] = set()
    reserved = frozenset().union(*policy._reserved.values()) if policy._reserved else frozenset()
    held: frozenset[str] = frozenset()  # the nodes of the gangs that hold what their victims free
    # per tenant whose gangs name users, its heads in the order as of its latest admission in this cycle
    by_user: dict[str, tuple[int, dict[QueueKey, tuple[QueueKey, Queued, int]], list[Queued]]] = {}
    pending, quotas, topology, now = policy.pending, policy._quota_texts, policy.inventory.topology, policy._now
    skip_refused = policy.skip_refused_flavors
    while order:
        entry = heapq.heappop(order)
        _, _, _, seq, version, gang_id, tenant, key = entry
        if version != changed.get(tenant, 0):  # the tenant started a gang in this cycle: rank it again
            # its users' shares moved too, or it stands for a queue whose head started: whose head it is now
            if len(key) > 3 or policy._user_gangs.get(tenant) or gang_id not in pending:
                made = by_user.get(tenant)
                if made is None or made[0] != changed[tenant]:  # once per admission of the tenant
                    current_heads = _heads(policy, tenant)
                    groups = {u[0][:3]: u for u in user_heads(policy, tenant, current_heads)}
                    made = by_user[tenant] = (changed[tenant], groups, [h for _, h in current_heads])
                now_head = made[1].get(key[:3])
                if now_head is None:  # the gangs of its priority, shape and preemptibility are gone
                    continue
                key, head, seq = now_head
                gang_id, current = head.request.gang_id, made[2]
            else:
                current = [h for h in map(policy._head, policy._queues[tenant].values()) if h is not None]
            borrows, share = policy.tiers(tenant, current)[key[0]]
            heapq.heappush(order, (borrows, key[0], share, seq, changed[tenant], gang_id, tenant, key))
            continue
        queued = pending[gang_id]
        quick = quotas.get(gang_id)
        if (
            quick is not None
            and quick[2] == topology  # the same nodes: it fits them, as then
            and queued.reason == quick[3]
            and not queued.victims
            and (blocker is None or (rules.backfill and queued.preemptible))
            and (quick[1] == quick[0][0] or _stopped_alike(policy, queued, quick))
        ):
            # its quota stops it as last time, and it would say the same: only the cheap effects of a
            # look (``refused``, a victim search that fails fast or is put off) are left to do; the same
            # tests as below, in the same order
            vec = queued.vec
            if (
                blocker is not None
                and not policy._searches_left
                and (queued.placed_shape in failed_shapes or policy.inventory.free_gpus < vec[0])
            ):
                continue
            if quick[4] or _no_bigger(vec, refused.get(queued.ledger, ())):
                continue  # stopped as a protected gang (it searches no victims), or a smaller gang was refused
            failed = queued.failed_search
            if failed is not None and failed[0] == policy._pversion and now < failed[1]:
                refused.setdefault(queued.ledger, []).append(vec)
                continue
            if policy._searches_left <= 0:
                refused.setdefault(queued.ledger, []).append(vec)
                policy._retry[gang_id] = now + preemption.SEARCH_PUT_OFF_S
                continue
        request = queued.request
        heap = policy._queues[tenant][key]
        cached = policy._fits.get(queued.shape)  # ``node_waits.fit``'s answer, read as it keeps it
        fit = cached[1] if cached and cached[0] == topology else node_waits.fit(policy, request, queued.shape)
        if fit != "now":  # it waits for nodes, not for what its tenant lent: no longer a lender waiting
            policy.lenders.forget(policy.tenancy.root(queued.ledger), request.gang_id)
        if fit == "drained":
            node_waits.wait_for_drain(policy, queued, decisions)
            continue
        if fit != "now":
            node_waits.wait_for_lost(policy, heap, decisions, timed=timed)
            continue
        if (
            blocker is not None
            and not policy._searches_left
            and queued.reason
            and not queued.victims
            and (queued.placed_shape in failed_shapes or policy.inventory.free_gpus < queued.vec[0])
        ):
            # behind the first gang that waits, with no GPUs it could take and no search left for this
            # event: nothing can change for it now, and its reason still holds (the cost of an event
            # under a long backlog is the gangs that can move, not every queue's head)
            continue
        if blocker is not None and (not rules.backfill or not queued.preemptible):
            why = blocker_why
            if rules.backfill and not queued.preemptible:
                why += " (this gang is not preemptible, so it does not backfill)"
            tkey: tuple[Any, ...] = ("behind", queued.shape, blocker.request.gang_id, why)
            policy._say(queued, policy._text(tkey, behind_reason, request, blocker.request, why), decisions)
            continue
        if len(queued.candidates) > 1:  # which of its flavors it is looked at on now
            if skip_refused and queued.reason and not queued.victims and _refused_everywhere(policy, queued, refused):
                continue  # whichever flavor it chose, the test below would pass it over: half the heads of the
                # fleet trace, each choosing among its flavors for nothing
            flavors.choose(policy, queued, (reserved if blocker is not None else frozenset()) | held)
        vec, ledger = queued.vec, queued.ledger  # its tenant on its flavor (its name without flavors)
        if queued.reason and not queued.victims and _no_bigger(vec, refused.get(ledger, ())):
            continue
        blocked = policy.tenancy.blocked(ledger, vec, not queued.preemptible)
        root = policy.tenancy.root(ledger)
        policy.lenders.update(root, request.gang_id, blocked)
        if blocked is None and policy.lenders.waiting(root) and policy.tenancy.would_borrow(ledger, vec):
            refused.setdefault(ledger, []).append(vec)  # a bigger gang would borrow too
            text = policy._text(("lender", tenant, queued.shape, root), lender_waiting_reason, request, root)
            policy._say(queued, text, decisions)
            continue
        if blocked is not None:
            if blocked.kind != "protected":  # a preemptible gang bigger than this one may still borrow
                refused.setdefault(ledger, []).append(vec)
            if queued.victims or (
                blocked.kind != "protected" and preemption.preempt_for(policy, queued, decisions, timed=timed)
            ):
                policy._say(queued, preemption.nominated(queued), decisions)
                held = preemption.hold(policy, queued, holds, held)
            else:
                # what it reads moves with its pool's usage (``_prio_counts`` with its tenants' usage), and
                # beyond nominal (no reclaim) the same stop says the same
                counter = policy.tenancy.pool_counter(ledger)
                if quick is not None and (
                    quick[1] == counter[0] or (blocked == quick[5] and not blocked.within_nominal)
                ):
                    stop = quick[6]
                else:
                    reclaim = blocked.within_nominal and preemption.reclaimable(policy, queued)
                    tkey = ("quota", ledger, blocked, queued.shape, reclaim)
                    stop = policy._text(tkey, quota_reason, tenant, blocked, root, request, reclaim, queued.flavor)
                text = stop + preemption.waiting_note(policy, queued)
                protected = blocked.kind == "protected"
                if len(queued.candidates) == 1:  # else another flavor's quota may take it at the next look
                    policy._quota_texts[gang_id] = (counter, counter[0], topology, text, protected, blocked, stop)
                policy._say(queued, text, decisions)
            continue
        shape = queued.placed_shape
        backfill = blocker is not None
        placement = None
        holding_out = False  # placed over several domains, it waits for one (``Topology(wait=...)``)
        if shape not in failed_shapes:
            # a backfilled gang stays off the nodes reserved for gangs waiting for their victims to leave
            exclude = (reserved if backfill else frozenset()) | held
            placement = policy.inventory.place(request, exclude, flavors.admits(queued.flavor, request))
            if placement is not None and request.topology_wait_s is not None:
                holding_out = holds_out(policy.inventory, request, placement, policy._topology_waits, now)
                placement = None if holding_out else placement
        if placement is None:
            failed_shapes.add(shape)
            waiting_first = blocker is None
            if queued.victims or (
                waiting_first and preemption.preempt_for(policy, queued, decisions, timed=timed, defrag=True)
            ):
                policy._say(queued, preemption.nominated(queued), decisions)
                held = preemption.hold(policy, queued, holds, held)
                why = "waits for the gangs it preempted to release"
            elif holding_out:
                policy._say(queued, policy._text(("one domain", shape), topology_wait_reason, request), decisions)
                why = f"waits for one {request.topology_preferred}"
            else:
                said = policy.inventory.domains.said(request) if policy.inventory.domains else None  # topology
                tkey = ("capacity", shape, rules.backfill, policy.inventory.drain_changes, said)
                text = policy._text(tkey, capacity_reason, request, rules.backfill, policy.inventory, queued.flavor)
                policy._say(queued, text + preemption.waiting_note(policy, queued), decisions)
                why = "waits for capacity"
            if waiting_first:
                blocker, blocker_why = queued, why
            continue
        held_back = request.gang_id in policy._reserved
        policy._admit(queued, placement, backfill=backfill, decisions=decisions)
        if held_back:  # the nodes it kept free are free for the gangs after it in this cycle too
            reserved = frozenset().union(*policy._reserved.values()) if policy._reserved else frozenset()
        changed[tenant] = changed.get(tenant, 0) + 1
        nxt = policy._head(heap)
        if nxt is not None:  # ranked again when it comes up, as the tenant's share moved
            heapq.heappush(order, (False, key[0], 0.0, nxt.seq, -1, nxt.request.gang_id, tenant, key))
        elif len(key) > 3 or policy._user_gangs.get(tenant):  # another user's gang of its shape may come next
            heapq.heappush(order, (False, key[0], 0.0, queued.seq, -1, gang_id, tenant, key))


def _heads(policy: Policy, tenant: str) -> list[tuple[QueueKey, Queued]]:
    """The tenant's queue heads now, with their queues' keys."""
    heads = ((key, policy._head(heap)) for key, heap in policy._queues[tenant].items())
    return [(key, head) for key, head in heads if head is not None]


def user_heads(policy: Policy, tenant: str, heads: list[tuple[QueueKey, Queued]]) -> list[tuple[QueueKey, Queued, int]]:
    """The heads of a tenant whose gangs name users that go into the order (``engine.scheduling.users``).

    Its users' queues of one priority, shape and preemptibility (one queue without users) stand for each other
    as a queue's gangs do: only the head of the user with the lowest share (then the oldest) is looked at, so
    users add no looks to a cycle. Per priority, those heads go by their users' shares onto the places the
    oldest gangs of their queues hold: the tenant's places among the other tenants are what they were without
    users. Each comes back with its key and its place (its ``seq`` in the order)."""
    shares = policy.tenancy.users.shares(tenant, (h.request.user for _, h in heads), policy.inventory.capacity)
    # queue without users -> (rank, key, head, the oldest gang's number among its users' heads)
    groups: dict[QueueKey, tuple[tuple[float, int], QueueKey, Queued, int]] = {}
    for key, head in heads:
        rank = (shares[head.request.user], head.seq)
        best = groups.get(key[:3])
        oldest = head.seq if best is None else min(best[3], head.seq)
        groups[key[:3]] = (rank, key, head, oldest) if best is None or rank < best[0] else (*best[:3], oldest)
    turns = take_turns((head.prio, rank, oldest, (key, head)) for rank, key, head, oldest in groups.values())
    return [(key, head, place) for (key, head), place in turns]


def _refused_everywhere(policy: Policy, queued: Queued, refused: dict[str, list[Vec]]) -> bool:
    """Whether, on every flavor a gang of several may use, a gang of its tenant no bigger was refused in this
    cycle: the test after its flavor choice passes it over whichever flavor it chooses, so no choice is made
    (it keeps the flavor it was last looked at on). Not for a lender waiting: its choice may leave its flavor,
    which forgets it there (``flavors.choose``)."""
    vec, tenant = queued.vec, queued.request.tenant
    for flavor in queued.candidates:
        if not _no_bigger(vec, refused.get(ledger_key(tenant, flavor), ())):
            return False
    return not policy.lenders.waits(policy.tenancy.root(queued.ledger), queued.request.gang_id)


def _no_bigger(vec: Vec, refusals: list[Vec] | tuple[()]) -> bool:
    """Whether a demand no bigger than ``vec`` is among the tenant's refusals of this cycle: then ``vec`` is
    refused too."""
    return any(vec[0] >= s[0] and vec[1] >= s[1] and vec[2] >= s[2] for s in refusals)


def _stopped_alike(policy: Policy, queued: Queued, quick: QuotaText) -> bool:
    """Whether its pool's usage moved but its quota stops it as before (``blocked`` is pure), above nominal
    (its reason names no reclaim): it says the same; then the cache says so for its pool's usage now."""
    blocked = policy.tenancy.blocked(queued.ledger, queued.vec, not queued.preemptible)
    if blocked is None or blocked != quick[5] or blocked.within_nominal:
        return False
    policy._quota_texts[queued.request.gang_id] = (quick[0], quick[0][0], *quick[2:])
    return True
