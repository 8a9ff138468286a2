"""The goodput ledger of bench_scheduler.py's trace, in simulated time; and what the Scheduler's counters cost.

:class:`SimLedger` splits every simulated attempt's GPU-seconds (admission to release, times its GPUs) as
engine.runtime.ledger splits a real one, with the simulation's own model of work: a gang works from its
admission; a preempted one stops at the notice, saves for ``--save-s`` while it still holds its GPUs
(``checkpoint``), and keeps only the work up to its last periodic checkpoint (the rest is ``lost_preemption``,
or ``lost_drain`` for a drain's); a gang that finishes keeps all of its work (``productive``). The simulation
has no launch, restore, failures or hangs, so those causes stay 0; queueing is the benchmark's queue delay,
beside the ledger, not in it.

:class:`TimedCounters` is ``engine.scheduling.counters.Counters`` with a stopwatch around the two calls the
policy makes per event (``released`` and ``observe``): what the admission-wait histogram, the restart
causes and the other counters add to each gang event in the Scheduler.
"""

from __future__ import annotations

import time
from typing import Any

from engine.core.protocol import BADPUT
from engine.scheduling.counters import Counters

__all__ = ["SimLedger", "TimedCounters"]


class SimLedger:
    """Per tenant: allocated and productive GPU-seconds, and badput by cause."""

    def __init__(self, tenants: list[str]) -> None:
        self.allocated = dict.fromkeys(tenants, 0.0)
        self.productive = dict.fromkeys(tenants, 0.0)
        self.badput = {t: dict.fromkeys(BADPUT, 0.0) for t in tenants}

    def completed(self, tenant: str, gpus: int, placed: float, released: float) -> None:
        """An attempt that ran its work to the end: all of it counted."""
        held = gpus * (released - placed)
        self.allocated[tenant] += held
        self.productive[tenant] += held

    def preempted(self, tenant: str, gpus: int, kept_s: float, lost_s: float, save_s: float, drain: bool) -> None:
        """An attempt stopped by a notice: ``kept_s`` of its work reached a checkpoint, ``lost_s`` did not,
        and it held its GPUs ``save_s`` longer to save."""
        self.allocated[tenant] += gpus * (kept_s + lost_s + save_s)
        self.productive[tenant] += gpus * kept_s
        self.badput[tenant]["lost_drain" if drain else "lost_preemption"] += gpus * lost_s
        self.badput[tenant]["checkpoint"] += gpus * save_s

    def result(self) -> dict[str, Any]:
        """JSON-able: the totals, goodput overall and per tenant, badput by cause (GPU-seconds)."""
        allocated, productive = sum(self.allocated.values()), sum(self.productive.values())
        causes = {c: round(sum(b[c] for b in self.badput.values()), 1) for c in BADPUT}
        return {
            "allocated_gpu_s": round(allocated, 1),
            "productive_gpu_s": round(productive, 1),
            "goodput": round(productive / allocated, 4) if allocated else None,
            "badput_gpu_s": causes,
            "goodput_by_tenant": {
                t: round(self.productive[t] / a, 4) if a else None for t, a in self.allocated.items()
            },
        }


class TimedCounters(Counters):
    """Counters that time themselves (``seconds`` in all, ``calls``, the slowest call)."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds = 0.0
        self.calls = 0
        self.slowest = 0.0

    def _clock(self, start: float) -> None:
        spent = time.perf_counter() - start
        self.seconds += spent
        self.calls += 1
        self.slowest = max(self.slowest, spent)

    def released(self, gang_id: str, policy: Any) -> None:
        start = time.perf_counter()
        super().released(gang_id, policy)
        self._clock(start)

    def observe(self, event: Any, decisions: Any, policy: Any) -> None:
        start = time.perf_counter()
        super().observe(event, decisions, policy)
        self._clock(start)
