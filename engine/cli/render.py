"""Terminal output of the CLI (rich tables) and its JSON forms."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, TypeVar

from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from engine.client import RunInfo, to_jsonable
from engine.core.waits import duration_text
from engine.rank.view import format_age, format_metrics
from engine.runtime.history import TaskRecord
from engine.runtime.ledger import add_ledgers, goodput_line

from .tracebacks import readable

__all__ = [
    "console",
    "err_console",
    "print_answer",
    "print_json",
    "print_unwrapped",
    "run_json",
    "show_attempts",
    "show_failure",
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
        "user": info.user,
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
        + (f"  started by {escape(info.user)}" if info.user else "")
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
            r.user or "",
            r.start_time.strftime("%Y-%m-%d %H:%M:%S") if r.start_time else "",
            r.close_time.strftime("%H:%M:%S") if r.close_time else "",
        )
        for r in runs
    ]
    table = Table(show_edge=False, header_style="bold")
    table.add_column("run", no_wrap=True)
    for column in ("workflow", "status", "tenant", "user", "started", "closed"):
        table.add_column(column)
    for run_id, workflow, status, tenant, user, started, closed in rows:
        table.add_row(escape(run_id), escape(workflow), _styled(status), escape(tenant), escape(user), started, closed)
    # the narrowest the table can be with no word broken (measured as if the terminal were unbounded)
    needed = Measurement.get(console, console.options.update_width(10_000), table).minimum
    if needed <= console.width:
        console.print(table)
        return
    for run_id, workflow, status, tenant, user, started, closed in rows:
        print_unwrapped(run_id)
        when = started + (f" → {closed}" if closed else "")
        by = f"  user {escape(user)}" if user else ""
        console.print(f"  {escape(workflow)}  {_styled(status)}  tenant {escape(tenant)}{by}  {when}")


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
