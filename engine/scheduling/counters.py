"""What the Scheduler has decided and seen since the cluster began, per tenant: admissions, preemptions by
cause, how long admitted gangs waited (a histogram), gang restarts by cause, and where the GPU-seconds of the
ended attempts went (the goodput ledger's causes).

Prometheus families (engine.runtime.metrics: ``gangflow_admitted_gangs_total``, ``gangflow_preempted_gangs_total``,
``gangflow_admission_wait_seconds``, ``gangflow_gang_restarts_total``) read them from ``describe``. They are the
policy's, carried across continue-as-new in its snapshot, so a Scheduler that continues as new does not reset
them (a reset only when the Scheduler starts afresh, which Prometheus's ``rate`` handles as any counter reset).
Counting reads the events and decisions after they are made: it never changes one. O(decisions) per event.

**Admission wait** is the policy's own clock: a gang's submission (its ``GangSubmitted`` event accepted) to its
``Admitted`` decision. A preempted or restarted gang waits again from its new submission (each attempt counts,
as for ``admitted``). The submission times of the gangs still waiting cross a continue-as-new at the end of
their pending rows (``snapshot``); a snapshot from before them restores with those waits unknown (not counted).

**Restarts.** The Scheduler hears of an attempt's end as its ``GangReleased``, and of the attempt after it as the
same gang id submitted again. What it knows at the release names the cause: the gang had been preempted
(``preemption``, or ``drain`` for a drain's), one of its nodes was reported lost (its GangTask reports lost nodes
before it releases: ``node_lost``), or neither (``rank_failure``: a rank exited non-zero or hung). A completed
gang is released the same way and never comes back, so a restart is counted only when its gang is submitted
again; the released causes wait for that in ``ended``, at most ``RESTART_WINDOW_S`` and ``MAX_ENDED`` of them
(oldest forgotten first: a gang that comes back later counts no restart).

**GPU-seconds by cause.** Each GangTask tells the ledger of each attempt once it ended (``LEDGER_SIGNAL``,
workflows.gang_ledger): its productive GPU-seconds and its badput by cause, summed here per tenant, flavor
("" without flavors) and cause. ``gangflow_gpu_seconds_total`` and the goodput ratio are read from them; the
Scheduler's state grows by tenants × flavors × 9 numbers, never per gang.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from engine.core.protocol import BADPUT
from engine.scheduling.events import Admitted, Decision, Event, GangRejected, GangSubmitted, Preempted

if TYPE_CHECKING:
    from engine.scheduling.policy import Policy

__all__ = ["MAX_ENDED", "RESTART_CAUSES", "RESTART_WINDOW_S", "WAIT_BUCKETS", "Counters"]

#: upper bounds (seconds) of the admission-wait histogram's buckets: a second to a day (plus +Inf)
WAIT_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 43200.0, 86400.0)
RESTART_CAUSES = ("node_lost", "preemption", "drain", "rank_failure")
#: a released attempt's cause waits this long for its gang to be submitted again (a GangTask resubmits at
#: once after a preemption or a system failure; after a user error once its retry backoff has passed)
RESTART_WINDOW_S = 3600.0
#: and at most this many of them wait (the snapshot carries them)
MAX_ENDED = 2000


class Counters:
    def __init__(
        self,
        admitted: Mapping[str, int] | None = None,
        preempted: Iterable[list[Any]] = (),
        waits: Iterable[list[Any]] = (),
        restarts: Iterable[list[Any]] = (),
    ) -> None:
        self.admitted: dict[str, int] = dict(admitted or {})  # tenant -> admissions
        self.preempted: dict[tuple[str, str], int] = {(str(t), str(c)): int(n) for t, c, n in preempted}
        # tenant -> [sum of waits, [count per bucket of WAIT_BUCKETS, then the +Inf bucket]] (not cumulative)
        self.waits: dict[str, list[Any]] = {str(t): [float(s), [int(n) for n in b]] for t, s, b in waits}
        self.restarts: dict[tuple[str, str], int] = {(str(t), str(c)): int(n) for t, c, n in restarts}
        #: (tenant, cause) -> the GPU-seconds its preempted gangs were expected to lose (``Preempted.cost_gpu_s``)
        self.lost: dict[tuple[str, str], float] = {}
        self.since: dict[str, float] = {}  # gang waiting -> its submission (policy clock)
        self.ended: dict[str, tuple[str, str, float]] = {}  # gang released -> (tenant, cause, when), oldest first
        self.gpu_s: dict[tuple[str, str, str], float] = {}  # (tenant, flavor or "", cause) -> GPU-seconds

    # -- counting ----------------------------------------------------------------------------------
    def released(self, gang_id: str, policy: Policy) -> None:
        """Before the policy applies a ``GangReleased``: remember why the attempt ended, should it come back."""
        self.since.pop(gang_id, None)  # a request withdrawn before its admission
        running = policy.running.get(gang_id)
        if running is None:
            return
        notice = running.preemption
        if notice is not None:
            cause = "drain" if notice.cause == "drain" else "preemption"
        else:
            nodes = policy.inventory.nodes
            lost = any(not (n := nodes.get(a.node_id)) or not n.alive for a in running.placement.nodes)
            cause = "node_lost" if lost else "rank_failure"
        now = policy._now
        self.ended.pop(gang_id, None)
        self.ended[gang_id] = (running.request.tenant, cause, now)
        ended = self.ended
        while ended:
            first = next(iter(ended))
            if len(ended) <= MAX_ENDED and ended[first][2] >= now - RESTART_WINDOW_S:
                break
            del ended[first]

    def observe(self, event: Event, decisions: Iterable[Decision], policy: Policy) -> None:
        """Count one event's decisions (after ``step`` applied them: every admitted and every preempted gang
        is among ``policy.running``, and a gang whose submission was accepted waits or runs)."""
        now = policy._now
        if isinstance(event, GangSubmitted):
            gang_id = event.request.gang_id
            refused = any(isinstance(d, GangRejected) and d.gang_id == gang_id for d in decisions)
            if not refused and (gang_id in policy.pending or gang_id in policy.running):
                self.since[gang_id] = now
                ended = self.ended.pop(gang_id, None)
                if ended is not None:
                    key = (ended[0], ended[1])
                    self.restarts[key] = self.restarts.get(key, 0) + 1
        running = policy.running
        for decision in decisions:
            if isinstance(decision, GangRejected):
                if decision.gang_id not in policy.pending:  # not a duplicate's refusal: the original still waits
                    self.since.pop(decision.gang_id, None)
                continue
            if not isinstance(decision, Admitted | Preempted):
                continue
            gang = running.get(decision.gang_id)
            if gang is None:
                continue
            tenant = gang.request.tenant
            if isinstance(decision, Admitted):
                self.admitted[tenant] = self.admitted.get(tenant, 0) + 1
                submitted = self.since.pop(decision.gang_id, None)
                if submitted is not None:
                    self._wait(tenant, max(0.0, now - submitted))
            else:
                key = (tenant, decision.cause)
                self.preempted[key] = self.preempted.get(key, 0) + 1
                if decision.cost_gpu_s is not None:
                    self.lost[key] = round(self.lost.get(key, 0.0) + decision.cost_gpu_s, 1)

    def ledger(self, payload: Any) -> bool:
        """Add an ended attempt's ledger (``LEDGER_SIGNAL``'s payload); False, counting nothing, where it is
        malformed (a signal's payload is never trusted: a cause it does not know, a negative or infinite
        figure, no tenant)."""
        if not isinstance(payload, Mapping):
            return False
        tenant, flavor, badput = payload.get("tenant"), payload.get("flavor"), payload.get("badput")
        if not isinstance(tenant, str) or not tenant or not isinstance(flavor, str | None):
            return False
        if not isinstance(badput, Mapping) or not set(badput) <= set(BADPUT):
            return False
        parts = {"productive": payload.get("productive_gpu_s"), **badput}
        if not all(_figure(v) for v in parts.values()):
            return False
        for cause, seconds in parts.items():
            key = (tenant, flavor or "", cause)
            self.gpu_s[key] = round(self.gpu_s.get(key, 0.0) + float(seconds), 3)
        return True

    def _wait(self, tenant: str, seconds: float) -> None:
        row = self.waits.get(tenant)
        if row is None:
            row = self.waits[tenant] = [0.0, [0] * (len(WAIT_BUCKETS) + 1)]
        row[0] += seconds
        row[1][bisect.bisect_left(WAIT_BUCKETS, seconds)] += 1  # le: a wait of exactly 60 s is in the 60 s bucket

    # -- views and continue-as-new -----------------------------------------------------------------
    def rows(self) -> dict[str, Any]:
        """JSON-able (``describe``'s, and the snapshot's with ``carried``): ``{"admitted": {tenant: n},
        "preempted": [[tenant, cause, n], ...], "wait_buckets": [...], "waits": [[tenant, sum, [n per bucket,
        +Inf last]], ...], "restarts": [[tenant, cause, n], ...]}``, and ``"preemption_cost_gpu_s": [[tenant,
        cause, GPU-s], ...]`` once a preemption recorded its cost, ``"gpu_seconds": [[tenant, flavor, cause,
        GPU-s], ...]`` once an attempt's ledger was told (a snapshot without them is what it was before)."""
        more: dict[str, Any] = {}
        if self.lost:
            more["preemption_cost_gpu_s"] = [[t, c, x] for (t, c), x in sorted(self.lost.items())]
        if self.gpu_s:
            more["gpu_seconds"] = [[t, f, c, x] for (t, f, c), x in sorted(self.gpu_s.items())]
        return {
            **more,
            "admitted": dict(self.admitted),
            "preempted": [[t, c, n] for (t, c), n in sorted(self.preempted.items())],
            "wait_buckets": list(WAIT_BUCKETS),
            "waits": [[t, s, list(b)] for t, (s, b) in sorted(self.waits.items())],
            "restarts": [[t, c, n] for (t, c), n in sorted(self.restarts.items())],
        }

    def carried(self) -> dict[str, Any]:
        """``rows`` and the released attempts waiting for their gang to come back (the snapshot's; the
        submission times of waiting gangs go with their pending rows: ``waited``)."""
        return {**self.rows(), "ended": [[g, t, c, w] for g, (t, c, w) in self.ended.items()]}

    def waited(self, gang_id: str, now: float) -> float | None:
        """How long a waiting gang has waited so far, None when unknown: to 0.1 s, what the snapshot carries (the
        buckets start at 1 s; about 4 KB per 1,000 waiting gangs, compressed)."""
        submitted = self.since.get(gang_id)
        return None if submitted is None else round(now - submitted, 1)

    @classmethod
    def from_rows(
        cls, rows: Mapping[str, Any] | None, waited: Mapping[str, float] | None = None, now: float = 0.0
    ) -> Counters:
        """The counters ``rows`` saved (``carried``), and the waits so far of the gangs waiting; none (a
        snapshot from before them) starts at 0. Waits kept with other bucket bounds start again at 0."""
        if not isinstance(rows, Mapping):
            rows = {}
        waits = rows.get("waits") or ()
        if list(rows.get("wait_buckets") or ()) != list(WAIT_BUCKETS):
            waits = ()
        counters = cls(rows.get("admitted") or {}, rows.get("preempted") or (), waits, rows.get("restarts") or ())
        counters.ended = {str(g): (str(t), str(c), float(w)) for g, t, c, w in rows.get("ended") or ()}
        counters.lost = {(str(t), str(c)): float(x) for t, c, x in rows.get("preemption_cost_gpu_s") or ()}
        counters.gpu_s = {(str(t), str(f), str(c)): float(x) for t, f, c, x in rows.get("gpu_seconds") or ()}
        counters.since = {g: now - w for g, w in (waited or {}).items()}
        return counters


def _figure(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
