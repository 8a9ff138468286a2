"""Fair share inside a tenant: each user's usage, so a tenant's gangs go in the order of their users' shares.

Slurm's fair-share tree ranks an account's users below the account (``fairshare=parent`` apart), Volcano
ranks users by their decayed share (v1.16): a user who has held half of the team's GPUs all morning waits
behind a colleague who has held none, whatever the order they submitted in. Here a gang request names its
run's user (``GangRequest.user``: the token's subject where the gateway stamps it, engine.runtime.gateway);
the admission cycle orders a tenant's queue heads of one priority by their user's share, then by submission,
and of its users' gangs of one shape looks at the head of the lowest share only, as one queue's head stands
for its gangs (``engine.scheduling.cycle.user_heads``: users add no looks to a cycle). The tenants keep their
places among themselves: its users take turns on the places the tenant's gangs hold, and a tenant whose gangs
name no user keeps its FIFO order.

A user's share is its dominant share of the cluster's capacity: per resource what its gangs hold now, plus
with ``policy.usage_half_life`` its decayed average usage (``engine.scheduling.usage_decay``: here all of its
usage decays, a user has no nominal quota of its own), the largest of the three over the capacity. All users
weigh the same. Kept per (tenant, user): one change costs O(1), as the tenants' ledger.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from engine.scheduling.usage_decay import UsageDecay

__all__ = ["Users", "take_turns"]

Vec = tuple[int, int, int]
T = TypeVar("T")


def _key(tenant: str, user: str) -> str:
    return f"{tenant}/{user}"  # a tenant's name has no "/" (config's name rule): the first one splits them


def take_turns(items: Iterable[tuple[int, tuple[float, int], int, T]]) -> Iterator[tuple[T, int]]:
    """A tenant's users take turns on the places its gangs hold (the module docstring): of ``(priority, rank,
    place, what)`` items, per priority, the places (numbers in the order) handed out again by rank (its user's
    share, then a gang's number), the lowest first; each ``what`` with its place. The one rule the cycle (for
    queue heads, ``engine.scheduling.cycle.user_heads``) and the queue's view (for every waiting gang,
    ``engine.scheduling.describe``) apply."""
    by_prio: dict[int, list[tuple[int, tuple[float, int], int, T]]] = {}
    for item in items:
        by_prio.setdefault(item[0], []).append(item)
    for group in by_prio.values():
        places = sorted(item[2] for item in group)
        group.sort(key=lambda item: item[1])
        for item, place in zip(group, places, strict=True):
            yield item[3], place


class Users:
    """Per (tenant, user): what its running gangs hold, and with a half-life its decayed usage."""

    def __init__(self, half_life: float | None) -> None:
        self.used: dict[str, list[int]] = {}  # _key(tenant, user) -> GPUs, millicores, bytes held now
        self.decay = UsageDecay(half_life) if half_life is not None else None
        self.now = 0.0  # the policy's clock (``Tenancy.advance`` moves it)

    def add(self, tenant: str, user: str, vec: Vec, sign: int = 1) -> None:
        """Count (``sign=1``) or uncount (``-1``) a running gang of ``user``'s; a gang without a user: nothing."""
        if not user:
            return
        key = _key(tenant, user)
        used = self.used.setdefault(key, [0, 0, 0])
        for r in range(3):
            used[r] += sign * vec[r]
        if self.decay is not None:
            self.decay.change(key, (used[0], used[1], used[2]), self.now)
        if not any(used) and (self.decay is None or not any(self.decay.value_at(key, self.now))):
            del self.used[key]  # nothing held and nothing remembered: the user leaves the ledger

    def share(self, tenant: str, user: str, capacity: Sequence[int]) -> float:
        """``user``'s dominant share in ``tenant`` (the module docstring); 0 for no user or one never seen."""
        if not user:
            return 0.0
        key = _key(tenant, user)
        used = self.used.get(key, (0, 0, 0))
        decay = self.decay
        past = decay.average(key, decay.ranked_at(self.now)) if decay is not None else (0.0, 0.0, 0.0)
        return max(((used[r] + past[r]) / capacity[r] for r in range(3) if capacity[r] > 0), default=0.0)

    def shares(self, tenant: str, users: Iterable[str], capacity: Sequence[int]) -> dict[str, float]:
        """``share`` of each of ``users`` in ``tenant``, once per user (a tenant has many gangs and few users)."""
        return {user: self.share(tenant, user, capacity) for user in set(users)}

    def moving(self) -> Iterator[str]:
        """The tenants whose users' shares move with the clock alone (a decayed history or a usage)."""
        if self.decay is not None:
            for key in self.decay.moving():
                yield key.partition("/")[0]

    def carry(self, old: Users) -> None:
        """A new configuration's ledger takes over ``old``'s histories when both have a half-life (the running
        gangs are counted again after this, as ``Tenancy.carry``)."""
        self.now = old.now
        if self.decay is not None and old.decay is not None:
            self.decay.take_over(old.decay, old.now)

    def rows(self, tenant: str) -> dict[str, dict[str, Any]]:
        """Per user of ``tenant``: what it holds, and its decayed usage in resource-seconds where one is kept."""
        out: dict[str, dict[str, Any]] = {}
        keys = set(self.used) | set(self.decay.rows() if self.decay is not None else ())
        for key in sorted(keys):
            owner, _, user = key.partition("/")
            if owner != tenant:
                continue
            used = self.used.get(key, [0, 0, 0])
            row: dict[str, Any] = {"used": (used[0], used[1], used[2])}
            if self.decay is not None:
                row["decayed"] = self.decay.value_at(key, self.now)
            out[user] = row
        return out

    # -- continue-as-new ---------------------------------------------------------------------------
    def history(self) -> dict[str, list[float]]:
        """What the snapshot carries: per ``tenant/user`` its decayed usage (``UsageDecay.rows``); {} without."""
        return self.decay.rows() if self.decay is not None else {}

    def restore_history(self, rows: Mapping[str, Any]) -> None:
        """Put back what ``history`` saved, after the running gangs were counted again."""
        if self.decay is not None:
            self.decay.restore_rows(rows)
