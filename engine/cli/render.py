"""Terminal output of the CLI (rich tables) and its JSON forms."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from engine.client import RunInfo, to_jsonable

__all__ = ["console", "err_console", "print_json", "run_json", "show_runs", "show_status"]

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
        f"[bold]{info.run_id}[/]  workflow [bold]{info.workflow}[/]  {_styled(info.status)}  tenant {info.tenant}"
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


def show_runs(runs: list[RunInfo]) -> None:
    table = Table(show_edge=False, header_style="bold")
    for column in ("run", "workflow", "status", "tenant", "started", "closed"):
        table.add_column(column)
    for r in runs:
        table.add_row(
            r.run_id,
            r.workflow,
            _styled(r.status),
            r.tenant or "",
            r.start_time.strftime("%Y-%m-%d %H:%M:%S") if r.start_time else "",
            r.close_time.strftime("%H:%M:%S") if r.close_time else "",
        )
    console.print(table if runs else "no runs")


def show_queue(data: dict[str, Any]) -> None:
    nodes = Table(title="nodes", show_edge=False, header_style="bold")
    for column in ("node", "address", "alive", "GPUs free/total", "free ids", "CPUs free/total", "gangs"):
        nodes.add_column(column)
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
        for column in ("gang", "tenant", "placement"):
            running.add_column(column)
        for g in data["running"]:
            where = "; ".join(f"{a['node_id']} gpus {a['gpu_ids']}" for a in g["nodes"])
            running.add_row(g["gang_id"], g["tenant"], where)
        console.print(running)
    if data.get("pending"):
        pending = Table(title="pending", show_edge=False, header_style="bold")
        for column in ("#", "gang", "tenant", "why"):
            pending.add_column(column)
        for q in data["pending"]:
            pending.add_row(str(q["position"]), q["gang_id"], q.get("tenant", ""), q.get("reason", ""))
        console.print(pending)
