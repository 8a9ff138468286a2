"""Terminal output of the CLI (rich tables) and its JSON forms."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, TypeVar

from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from engine.client import RunInfo, to_jsonable
from engine.core.labels import format_labels
from engine.core.waits import duration_text
from engine.rank.view import format_age, format_metrics
from engine.runtime.history import TaskRecord
from engine.runtime.ledger import add_ledgers, goodput_line
from engine.scheduling.lost_work import gpu_minutes

from .tracebacks import readable

__all__ = [
    "console",
    "err_console",
    "print_answer",
    "print_json",
    "print_unwrapped",
    "run_json",
    "show_attempts",
    "show_drain",
    "show_failure",
    "show_queue",
    "show_queues",
    "show_ranks",
    "show_release",
    "show_runs",
    "show_status",
    "waiting_lines",
]


def _console(stderr: bool) -> Console:
    """A terminal gets tables fitted to its width; a pipe or a file gets lines as long as they are (rich would
    wrap them at 80 columns, and a wrapped line breaks grep, a pasted command and a log reader). $COLUMNS
    still wins. The stream is looked up at each write (rich's default), so a redirected one is honoured."""
    stream = sys.stderr if stderr else sys.stdout
    wide = None if stream.isatty() or os.environ.get("COLUMNS") else 10_000
    return Console(stderr=stderr, highlight=False, width=wide)


console = _console(stderr=False)
err_console = _console(stderr=True)

_STYLE = {
    "COMPLETED": "green",
    "completed": "green",
    "RUNNING": "cyan",
    "running": "cyan",
    "scheduled": "cyan",
    "waiting": "magenta",
    "FAILED": "red",
    "failed": "red",
    "TIMED_OUT": "red",
    "timed out": "red",
    "CANCELED": "yellow",
    "cancelled": "yellow",
    "TERMINATED": "yellow",
    "terminated": "yellow",
    "cached": "blue",
}


def _styled(status: str) -> str:
    return f"[{_STYLE.get(status, 'white')}]{status}[/]"


def print_json(data: Any) -> None:
    print(json.dumps(data, default=str))


T = TypeVar("T")


def print_answer(
    as_json: bool, data: T, show: Callable[[T], object], json_form: Callable[[T], Any] | None = None
) -> None:
    """What a command answers, as ``--json`` asks: ``data`` as one line of JSON (``json_form(data)`` where the
    JSON form is not ``data`` itself), else ``show(data)`` for a person."""
    if as_json:
        print_json(data if json_form is None else json_form(data))
    else:
        show(data)


def print_unwrapped(text: str) -> None:
    """One line, never broken by rich however narrow the terminal (the terminal may still fold it on
    screen, but a copy of it stays one line): commands to paste, ids to copy."""
    console.print(text, soft_wrap=True, markup=False)


def run_json(info: RunInfo) -> dict[str, Any]:
    return {
        "run_id": info.run_id,
        "workflow": info.workflow,
        "status": info.status,
        "tenant": info.tenant,
        "priority": info.priority,
        "schedule": info.schedule,
        "start_time": info.start_time.isoformat() if info.start_time else None,
        "close_time": info.close_time.isoformat() if info.close_time else None,
        "result": to_jsonable(info.result),
        "error": info.error,
        "progress": info.progress,
        "waiting": (info.progress or {}).get("waiting") or [],
        "tasks": [
            {
                "name": t.name,
                "kind": t.kind,
                "status": t.status,
                "attempt": t.attempt,
                "seconds": t.seconds,
                "error": t.error,
                "detail": t.detail,
                "cached_from": t.cached_from,
                **({"call": t.call, "attempts": t.attempts} if t.kind == "gang" else {}),
            }
            for t in info.tasks
        ],
    }


def _task_status(task: TaskRecord) -> str:
    """A task call's status cell: a cache hit names the run whose result it reused."""
    if task.status == "cached" and task.cached_from:
        return f"[blue]cached (from run {escape(task.cached_from)})[/]"
    return _styled(task.status)


def waiting_lines(progress: Mapping[str, Any], run_id: str = "RUN") -> list[str]:
    """What a running run waits for (engine.approve / engine.wait_for_input), one line each."""
    lines = []
    for wait in progress.get("waiting") or []:
        since = str(wait.get("since") or "")[:19].replace("T", " ")
        timeout = wait.get("timeout_s")
        until = f", times out after {duration_text(timedelta(seconds=timeout))}" if timeout else ""
        if wait.get("kind") == "approval":
            line = f"waiting for approval: {wait.get('name')} (since {since} UTC{until}; gangflow approve {run_id})"
        else:
            prompt = f" — {wait['prompt']}" if wait.get("prompt") else ""
            line = (
                f"waiting for input {wait.get('name')!r} ({wait.get('type')}) since {since} UTC{until}{prompt} "
                f"(gangflow input {run_id} {wait.get('name')} VALUE)"
            )
        lines.append(line + (f"; {wait['note']}" if wait.get("note") else ""))
    return lines


def show_status(info: RunInfo, *, result: bool = True, verbose: bool = False) -> None:
    console.print(
        f"[bold]{escape(info.run_id)}[/]  workflow [bold]{info.workflow}[/]  {_styled(info.status)}  "
        f"tenant {info.tenant}"
        + (f"  priority {escape(info.priority)}" if info.priority else "")
        + (f"  scheduled by {escape(info.schedule)}" if info.schedule else ""),
        soft_wrap=True,  # the run id stays whole, to be copied
    )
    if info.progress:
        running = ", ".join(info.progress.get("running") or []) or "—"
        console.print(f"running: {running} · done: {info.progress.get('done', 0)}")
        for line in waiting_lines(info.progress, info.run_id):
            console.print(f"[bold magenta]{escape(line)}[/]", soft_wrap=True)
    if info.tasks:
        table = Table(show_edge=False, header_style="bold")
        for column in ("#", "task", "kind", "status", "attempt", "seconds"):
            table.add_column(column)
        table.add_column("detail")
        for n, t in enumerate(info.tasks, 1):
            seconds = f"{t.seconds:.2f}" if t.seconds is not None else ""
            table.add_row(str(n), t.name, t.kind, _task_status(t), str(t.attempt), seconds, escape(t.detail or ""))
        console.print(table)
    show_attempts(info)
    if result and info.status == "COMPLETED":
        console.print("[bold]result:[/]", to_jsonable(info.result))
    if info.error:
        console.print("[bold red]error:[/]")
        console.print(readable(info.error, verbose=verbose), markup=False)


def _steps(attempt: Mapping[str, Any]) -> str:
    first, last = attempt.get("first_step"), attempt.get("last_step")
    if first is None and last is None:
        return "—"
    return f"{'?' if first is None else first} → {'?' if last is None else last}"


def show_attempts(info: RunInfo) -> None:
    """Per distributed task call, its attempts (0-based, as ``GANGFLOW_ATTEMPT`` and the rank table number
    them): how each ended, how long it ran, its first and last step, where it ran."""
    for task in info.tasks:
        if task.kind != "gang" or not task.attempts:
            continue
        console.print(f"[bold]{escape(task.call or task.name)}[/] attempts")
        table = Table(show_edge=False, header_style="bold")
        # the flavor each attempt was admitted on, where the queue file names flavors (else no column)
        flavors = any(attempt.get("flavor") for attempt in task.attempts)
        for column in ("attempt", "ended", "seconds", "steps", "nodes", *(("flavor",) if flavors else ())):
            table.add_column(column)
        for attempt in task.attempts:
            seconds = attempt.get("duration_s")
            kind = attempt.get("kind")
            ended = attempt.get("ended") or ("running" if kind == "running" else "—")
            table.add_row(
                str(attempt.get("attempt")),
                _styled(ended) if ended in _STYLE else escape(str(ended)),
                f"{seconds:.1f}" if isinstance(seconds, int | float) else "",
                _steps(attempt),
                escape(", ".join(str(n) for n in attempt.get("nodes") or [])),
                *((escape(str(attempt.get("flavor") or "")),) if flavors else ()),
            )
        console.print(table)
        ledger = add_ledgers(a.get("ledger") for a in task.attempts)
        if ledger is not None:  # the finished attempts' GPU-seconds by cause (engine.runtime.ledger)
            console.print(f"  {goodput_line(ledger)}", markup=False)


def show_ranks(info: RunInfo, views: Mapping[int, Mapping[str, Any]]) -> None:
    """Per distributed task call, a table of its ranks: node, rank, pid, last step, metrics, report age."""
    for index, view in sorted(views.items()):
        name = info.tasks[index].name if index < len(info.tasks) else view.get("gang_id", "")
        when = "running" if view.get("live") else "last reports"
        console.print(f"[bold]{escape(str(name))}[/] ranks (attempt {view.get('attempt')}, {when})")
        table = Table(show_edge=False, header_style="bold")
        for column in ("node", "rank", "pid", "step", "metrics", "last report"):
            table.add_column(column)
        for row in view.get("ranks") or []:
            step, pid = row.get("step"), row.get("pid")
            table.add_row(
                escape(str(row.get("node"))),
                str(row.get("rank")),
                "" if pid is None else str(pid),
                "—" if step is None else str(step),
                escape(format_metrics(row.get("metrics") or {})),
                format_age(row.get("age_s")),
            )
        console.print(table)


def show_failure(run_id: str, error: str | None, *, verbose: bool = False) -> None:
    """A failed run, on stderr: its id, then the failing task's error with the author's own frames (every frame
    with ``verbose``)."""
    err_console.print(f"[bold red]{escape(run_id)} failed[/]")
    err_console.print(readable(error or "", verbose=verbose), markup=False)
    if not verbose and error and readable(error) != error:
        err_console.print("(--verbose shows Temporal's and gangflow's frames too)", style="dim")


def show_runs(runs: list[RunInfo]) -> None:
    """A table when it fits the terminal with every run id whole (ids are copied into ``status``, so they
    are never cut short); otherwise one run per two lines, the id alone on the first."""
    if not runs:
        console.print("no runs")
        return
    rows = [
        (
            r.run_id,
            r.workflow,
            r.status,
            r.tenant or "",
            r.start_time.strftime("%Y-%m-%d %H:%M:%S") if r.start_time else "",
            r.close_time.strftime("%H:%M:%S") if r.close_time else "",
        )
        for r in runs
    ]
    table = Table(show_edge=False, header_style="bold")
    table.add_column("run", no_wrap=True)
    for column in ("workflow", "status", "tenant", "started", "closed"):
        table.add_column(column)
    for run_id, workflow, status, tenant, started, closed in rows:
        table.add_row(escape(run_id), escape(workflow), _styled(status), escape(tenant), started, closed)
    # the narrowest the table can be with no word broken (measured as if the terminal were unbounded)
    needed = Measurement.get(console, console.options.update_width(10_000), table).minimum
    if needed <= console.width:
        console.print(table)
        return
    for run_id, workflow, status, tenant, started, closed in rows:
        print_unwrapped(run_id)
        when = started + (f" → {closed}" if closed else "")
        console.print(f"  {escape(workflow)}  {_styled(status)}  tenant {escape(tenant)}  {when}")


def show_release(freed: dict[str, Any]) -> None:
    """What ``Client.release`` freed: a running gang's nodes and GPUs, or a queued request."""
    gang = escape(freed["gang_id"])
    if freed["state"] == "pending":
        console.print(
            f"withdrew the queued request of gang [bold]{gang}[/] (#{freed['position']} in the queue, asking "
            f"for {freed['gpus_per_node']} GPU(s) on each of {freed['nnodes']} node(s)); nothing was allocated",
            soft_wrap=True,
        )
        return
    nodes = freed["nodes"]
    gpus = sum(len(n["gpu_ids"]) for n in nodes)
    where = "; ".join(
        f"{escape(n['node_id'])} " + (f"GPUs {','.join(map(str, n['gpu_ids']))}" if n["gpu_ids"] else "(no GPUs)")
        for n in nodes
    )
    console.print(
        f"released gang [bold]{gang}[/] (tenant {escape(freed['tenant'])}): {gpus} GPU(s) on {len(nodes)} "
        f"node(s) free again: {where}",
        soft_wrap=True,
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
        console.print("no tenants")
        return
    configured = _configured(data)
    if data.get("tenant_view"):
        console.print(
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
    console.print(table)


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
        console.print(f"node [bold]{node}[/] undrained: it takes new gangs again", soft_wrap=True)
        return
    reason = f" ({escape(answer['reason'])})" if answer.get("reason") else ""
    console.print(f"node [bold]{node}[/] drained{reason}: it takes no new gangs", soft_wrap=True)
    preempted, leaving, remaining = (list(answer.get(k) or []) for k in ("preempted", "leaving", "remaining"))
    if preempted:
        console.print(
            f"preempted {len(preempted)} gang(s): each gets its notice, saves a checkpoint and is placed elsewhere: "
            + escape(", ".join(preempted)),
            soft_wrap=True,
        )
    if leaving:
        console.print(f"already leaving (preempted earlier): {escape(', '.join(leaving))}", soft_wrap=True)
    if remaining:
        console.print(
            f"still running there, not preemptible (they run to their end): {escape(', '.join(remaining))}",
            soft_wrap=True,
        )
    if not (preempted or leaving or remaining):
        console.print("no gang was running there")


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
        console.print(_tenant_summary(data["tenants"]))
    if data.get("running"):
        running = Table(title="running gangs", show_edge=False, header_style="bold")
        running.add_column("gang", no_wrap=True, overflow="fold")
        for column in ("tenant", "priority", "state", "placement"):
            running.add_column(column, overflow="fold")
        for g in data["running"]:
            where = "; ".join(f"{a['node_id']} gpus {a['gpu_ids']}" for a in g.get("nodes", []))
            state = _preempting(g, now) if g.get("preempting") else "running"
            running.add_row(escape(g["gang_id"]), _who(g), escape(g.get("priority") or ""), state, where)
        console.print(running)
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
        console.print(pending)


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
    console.print(nodes if data.get("nodes") else "no nodes registered")


def _tenant_view_header(data: Mapping[str, Any]) -> None:
    """What a tenant's ``gangflow cluster`` says first: whose view it is and what it leaves out."""
    tenant, totals = data["tenant_view"], data.get("totals") or {}
    console.print(
        f"{escape(str(tenant))}'s view, through its Nexus endpoint: its own gangs and quota only (the nodes and "
        "other tenants' gangs are the platform's: ask the platform operator); the cluster has "
        f"{totals.get('alive_nodes', '?')} alive node(s), {totals.get('gpus_total', '?')} GPU(s) in all",
        soft_wrap=True,
    )
    if not data.get("running") and not data.get("pending"):
        console.print(f"no gang of {escape(str(tenant))} is running or pending")
