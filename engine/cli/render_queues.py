"""Terminal output of the queue commands: ``gangflow queues show`` (per tenant, flavor and user),
``gangflow cluster`` (nodes, tenants, running and pending gangs) and ``gangflow node drain``.

It prints through ``render.console``, looked up at each write, so what captures or replaces that console
(a test, a redirected stream) captures these tables too.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

from rich.markup import escape
from rich.table import Table

from engine.core.labels import format_labels
from engine.scheduling.lost_work import gpu_minutes

from . import render

__all__ = ["show_drain", "show_queue", "show_queues"]


#: ``gangflow cluster`` before any node agent registered
_NO_NODES = (
    "no nodes registered: distributed tasks wait for one (gangflow dev --nodes N starts N node agents; on a "
    "cluster, gangflow node --node-id ID on each GPU server)"
)
_MEM_UNITS = (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10))


def _mem(amount: float) -> str:
    """Bytes as the quota was likely written: 64Gi, 1.5Gi, 512Mi."""
    for unit, size in _MEM_UNITS:
        if amount >= size:
            return f"{amount / size:.3g}{unit}"
    return f"{amount:g}"


def _amount(resource: str, value: Any) -> str:
    """One resource of a quota or usage: None is unlimited; CPUs as a number of CPUs, memory in bytes."""
    if value is None:
        return "∞"
    if not isinstance(value, int | float):
        return str(value)
    return _mem(value) if resource == "mem" else f"{value:g}"


def _amounts(values: Any) -> str:
    """A quota or a usage, one resource a line (gpu, cpu, mem)."""
    values = values if isinstance(values, Mapping) else {}
    return "\n".join(f"{r} {_amount(r, values.get(r, 0))}" for r in ("gpu", "cpu", "mem"))


def _decayed(values: Any) -> str:
    """A tenant's decayed usage above nominal (``usage_half_life``): resource-seconds shown as hours."""
    values = values if isinstance(values, Mapping) else {}
    lines = []
    for resource, unit in (("gpu", " GPU·h"), ("cpu", " CPU·h"), ("mem", "·h")):
        value = values.get(resource, 0)
        if not isinstance(value, int | float):
            lines.append(f"{resource} {value}")
        elif resource == "mem":
            lines.append(f"mem {_mem(value / 3600)}{unit}")
        else:
            lines.append(f"{resource} {value / 3600:.3g}{unit}")
    return "\n".join(lines)


def _share(value: Any) -> str:
    """The dominant resource share (weight 0: infinite, never favoured)."""
    if isinstance(value, int | float):
        return "∞" if math.isinf(value) else f"{value:.2f}"
    return "—" if value is None else str(value)


def _configured(data: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Tenant name → its entry in the applied configuration (cohort, weight), when the answer has it."""
    config = data.get("config")
    tenants = config.get("tenants") if isinstance(config, Mapping) else None
    return {str(t.get("name")): t for t in tenants or [] if isinstance(t, Mapping)}


def _half_life(data: Mapping[str, Any]) -> str:
    """``" (half-life 7d)"`` from the applied configuration, when the answer has it."""
    config = data.get("config")
    policy = config.get("policy") if isinstance(config, Mapping) else None
    seconds = policy.get("usage_half_life") if isinstance(policy, Mapping) else None
    if not isinstance(seconds, int | float) or isinstance(seconds, bool):
        return ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f" (half-life {seconds / size:g}{unit})"
    return f" (half-life {seconds:g}s)"


def show_queues(data: Mapping[str, Any]) -> None:
    """``gangflow queues show``: per tenant its nominal quota, what it uses, borrows and lends, its
    pending gangs and its fair share."""
    tenants = data.get("tenants")
    if not isinstance(tenants, Mapping) or not tenants:
        render.console.print("no tenants")
        return
    configured = _configured(data)
    if data.get("tenant_view"):
        render.console.print(
            f"{escape(str(data['tenant_view']))}'s queue, through its Nexus endpoint (other tenants' rows are the "
            "platform's)",
            soft_wrap=True,
        )
    table = Table(title="tenants", show_edge=False, header_style="bold")
    table.add_column("tenant", no_wrap=True)
    for column in ("nominal", "used", "borrowed", "lent"):
        table.add_column(column, no_wrap=True)
    # a Scheduler with ``policy.usage_half_life`` says what each tenant used lately above its quota, decayed
    decayed = any(isinstance(e, Mapping) and "decayed_usage" in e for e in tenants.values())
    if decayed:
        table.add_column(f"decayed usage{_half_life(data)}", no_wrap=True)
    table.add_column("pending", justify="right")
    table.add_column("share", justify="right")
    for name, entry in sorted(tenants.items()):
        entry = entry if isinstance(entry, Mapping) else {}
        conf = configured.get(name) or entry  # the Scheduler's entry may say cohort and weight itself
        who = [escape(name)]
        if conf.get("cohort"):
            who.append(f"cohort {escape(str(conf['cohort']))}")
        if isinstance(conf.get("weight"), int | float):
            who.append(f"weight {conf['weight']:g}")
        flavors = entry.get("flavors")
        flavors = flavors if isinstance(flavors, Mapping) else {}
        users = entry.get("users")
        users = users if isinstance(users, Mapping) else {}
        table.add_row(
            "\n".join(who),
            *(_amounts(entry.get(k)) for k in ("nominal", "used", "borrowed", "lent")),
            *([_decayed(entry.get("decayed_usage"))] if decayed else []),
            str(entry.get("pending", 0)),
            _share(entry.get("share")),
            end_section=not flavors and not users,
        )
        # with flavors, one row per flavor under its tenant (its share is the largest of theirs); where its gangs
        # name their runs' users, one row per user (the order inside the tenant: engine.scheduling.users)
        below = [(f"  on {escape(str(f))}", r, False) for f, r in sorted(flavors.items())]
        below += [(f"  user {escape(str(u))}", r, True) for u, r in sorted(users.items())]
        for at, (label, row, user) in enumerate(below):
            row = row if isinstance(row, Mapping) else {}
            # a user has no quota of its own: what it holds, its decayed usage, its gangs waiting, its share
            amounts = [
                _amounts(row.get(k)) if k == "used" or not user else "" for k in ("nominal", "used", "borrowed", "lent")
            ]
            table.add_row(
                label,
                *amounts,
                *([_decayed(row.get("decayed_usage")) if user else ""] if decayed else []),
                str(row.get("pending", 0)) if user else "",
                _share(row.get("share")),
                end_section=at == len(below) - 1,
            )
    render.console.print(table)


def _tenant_summary(tenants: Mapping[str, Any]) -> Table:
    """``gangflow cluster``'s per-tenant lines: GPUs only (``gangflow queues show`` has every resource); with
    flavors, a line per flavor under its tenant, as there (a total over flavors would hide a full one)."""
    table = Table(title="tenants", show_edge=False, header_style="bold")
    table.add_column("tenant", no_wrap=True)
    for column in ("GPUs used/quota", "borrowed", "lent", "pending", "share"):
        table.add_column(column, justify="right")

    def gpus(entry: Mapping[str, Any], key: str) -> str:
        values = entry.get(key)
        return _amount("gpu", values.get("gpu", 0) if isinstance(values, Mapping) else 0)

    for name, entry in sorted(tenants.items()):
        entry = entry if isinstance(entry, Mapping) else {}
        flavors = entry.get("flavors")
        flavors = flavors if isinstance(flavors, Mapping) else {}
        table.add_row(
            escape(name),
            f"{gpus(entry, 'used')}/{gpus(entry, 'nominal')}",
            gpus(entry, "borrowed"),
            gpus(entry, "lent"),
            str(entry.get("pending", 0)),
            _share(entry.get("share")),
        )
        for flavor, row in sorted(flavors.items()):
            row = row if isinstance(row, Mapping) else {}
            table.add_row(
                f"  on {escape(str(flavor))}",
                f"{gpus(row, 'used')}/{gpus(row, 'nominal')}",
                gpus(row, "borrowed"),
                gpus(row, "lent"),
                "",
                _share(row.get("share")),
            )
    return table


def show_drain(answer: Mapping[str, Any]) -> None:
    """What ``gangflow node drain|undrain`` did: the node's new state and what happens to its gangs."""
    node = escape(str(answer.get("node_id")))
    if not answer.get("drained"):
        render.console.print(f"node [bold]{node}[/] undrained: it takes new gangs again", soft_wrap=True)
        return
    reason = f" ({escape(answer['reason'])})" if answer.get("reason") else ""
    render.console.print(f"node [bold]{node}[/] drained{reason}: it takes no new gangs", soft_wrap=True)
    preempted, leaving, remaining = (list(answer.get(k) or []) for k in ("preempted", "leaving", "remaining"))
    if preempted:
        render.console.print(
            f"preempted {len(preempted)} gang(s): each gets its notice, saves a checkpoint and is placed elsewhere: "
            + escape(", ".join(preempted)),
            soft_wrap=True,
        )
    if leaving:
        render.console.print(f"already leaving (preempted earlier): {escape(', '.join(leaving))}", soft_wrap=True)
    if remaining:
        render.console.print(
            f"still running there, not preemptible (they run to their end): {escape(', '.join(remaining))}",
            soft_wrap=True,
        )
    if not (preempted or leaving or remaining):
        render.console.print("no gang was running there")


def _node_state(n: Mapping[str, Any]) -> str:
    state = "[green]up[/]" if n.get("alive", True) else "[red]lost[/]"
    if n.get("drained"):
        reason = f": {escape(n['drain_reason'])}" if n.get("drain_reason") else ""
        state = "[yellow]drained[/]" + reason + ("" if n.get("alive", True) else " [red](lost)[/]")
    return state


def _capacity(n: Mapping[str, Any]) -> tuple[str, str, str]:
    """GPUs free/total, the free ids, CPUs free/total. A drained or lost node offers nothing, so the Scheduler
    counts none of it free: say why rather than "0/2", which reads as a busy node (its idle GPUs are those no
    gang holds)."""
    if n.get("drained") or not n.get("alive", True):
        why = "drained" if n.get("drained") else "lost"
        idle = n["gpus_total"] - len(n.get("used_gpu_ids") or [])
        return f"{why}: {idle}/{n['gpus_total']} idle", "", why
    return (
        f"{n['gpus_free']}/{n['gpus_total']}",
        ",".join(map(str, n["free_gpu_ids"])),
        (f"{n['cpus_free']:g}/{n['cpus_total']:g}"),
    )


def _preempting(g: Mapping[str, Any], now: float) -> str:
    """``preempting: reclaim by <gang> of <tenant>, 12 s of 120 s grace`` (or ``drain of node <id>``)."""
    notice = g.get("preempted")
    if not isinstance(notice, Mapping):
        return "[yellow]preempting[/]"  # an older Scheduler says only that
    cause = str(notice.get("cause") or "preemption")
    if cause == "drain":
        who = f"drain of node {notice.get('by')}"
    else:
        who = f"{cause} by {notice.get('by')}" + (f" of {notice['by_tenant']}" if notice.get("by_tenant") else "")
    text = f"[yellow]preempting[/]: {escape(who)}"
    since, grace = notice.get("since"), notice.get("grace_s")
    if isinstance(since, int | float) and isinstance(grace, int | float):
        text += f", {max(0.0, now - since):.0f} s of {grace:g} s grace"
    cost = notice.get("cost_gpu_s")
    if isinstance(cost, int | float) and not isinstance(cost, bool):  # an older Scheduler does not say
        text += f", costs {gpu_minutes(float(cost))}"
    return text


def show_queue(data: dict[str, Any], now: float | None = None) -> None:
    """``gangflow cluster``: nodes (drained ones with their reason), tenants, running gangs (those being
    preempted with why and how much of their grace is gone; ``now``: epoch seconds), the pending queue. A
    tenant's view (the isolated layout: ``"tenant_view"``) has no nodes and says so."""
    now = time.time() if now is None else now
    if data.get("tenant_view"):
        _tenant_view_header(data)
    else:
        _nodes_table(data)
    # Older Schedulers have no tenants, priorities or preemption: every such key is optional.
    if isinstance(data.get("tenants"), Mapping) and data["tenants"]:
        render.console.print(_tenant_summary(data["tenants"]))
    if data.get("running"):
        running = Table(title="running gangs", show_edge=False, header_style="bold")
        running.add_column("gang", no_wrap=True, overflow="fold")
        for column in ("tenant", "priority", "state", "placement"):
            running.add_column(column, overflow="fold")
        for g in data["running"]:
            where = "; ".join(f"{a['node_id']} gpus {a['gpu_ids']}" for a in g.get("nodes", []))
            state = _preempting(g, now) if g.get("preempting") else "running"
            running.add_row(escape(g["gang_id"]), _who(g), escape(g.get("priority") or ""), state, where)
        render.console.print(running)
    if data.get("pending"):
        pending = Table(title="pending", show_edge=False, header_style="bold")
        pending.add_column("#")
        pending.add_column("gang", no_wrap=True, overflow="fold")
        for column in ("tenant", "priority", "why"):
            pending.add_column(column, overflow="fold")
        for q in data["pending"]:
            pending.add_row(
                str(q.get("position", "")),
                escape(q["gang_id"]),
                _who(q),
                escape(q.get("priority") or ""),
                escape(q.get("reason") or ""),
            )
        render.console.print(pending)


def _who(gang: Mapping[str, Any]) -> str:
    """A gang's tenant, and under it its run's user where it names one (fair share orders a tenant's gangs by it)."""
    user = gang.get("user")
    return escape(gang.get("tenant") or "") + (f"\nuser {escape(str(user))}" if user else "")


def _nodes_table(data: Mapping[str, Any]) -> None:
    nodes = Table(title="nodes", show_edge=False, header_style="bold")
    nodes.add_column("node", no_wrap=True, overflow="fold")  # ids are copied into other commands: never "…"
    for column in ("address", "state", "sandbox", "GPUs free/total", "free ids", "CPUs free/total", "labels", "gangs"):
        nodes.add_column(column, overflow="fold")
    for n in data.get("nodes", []):
        labels = n.get("labels") or {}  # an older Scheduler does not say: its agents carried none
        nodes.add_row(
            n["node_id"],
            n["address"],
            _node_state(n),
            "yes" if n.get("sandboxed") else "no",  # an older Scheduler does not say: its agents did not sandbox
            *_capacity(n),
            escape(format_labels(labels) if isinstance(labels, Mapping) else "")
            + (f" (flavor {escape(str(n['flavor']))})" if n.get("flavor") else ""),
            ", ".join(n["gangs"]),
        )
    # the first thing a new stack shows: say how a node comes (distributed tasks wait for one until then)
    render.console.print(nodes if data.get("nodes") else _NO_NODES)


def _tenant_view_header(data: Mapping[str, Any]) -> None:
    """What a tenant's ``gangflow cluster`` says first: whose view it is and what it leaves out."""
    tenant, totals = data["tenant_view"], data.get("totals") or {}
    render.console.print(
        f"{escape(str(tenant))}'s view, through its Nexus endpoint: its own gangs and quota only (the nodes and "
        "other tenants' gangs are the platform's: ask the platform operator); the cluster has "
        f"{totals.get('alive_nodes', '?')} alive node(s), {totals.get('gpus_total', '?')} GPU(s) in all",
        soft_wrap=True,
    )
    if not data.get("running") and not data.get("pending"):
        render.console.print(f"no gang of {escape(str(tenant))} is running or pending")
