"""What one tenant may see of the Scheduler's state: its own rows, and no other tenant's gang ids.

In the isolated layout the Scheduler and the gangs live in the platform namespace, which a tenant's
credentials cannot read; the platform's Nexus handler answers the tenant's look instead
(``engine.runtime.platform``), with what these functions keep of the Scheduler's ``describe`` and ``queues``
answers and of the tenant's own gangs' status. The tenant comes from the endpoint, never from the caller.

Kept: the tenant's running and pending gangs (with their queue position, which says how many gangs go
first, not whose), its own quota row, and cluster-wide totals of capacity (how many nodes and GPUs there
are, as Kueue shows a ClusterQueue's); what a task may ask for: the flavors and topology levels the queue
configuration declares (names only) and the distinct label sets the nodes carry (without the nodes), so a run
asking for one the cluster lacks is refused before it starts (engine.client._fleet). Dropped: the nodes (the
platform's: ids, addresses, who runs where), other tenants' rows. Every text
the tenant is shown (pending reasons, phases, attempt reasons) has other tenants' gang ids replaced with
"a gang of <tenant>": a gang id carries its run's id, which is that tenant's own business.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["own_cluster", "own_gang", "own_queues", "redact"]

#: a gang id as the platform names it: ``<tenant>:<run>.<call>`` (engine.runtime.platform)
_GANG_ID = re.compile(r"'?\b([a-z0-9](?:[-a-z0-9]*[a-z0-9])?):([A-Za-z0-9_.\-]*[A-Za-z0-9_])'?")
#: the totals a tenant may read (capacity, not who holds it)
_TOTALS = ("nodes", "alive_nodes", "gpus_total")


def redact(text: str, tenant: str, tenants: Iterable[str]) -> str:
    """``text`` with every gang id of another of ``tenants`` replaced by "a gang of <that tenant>"
    (``behind gang 'team-b:r.train-1' of team-b`` reads ``behind a gang of team-b``)."""
    others = set(tenants) - {tenant}
    if not others or ":" not in text:
        return text

    def one(match: re.Match[str]) -> str:
        return f"a gang of {match[1]}" if match[1] in others else match[0]

    out = _GANG_ID.sub(one, text)
    for other in others:  # "gang a gang of team-b of team-b" said twice
        out = out.replace(f"gang a gang of {other} of {other}", f"a gang of {other}")
    return out


def _redacted(value: Any, tenant: str, tenants: Iterable[str]) -> Any:
    if isinstance(value, str):
        return redact(value, tenant, tenants)
    if isinstance(value, list):
        return [_redacted(v, tenant, tenants) for v in value]
    if isinstance(value, Mapping):
        return {k: _redacted(v, tenant, tenants) for k, v in value.items()}
    return value


def _tenants(described: Mapping[str, Any]) -> set[str]:
    known = set(described.get("tenants") or {})
    for where in ("running", "pending"):
        known.update(str(g.get("tenant")) for g in described.get(where) or [] if g.get("tenant"))
    return known


def _own(entry: Mapping[str, Any], tenant: str) -> bool:
    return entry.get("tenant") == tenant or str(entry.get("gang_id", "")).startswith(f"{tenant}:")


def own_cluster(described: Mapping[str, Any], tenant: str) -> dict[str, Any]:
    """The tenant's part of the Scheduler's ``describe``: its running and pending gangs, its tenant row,
    capacity totals, and ``tenant_view`` naming whose view it is (``gangflow cluster`` says so)."""
    known = _tenants(described)
    running = [_redacted(g, tenant, known) for g in described.get("running") or [] if _own(g, tenant)]
    pending = [_redacted(g, tenant, known) for g in described.get("pending") or [] if _own(g, tenant)]
    totals = {k: v for k, v in (described.get("totals") or {}).items() if k in _TOTALS}
    totals.update(running=len(running), pending=len(pending))
    rows = described.get("tenants") or {}
    sets: list[dict[str, Any]] = []
    for node in described.get("nodes") or []:
        labels = node.get("labels") if isinstance(node, Mapping) else None
        own = dict(labels) if isinstance(labels, Mapping) else {}
        if own not in sets:
            sets.append(own)
    return {
        "tenant_view": tenant,
        "label_sets": sets,
        "nodes": [],
        "drained": [],
        "tenants": {tenant: rows[tenant]} if tenant in rows else {},
        "running": running,
        "pending": pending,
        "totals": totals,
    }


def own_queues(queues: Mapping[str, Any], tenant: str) -> dict[str, Any]:
    """The tenant's row of the Scheduler's ``queues`` answer (its quota, use, borrowing, share), alone, and the
    names of the flavors and topology levels the configuration declares."""
    rows = queues.get("tenants") or {}
    config = queues.get("config")
    config = config if isinstance(config, Mapping) else {}
    flavors = [str(f.get("name")) for f in config.get("flavors") or [] if isinstance(f, Mapping)]
    levels = config.get("topology")
    own = next((t for t in config.get("tenants") or [] if isinstance(t, Mapping) and t.get("name") == tenant), {})
    quota = own.get("quota")
    per_flavor = isinstance(quota, Mapping) and quota and all(isinstance(v, Mapping) for v in quota.values())
    return {
        "tenant_view": tenant,
        "tenants": {tenant: rows[tenant]} if tenant in rows else {},
        "flavors": flavors,
        "topology": [str(level) for level in levels] if isinstance(levels, list) else [],
        # the flavors its quota names, where it is per flavor (it may use only those); None: every flavor
        "own_flavors": [str(name) for name in quota] if per_flavor and isinstance(quota, Mapping) else None,
    }


def own_gang(status: Mapping[str, Any], tenant: str, tenants: Iterable[str]) -> dict[str, Any]:
    """A gang of the tenant's, as its GangTask's status query answers, with ``state``: "waiting" while it
    holds no placement, else "running"; other tenants' gang ids (a preemptor's) redacted."""
    known = set(tenants)
    answer: dict[str, Any] = _redacted(dict(status), tenant, known)
    answer["state"] = "running" if status.get("placement") else "waiting"
    return answer
