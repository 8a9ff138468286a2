"""GPU flavors (Kueue's ResourceFlavor): which nodes a flavor holds, which flavors a gang may use, and the one
it is admitted on.

**Nodes.** A node belongs to a flavor when its labels (``NodeSpec.labels``) carry all of the flavor's
``node_labels``. A node that matches several flavors belongs to the *first* of them in the queue file (a
node is in one flavor, so its GPUs are counted once); a node that matches none belongs to no flavor, and
with flavors declared no gang is placed on it (``describe`` shows its flavor as null). Without ``flavors:``
there is one implicit flavor (None) that every node belongs to.

**Gangs.** A gang may use its request's ``flavors`` (any of, in that order), else its tenant's (the order of
its per-flavor quota, else the file's), less the flavors its tenant has no quota on, those whose taints it
does not tolerate (every taint must be in ``tolerations``), and those whose ``node_labels`` contradict its
``node_selector``: its *candidates*. A request naming an unknown flavor, or left with no candidate, is
rejected at once with a reason naming what exists (``refusal``). A label no registered node carries is not
a contradiction (a node with it may register): the gang waits for such a node, as for any node big enough
(``engine.scheduling.node_waits``), and its reason names the labels that exist.

**One flavor per gang** (``choose``, at each look while it waits): the first candidate whose quota (nominal,
or borrowing within the limits, of that flavor's ledger) and nodes (of the flavor, matching the selector)
take it now, with ``policy.flavor_fungibility``: under ``when_can_borrow: try_next_flavor`` a flavor that
would need borrowing is kept only as a fallback while a later one fits within quota; under
``when_can_preempt: try_next_flavor`` (the default) a flavor that would need preemption (its quota or nodes
are taken) is a fallback while a later one fits as it is, and ``preempt`` stops there (when a victim
could exist: a borrower to reclaim from, a lower-priority gang of its own, a backfilled gang). Failing all,
the gang waits on its first fallback (borrow, then preempt), else on its first candidate, and its reason
says why there. Once it preempted for a flavor it stays on it. ``Admitted.flavor`` names it. A gang that
prefers a topology level with a wait that has not run out (``topology.as_placed``) takes first a flavor where
it starts in one domain now, within its quota; else it is chosen as above (where it then fits over several
domains, it waits for one there): it would not wait on its first flavor while another had a domain free.

**Quota per flavor.** The tenancy ledger has one entry per (tenant, flavor), ``team-a/h100``, with that
flavor's quota and limits, and each cohort one pool per flavor (``research/h100``): borrowing, lending,
reclaim and the lenders waiting are per flavor, on today's code paths. A tenant's fair share is the
*largest* of its per-flavor shares (Kueue's dominant-resource share, the flavors counted as resources). Without
flavors the ledger's keys are the tenants' names and nothing differs from before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from engine.scheduling import node_waits, preemption, topology  # used at call time only: the cycle is harmless
from engine.scheduling.config import QueueConfig
from engine.scheduling.model import GangRequest, NodeSpec
from engine.scheduling.state import Queued, Running, Shape, shape_of
from engine.scheduling.tenancy import Ledger, demand, key, ledgers

if TYPE_CHECKING:
    from engine.scheduling.inventory import Node
    from engine.scheduling.policy import Policy

__all__ = [
    "Ledger",
    "admits",
    "any_node",
    "assign",
    "candidates",
    "choose",
    "classifier",
    "describe_flavors",
    "key",
    "ledgers",
    "make_queued",
    "policy_fit",
    "refusal",
    "running_admits",
    "shape",
]


def classifier(config: QueueConfig) -> Callable[[NodeSpec], str | None]:
    """The flavor of a node: the first declared flavor whose node_labels its labels carry (module docstring)."""
    flavors = [(f.name, tuple(f.node_labels.items())) for f in config.flavors]

    def flavor_of(spec: NodeSpec) -> str | None:
        labels = spec.labels
        for name, wanted in flavors:
            if all(labels.get(k) == v for k, v in wanted):
                return name
        return None

    return flavor_of


def candidates(config: QueueConfig, request: GangRequest) -> tuple[str | None, ...]:
    """The flavors the gang may use, in order (module docstring); (None,) without flavors, () for none."""
    if not config.flavors:
        return (None,)
    own = config.tenant_flavors(request.tenant)
    declared = {f.name: f for f in config.flavors}
    tolerated = set(request.tolerations)
    selector = request.node_selector
    out: list[str | None] = []
    for name in request.flavors or own:
        flavor = declared.get(name)
        if flavor is None or name not in own or not set(flavor.taints) <= tolerated:
            continue
        if any(k in flavor.node_labels and flavor.node_labels[k] != v for k, v in selector.items()):
            continue
        out.append(name)
    return tuple(out)


def shape(config: QueueConfig, request: GangRequest) -> Shape:
    """The gang's shape: today's 4-tuple for a plain gang, with its candidates and node selector after it when
    either matters (so gangs that may use different nodes never share a queue or a cached fit)."""
    plain = shape_of(request)
    cands = candidates(config, request)
    if cands == (None,) and not request.node_selector:
        return plain
    return (*plain, cands, tuple(sorted(request.node_selector.items())))


def make_queued(policy: Policy, request: GangRequest, seq: int, prio: int, preemptible: bool) -> Queued:
    """A waiting gang's record, with its shape, candidates and (a single candidate's) flavor."""
    queued = Queued(request, seq, prio, preemptible, demand(request), shape(policy.config, request))
    assign(policy.config, queued)
    return queued


def assign(config: QueueConfig, queued: Queued) -> None:
    """Its candidates and starting flavor (its first candidate) under ``config``."""
    queued.shape = shape(config, queued.request)
    queued.candidates = candidates(config, queued.request) or (None,)
    queued.on(queued.candidates[0])


def any_node(flavor: str | None, request: GangRequest) -> bool:
    """Whether a gang on ``flavor`` may use every node (``admits`` gives no filter): a plain gang without flavors."""
    return flavor is None and not request.node_selector


def admits(flavor: str | None, request: GangRequest) -> Callable[[Node], bool] | None:
    """The node filter of a gang on ``flavor``: the flavor's nodes that carry its node selector; None (every
    node, ``any_node``) for a plain gang without flavors."""
    if any_node(flavor, request):
        return None
    selector = tuple(request.node_selector.items())

    def admitted(node: Node) -> bool:
        return node.flavor == flavor and all(node.spec.labels.get(k) == v for k, v in selector)

    return admitted


def _could_preempt(policy: Policy, queued: Queued, ledger: str, quota_blocked: bool) -> bool:
    """Cheap: whether a victim for ``queued`` could exist on the flavor of ``ledger`` (Kueue's "can preempt")."""
    knobs = policy.config.policy
    counts = policy._prio_counts.get(ledger, {})
    if knobs.within_tenant == "lower_priority" and any(n for p, n in counts.items() if p < queued.prio):
        return True
    if preemption.reclaimable(policy, queued):
        return True
    return not quota_blocked and policy._backfill_seq > queued.seq


def choose(policy: Policy, queued: Queued, exclude: frozenset[str]) -> None:
    """Set ``queued.flavor`` to the flavor it is looked at on now (module docstring). O(candidates × a
    placement); nothing to do for a gang with one candidate, or one waiting for the victims it preempted."""
    cands = queued.candidates
    if len(cands) < 2 or queued.victims:
        return
    knobs = policy.config.policy.flavor_fungibility
    tenancy, request, vec = policy.tenancy, queued.request, queued.vec
    before = queued.ledger
    borrow_at: str | None = None
    preempt_at: str | None = None
    fits_at: str | None = None
    chosen: str | None = None
    asked = topology.as_placed(policy.inventory, policy._topology_waits, request, policy._now)
    if asked is not request:  # it would wait for one domain: a flavor with one free now first, within quota
        chosen = next((f for f in cands if _starts_in_one(policy, queued, f, asked, exclude)), None)
    for flavor in cands if chosen is None else ():
        queued.on(flavor)
        if policy_fit(policy, queued) != "now":
            continue
        fits_at = fits_at or flavor
        ledger = queued.ledger
        blocked = tenancy.blocked(ledger, vec, not queued.preemptible)
        if blocked is not None and blocked.kind in ("never", "never_protected", "protected"):
            continue
        # too few GPUs free on the flavor: no placement to try (the flavor is full, as a waiting gang mostly finds it)
        placed = blocked is None and _placeable(policy, queued, flavor, request, exclude)
        if placed:
            if knobs.when_can_borrow == "borrow" or not tenancy.would_borrow(ledger, vec):
                chosen = flavor
                break
            borrow_at = borrow_at or flavor
            continue
        if (knobs.when_can_preempt == "preempt" or preempt_at is None) and _could_preempt(
            policy, queued, ledger, blocked is not None
        ):
            if knobs.when_can_preempt == "preempt":
                chosen = flavor
                break
            preempt_at = preempt_at or flavor
    queued.on(chosen or borrow_at or preempt_at or fits_at or cands[0])
    if queued.ledger != before:  # a lender waiting on the flavor it left no longer waits there
        policy.lenders.forget(tenancy.root(before), request.gang_id)
        policy._quota_texts.pop(request.gang_id, None)


def _placeable(policy: Policy, queued: Queued, flavor: str | None, asked: GangRequest, exclude: frozenset[str]) -> bool:
    """Whether ``asked`` (the gang's request, or as ``topology.as_placed`` has it) has a placement on ``flavor``
    now; too few GPUs free on the flavor: no placement to try (a waiting gang mostly finds it full)."""
    return policy.inventory.free_by_flavor.get(flavor or "", 0) >= queued.vec[0] and policy.inventory.can_place(
        asked, (queued.shape, flavor, exclude), exclude, admits(flavor, queued.request)
    )


def _starts_in_one(
    policy: Policy, queued: Queued, flavor: str | None, asked: GangRequest, exclude: frozenset[str]
) -> bool:
    """Whether the gang starts on ``flavor`` now in one domain (``asked``): within quota, borrowing where
    ``when_can_borrow`` allows it."""
    queued.on(flavor)
    if policy_fit(policy, queued) != "now" or policy.tenancy.blocked(queued.ledger, queued.vec, not queued.preemptible):
        return False
    knobs = policy.config.policy.flavor_fungibility
    if knobs.when_can_borrow != "borrow" and policy.tenancy.would_borrow(queued.ledger, queued.vec):
        return False
    return _placeable(policy, queued, flavor, asked, exclude)


def policy_fit(policy: Policy, queued: Queued) -> str:
    """``node_waits.fit`` of the gang on its current flavor alone."""
    return node_waits.fit_on(policy, queued.request, queued.shape, queued.flavor)


def refusal(policy: Policy, request: GangRequest) -> str | None:
    """Why a request can never run on any flavor (module docstring), naming what exists; None if it can."""
    config = policy.config
    if not config.flavors:
        return None
    declared = [f.name for f in config.flavors]
    for name in request.flavors:
        if name not in declared:
            return f"rejected: no flavor named {name!r} (flavors: {', '.join(declared)})"
    if candidates(config, request):
        return None
    own = config.tenant_flavors(request.tenant)
    asked = request.flavors or own
    usable = [n for n in asked if n in own]
    if not usable:
        return (
            f"rejected: tenant {request.tenant} has no quota on flavor{'s' if len(asked) > 1 else ''} "
            f"{', '.join(asked)} (its flavors: {', '.join(own) or 'none'})"
        )
    why = []
    for flavor in (f for f in config.flavors if f.name in usable):
        untolerated = sorted(set(flavor.taints) - set(request.tolerations))
        if untolerated:
            why.append(f"{flavor.name} has taint{'s' if len(untolerated) > 1 else ''} {', '.join(untolerated)}")
            continue
        clash = sorted(k for k, v in request.node_selector.items() if flavor.node_labels.get(k, v) != v)
        labels = ", ".join(f"{k}={flavor.node_labels[k]}" for k in clash)
        why.append(f"{flavor.name} nodes have {labels}")
    tolerations = ", ".join(request.tolerations) or "none"
    selector = ", ".join(f"{k}={v}" for k, v in sorted(request.node_selector.items())) or "none"
    return (
        f"rejected: no flavor of tenant {request.tenant} can take the gang ({'; '.join(why)}); the gang "
        f"tolerates {tolerations} and selects {selector}"
    )


def describe_flavors(policy: Policy) -> dict[str, Any]:
    """Per flavor: its labels, taints, nodes and GPUs (offered, free) for ``describe`` and ``queues``."""
    rows: dict[str, Any] = {
        f.name: {"node_labels": dict(f.node_labels), "taints": list(f.taints), "nodes": 0, "gpus": 0, "gpus_free": 0}
        for f in policy.config.flavors
    }
    for node in policy.inventory.offered_nodes():
        row = rows.get(node.flavor or "")
        if row is not None:
            row["nodes"] += 1
            row["gpus"] += node.spec.gpus
            row["gpus_free"] += len(node.free_gpus)
    return rows


def running_admits(running: Running) -> Callable[[Node], bool] | None:
    return admits(running.flavor, running.request)
