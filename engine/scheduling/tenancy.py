"""Tenants' usage against their quotas, cohort borrowing, and fair share, updated one gang at a time.

With flavors the ledger has one entry per tenant and flavor (``team-a/h100``) and each cohort one pool per
flavor (``research/h100``): everything below holds per entry (``ledgers``, ``engine.scheduling.flavors``).

Resources are vectors ``(gpu, millicores, bytes)``. For each tenant and resource its configuration gives
a nominal quota ``N`` (None: not limited), a borrowing limit ``B`` (None: unlimited) and a lending limit
``L`` (None: lend all of ``N``). As in Kueue, a tenant keeps ``G = N - L`` for itself alone and puts ``L``
into its root cohort's pool; the pool's usage is the sum over its tenants of ``max(0, used - G)``. A gang
of demand ``d`` is admissible for tenant ``t`` when, for every limited resource:

- ``used + d <= N``, or the tenant has a cohort and ``used + d - N <= B`` (borrowing), and
- the pool stays within its total: the tenant's draw ``max(0, used + d - G)`` replaces its current one.

So a tenant under its nominal quota can still be blocked when others borrowed what it lent: that is
exactly when it may *reclaim* (see ``engine.scheduling.preemption``). Nested cohorts (``parent:``) share
one pool: the root's. A tenant without a cohort neither lends nor borrows.

**Only preemptible gangs borrow.** The gangs that may not be preempted (*protected*) are counted apart
too, and a protected gang is admissible only when ``protected + d <= N``: whatever a tenant holds above
its nominal quota is then held by preemptible gangs, so a lender can always reclaim it.

**Fair share** (weighted dominant resource share, Kueue's DRS generalised to tenants without quota):
``share(t) = max over r of max(0, used[r] - N[r]) / C[r] / weight(t)``, over the resources the tenant's
quota limits (all three, with ``N = 0``, for a tenant without any quota), ``C[r]`` the capacity of the
offered nodes. A tenant within its quota has share 0; among
tenants above it, the one borrowing least relative to its weight goes first. Weight 0 means an infinite
share (it only gets what nobody else wants).

**With memory** (``policy.usage_half_life``): ``used[r] - N[r]`` becomes that plus the tenant's decayed
average usage above nominal (``engine.scheduling.usage_decay``), so a tenant that borrowed much lately
ranks after one that did not, even once both are back within their quotas. The ledger keeps it on the
policy's clock (``advance``); without the key nothing of it exists and the share is exactly as above.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from engine.scheduling.config import QueueConfig, ResourceAmounts, for_flavor
from engine.scheduling.inventory import millicores
from engine.scheduling.model import GangRequest
from engine.scheduling.usage_decay import FloatVec, UsageDecay
from engine.scheduling.users import Users

__all__ = ["RESOURCES", "Blocked", "Ledger", "Tenancy", "Vec", "demand", "key", "ledgers"]

Vec = tuple[int, int, int]
RESOURCES = ("gpu", "cpu", "mem")
_INF = float("inf")


def demand(request: GangRequest) -> Vec:
    """A gang's whole demand: GPUs, millicores and bytes over all of its nodes."""
    n = request.nnodes
    return (n * request.gpus_per_node, n * millicores(request.cpus_per_node), n * (request.mem_per_node or 0))


#: one ledger entry: (key, tenant, quota, borrowing limit, lending limit, weight, root cohort's pool key)
Ledger = tuple[str, str, ResourceAmounts | None, ResourceAmounts | None, ResourceAmounts | None, float, str | None]


def key(tenant: str, flavor: str | None) -> str:
    """The tenancy ledger's key of a tenant on a flavor (tenant and flavor names are DNS labels: no '/')."""
    return tenant if flavor is None else f"{tenant}/{flavor}"


def ledgers(config: QueueConfig) -> list[Ledger]:
    """The tenancy ledger's entries, in the configuration's order: one per tenant without flavors (keyed by its
    name, as before flavors), one per tenant and flavor it may use with them."""
    rows: list[Ledger] = []
    for t in config.tenants:
        root = config.root_cohort(t.name)
        for flavor in config.tenant_flavors(t.name) or (None,):
            rows.append(
                (
                    key(t.name, flavor),
                    t.name,
                    _flat(t.quota, flavor),
                    _flat(t.borrowing_limit, flavor),
                    _flat(t.lending_limit, flavor),
                    t.weight,
                    None if root is None else key(root, flavor),
                )
            )
    return rows


def _flat(amounts: ResourceAmounts | dict[str, ResourceAmounts] | None, flavor: str | None) -> ResourceAmounts | None:
    if flavor is None:  # no flavors: the configuration's quotas are per resource (config_checks)
        return amounts if isinstance(amounts, ResourceAmounts) else None
    return for_flavor(amounts, flavor)


@dataclass(frozen=True, slots=True)
class Blocked:
    """Why a tenant cannot take a demand now. ``kind``: "quota" (at nominal, no cohort), "borrowing_limit",
    "cohort" (the pool has too little idle), "protected" (a gang that is not preemptible and would take its
    tenant's protected gangs above nominal: it does not borrow), "never" (more than the tenant may ever hold),
    "never_protected" (a protected gang bigger than the nominal quota)."""

    kind: str
    resource: int
    nominal: int | None
    limit: int | None  # the borrowing limit, or the most the tenant may ever hold (kind "never")
    idle: int  # what the cohort pool has idle for this tenant (kind "cohort")
    within_nominal: bool  # True when used + demand <= nominal: the tenant may reclaim what it lent


def _amounts(amounts: ResourceAmounts | None) -> tuple[int | None, int | None, int | None]:
    if amounts is None:
        return (None, None, None)
    return (amounts.gpu, amounts.cpu, amounts.mem)


@dataclass(slots=True)
class _Tenant:
    nominal: tuple[int | None, int | None, int | None]
    borrowing: tuple[int | None, int | None, int | None]
    guaranteed: tuple[int, int, int]  # N - L: never lent
    lendable: tuple[int, int, int]
    weight: float
    root: str | None
    used: list[int]
    ceilings: tuple[float, float, float] = (_INF, _INF, _INF)  # see ``ceiling``: fixed per configuration
    protected: list[int] = field(default_factory=lambda: [0, 0, 0])  # what its gangs not preemptible use
    #: how many times the usage of its pool (its root cohort's tenants, or itself alone without one) changed,
    #: shared by the pool's tenants: what ``blocked`` reads cannot have moved while it stays the same
    pool_version: list[int] = field(default_factory=lambda: [0])
    #: the resources fair share measures it on: those its quota limits, all three for a tenant without any
    limited: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        self.limited = tuple(r for r in range(3) if self.nominal[r] is not None) or (0, 1, 2)


class Tenancy:
    """Usage of every tenant and of every cohort pool under one queue configuration."""

    def __init__(self, config: QueueConfig) -> None:
        self.config = config
        self.tenants: dict[str, _Tenant] = {}
        self.pool_total: dict[str, list[int]] = {}
        self.pool_used: dict[str, list[int]] = {}
        self.borrowers: set[str] = set()  # tenants above their nominal quota of some resource, kept by ``add``
        self.changes: dict[str, int] = {}  # per tenant, how many times its usage changed: a cache stamp
        self.touched: set[str] = set()  # the tenants whose usage changed since the policy last looked
        self.now = 0.0  # the policy's clock (``advance``): when a change of usage happens, for ``decay``
        half_life = config.policy.usage_half_life
        #: each tenant's decayed usage above nominal (fair share with memory); None: no ``usage_half_life``
        self.decay = UsageDecay(half_life) if half_life is not None else None
        self.users = Users(half_life)  # each user's usage inside its tenant (``engine.scheduling.users``)
        #: ``blocked``'s answers, (tenant, demand, protected) -> (its pool's version then, answer): a pure
        #: function of the pool's usage, asked again for every waiting head at every event
        self._blocked: dict[tuple[str, Vec, bool], tuple[int, Blocked | None]] = {}
        versions: dict[str, list[int]] = {}
        #: per root cohort, its tenants in the configuration's order
        self.members: dict[str, list[str]] = {}
        #: per tenant its ledger keys: its name alone without flavors, ``tenant/flavor`` per flavor with them
        #: (``engine.scheduling.flavors``); a pool's key is its root cohort's, per flavor alike
        self.keys: dict[str, list[str]] = {}
        for name, owner, quota, borrowing, lending_limit, weight, root in ledgers(config):
            nominal = _amounts(quota)
            lending = _amounts(lending_limit)
            lendable = tuple(
                0 if root is None or n is None else (n if lim is None else min(lim, n))
                for n, lim in zip(nominal, lending, strict=True)
            )
            guaranteed = tuple((n or 0) - lend for n, lend in zip(nominal, lendable, strict=True))
            self.tenants[name] = _Tenant(
                nominal=nominal,
                borrowing=_amounts(borrowing),
                guaranteed=(guaranteed[0], guaranteed[1], guaranteed[2]),
                lendable=(lendable[0], lendable[1], lendable[2]),
                weight=weight,
                root=root,
                used=[0, 0, 0],
                pool_version=[0] if root is None else versions.setdefault(root, [0]),
            )
            self.keys.setdefault(owner, []).append(name)
            if root is not None:
                self.members.setdefault(root, []).append(name)
                total = self.pool_total.setdefault(root, [0, 0, 0])
                self.pool_used.setdefault(root, [0, 0, 0])
                for r in range(3):
                    total[r] += lendable[r]
        for entry in self.tenants.values():  # once every pool is summed up
            c = [self._ceiling(entry, r) for r in range(3)]
            entry.ceilings = (c[0], c[1], c[2])

    def root(self, tenant: str) -> str | None:
        """The root cohort whose pool the tenant shares (None: it neither lends nor borrows)."""
        entry = self.tenants.get(tenant)
        return entry.root if entry is not None else None

    def _get(self, tenant: str) -> _Tenant:
        # a running gang of a tenant removed from the configuration keeps being counted (it still holds
        # GPUs) under an ad-hoc tenant without quota, cohort or weight
        entry = self.tenants.get(tenant)
        if entry is None:
            entry = self.tenants[tenant] = _Tenant(
                (0, 0, 0), (0, 0, 0), (0, 0, 0), (0, 0, 0), 1.0, None, [0, 0, 0], (0, 0, 0)
            )
        return entry

    def _draw(self, t: _Tenant, r: int, used: int) -> int:
        return max(0, used - t.guaranteed[r]) if t.nominal[r] is not None else 0

    def add(self, tenant: str, vec: Vec, sign: int = 1, *, protected: bool = False, user: str = "") -> None:
        """Count (``sign=1``) or uncount (``-1``) a gang's demand; ``protected``: a gang not preemptible;
        ``user``: its run's user (a gang that runs or stops running; the victim search's trials name none)."""
        t = self._get(tenant)
        owner = tenant.partition("/")[0]  # the tenant of a ledger key (``keys``)
        if user:  # (the many trials of a victim search name none: not even a call for them)
            self.users.add(owner, user, vec, sign)
        self.changes[owner] = self.changes.get(owner, 0) + 1
        self.touched.add(owner)
        t.pool_version[0] += 1
        if protected:
            for r in range(3):
                t.protected[r] += sign * vec[r]
        pool = self.pool_used.get(t.root) if t.root is not None else None
        for r in range(3):
            before = t.used[r]
            t.used[r] = before + sign * vec[r]
            if pool is not None:
                pool[r] += self._draw(t, r, t.used[r]) - self._draw(t, r, before)
        if any(n is not None and u > n for n, u in zip(t.nominal, t.used, strict=True)):
            self.borrowers.add(tenant)
        else:
            self.borrowers.discard(tenant)
        if self.decay is not None:
            self.decay.change(tenant, self._over(t), self.now)

    def _over(self, t: _Tenant) -> Vec:
        """What the tenant uses above nominal on the resources fair share measures it on (``share``)."""
        over = [0, 0, 0]
        for r in t.limited:
            over[r] = max(0, t.used[r] - (t.nominal[r] or 0))
        return (over[0], over[1], over[2])

    def advance(self, now: float) -> bool:
        """The policy's clock is ``now``. With a half-life, the share of every tenant with a history moves
        with each step of the clock fair share reads (``UsageDecay.ranked_at``): they count as changed then
        (``changes``, ``touched``), and True says the order may have changed, even if the event changed
        nothing else. O(tenants) then, O(1) otherwise; always False without a half-life."""
        if now == self.now:
            return False
        before, self.now = self.now, now
        self.users.now = now
        decay = self.decay
        if decay is None or decay.ranked_at(now) == decay.ranked_at(before):
            return False
        moved = False
        for key in itertools.chain(decay.moving(), self.users.moving()):  # users' shares order its gangs
            tenant = key.partition("/")[0]  # the tenant of a ledger key (``keys``)
            self.changes[tenant] = self.changes.get(tenant, 0) + 1
            self.touched.add(tenant)
            moved = True
        return moved

    def carry(self, old: Tenancy) -> None:
        """A new configuration's ledger (empty yet) takes over ``old``'s clock and, when it has a half-life
        too, the decayed usage (the running gangs are counted again after this)."""
        self.now = old.now
        self.users.carry(old.users)
        if self.decay is not None and old.decay is not None:
            self.decay.take_over(old.decay, old.now)

    def decayed(self, tenant: str) -> FloatVec | None:
        """The tenant's decayed usage above nominal now, in resource-seconds; None without a half-life."""
        return None if self.decay is None else self.decay.value_at(tenant, self.now)

    def blocked(self, tenant: str, vec: Vec, protected: bool = False) -> Blocked | None:
        """None when ``tenant`` may take ``vec`` now, else the first resource that stops it. A ``protected``
        gang (not preemptible) must also keep the tenant's protected gangs within its nominal quota."""
        t = self._get(tenant)
        key = (tenant, vec, protected)
        cached = self._blocked.get(key)
        if cached is not None and cached[0] == t.pool_version[0]:
            return cached[1]
        if len(self._blocked) > 10_000:
            self._blocked.clear()
        answer = self._blocked_now(t, vec, protected)
        self._blocked[key] = (t.pool_version[0], answer)
        return answer

    def pool_counter(self, tenant: str) -> list[int]:
        """The counter of the tenant's pool's usage changes (see ``_Tenant.pool_version``), itself: a cache
        keeps it with the count it read, and compares them later without asking again."""
        return self._get(tenant).pool_version

    def _blocked_now(self, t: _Tenant, vec: Vec, protected: bool) -> Blocked | None:
        for r in range(3):  # "never" first: such a gang is rejected, whatever else stops it now
            nominal = t.nominal[r]
            if nominal is not None and vec[r] > t.ceilings[r]:
                return Blocked("never", r, nominal, int(t.ceilings[r]), 0, t.used[r] + vec[r] <= nominal)
            if protected and nominal is not None and vec[r] > nominal:
                return Blocked("never_protected", r, nominal, nominal, 0, False)
        if protected:  # it would borrow were it admitted: it waits for the tenant's protected gangs instead
            for r in range(3):
                nominal = t.nominal[r]
                if nominal is not None and vec[r] and t.protected[r] + vec[r] > nominal:
                    return Blocked("protected", r, nominal, None, max(0, nominal - t.protected[r]), False)
        for r in range(3):
            nominal = t.nominal[r]
            if nominal is None or vec[r] == 0:
                continue
            after = t.used[r] + vec[r]
            within = after <= nominal
            if t.root is None:
                if not within:
                    return Blocked("quota", r, nominal, None, 0, False)
                continue
            limit = t.borrowing[r]
            if not within and limit is not None and after - nominal > limit:
                return Blocked("borrowing_limit", r, nominal, limit, 0, False)
            total, used = self.pool_total[t.root][r], self.pool_used[t.root][r]
            guaranteed = t.guaranteed[r]  # ``_draw``, inlined (the nominal quota is set): asked at every event
            draw_before, draw_after = max(0, t.used[r] - guaranteed), max(0, after - guaranteed)
            if used - draw_before + draw_after > total:
                idle = max(0, t.guaranteed[r] - t.used[r]) + max(0, total - used)
                return Blocked("cohort", r, nominal, limit, idle, within)
        return None

    def _ceiling(self, t: _Tenant, r: int) -> float:
        """The most of resource ``r`` the tenant could ever hold with nothing else running."""
        nominal = t.nominal[r]
        if nominal is None:
            return _INF
        if t.root is None:
            return nominal
        limit = t.borrowing[r]
        most = t.guaranteed[r] + self.pool_total[t.root][r]
        return most if limit is None else min(most, nominal + limit)

    def borrowing(self, tenant: str) -> bool:
        """Whether the tenant uses more than its nominal quota of some resource."""
        return tenant in self.borrowers

    def would_borrow(self, tenant: str, vec: Vec) -> bool:
        """Whether taking ``vec`` would put the tenant above its nominal quota of a resource ``vec`` asks for."""
        t = self._get(tenant)
        return any(v and n is not None and u + v > n for n, u, v in zip(t.nominal, t.used, vec, strict=True))

    def within_nominal(self, tenant: str, vec: Vec) -> bool:
        t = self._get(tenant)
        return all(n is None or u + v <= n for n, u, v in zip(t.nominal, t.used, vec, strict=True))

    def share(self, tenant: str, capacity: Sequence[int], plus: Vec = (0, 0, 0)) -> float:
        """Weighted dominant resource share (see the module docstring), with ``plus`` more in use."""
        t = self._get(tenant)
        dominant = 0.0
        decay = self.decay
        past = decay.average(tenant, decay.ranked_at(self.now)) if decay is not None else None
        for r in t.limited:
            over = float(t.used[r] + plus[r] - (t.nominal[r] or 0))  # a float: the compiled policy keeps types
            if past is not None:  # fair share with memory: its recent average above nominal counts too
                over = max(0, over) + past[r]
            if over > 0 and capacity[r] > 0:
                dominant = max(dominant, over / capacity[r])
        if dominant == 0.0:
            return 0.0
        return dominant / t.weight if t.weight > 0 else _INF

    def tenant_share(self, tenant: str, capacity: Sequence[int]) -> float:
        """A tenant's fair share: the largest of its ledger keys' shares (one without flavors)."""
        keys = self.keys.get(tenant)
        if not keys:
            return self.share(tenant, capacity)
        return max(self.share(k, capacity) for k in keys)

    def tenant_within_nominal(self, tenant: str, vec: Vec) -> bool:
        """Whether ``vec`` keeps the tenant within its nominal quota on one of its flavors at least."""
        return any(self.within_nominal(k, vec) for k in self.keys.get(tenant) or [tenant])

    def uncohorted(self) -> list[str]:
        """The configured ledger keys outside any cohort, in the configuration's order."""
        return [k for keys in self.keys.values() for k in keys if self.tenants[k].root is None]

    def used(self, tenant: str) -> tuple[int, int, int]:
        u = self._get(tenant).used
        return (u[0], u[1], u[2])

    def nominal(self, tenant: str) -> tuple[int | None, int | None, int | None]:
        return self._get(tenant).nominal

    def borrowed(self, tenant: str) -> tuple[int, int, int]:
        t = self._get(tenant)
        b = [max(0, u - n) if n is not None else 0 for u, n in zip(t.used, t.nominal, strict=True)]
        return (b[0], b[1], b[2])

    def lent(self) -> dict[str, tuple[int, int, int]]:
        """What each tenant's idle nominal quota currently lends to borrowers of its cohort.

        Borrowed amounts are attributed to lenders in name order, each up to its idle lendable quota
        (a display choice: the pool does not record who lent to whom)."""
        lent = {name: [0, 0, 0] for name in self.tenants}
        for root in self.pool_total:
            members = sorted(name for name, t in self.tenants.items() if t.root == root)
            for r in range(3):
                owed = sum(self.borrowed(name)[r] for name in members)
                for name in members:
                    t = self.tenants[name]
                    nominal = t.nominal[r]
                    idle = 0 if nominal is None else max(0, min(t.lendable[r], nominal - t.used[r]))
                    give = min(idle, owed)
                    lent[name][r] += give
                    owed -= give
        return {name: (v[0], v[1], v[2]) for name, v in lent.items()}
