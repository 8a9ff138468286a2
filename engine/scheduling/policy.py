"""The scheduling policy: ``Policy.step(event, now) -> decisions``, deterministic and incremental.

It runs inside the Scheduler workflow, so it reads no clock (``now`` is the workflow's clock), uses no
randomness and no I/O: the same events at the same times always give the same decisions, also after a
continue-as-new (``snapshot`` / ``restore``). Its state is mutable and indexed so that one event costs
about O(tenants × shapes + nodes looked at), never a pass over every queued gang.

**Order.** Pending gangs are kept per tenant in FIFO queues, one per (priority, shape). After an event the heads of
those queues are tried in order: a gang that keeps its tenant within its nominal quota before one that would make it
borrow (as Kueue orders them: nothing is admitted on lent capacity ahead of the lender, whatever its priority), then
higher priority, then the tenant with the lowest fair share (``engine.scheduling.tenancy``; it remembers recent usage
with ``usage_half_life``), then submission order. Within a tenant, priority still comes first (a gang borrows in this
sense when it or a gang of higher priority of its tenant would). When a head is admitted, the next gang of its queue
joins the order; when it is not, the rest of its queue (same tenant, priority and shape) waits too, so an event looks at
a few heads, not at 15,000 gangs.

**Admission** is all-or-nothing: the tenant's quota must allow the whole gang (nominal quota, or
borrowing idle cohort capacity within the limits), and ``nnodes`` nodes must each hold one node's
share (best fit, ``engine.scheduling.inventory``).

**Lent capacity is always reclaimable** (Kueue's guarantee). Only preemptible gangs borrow: a gang that is
not preemptible is admitted only while its tenant's protected gangs stay within its nominal quota
(``Tenancy.blocked``), so what a tenant holds above its quota can always be preempted. And while a gang
within its tenant's nominal quota waits for its cohort to give lent capacity back (a *lender waiting*),
no gang that would borrow from that cohort is admitted: what the reclaim frees goes to the lender, not
to a new borrower that would have to be reclaimed in turn. So a gang within its nominal quota (with
``reclaim_within_cohort: any``, and the nominal quotas adding up to what the nodes hold) starts within
``min_runtime`` + ``preemption_grace`` of its arrival (+ ``checkpoint_wait`` and
``preemption.CHECKPOINT_LATE_S`` where a wait is set): every borrower it needs gone was admitted before it
arrived (tests/unit/test_scheduling_reclaim.py checks it in simulated time).

**Backfill without starvation.** The first gang in order that the nodes cannot hold is the *blocker*.
Gangs after it may still start on idle GPUs, but only as *backfill*: they must be preemptible, and any
gang that was already waiting when they started may preempt them. A blocker that needs whole nodes may
also *defragment*: smaller gangs of no higher priority move (preempted, and able to start again at once
on idle GPUs elsewhere). So idle GPUs are used, and the blocker's wait is bounded: it waits at most for
the gangs admitted *before* it started waiting, or for the minimum runtime and the grace of the
backfilled gangs in its way. The nodes a blocker will take (freed by its victims, or held by victims too
young to preempt yet) are reserved: nothing backfills there meanwhile, so short gangs cannot keep
replacing each other on them. A gang waiting for its victims also holds what they free, quota and nodes,
from the gangs after it in the order (``preemption.hold``), or one could take it and be preempted in turn.

**Preemption** has four causes: *reclaim* (a tenant within its nominal quota takes back what it lent to
borrowers of its cohort; ``policy.reclaim_within_cohort``), *priority* (within a tenant;
``policy.within_tenant``), *backfill* and *defrag* (above). Victims are whole gangs, preemptible, admitted
at least ``policy.min_runtime`` ago, chosen by ``engine.scheduling.preemption`` (borrowers first, then the
least work lost, ``.lost_work``, from the checkpoints gangs report). A gang is never preempted for one it
was itself preempted for: no cycles. A preempted gang keeps its place in the order when it comes back; one
being preempted is never chosen again (a drain of its node included). An event runs at most one victim
search (a Tick, four): one put off comes back on a Tick within ``SEARCH_PUT_OFF_S``. A gang whose search
waits for a victim (too young, or about to checkpoint: ``policy.checkpoint_wait``) names it in its reason.

**Nodes.** A node that has not re-registered for ``node_ttl_s`` is lost; its allocations stay until their gangs release
them. A gang that only lost nodes could hold waits for them without holding up the queue and is rejected after
``request.lost_node_wait_s``; so does one that no registered node can hold (none registered yet, none big enough:
``wait_for_nodes``), waiting for one to register. A request that can never be admitted (more than its tenant may ever
hold, unknown tenant or priority class, a class its tenant may not use, malformed, duplicate) is rejected at once, and
so is a gang beyond its tenant's ``max_pending`` gangs waiting (a preempted gang coming back is never refused for it).

**Drain.** An operator drains a node (``NodeDrained``): it takes no new gangs, and every preemptible gang
on it is preempted at once (cause ``drain``, ``by`` the node; whatever its age: ``min_runtime`` and the
no-cycle rule are about gangs taking each other's place) and comes back at its place in the order, to be
placed elsewhere. A gang that is not preemptible runs there to its end. A drained node is "not usable now
but not gone": a gang that only it could hold waits for an undrain, with a reason naming it, without a
deadline and without holding up the queue; it is never rejected for it. The flag and its reason survive
the node's re-registrations, its loss and ``snapshot``.

**Decisions**, in order: what the event itself caused (``GangRejected``), then ``Admitted`` / ``Preempted``
as the order is walked, and ``Pending`` for a gang whose reason changed (a new gang always gets one).

**Where.** This module: the state and the events. The admission cycle ``engine.scheduling.cycle``, victim
search ``.preemption``, waits for lost and drained nodes ``.node_waits``, lenders waiting ``.lenders``, requests
rejected at once and a new configuration ``.intake``, continue-as-new ``.snapshot``, what is counted (metrics)
``.counters``, the per-gang records they share ``.state``; they read and update the policy's state, which stays
this class's.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from engine.scheduling import cycle, flavors, intake, lost_work, node_waits, topology
from engine.scheduling import describe as views
from engine.scheduling import snapshot as snapshots
from engine.scheduling.config import DEFAULT_QUEUE_CONFIG, QueueConfig
from engine.scheduling.counters import Counters
from engine.scheduling.events import (
    Admitted,
    ConfigApplied,
    Decision,
    Event,
    GangCheckpointed,
    GangRejected,
    GangReleased,
    GangSubmitted,
    NodeDrained,
    NodeLost,
    NodeRegistered,
    Pending,
    Tick,
)
from engine.scheduling.inventory import Inventory
from engine.scheduling.lenders import Lenders
from engine.scheduling.model import DEFAULT_NODE_TTL_S, GangRequest, Placement
from engine.scheduling.reasons import queued_reason
from engine.scheduling.state import Fit, Queued, QueueKey, Running, Shape
from engine.scheduling.tenancy import Tenancy

__all__ = ["Policy"]


class Policy:
    """The scheduler's state and rules (see the module docstring)."""

    def __init__(self, config: QueueConfig = DEFAULT_QUEUE_CONFIG, node_ttl_s: float = DEFAULT_NODE_TTL_S) -> None:
        self.config = config
        #: a gang no registered node can hold waits for one to register (up to its ``lost_node_wait_s``), as
        #: Kueue keeps a workload no flavor fits pending; False: rejected at once (Schedulers recorded before)
        self.wait_for_nodes = True
        #: a gang waiting for its victims holds what they free for the rest of each cycle (``_hold``); False:
        #: what Schedulers recorded before decided (a lower gang could take it, and be preempted in a loop)
        self.hold_for_victims = True
        #: a gang preferring a topology level that must move gangs moves them out of one domain where it can
        #: (``topology.chooser``); False: its victims are chosen topology-blind (Schedulers recorded before)
        self.defrag_preferred = True
        #: a gang whose victim search waits for a victim too young to go (``min_runtime``) names it in its
        #: reason, as one waiting for a victim's checkpoint does; False: Schedulers recorded before
        self.name_young_victims = True
        #: a gang of several flavors whose tenant was refused, in this cycle, a gang no bigger on each of them is
        #: passed over without choosing its flavor again (``cycle._refused_everywhere``); False: Schedulers
        #: recorded before chose it, and it kept the flavor chosen
        self.skip_refused_flavors = True
        self.inventory = Inventory(node_ttl_s)
        if config.flavors:  # a node's flavor from its labels (``engine.scheduling.flavors``)
            self.inventory.reclassify(flavors.classifier(config))
        topology.declare(self.inventory, config.topology)  # domains of its levels (none declared: no index)
        self.tenancy = Tenancy(config)
        self.running: dict[str, Running] = {}  # in admission order
        self.pending: dict[str, Queued] = {}
        self._queues: dict[str, dict[QueueKey, list[tuple[int, str]]]] = {}  # tenant -> key -> heap (seq, id)
        self._by_tenant: dict[str, dict[str, Running]] = {}
        self._seq = 0
        self._now = 0.0
        #: bumps on what can turn a failed victim search into a successful one (a release, a node or config
        #: change, a tenant starting to borrow); a search that found nothing is not repeated before it moves
        self._pversion = 0
        self._backfill_seq = 0  # the admission sequence number of the latest backfilled gang
        self._prio_counts: dict[str, dict[int, int]] = {}  # tenant -> priority value -> running gangs
        self._requeue: dict[str, int] = {}  # a preempted gang's place in the order, until it comes back
        self._evicted_for: dict[str, set[str]] = {}  # gang -> the gangs it was preempted for (no cycles)
        #: pending gangs waiting for their victims to leave -> the nodes they will take (nothing backfills there)
        self._reserved: dict[str, frozenset[str]] = {}
        self._lost_waiters: set[str] = set()
        self._retry: dict[str, float] = {}  # blocked gangs whose victim search waits for a gang to come of age
        #: gangs preferring a level with a wait -> when they could first have started over several domains
        #: (``topology.holds_out``)
        self._topology_waits: dict[str, float] = {}
        self._fits: dict[Shape, tuple[int, Fit]] = {}  # shape -> (topology then, fit)
        self._topology_seen = 0
        self._texts: dict[tuple[Any, ...], str] = {}
        self._tier_cache: dict[str, tuple[Any, dict[int, tuple[bool, float]]]] = {}
        # caches of pure functions of the state, keyed on what they read (a restored policy, with them empty,
        # decides the same): per tenant its entries in the order (``cycle.run``), and per gang its quota reason
        self._touched: set[str] = set()  # the tenants whose pending gangs changed since the last cycle
        self._entries: dict[str, list[Any]] = {}
        self._entries_for: tuple[int, Tenancy | None] = (-1, None)  # the topology and ledger they were made with
        self._quota_texts: dict[str, cycle.QuotaText] = {}  # gang -> its quota text (``.cycle``)
        self._reclaimable: dict[tuple[str, int], tuple[int, Tenancy, bool]] = {}  # ``preemption.reclaimable``
        self._admitted_latest: float | None = None  # see ``preemption._latest_admission``
        self._searches_left = 1
        self._pending_counts: dict[str, int] = {}  # tenant -> its gangs waiting (``max_pending``)
        self._user_gangs: dict[str, int] = {}  # tenant -> its gangs waiting that name a user (``cycle.user_heads``)
        self.lenders = Lenders()  # nothing borrows from a cohort while a lender waits there (module docstring)
        self.counters = Counters()  # admissions, waits, preemptions, restarts so far (Prometheus)
        self.lost_work = lost_work.LostWork()  # victims by the work they would lose (``.lost_work``)

    # -- events ------------------------------------------------------------------------------------
    def step(self, event: Event, now: float | None = None) -> list[Decision]:
        """Apply one event, then admit (and preempt) what the order allows; return the decisions.

        ``now`` (seconds, the Scheduler's workflow clock) drives node expiry, the wait for lost nodes, the minimum
        runtime and the decay of usage (``usage_half_life``: shares move with the clock). Without it (unit tests
        of the pure rules) no deadline fires and every running gang counts as old enough to preempt."""
        if now is not None:
            self._now = now
        reranked = now is not None and self.tenancy.advance(now)  # the shares moved with the clock: order again
        decisions: list[Decision] = []
        changed = True
        if isinstance(event, NodeRegistered):
            changed = self.inventory.register(event.spec, self._now)
        elif isinstance(event, NodeLost):
            changed = self.inventory.set_offered(event.node_id, alive=False)
        elif isinstance(event, NodeDrained):
            changed = node_waits.drain(self, event, decisions)
        elif isinstance(event, GangSubmitted):
            changed = self._submit(event.request, decisions)
        elif isinstance(event, GangReleased):
            self.counters.released(event.gang_id, self)  # why the attempt ended, before it is gone
            self._release(event.gang_id)
        elif isinstance(event, ConfigApplied):
            intake.reconfigure(self, event.config, decisions)
        elif isinstance(event, GangCheckpointed):
            changed = lost_work.record(self, event)
        if now is not None and self.inventory.expire(now):
            changed = True
        if changed or reranked:
            # a Tick may carry searches put off by earlier events: it allows more of them than an event does
            cycle.run(self, decisions, timed=now is not None, searches=4 if isinstance(event, Tick) else 1)
        if isinstance(event, GangSubmitted):
            queued = self.pending.get(event.request.gang_id)
            if queued is not None and not queued.reason:  # not looked at yet: behind its tenant's earlier gangs
                request = queued.request
                key = ("queued", request.tenant, queued.shape)
                self._say(queued, self._text(key, queued_reason, request), decisions)
        self.counters.observe(event, decisions, self)
        return decisions

    def _submit(self, request: GangRequest, decisions: list[Decision]) -> bool:
        refusal = intake.refusal(self, request, arriving=True)
        if refusal is not None:
            decisions.append(GangRejected(gang_id=request.gang_id, reason=refusal))
            return False
        cls = self.config.priority(request.priority)
        seq = self._requeue.pop(request.gang_id, None)
        if seq is None:
            seq = self._next_seq()
        preemptible = cls.preemptible and request.preemptible
        self._enqueue(flavors.make_queued(self, request, seq, cls.value, preemptible))
        return True

    def _enqueue(self, queued: Queued) -> None:
        self.pending[queued.request.gang_id] = queued
        tenant = queued.request.tenant
        self._pending_counts[tenant] = self._pending_counts.get(tenant, 0) + 1
        if queued.request.user:
            self._user_gangs[tenant] = self._user_gangs.get(tenant, 0) + 1
        self._touched.add(tenant)
        heap = self._queues.setdefault(queued.request.tenant, {}).setdefault(queued.key, [])
        heapq.heappush(heap, (queued.seq, queued.request.gang_id))

    def _release(self, gang_id: str) -> None:
        running = self.running.pop(gang_id, None)
        if running is not None:
            self._by_tenant[running.ledger].pop(gang_id, None)
            self.inventory.release(gang_id, running.placement)
            protected, user = not running.preemptible, running.request.user
            self.tenancy.add(running.ledger, running.vec, -1, protected=protected, user=user)
            self._count_prio(running, -1)
            self._pversion += 1
            preemptor = self.pending.get(running.preempted_for or "")
            if preemptor is not None:
                preemptor.victims.discard(gang_id)
            if running.preemption is not None:
                self._requeue[gang_id] = running.seq  # it comes back at its place in the order
            else:
                self._evicted_for.pop(gang_id, None)  # done: its history no longer matters
            return
        if gang_id in self.pending:  # withdrawn while waiting; its heap entry is skipped lazily
            self._forget(gang_id)
        else:  # a preempted gang that will not come back (its run ended): forget its place and history
            self._requeue.pop(gang_id, None)
            self._evicted_for.pop(gang_id, None)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    # -- the admission cycle -------------------------------------------------------------------------
    def _head(self, heap: list[tuple[int, str]]) -> Queued | None:
        while heap:
            seq, gang_id = heap[0]
            queued = self.pending.get(gang_id)
            if queued is not None and queued.seq == seq:
                return queued
            heapq.heappop(heap)  # withdrawn, admitted or re-queued: a stale entry
        return None

    def tiers(self, tenant: str, heads: list[Queued]) -> dict[int, tuple[bool, float]]:
        """Per priority value, how the tenant's heads rank against other tenants': (whether its next gang in
        FIFO order would make it borrow, its fair share). A gang that keeps its tenant within its quota goes
        before one that would make its tenant borrow (so nothing is admitted only to be reclaimed at once,
        Kueue's "final share" idea); then the lowest share. Within a tenant and priority the tier is the
        same for every head, so its gangs keep their FIFO order."""
        first: dict[int, Queued] = {}
        for head in heads:
            if head.prio not in first or head.seq < first[head.prio].seq:
                first[head.prio] = head
        # the same heads, usage and capacity as last time (most events touch one tenant): the same tiers
        stamp = (self.tenancy.changes.get(tenant, 0), self.inventory.topology, [q.seq for q in first.values()])
        cached = self._tier_cache.get(tenant)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        share = self.tenancy.tenant_share(tenant, self.inventory.capacity)
        tiers: dict[int, tuple[bool, float]] = {}
        borrows = False  # within the tenant priority comes first: a gang ranks as borrowing when one above it does
        for prio in sorted(first, reverse=True):
            borrows = borrows or not self.tenancy.tenant_within_nominal(tenant, first[prio].vec)
            tiers[-prio] = (borrows, share)
        self._tier_cache[tenant] = (stamp, tiers)
        return tiers

    def _text(self, key: tuple[Any, ...], build: Callable[..., str], *args: Any) -> str:
        """A reason text, built once per distinct situation (``key``): many gangs wait for the same thing."""
        text = self._texts.get(key)
        if text is None:
            if len(self._texts) > 10_000:
                self._texts.clear()
            text = self._texts[key] = build(*args)
        return text

    def _say(self, queued: Queued, reason: str, decisions: list[Decision]) -> None:
        if reason != queued.reason:
            queued.reason = reason
            decisions.append(Pending(gang_id=queued.request.gang_id, reason=reason))

    def _admit(self, queued: Queued, placement: Placement, *, backfill: bool, decisions: list[Decision]) -> None:
        request = queued.request
        gang_id = request.gang_id
        running = Running(
            request,
            placement,
            queued.seq,
            self._next_seq(),
            self._now,
            queued.prio,
            queued.preemptible,
            queued.vec,
            backfill,
            flavor=queued.flavor,
        )
        ledger = queued.ledger
        borrowing = self.tenancy.borrowing(ledger)
        self.inventory.take(request, placement)
        self.tenancy.add(ledger, queued.vec, protected=not queued.preemptible, user=request.user)
        if self.tenancy.borrowing(ledger) != borrowing:
            self._pversion += 1  # its older gangs may now be reclaimed
        self.running[gang_id] = running
        self._by_tenant.setdefault(ledger, {})[gang_id] = running
        self._count_prio(running, 1)
        if backfill:
            self._backfill_seq = running.admit_seq
        if self._admitted_latest is not None:
            self._admitted_latest = max(self._admitted_latest, running.admitted_at)
        self._forget(gang_id)
        decisions.append(Admitted(placement=placement, flavor=queued.flavor))

    def _count_prio(self, running: Running, sign: int) -> None:
        if running.preemptible:
            counts = self._prio_counts.setdefault(running.ledger, {})
            counts[running.prio] = counts.get(running.prio, 0) + sign

    def _forget(self, gang_id: str) -> None:
        """A gang leaves the queue (admitted, withdrawn, rejected)."""
        queued = self.pending.pop(gang_id, None)
        if queued is not None:
            tenant = queued.request.tenant
            self._pending_counts[tenant] -= 1
            if queued.request.user:
                self._user_gangs[tenant] -= 1
            self._touched.add(tenant)
            self._quota_texts.pop(gang_id, None)
            self.lenders.forget(self.tenancy.root(queued.ledger), gang_id)
        self._reserved.pop(gang_id, None)
        self._lost_waiters.discard(gang_id)
        self._retry.pop(gang_id, None)
        self._topology_waits.pop(gang_id, None)

    # -- time ------------------------------------------------------------------------------------------
    def next_deadline(self) -> float | None:
        """When ``step`` would next change something by itself (a node expiring, a lost-node wait running
        out, a gang old enough to be preempted): the Scheduler sends a ``Tick`` then. None: nothing pending."""
        return node_waits.next_deadline(self)

    # -- views -----------------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """Nodes, running gangs, the queue in order with reasons, and the tenants (``gangflow cluster``)."""
        return views.describe(self)

    def describe_node(self, node_id: str) -> dict[str, Any] | None:
        """``node_id``'s row of ``describe`` (None: never registered), O(1): what a starting agent asks."""
        return views.describe_node(self, node_id)

    def queues(self) -> dict[str, Any]:
        """Per tenant: nominal, used, borrowed, lent, pending and share (``gangflow queues show``)."""
        return views.queues(self)

    def drain_report(self, node_id: str) -> dict[str, list[str]]:
        """The running gangs on a node by what a drain does to them (``node_waits.drain_report``)."""
        return node_waits.drain_report(self, node_id)

    # -- continue-as-new -------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Everything ``restore`` needs, compact (``engine.scheduling.snapshot``)."""
        return snapshots.take(self)

    @classmethod
    def restore(cls, snapshot: dict[str, Any]) -> Policy:
        """The policy ``snapshot`` saved; it decides exactly as the original would have."""
        return snapshots.restore(cls, snapshot)
