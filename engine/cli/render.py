"""Terminal output of the CLI (rich tables) and its JSON forms."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from engine.client import RunInfo, to_jsonable

__all__ = [
    "console",
    "err_console",
    "print_json",
    "print_unwrapped",
    "run_json",
    "show_failure",
    "show_queue",
    "show_release",
    "show_runs",
    "show_status",
]

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

_STYLE = {
    "COMPLETED": "green",
    "completed": "green",
    "RUNNING": "cyan",
    "running": "cyan",
    "scheduled": "cyan",
    "FAILED": "red",
    "failed": "red",
    "TIMED_OUT": "red",
    "timed out": "red",
    "CANCELED": "yellow",
    "cancelled": "yellow",
    "TERMINATED": "yellow",
    "terminated": "yellow",
}


def _styled(status: str) -> str:
    return f"[{_STYLE.get(status, 'white')}]{status}[/]"


def print_json(data: Any) -> None:
    print(json.dumps(data, default=str))


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
        "start_time": info.start_time.isoformat() if info.start_time else None,
        "close_time": info.close_time.isoformat() if info.close_time else None,
        "result": to_jsonable(info.result),
        "error": info.error,
        "progress": info.progress,
        "tasks": [
            {
                "name": t.name,
                "kind": t.kind,
                "status": t.status,
                "attempt": t.attempt,
                "seconds": t.seconds,
                "error": t.error,
                "detail": t.detail,
            }
            for t in info.tasks
        ],
    }


def show_status(info: RunInfo, *, result: bool = True) -> None:
    console.print(
        f"[bold]{escape(info.run_id)}[/]  workflow [bold]{info.workflow}[/]  {_styled(info.status)}  "
        f"tenant {info.tenant}",
        soft_wrap=True,  # the run id stays whole, to be copied
    )
    if info.progress:
        running = ", ".join(info.progress.get("running") or []) or "—"
        console.print(f"running: {running} · done: {info.progress.get('done', 0)}")
    if info.tasks:
        table = Table(show_edge=False, header_style="bold")
        for column in ("#", "task", "kind", "status", "attempt", "seconds"):
            table.add_column(column)
        table.add_column("detail")
        for n, t in enumerate(info.tasks, 1):
            seconds = f"{t.seconds:.2f}" if t.seconds is not None else ""
            table.add_row(str(n), t.name, t.kind, _styled(t.status), str(t.attempt), seconds, escape(t.detail or ""))
        console.print(table)
    if result and info.status == "COMPLETED":
        console.print("[bold]result:[/]", to_jsonable(info.result))
    if info.error:
        console.print("[bold red]error:[/]")
        console.print(info.error, markup=False)


def show_failure(run_id: str, error: str | None) -> None:
    """A failed run, on stderr: its id, then the failing task's error as it was raised."""
    err_console.print(f"[bold red]{escape(run_id)} failed[/]")
    err_console.print(error or "", markup=False)


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


def show_queue(data: dict[str, Any]) -> None:
    nodes = Table(title="nodes", show_edge=False, header_style="bold")
    nodes.add_column("node", no_wrap=True, overflow="fold")  # ids are copied into other commands: never "…"
    for column in ("address", "alive", "GPUs free/total", "free ids", "CPUs free/total", "gangs"):
        nodes.add_column(column, overflow="fold")
    for n in data.get("nodes", []):
        nodes.add_row(
            n["node_id"],
            n["address"],
            "[green]yes[/]" if n["alive"] else "[red]lost[/]",
            f"{n['gpus_free']}/{n['gpus_total']}",
            ",".join(map(str, n["free_gpu_ids"])),
            f"{n['cpus_free']:g}/{n['cpus_total']:g}",
            ", ".join(n["gangs"]),
        )
    console.print(nodes if data.get("nodes") else "no nodes registered")
    if data.get("running"):
        running = Table(title="running gangs", show_edge=False, header_style="bold")
        running.add_column("gang", no_wrap=True, overflow="fold")
        for column in ("tenant", "placement"):
            running.add_column(column, overflow="fold")
        for g in data["running"]:
            where = "; ".join(f"{a['node_id']} gpus {a['gpu_ids']}" for a in g["nodes"])
            running.add_row(g["gang_id"], g["tenant"], where)
        console.print(running)
    if data.get("pending"):
        pending = Table(title="pending", show_edge=False, header_style="bold")
        pending.add_column("#")
        pending.add_column("gang", no_wrap=True, overflow="fold")
        for column in ("tenant", "why"):
            pending.add_column(column, overflow="fold")
        for q in data["pending"]:
            pending.add_row(str(q["position"]), q["gang_id"], q.get("tenant", ""), q.get("reason", ""))
        console.print(pending)
