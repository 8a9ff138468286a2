"""Preemption: which running gangs a waiting gang may preempt, and the few whole gangs it does.

**Who may go** (``preempt_for``, for the policy's admission cycle): a gang that cannot start ranks the
running gangs as victims by the four causes of ``engine.scheduling.policy`` (reclaim, priority, backfill,
defrag; the first that applies names the cause). A victim is preemptible, not already leaving, not a
gang this one was itself preempted for (no cycles), and admitted at least ``policy.min_runtime`` ago;
with ``policy.checkpoint_wait``, not one whose next checkpoint is expected within it (``lost_work``), until
just after that checkpoint.
An event runs a bounded number of searches: a search put off comes back within ``SEARCH_PUT_OFF_S``,
and one that found nothing is not repeated before something that could change its answer moves.

**Choosing victims** (``choose_victims``): few whole gangs whose removal lets the waiting gang start, at a
bounded cost. The policy says which running gangs the waiting gang may preempt and how much it prefers
each (``rank``: lower is preferred; None: not a candidate).

*Which rule, which cost.* The rules say who may go at all (above: whole gangs, preemptible, old enough, no
cycles, the causes' own conditions such as ``within_tenant: lower_priority``). Of the gangs they allow,
those of borrowing tenants go first: a rule (Kueue's, for reclaim; the lent capacity is always
reclaimable). Beyond that, today's order was a heuristic: the lowest priority, then the most recently
admitted, and fewest victims first. Once gangs report checkpoints (``engine.scheduling.lost_work``,
``LostWork.active``), the expected lost GPU-seconds replace it: ``rank`` is (not a borrower, cost,
priority, most recent admission), each node's victims and the nodes themselves are chosen by their total
cost (fewer victims only breaks a tie), and the reverse prune gives back the dearest victims first. Before
any report the order is today's exactly (no cost says more than an admission time). Known gap: a victim
spanning several nodes counts its whole cost on each node looked at, so cheaper one-node victims can win
over it where it alone would free them all (tests/unit/test_scheduling_lost_work.py).

1. Nodes are looked at from the one with the most free GPUs down (they need the fewest victims), at most
   ``NODES_LOOKED_AT`` beyond what the gang needs: a search costs O(that), not O(cluster). On each node,
   the shortest prefix of its candidates in preference order that frees one node's share (costed: then
   pruned, dearest first, of the victims the rest can spare). The gang's ``nnodes`` cheapest nodes win:
   fewest victims, then the most preferable worst victim, then node id (costed: the borrower rule, then
   the least total cost, then fewest victims, then node id).
2. If the tenant's quota still blocks it (a cohort pool lent out), ``more`` candidates, in preference
   order, are added until it does not (among each tenant's ``MORE_VICTIMS`` most recently admitted).
3. Reverse prune (as Kueue does): each victim, last chosen first, is given back if the gang still fits
   without it. What remains is minimal: no victim can be spared.

With flavors (``engine.scheduling.flavors``) a search looks only at the nodes of the gang's flavor (with its
node selector) and frees quota only in its tenant's ledger on that flavor (borrowers of that flavor's pool,
its own gangs there): a gang on another flavor is never a victim, as its release would free nothing the
gang can use.

Every preemption records what it costs (``Preempted.cost_gpu_s``) and the waiting gang's reason says it.

Everything is tried on the live inventory and tenancy, then undone: nothing changes until the policy
acts on the answer, and the answer is deterministic.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from engine.scheduling import flavors, topology
from engine.scheduling.events import Decision, Preempted
from engine.scheduling.inventory import Inventory, Node, millicores
from engine.scheduling.lost_work import gpu_minutes, lost_gpu_s, next_checkpoint
from engine.scheduling.model import GangRequest, Placement
from engine.scheduling.reasons import needs, nominated_reason, waiting_note_text
from engine.scheduling.state import Cause, Notice, Queued, Running
from engine.scheduling.tenancy import Tenancy, Vec

if TYPE_CHECKING:
    from engine.scheduling.policy import Policy

__all__ = [
    "CHECKPOINT_LATE_S",
    "MORE_VICTIMS",
    "NODES_LOOKED_AT",
    "SEARCH_PUT_OFF_S",
    "Hold",
    "Victim",
    "choose_victims",
    "hold",
    "nominated",
    "preempt_for",
    "reclaimable",
    "unhold",
    "waiting_note",
]

#: how many nodes beyond the gang's own ``nnodes`` a search looks at (the ones with the most free GPUs)
NODES_LOOKED_AT = 8
#: how soon a gang whose victim search was put off (one search per event) searches again, policy seconds
SEARCH_PUT_OFF_S = 5.0
#: how long after its expected time a victim's checkpoint is waited for (``policy.checkpoint_wait``): its report
#: comes once the save is done; one later still is not waited for
CHECKPOINT_LATE_S = 5.0
#: how many of a tenant's most recent gangs a victim search considers to free quota (not nodes)
MORE_VICTIMS = 256


# -- who may go --------------------------------------------------------------------------------------------
def preempt_for(
    policy: Policy, queued: Queued, decisions: list[Decision], *, timed: bool, defrag: bool = False
) -> bool:
    """Find and preempt the victims that let ``queued`` start; False if there are none (yet)."""
    failed = queued.failed_search
    if failed is not None and failed[0] == policy._pversion and policy._now < failed[1]:
        return False  # nothing changed since the last search found nothing
    if policy._searches_left <= 0:
        # put off to bound this event's cost: a Tick comes back for it soon, whatever else happens
        policy._retry[queued.request.gang_id] = policy._now + SEARCH_PUT_OFF_S
        return False
    policy._searches_left -= 1
    costed = policy.lost_work.active
    rank, more, routes, waited = _ranking(policy, queued, timed=timed, defrag=defrag)
    admits, ledger = flavors.admits(queued.flavor, queued.request), queued.ledger
    # a gang naming a topology level: the same search per domain (engine.scheduling.topology)
    one = topology.waiting_for_one(policy._topology_waits, queued.request, policy._now)
    choose = topology.chooser(
        choose_victims, policy.inventory, queued.request, policy._now, preferred=policy.defrag_preferred, one=one
    )
    chosen = choose(
        policy.inventory,
        policy.tenancy,
        queued.request,
        queued.vec,
        policy.running,
        rank,
        more,
        lazy=not timed or (_nobody_waited_for(policy) and _latest_admission(policy) <= policy._now),
        costed=costed,
        admits=admits,
        ledger=ledger,
    )
    victims, nodes = chosen if chosen is not None else ([], frozenset[str]())
    comes_of_age = min((w[0] for w in waited), default=float("inf"))  # the first gang waited for is ready
    moved = [policy.running[v.request.gang_id] for v in victims if routes[v.request.gang_id] == "defrag"]
    if moved and not _can_move(policy, queued, victims, moved):
        victims = []
    if not victims and waited and defrag:
        # The gangs in its way are too young to preempt yet. Keep new backfill off the nodes it would take
        # meanwhile: else short gangs could keep replacing each other there, never old enough, and
        # starve it (the bound in ``engine.scheduling.policy``'s docstring needs this).
        rank, more, _, _ = _ranking(policy, queued, timed=False, defrag=defrag)
        later = choose(
            policy.inventory,
            policy.tenancy,
            queued.request,
            queued.vec,
            policy.running,
            rank,
            more,
            costed=costed,
            admits=admits,
            ledger=ledger,
        )
        if later is not None:
            policy._reserved[queued.request.gang_id] = later[1]
    if not victims:
        queued.failed_search = (policy._pversion, comes_of_age)
        # its reason names the victim it waits for (the first to be ready): else it would read as a wait for
        # capacity or quota alone (Schedulers recorded before named no victim too young to go)
        named = [w for w in waited if w[3] == "checkpoint" or policy.name_young_victims]
        queued.waited_for = min(named)[1:] if named else None
        if comes_of_age != float("inf"):
            policy._retry[queued.request.gang_id] = comes_of_age
        return False
    policy._retry.pop(queued.request.gang_id, None)
    gang_id, tenant = queued.request.gang_id, queued.request.tenant
    grace = policy.config.policy.preemption_grace
    causes = []
    total = 0.0
    for victim in victims:
        running = policy.running[victim.request.gang_id]
        cause = routes[running.request.gang_id]
        causes.append(cause)
        cost = round(lost_gpu_s(running, policy._now), 1)
        total += cost
        running.preempted_for = gang_id
        running.preemption = Notice(cause, gang_id, tenant, policy._now, grace, cost)
        policy._evicted_for.setdefault(running.request.gang_id, set()).add(gang_id)
        reason = (
            f"preempted ({cause}) to make room for gang {gang_id!r} of {tenant}, which needs {needs(queued.request)}"
        )
        decisions.append(
            Preempted(
                gang_id=running.request.gang_id,
                by=gang_id,
                by_tenant=tenant,
                cause=cause,
                reason=reason,
                grace_s=grace,
                cost_gpu_s=cost,
            )
        )
    queued.victims = {v.request.gang_id for v in victims}
    # said in its reason once gangs report checkpoints: before, the reasons are today's, word for word
    queued.victims_cost = round(total, 1) if policy.lost_work.seen else None
    queued.cause = ", ".join(sorted(set(causes)))
    queued.failed_search = queued.waited_for = None
    policy._reserved[gang_id] = nodes
    return True


def waiting_note(policy: Policy, queued: Queued) -> str:
    """What its reason adds while its last victim search waits for a victim (``Queued.waited_for``): to save
    its next checkpoint or to have run ``min_runtime`` ("" else)."""
    failed, waited = queued.failed_search, queued.waited_for
    if waited is None or failed is None or policy._now >= failed[1]:
        return ""
    return waiting_note_text(*waited)


def nominated(queued: Queued) -> str:
    """The reason of a gang waiting for the gangs it preempted: which, why, and what it costs them."""
    cost = None if queued.victims_cost is None else gpu_minutes(queued.victims_cost)
    return nominated_reason(queued.request, sorted(queued.victims), queued.cause, cost)


def _nobody_waited_for(policy: Policy) -> bool:
    """Whether no victim is waited for: no minimum runtime, no checkpoint wait counting (``rank`` then notes
    no gang that comes of age later)."""
    knobs = policy.config.policy
    return knobs.min_runtime <= 0 and (knobs.checkpoint_wait <= 0 or not policy.lost_work.active)


def _latest_admission(policy: Policy) -> float:
    """No running gang was admitted later than this (the latest admission since it was worked out from the
    running gangs, a restored policy's included): with no minimum runtime, no gang is too young to go."""
    if policy._admitted_latest is None:
        policy._admitted_latest = max((r.admitted_at for r in policy.running.values()), default=float("-inf"))
    return policy._admitted_latest


def _can_move(policy: Policy, queued: Queued, victims: Sequence[Victim], moved: list[Running]) -> bool:
    """Whether, with ``victims`` gone and ``queued`` placed, every gang ``moved`` for defragmentation fits
    the idle capacity left at once (else moving it would only trade one waiting gang for another)."""
    inventory = policy.inventory
    released = [policy.running[v.request.gang_id] for v in victims]
    taken: list[tuple[GangRequest, Placement]] = []
    for running in released:
        inventory.release(running.request.gang_id, running.placement)
    try:
        gangs = [
            (queued.request, queued.flavor),
            *((r.request, r.flavor) for r in sorted(moved, key=lambda r: -r.vec[0])),
        ]
        for request, flavor in gangs:
            placement = inventory.place(request, admits=flavors.admits(flavor, request))
            if placement is None:
                return False
            inventory.take(request, placement)
            taken.append((request, placement))
        return True
    finally:
        for request, placement in reversed(taken):
            inventory.release(request.gang_id, placement)
        for running in released:
            inventory.take(running.request, running.placement)


def _ranking(
    policy: Policy, queued: Queued, *, timed: bool, defrag: bool
) -> tuple[
    Callable[[str], tuple[Any, ...] | None],
    Callable[[], list[str]],
    dict[str, Cause],
    list[tuple[float, str, str, str]],
]:
    """How ``queued`` ranks the running gangs as victims (None: not one), the candidates that free quota
    in preference order (computed only if asked), why each victim may go (reclaim over priority over
    backfill over defrag when several apply), and the victims not preempted yet, (when they may go, gang,
    tenant, why): too young ("min_runtime") or kept until just after their next checkpoint ("checkpoint",
    ``policy.checkpoint_wait``).

    ``defrag`` (the first gang in order, blocked by the nodes, not by its quota): smaller gangs of no
    higher priority may move to make room, when the cluster has enough idle GPUs for it elsewhere
    (``preempt_for`` checks that every such victim can start again at once).

    Once the policy counts lost work (``LostWork.active``), a rank is (not a borrower, its expected lost
    GPU-seconds, priority, most recent admission): ``choose_victims(costed=True)`` reads the cost there."""
    knobs = policy.config.policy
    request = queued.request
    tenant = queued.ledger  # the tenant on the gang's flavor (its name without flavors)
    root = policy.tenancy.root(tenant)
    counts = policy._prio_counts.get(tenant, {})
    lower = knobs.within_tenant == "lower_priority" and any(n for p, n in counts.items() if p < queued.prio)
    # the other tenants of its cohort that borrow (the configured ones without a cohort, when it has none)
    members = policy.tenancy.members.get(root, []) if root is not None else policy.tenancy.uncohorted()
    borrowers = {name for name in members if name != tenant and policy.tenancy.borrowing(name)}
    reclaim = (
        bool(borrowers)
        and knobs.reclaim_within_cohort != "never"
        and root is not None
        and policy.tenancy.within_nominal(tenant, queued.vec)
    )
    backfilled = policy._backfill_seq > queued.seq
    defrag = defrag and policy.inventory.free_gpus >= queued.vec[0] > 0
    forbidden = policy._evicted_for.get(request.gang_id, set())
    routes: dict[str, Cause] = {}
    waited: list[tuple[float, str, str, str]] = []

    # read once: a search ranks every gang on the nodes it looks at
    running, prio, seq, gpus, now = policy.running, queued.prio, queued.seq, queued.vec[0], policy._now
    any_prio, min_runtime, wait = knobs.reclaim_within_cohort == "any", knobs.min_runtime, knobs.checkpoint_wait
    costed = policy.lost_work.active

    def route(r: Running) -> Cause | None:
        other = r.ledger
        if reclaim and other in borrowers and (any_prio or r.prio < prio):
            return "reclaim"
        if lower and other == tenant and r.prio < prio:
            return "priority"
        if backfilled and r.backfill and r.admit_seq > seq and r.prio <= prio:
            return "backfill"
        if defrag and r.prio <= prio and r.vec[0] < gpus:
            return "defrag"
        return None

    def rank(gang_id: str) -> tuple[Any, ...] | None:
        r = running[gang_id]
        if not r.preemptible or r.preemption is not None or gang_id in forbidden:
            return None
        cause = route(r)
        if cause is None:
            return None
        of_age = r.admitted_at + min_runtime  # the same sum as the deadline it gives
        if timed and of_age > now:
            waited.append((of_age, gang_id, r.request.tenant, "min_runtime"))
            return None
        if timed and wait > 0 and costed and (after := _after_checkpoint(r, now, wait)) is not None:
            waited.append((after, gang_id, r.request.tenant, "checkpoint"))
            return None
        routes[gang_id] = cause
        if costed:
            return (r.ledger not in borrowers, lost_gpu_s(r, now), r.prio, -r.admit_seq)
        return (r.ledger not in borrowers, r.prio, -r.admit_seq)

    def more() -> list[str]:
        # only reclaim and priority free the tenant's quota; their gangs, best victims first
        tenants = sorted(borrowers) if reclaim else []
        tenants += [tenant] if lower else []
        # the most recently admitted of each (the preferred victims), a bounded number: a search costs
        # O(that), not O(every gang the cohort runs)
        ids = [g for t in tenants for g in itertools.islice(reversed(policy._by_tenant.get(t, {})), MORE_VICTIMS)]
        return sorted((g for g in ids if rank(g) is not None), key=lambda g: rank(g) or ())

    if not (lower or backfilled or reclaim or defrag):
        return (lambda _: None), list, routes, waited  # nobody could be a victim: no walk at all
    return rank, more, routes, waited


def _after_checkpoint(r: Running, now: float, wait: float) -> float | None:
    """When to preempt ``r`` just after its next checkpoint (``policy.checkpoint_wait``), or None (now will
    do): it is expected within ``wait``, and sooner than the work it would lose now is old (waiting then
    delays the gang less than it saves, and the wait ends: just after a checkpoint a victim's loss is young)."""
    due, checkpoint = next_checkpoint(r), r.checkpoint
    if due is None or checkpoint is None or now >= due + CHECKPOINT_LATE_S:
        return None  # not known, or it did not come in time: not waited for again
    # an interval is known only for a checkpoint of this attempt: the work it would lose is since then
    return due + CHECKPOINT_LATE_S if due - now <= min(wait, now - checkpoint.at) else None


def reclaimable(policy: Policy, queued: Queued) -> bool:
    """Whether a borrower of the gang's root cohort runs a gang it may reclaim (preemptible, and of lower
    priority under ``reclaim_within_cohort: lower_priority``), old enough or not yet."""
    rule, tenant = policy.config.policy.reclaim_within_cohort, queued.ledger
    root = policy.tenancy.root(tenant)
    if rule == "never" or root is None:
        return False
    # what it reads (the pool's borrowers and what they run) moves with the pool's usage: asked for every
    # waiting head at every event, it is worked out once per usage change of the pool
    version = policy.tenancy.pool_counter(tenant)[0]
    key = (tenant, queued.prio if rule != "any" else 0)
    cached = policy._reclaimable.get(key)
    if cached is not None and cached[0] == version and cached[1] is policy.tenancy:  # (a new config: a new one)
        return cached[2]
    found = any(
        n and (rule == "any" or prio < queued.prio)
        for name in policy.tenancy.members.get(root, [])
        if name != tenant and policy.tenancy.borrowing(name)
        for prio, n in policy._prio_counts.get(name, {}).items()
    )
    if len(policy._reclaimable) > 10_000:
        policy._reclaimable.clear()
    policy._reclaimable[key] = (version, policy.tenancy, found)
    return found


# -- what a gang waiting for its victims holds --------------------------------------------------------------
#: one change to the tenancy ledger, to undo: (tenant, demand, protected, the sign that undoes it)
Hold = tuple[str, Vec, bool, int]


def hold(policy: Policy, queued: Queued, holds: list[Hold], held: frozenset[str]) -> frozenset[str]:
    """``queued`` waits for its victims: for the rest of the admission cycle (until ``unhold``) the tenancy
    counts it admitted and, of what its victims hold, the part it will take gone (a victim's tenant keeps the
    rest until it releases), so a gang after it in the order cannot take what they free (and be preempted for
    it in turn: in a loop when gangs release and come back at once, as with no save time and
    ``min_runtime: 0``), and nothing is counted free that still runs: counting whole victims gone let a
    later gang in above the cohort's pool while they ran (the property tests found it). The quota's
    counterpart of the nodes ``Policy._reserved`` keeps free; those nodes join ``held``, the nodes kept from
    the gangs after it."""
    if not policy.hold_for_victims:
        return held
    tenancy = policy.tenancy
    tenancy.add(queued.ledger, queued.vec, protected=not queued.preemptible)
    holds.append((queued.ledger, queued.vec, not queued.preemptible, -1))
    left = queued.vec
    for gang_id in sorted(queued.victims):
        running = policy.running.get(gang_id)
        if running is None:
            continue
        take = (min(running.vec[0], left[0]), min(running.vec[1], left[1]), min(running.vec[2], left[2]))
        left = (left[0] - take[0], left[1] - take[1], left[2] - take[2])
        tenancy.add(running.ledger, take, -1, protected=not running.preemptible)
        holds.append((running.ledger, take, not running.preemptible, 1))
    return held | policy._reserved.get(queued.request.gang_id, frozenset())


def unhold(policy: Policy, holds: list[Hold]) -> None:
    """Undo every ``hold`` (the ledger's pool draws are a sum over tenants: the order does not matter)."""
    for tenant, vec, protected, sign in reversed(holds):
        policy.tenancy.add(tenant, vec, sign, protected=protected)
    holds.clear()


# -- choosing victims --------------------------------------------------------------------------------------
class Victim(Protocol):
    @property
    def request(self) -> GangRequest: ...
    @property
    def placement(self) -> Placement: ...
    @property
    def vec(self) -> Vec: ...
    @property
    def ledger(self) -> str: ...


def choose_victims(
    inventory: Inventory,
    tenancy: Tenancy,
    request: GangRequest,
    vec: Vec,
    running: Mapping[str, Victim],
    rank: Callable[[str], Any],
    more: Callable[[], Iterable[str]],
    *,
    lazy: bool = False,
    costed: bool = False,
    admits: Callable[[Node], bool] | None = None,
    ledger: str | None = None,
    among: Iterable[Node] | None = None,
) -> tuple[list[Victim], frozenset[str]] | None:
    """The victims to preempt so that ``request`` fits and the nodes it will take once they are gone, or
    None when none are found. ``lazy``: ``rank`` has no effect that matters beyond its answer (it notes no
    gang too young to go), so a node is left at the first gang it may not preempt that keeps it too full.
    ``costed``: each rank is (rule, cost, ...): a victim's cost is its second item, and nodes are chosen by
    the rule, then their victims' total cost (the module docstring). ``admits``: the nodes it may use (its
    flavor's, with its node selector; None: any); ``ledger``: its tenant's ledger key on that flavor (None: its
    tenant's name, as without flavors); ``among``: the nodes to free, most free first (one topology domain's);
    None: the cluster's."""
    tenant = request.tenant if ledger is None else ledger
    gpus, mc, mem = request.gpus_per_node, millicores(request.cpus_per_node), request.mem_per_node
    ranks: dict[str, Any] = {}
    unranked = object()

    def ranked(gang_id: str) -> Any:
        r = ranks.get(gang_id, unranked)
        if r is unranked:
            r = ranks[gang_id] = rank(gang_id)
        return r

    options: list[tuple[Any, str, list[str]]] = []  # (what orders them, node id, victims)
    budget = request.nnodes + NODES_LOOKED_AT
    for node in inventory.most_free_first() if among is None else among:
        if budget == 0:
            break
        node_id = node.spec.node_id
        if admits is not None and not admits(node):
            continue  # not a node of its flavor: nothing released there helps it
        budget -= 1
        if node.fits(gpus, mc, mem):
            options.append(((False, 0.0, 0) if costed else (0, ()), node_id, []))
            continue
        if not node.fits_idle(gpus, mc, mem):
            continue
        if lazy:
            # the GPUs gangs it may not preempt can keep on the node, and it still fits
            slack = len(node.free_gpus) - gpus + sum(len(h.gpu_ids) for h in node.held.values())
            scored = []
            for g, h in node.held.items():
                if (r := ranked(g)) is not None:
                    scored.append((r, g))
                else:
                    slack -= len(h.gpu_ids)
                    if slack < 0:
                        break
            if slack < 0:
                continue
            held = sorted(scored)
        else:
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
                if not costed:
                    options.append(((len(chosen), r), node_id, chosen))
                    break
                chosen = _spare(node, chosen, (gpus, mc, mem), (free_gpus, free_mc, free_mem), ranked)
                rule = max(ranked(g)[0] for g in chosen)
                options.append(((rule, sum(ranked(g)[1] for g in chosen), len(chosen)), node_id, chosen))
                break
    if len(options) < request.nnodes:
        return None
    options.sort(key=lambda o: (o[0], o[1]))
    picked = sorted({g for _, _, chosen in options[: request.nnodes] for g in chosen}, key=ranked)

    removed: list[str] = []
    try:
        for gang_id in picked:
            _remove(inventory, tenancy, running[gang_id])
            removed.append(gang_id)
        if tenancy.blocked(tenant, vec) is not None:
            for gang_id in more():  # the quota still blocks it: free more of the cohort, by preference
                if gang_id not in removed and ranked(gang_id) is not None:
                    _remove(inventory, tenancy, running[gang_id])
                    removed.append(gang_id)
                    if tenancy.blocked(tenant, vec) is None:
                        break
        if tenancy.blocked(tenant, vec) is not None or inventory.place(request, admits=admits) is None:
            return None
        needed: list[str] = []
        for gang_id in reversed(removed):  # reverse prune
            _restore(inventory, tenancy, running[gang_id])
            if tenancy.blocked(tenant, vec) is None and inventory.place(request, admits=admits) is not None:
                continue  # spared: the gang fits without preempting it
            _remove(inventory, tenancy, running[gang_id])
            needed.append(gang_id)
        removed = needed
        placement = inventory.place(request, admits=admits)
        nodes = frozenset(a.node_id for a in placement.nodes) if placement is not None else frozenset[str]()
        return [running[g] for g in sorted(needed, key=ranked)], nodes
    finally:
        for gang_id in removed:
            _restore(inventory, tenancy, running[gang_id])


def _spare(
    node: Any,
    chosen: list[str],
    need: tuple[int, int, int | None],
    freed: tuple[int, int, int | None],
    ranked: Callable[[str], Any],
) -> list[str]:
    """Of a node's victims (``chosen``, which free ``freed``: GPUs, millicores, bytes), give back the
    dearest the node can spare and still free ``need``: the cheapest prefix in rank order may hold a
    cheap gang that a dearer one chosen after it makes needless. O(victims on the node)."""
    free_gpus, free_mc, free_mem = freed
    gpus, mc, mem = need
    kept = list(chosen)
    for gang_id in sorted(chosen, key=ranked, reverse=True):
        hold = node.held[gang_id]
        left_gpus, left_mc = free_gpus - len(hold.gpu_ids), free_mc - hold.millicores
        left_mem = None if free_mem is None else free_mem - hold.mem
        if left_gpus >= gpus and left_mc >= mc and (mem is None or left_mem is None or left_mem >= mem):
            kept.remove(gang_id)
            free_gpus, free_mc, free_mem = left_gpus, left_mc, left_mem
    return kept


def _remove(inventory: Inventory, tenancy: Tenancy, c: Victim) -> None:
    inventory.release(c.request.gang_id, c.placement)
    tenancy.add(c.ledger, c.vec, -1)


def _restore(inventory: Inventory, tenancy: Tenancy, c: Victim) -> None:
    inventory.take(c.request, c.placement)
    tenancy.add(c.ledger, c.vec, 1)
