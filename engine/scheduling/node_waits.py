"""Nodes a gang cannot use now: lost ones (a bounded wait) and drained ones (an operator's decision).

Both keep a gang waiting without holding up the queue (``engine.scheduling.policy``, **Nodes** and
**Drain**). A gang that only lost nodes could hold waits for them up to its ``lost_node_wait_s`` and is
then rejected; one that only drained nodes could hold waits for an undrain, without a deadline. A drain
also preempts the preemptible gangs on the node, at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.scheduling import flavors, topology
from engine.scheduling.events import Decision, GangRejected, NodeDrained, Preempted
from engine.scheduling.lost_work import lost_gpu_s
from engine.scheduling.model import GangRequest
from engine.scheduling.reasons import (
    drained_wait_reason,
    draining_reason,
    lost_wait_expired_reason,
    lost_wait_reason,
    node_wait_expired_reason,
    node_wait_reason,
)
from engine.scheduling.state import Fit, Notice, Queued, Shape

if TYPE_CHECKING:
    from engine.scheduling.policy import Policy

__all__ = [
    "drain",
    "drain_report",
    "fit",
    "fit_on",
    "next_deadline",
    "revive_lost_waiters",
    "wait_for_drain",
    "wait_for_lost",
]


def fit(policy: Policy, request: GangRequest, shape: Shape | None = None) -> Fit:
    """Whether the request fits the offered nodes when idle, else what it waits for (``Fit``), cached per
    shape until the nodes change. Drained nodes are "not usable now but not gone": a gang that only
    they could hold waits for an operator, however long, and never for a lost node's deadline. With
    flavors, the best of its candidate flavors (``engine.scheduling.flavors``)."""
    shape = shape or flavors.shape(policy.config, request)
    cached = policy._fits.get(shape)
    if cached is None or cached[0] != policy.inventory.topology:
        found = [fit_on(policy, request, shape, f) for f in flavors.candidates(policy.config, request) or (None,)]
        cached = policy._fits[shape] = (policy.inventory.topology, min(found, key=_FITS.index))
    return cached[1]


#: what a gang with several candidate flavors waits for: the best of them
_FITS: list[Fit] = ["now", "drained", "lost", "never"]


def fit_on(policy: Policy, request: GangRequest, shape: Shape, flavor: str | None) -> Fit:
    """``fit`` on one flavor (with the gang's node selector), cached alike."""
    # (its node filter, ``flavors.admits``, is built only to count, on a miss)
    key = shape if flavors.any_node(flavor, request) else (shape, flavor)
    cached = policy._fits.get(key)
    if cached is None or cached[0] != policy.inventory.topology:
        n = request.nnodes
        offered, alive, undrained, every = policy.inventory.fit_counts(request, flavors.admits(flavor, request))
        fit: Fit
        if offered >= n:
            fit = "now"
        elif every < n:
            fit = "never"
        elif undrained >= n and alive < n:
            fit = "lost"  # lost nodes would do, and undraining would not be enough
        else:
            fit = "drained"
        cached = policy._fits[key] = (policy.inventory.topology, fit)
    return cached[1]


# -- lost nodes ------------------------------------------------------------------------------------------
def wait_for_lost(policy: Policy, heap: list[tuple[int, str]], decisions: list[Decision], *, timed: bool) -> None:
    """A whole queue (one shape) fits only with lost nodes back, or no registered node can hold it at all
    (none registered yet, or none big enough): its gangs wait for nodes, each up to its ``lost_node_wait_s``,
    without holding up anyone else."""
    reason = ""
    unregistered = False  # no registered node would do, lost ones included: waiting for new ones
    for seq, gang_id in sorted(heap):
        queued = policy.pending.get(gang_id)
        if queued is None or queued.seq != seq:
            continue
        request = queued.request
        unregistered = fit(policy, request, queued.shape) == "never"
        if queued.lost_wait_since is None and timed:
            queued.lost_wait_since = policy._now
        policy._lost_waiters.add(gang_id)
        since = queued.lost_wait_since
        if since is not None and policy._now - since >= request.lost_node_wait_s:
            policy._forget(gang_id)
            expired = node_wait_expired_reason if unregistered else lost_wait_expired_reason
            decisions.append(GangRejected(gang_id=gang_id, reason=expired(request, policy.inventory)))
            continue
        reason = reason or (node_wait_reason if unregistered else lost_wait_reason)(request, policy.inventory)
        policy._say(queued, reason, decisions)


def revive_lost_waiters(policy: Policy) -> None:
    for gang_id in sorted(policy._lost_waiters):
        queued = policy.pending.get(gang_id)
        if queued is None:
            policy._lost_waiters.discard(gang_id)
        elif fit(policy, queued.request) in ("now", "drained"):  # no deadline while an operator decides
            queued.lost_wait_since = None
            policy._lost_waiters.discard(gang_id)


# -- drained nodes ---------------------------------------------------------------------------------------
def drain(policy: Policy, event: NodeDrained, decisions: list[Decision]) -> bool:
    """Drain or undrain a node; True when what it offers changed. A drain preempts every preemptible
    gang on the node whatever its age (the operator needs the node; ``min_runtime`` and the no-cycle
    rule are about gangs taking each other's place), once: a gang already leaving keeps its notice.
    Gangs that are not preemptible run there to their end."""
    node = policy.inventory.nodes.get(event.node_id)
    if node is None:
        return False
    changed = policy.inventory.set_offered(event.node_id, drained=event.drained, reason=event.reason)
    if not event.drained:
        return changed
    grace = policy.config.policy.preemption_grace
    reason = draining_reason(event.node_id, node.drain_reason)
    for gang_id in sorted(node.held):
        running = policy.running.get(gang_id)
        if running is None or not running.preemptible or running.preemption is not None:
            continue
        cost = round(lost_gpu_s(running, policy._now), 1)
        running.preemption = Notice("drain", event.node_id, "", policy._now, grace, cost)
        decisions.append(
            Preempted(
                gang_id=gang_id,
                by=event.node_id,
                by_tenant="",
                cause="drain",
                reason=reason,
                grace_s=grace,
                cost_gpu_s=cost,
            )
        )
    return changed


def wait_for_drain(policy: Policy, queued: Queued, decisions: list[Decision]) -> None:
    """The head of a queue (one shape) that only drained nodes could hold: it waits for an operator to
    undrain them, without a deadline and without holding up anyone else; the gangs behind it in its
    queue say they are queued behind it."""
    policy._reserved.pop(queued.request.gang_id, None)  # nothing to keep free for it while it cannot fit
    key = ("drained", queued.shape, policy.inventory.topology)
    policy._say(queued, policy._text(key, drained_wait_reason, queued.request, policy.inventory), decisions)


def drain_report(policy: Policy, node_id: str) -> dict[str, list[str]]:
    """The running gangs on a node by what a drain does to them: ``leaving`` (preempted, not released
    yet) and ``remaining`` (not preemptible: they run there to their end). O(gangs on the node)."""
    node = policy.inventory.nodes.get(node_id)
    report: dict[str, list[str]] = {"leaving": [], "remaining": []}
    for gang_id in sorted(node.held if node is not None else ()):
        running = policy.running.get(gang_id)
        if running is not None and running.preemption is not None:
            report["leaving"].append(gang_id)
        elif running is not None and not running.preemptible:
            report["remaining"].append(gang_id)
    return report


def next_deadline(policy: Policy) -> float | None:
    """``Policy.next_deadline``: a node expiring, a lost-node wait running out, a victim search put off or a
    victim coming of age (``Policy._retry``), a preferring gang's wait for one domain running out."""
    deadlines = [policy.inventory.next_expiry()]
    for gang_id in policy._lost_waiters:
        queued = policy.pending.get(gang_id)
        if queued is not None and queued.lost_wait_since is not None:
            deadlines.append(queued.lost_wait_since + queued.request.lost_node_wait_s)
    deadlines += policy._retry.values()
    for gang_id in policy._topology_waits:  # a preferring gang's wait for one domain runs out
        queued = policy.pending.get(gang_id)
        end = None if queued is None else topology.wait_ends(policy._topology_waits, queued.request)
        if end is not None and end > policy._now:
            deadlines.append(end)
    known = [d for d in deadlines if d is not None]
    return min(known) if known else None
