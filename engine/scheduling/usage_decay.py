"""Fair share with memory: each tenant's recent usage, decayed with a half-life (``policy.usage_half_life``).

Slurm's ``PriorityDecayHalfLife``, Kueue's admission fair sharing (``usageHalfLifeTime``) and Volcano's
decayed share all do this: a tenant that used the whole cluster yesterday yields today. Here the usage
that decays is what fair share measures (``engine.scheduling.tenancy``): per resource, what the tenant
uses above its nominal quota (everything, for a tenant without any quota), accumulated over time, so in
GPU-seconds, millicore-seconds and byte-seconds, and each second of it weighs ``2^(-age / half_life)``::

    H(t) = integral of over(s) * 2^(-(t - s) / h) ds

Between two changes of a tenant's usage ``over`` is constant, so ``H`` is kept per tenant as
``(value, rate, as_of)`` and brought forward lazily, in closed form (``d = 2^(-(t - as_of) / h)``,
``tau = h / ln 2`` the mean age of a decayed second)::

    H(t) = H(as_of) * d + rate * tau * (1 - d)

One change costs O(1) (``change``), one read O(1) (``value_at``): nothing is done per event for a tenant
whose usage did not change. ``H / tau`` is the decayed *average* usage, in the resource's own units: a
tenant that has held ``g`` GPUs above its quota for much longer than ``h`` has an average of ``g``; one
that held them for exactly ``h`` and then stopped, ``g / 2``. Fair share adds that average to the current
usage (``Tenancy.share``).

Fair share reads it on a clock that moves in steps of ``half_life / 1024`` (``ranked_at``: 10 minutes for
a 7-day half-life, 3.5 s for 1 hour), in which a history changes by under 0.07 %: between two steps the
order changes only for the tenants whose usage changed, so an event does not re-rank every tenant with a
history; at a step it does, O(tenants) (``Tenancy.advance``).

Time is the policy's clock (``Policy.step``'s ``now``: the Scheduler workflow's clock), so the values are
the same on every replay; they are carried across continue-as-new in the snapshot (``rows``) and a snapshot
from before restores with no history. Only the ``(value, as_of)`` pairs travel: each ``rate`` is the
tenant's usage then, which the restored ledger counts again from the running gangs.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["RANK_STEPS", "FloatVec", "UsageDecay"]

#: steps per half-life of the clock fair share reads the decayed usage on (``UsageDecay.ranked_at``)
RANK_STEPS = 1024

Vec = tuple[int, int, int]
FloatVec = tuple[float, float, float]


@dataclass(slots=True)
class _Record:
    value: FloatVec  # H at ``as_of``: resource-seconds
    rate: Vec  # usage above nominal since ``as_of``
    as_of: float


class UsageDecay:
    """Per tenant, its usage above nominal in resource-seconds, decayed with ``half_life`` seconds."""

    def __init__(self, half_life: float) -> None:
        if not half_life > 0 or not math.isfinite(half_life):  # the configuration refuses it first
            raise ValueError(f"usage half-life must be a finite number of seconds > 0, got {half_life!r}")
        self.half_life = half_life
        #: the mean age of a decayed second: what turns resource-seconds into an average usage
        self.tau = half_life / math.log(2)
        self.step = half_life / RANK_STEPS
        self._records: dict[str, _Record] = {}

    def ranked_at(self, now: float) -> float:
        """The start of the step of ``now`` (a pure function of it: replays and restored policies agree)."""
        return math.floor(now / self.step) * self.step

    def _factor(self, record: _Record, now: float) -> float:
        # ``now`` before ``as_of``: a step's start (``ranked_at``) read after a change within that step (or a
        # clock gone back, which the workflow clock never does): the value then, not a grown one
        return math.pow(2.0, -max(0.0, now - record.as_of) / self.half_life)

    def _at(self, record: _Record, now: float) -> FloatVec:
        d = self._factor(record, now)
        v, rate, grown = record.value, record.rate, self.tau * (1.0 - d)
        return (v[0] * d + rate[0] * grown, v[1] * d + rate[1] * grown, v[2] * d + rate[2] * grown)

    def change(self, tenant: str, rate: Vec, now: float) -> None:
        """The tenant's usage above nominal is ``rate`` from ``now`` on: settle what it used until now."""
        record = self._records.get(tenant)
        if record is None:
            self._records[tenant] = _Record((0.0, 0.0, 0.0), rate, now)
        elif rate != record.rate:  # the same rate goes on: nothing to settle (any change within the quota)
            record.value, record.rate, record.as_of = self._at(record, now), rate, now

    def value_at(self, tenant: str, now: float) -> FloatVec:
        """The tenant's decayed usage at ``now``, in resource-seconds (0 for a tenant never seen)."""
        record = self._records.get(tenant)
        return (0.0, 0.0, 0.0) if record is None else self._at(record, now)

    def average(self, tenant: str, now: float) -> FloatVec:
        """The decayed usage as an average usage (``H / tau``), in GPUs, millicores and bytes."""
        v = self.value_at(tenant, now)
        return (v[0] / self.tau, v[1] / self.tau, v[2] / self.tau)

    def moving(self) -> Iterator[str]:
        """The tenants whose decayed usage changes as time passes (a history or a usage above nominal):
        their share moves with the clock alone. O(tenants)."""
        for tenant, record in self._records.items():
            if any(record.rate) or any(record.value):
                yield tenant

    def take_over(self, old: UsageDecay, now: float) -> None:
        """Keep ``old``'s history under a new configuration: each value settled at ``now`` under the old
        usage, with no usage from then on (the new ledger counts the running gangs again, ``change``)."""
        for tenant in old._records:
            self._records[tenant] = _Record(old.value_at(tenant, now), (0, 0, 0), now)

    # -- continue-as-new ---------------------------------------------------------------------------
    def rows(self) -> dict[str, list[float]]:
        """What the snapshot carries: per tenant ``[gpu, cpu, mem, as_of]`` (JSON floats round-trip exactly)."""
        return {t: [*r.value, r.as_of] for t, r in sorted(self._records.items())}

    def restore_rows(self, rows: Mapping[str, Any]) -> None:
        """Put back what ``rows`` saved; each rate stays what the restored ledger counted (``change``). A
        tenant without a row (a snapshot from before ``usage_half_life``) keeps no history."""
        for tenant, (gpu, cpu, mem, as_of) in rows.items():
            record = self._records.get(tenant)
            rate = record.rate if record is not None else (0, 0, 0)
            self._records[tenant] = _Record((float(gpu), float(cpu), float(mem)), rate, float(as_of))
