"""The policy's state across a continue-as-new: ``take`` (``Policy.snapshot``) and ``restore`` (``Policy.restore``).

The Scheduler workflow carries the snapshot as the argument of its next run, so the format is a wire
format: recorded histories hold it (tests/histories), and a run in flight carries one across an upgrade.
It is versioned (``SNAPSHOT_VERSION``) and only ever grows (at the end of its rows, or by a key a restore
reads with a default); a restored policy decides exactly as the original would have.

Compact on purpose (Temporal's payload limit is 2 MB): the rows are positional lists, repeated strings
(tenants, reasons) are stored once, and the JSON is zlib-compressed and base64-encoded.
"""

from __future__ import annotations

import base64
import json
import zlib
from typing import TYPE_CHECKING, Any

from engine.scheduling import flavors
from engine.scheduling.config import dump_queue_config, load_queue_config
from engine.scheduling.counters import Counters
from engine.scheduling.lenders import Lenders
from engine.scheduling.model import GangRequest, NodeAssignment, NodeSpec, Placement
from engine.scheduling.state import Checkpoint, Notice, Running
from engine.scheduling.tenancy import demand

if TYPE_CHECKING:
    from engine.scheduling.policy import Policy

__all__ = ["SNAPSHOT_VERSION", "restore", "take"]

SNAPSHOT_VERSION = 1


def _failed(search: tuple[int, float] | None, waited: tuple[str, str, str] | None) -> list[Any] | None:
    # JSON has no infinity: "no victim comes of age" is null; the victim waited for (gang, tenant, why) only
    # where there is one
    if search is None:
        return None
    return [search[0], None if search[1] == float("inf") else search[1], *(waited or ())]


def take(policy: Policy) -> dict[str, Any]:
    """Everything ``restore`` needs, compact: 15,000 queued gangs take a few hundred KB of JSON before
    compression, well under Temporal's 2 MB payload limit after it. Repeated strings (tenants, reasons)
    are stored once."""
    strings: dict[str, int] = {}

    def sid(text: str) -> int:
        return strings.setdefault(text, len(strings))

    def req(r: GangRequest) -> list[Any]:
        row = [
            r.gang_id,
            r.nnodes,
            r.gpus_per_node,
            r.cpus_per_node,
            r.mem_per_node,
            sid(r.tenant),
            r.priority,
            r.preemptible,
            r.lost_node_wait_s,
        ]
        if r.flavors or r.node_selector or r.tolerations or r.topology_required or r.topology_preferred or r.user:
            # the fleet's fields, only when set: a row without them is as before, byte for byte (the wait too)
            fleet = [list(r.flavors), r.node_selector, list(r.tolerations), r.topology_required, r.topology_preferred]
            row.append(fleet + ([r.topology_wait_s] if r.topology_wait_s is not None else []))
        if r.user:  # its run's user, after the fleet's fields (then always there), only when set
            row.append(sid(r.user))
        return row

    data = {
        "ttl": policy.inventory.node_ttl_s,
        "now": policy._now,
        "seq": policy._seq,
        "config": dump_queue_config(policy.config),
        "nodes": [
            [
                n.spec.node_id,
                n.spec.address,
                n.spec.gpus,
                n.spec.cpus,
                n.spec.mem,
                n.alive,
                n.last_seen,
                n.drained,
                sid(n.drain_reason),
                n.spec.sandboxed,
                n.spec.leased,
                *([n.spec.labels] if n.spec.labels else []),  # none: the row is as before labels
            ]
            for n in policy.inventory.nodes.values()
        ],
        "running": [
            [
                req(r.request),
                [[a.node_id, a.address, a.node_rank, list(a.gpu_ids)] for a in r.placement.nodes],
                r.seq,
                r.admit_seq,
                r.admitted_at,
                r.prio,
                r.preemptible,
                r.backfill,
                r.preempted_for,
                None if r.preemption is None else r.preemption.row(),
                # each only where there is one (then the flavor, None for none, keeps its place): a snapshot
                # without flavors and checkpoints is as before, byte for byte
                *(
                    [r.flavor, *([] if r.checkpoint is None else [r.checkpoint.row()])]
                    if r.flavor is not None or r.checkpoint is not None
                    else []
                ),
            ]
            for r in policy.running.values()
        ],
        "pending": [
            [
                req(q.request),
                q.seq,
                q.prio,
                q.preemptible,
                sid(q.reason),
                q.lost_wait_since,
                sorted(q.victims),
                q.cause,
                _failed(q.failed_search, q.waited_for),
                policy.counters.waited(q.request.gang_id, policy._now),  # its wait so far (the histogram's)
                # its flavor, then what its victims lose (lost_work): as the running rows
                *(
                    [q.flavor, *([] if q.victims_cost is None else [q.victims_cost])]
                    if q.flavor is not None or q.victims_cost is not None
                    else []
                ),
            ]
            for q in sorted(policy.pending.values(), key=lambda q: q.seq)
        ],
        "requeue": policy._requeue,
        "reserved": {k: sorted(v) for k, v in policy._reserved.items()},
        "backfill_seq": policy._backfill_seq,
        "pversion": policy._pversion,
        "retry": policy._retry,
        "evicted_for": {k: sorted(v) for k, v in policy._evicted_for.items()},
        "lenders": policy.lenders.rows(),
        "counters": policy.counters.carried(),
        "strings": list(strings),
    }
    if policy.tenancy.decay is not None:  # only then: a snapshot without a half-life is as before, byte for byte
        data["usage"] = policy.tenancy.decay.rows()
    user_usage = policy.tenancy.users.history()  # the users' decayed usage (``engine.scheduling.users``)
    if user_usage:  # only then, as ``usage``
        data["user_usage"] = user_usage
    if policy.lost_work.seen:  # only then, as ``usage``
        data["checkpoints"] = True
    if policy._topology_waits:  # only then, as ``usage``
        data["topology_waits"] = policy._topology_waits
    blob = zlib.compress(json.dumps(data, separators=(",", ":")).encode(), 6)
    return {"v": SNAPSHOT_VERSION, "zlib": base64.b64encode(blob).decode("ascii")}


def restore(cls: type[Policy], snapshot: dict[str, Any]) -> Policy:
    """The policy ``snapshot`` saved; it decides exactly as the original would have."""
    if snapshot.get("v") != SNAPSHOT_VERSION:
        raise ValueError(f"unknown scheduler snapshot version {snapshot.get('v')!r}")
    data = json.loads(zlib.decompress(base64.b64decode(snapshot["zlib"])))
    strings: list[str] = data["strings"]

    def req(v: list[Any]) -> GangRequest:
        fleet = v[9] if len(v) > 9 else [[], {}, [], None, None]  # a row from before flavors: none
        return GangRequest(
            gang_id=v[0],
            nnodes=v[1],
            gpus_per_node=v[2],
            cpus_per_node=v[3],
            mem_per_node=v[4],
            tenant=strings[v[5]],
            priority=v[6],
            preemptible=v[7],
            lost_node_wait_s=v[8],
            flavors=tuple(fleet[0]),
            node_selector=fleet[1],
            tolerations=tuple(fleet[2]),
            topology_required=fleet[3],
            topology_preferred=fleet[4],
            topology_wait_s=fleet[5] if len(fleet) > 5 else None,
            user=strings[v[10]] if len(v) > 10 else "",
        )

    policy = cls(load_queue_config(data["config"]), node_ttl_s=data["ttl"])
    policy._now, policy._seq = data["now"], data["seq"]
    policy.tenancy.now = policy.tenancy.users.now = policy._now
    inventory = policy.inventory
    # Rows grew at their end over time (the drain reason, sandboxed, leased, the preemption notice): a snapshot
    # from before a field was added still restores (runs in flight carry one across an upgrade).
    for node_id, address, gpus, cpus, mem, alive, last_seen, drained, *more in data["nodes"]:
        sandboxed = bool(more[1]) if len(more) > 1 else False  # a row from before it carried ``sandboxed``
        leased = bool(more[2]) if len(more) > 2 else False  # a row from before node leases: its agent re-registers
        labels = more[3] if len(more) > 3 else {}  # a row from before node labels
        spec = NodeSpec(
            node_id=node_id,
            address=address,
            gpus=gpus,
            cpus=cpus,
            mem=mem,
            sandboxed=sandboxed,
            leased=leased,
            labels=labels,
        )
        inventory.register(spec, last_seen)
        reason = strings[more[0]] if more else ""
        inventory.set_offered(node_id, alive=alive, drained=drained, reason=reason)
    notices: dict[str, list[Any] | None] = {}
    checkpoints: dict[str, list[Any]] = {}
    for r, nodes, seq, admit_seq, admitted_at, prio, preemptible, backfill, preempted_for, *more in data["running"]:
        request = req(r)
        notices[request.gang_id] = more[0] if more else None
        flavor = more[1] if len(more) > 1 else None  # a row from before flavors: none
        if len(more) > 2:  # its last checkpoint (rows from before them, or of gangs that reported none: none)
            checkpoints[request.gang_id] = more[2]
        placement = Placement(
            gang_id=request.gang_id,
            nodes=tuple(NodeAssignment(node_id=n, address=a, node_rank=k, gpu_ids=tuple(g)) for n, a, k, g in nodes),
        )
        running = Running(
            request,
            placement,
            seq,
            admit_seq,
            admitted_at,
            prio,
            preemptible,
            demand(request),
            backfill,
            preempted_for,
            flavor=flavor,
        )
        inventory.take(request, placement)
        policy.tenancy.add(running.ledger, running.vec, protected=not preemptible, user=request.user)
        policy.running[request.gang_id] = running
        policy._by_tenant.setdefault(running.ledger, {})[request.gang_id] = running
        policy._count_prio(running, 1)
        if request.gang_id in checkpoints:
            running.checkpoint = Checkpoint(*checkpoints[request.gang_id])
    waited: dict[str, float] = {}  # the waits so far (rows from before them have none: unknown)
    for r, seq, prio, preemptible, reason, since, victims, cause, failed, *later in data["pending"]:
        request = req(r)
        if later and later[0] is not None:
            waited[request.gang_id] = later[0]
        queued = flavors.make_queued(policy, request, seq, prio, preemptible)
        queued.reason, queued.lost_wait_since, queued.victims, queued.cause = (
            strings[reason],
            since,
            set(victims),
            cause,
        )
        if len(later) > 1 and later[1] is not None:  # the flavor it was looked at on (else its first candidate)
            queued.on(later[1])
        if failed is not None:  # a restored policy searches exactly when the original would have
            queued.failed_search = (failed[0], float("inf") if failed[1] is None else failed[1])
            if len(failed) > 2:
                queued.waited_for = (failed[2], failed[3], failed[4])
        if len(later) > 2:
            queued.victims_cost = later[2]
        policy._enqueue(queued)
        if since is not None:
            policy._lost_waiters.add(request.gang_id)
    policy._requeue = dict(data["requeue"])
    policy._reserved = {k: frozenset(v) for k, v in data["reserved"].items()}
    policy._backfill_seq = data["backfill_seq"]
    policy._pversion = data["pversion"]
    policy._topology_seen = inventory.topology  # the count restarts with the restored nodes
    policy._retry = dict(data["retry"])
    policy._topology_waits = dict(data.get("topology_waits", {}))
    policy._evicted_for = {k: set(v) for k, v in data["evicted_for"].items()}
    # keys added later are absent from older snapshots: their default is what a policy of then did
    policy.lenders = Lenders({k: set(v) for k, v in data.get("lenders", {}).items()})
    policy.counters = Counters.from_rows(data.get("counters"), waited, policy._now)
    policy.lost_work.seen = bool(data.get("checkpoints", False))
    if policy.tenancy.decay is not None:  # after the running gangs were counted again: their rates are set
        policy.tenancy.decay.restore_rows(data.get("usage", {}))  # none before ``usage_half_life``: no history
    policy.tenancy.users.restore_history(data.get("user_usage", {}))
    for gang_id, running in policy.running.items():
        notice = notices[gang_id]
        if notice is not None:
            running.preemption = Notice(*notice)
        elif running.preempted_for is not None:  # an older snapshot: what it knew of the preemption
            preemptor = policy.pending.get(running.preempted_for)
            cause = preemptor.cause if preemptor is not None and "," not in preemptor.cause else ""
            tenant = preemptor.request.tenant if preemptor is not None else ""
            grace = policy.config.policy.preemption_grace
            running.preemption = Notice(cause, running.preempted_for, tenant, policy._now, grace)
    return policy
