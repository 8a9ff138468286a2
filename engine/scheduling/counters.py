"""What the Scheduler has decided since the cluster began, per tenant: admissions and preemptions by cause.

Prometheus counters (engine.runtime.metrics: ``gangflow_admitted_gangs_total``, ``gangflow_preempted_gangs_total``)
read them from ``describe``. They are the policy's, carried across continue-as-new in its snapshot, so a
Scheduler that continues as new does not reset them (a reset only when the Scheduler starts afresh, which
Prometheus's ``rate`` handles as any counter reset). Counting reads the decisions after they are made: it never
changes one. O(decisions) per event.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from engine.scheduling.events import Admitted, Decision, Preempted

__all__ = ["Counters"]


class Counters:
    def __init__(self, admitted: Mapping[str, int] | None = None, preempted: Iterable[list[Any]] = ()) -> None:
        self.admitted: dict[str, int] = dict(admitted or {})  # tenant -> admissions
        self.preempted: dict[tuple[str, str], int] = {(str(t), str(c)): int(n) for t, c, n in preempted}

    def observe(self, decisions: Iterable[Decision], tenant_of: Mapping[str, Any]) -> None:
        """Count one event's decisions; ``tenant_of``: the running gangs (``Policy.running``), where every
        admitted and every preempted gang still is when its decision is made."""
        for decision in decisions:
            if isinstance(decision, Admitted | Preempted):
                running = tenant_of.get(decision.gang_id)
                if running is None:
                    continue
                tenant = running.request.tenant
                if isinstance(decision, Admitted):
                    self.admitted[tenant] = self.admitted.get(tenant, 0) + 1
                else:
                    key = (tenant, decision.cause)
                    self.preempted[key] = self.preempted.get(key, 0) + 1

    def rows(self) -> dict[str, Any]:
        """JSON-able (the snapshot's and ``describe``'s): ``{"admitted": {tenant: n}, "preempted": [[tenant,
        cause, n], ...]}``."""
        return {
            "admitted": dict(self.admitted),
            "preempted": [[t, c, n] for (t, c), n in sorted(self.preempted.items())],
        }

    @classmethod
    def from_rows(cls, rows: Mapping[str, Any] | None) -> Counters:
        """The counters ``rows`` saved; none (a snapshot from before them) starts at 0."""
        if not isinstance(rows, Mapping):
            return cls()
        return cls(rows.get("admitted") or {}, rows.get("preempted") or ())
