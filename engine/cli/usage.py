"""``gangflow usage``: where the GPU-hours went, from the goodput ledger of every gang attempt.

    gangflow usage [--tenant T] [--since 7d] [--by tenant|run|priority|node|flavor|cause] [--json | --csv] [--limit N]
                   [--plot F.png]

Each run's distributed task calls, and those of the child workflows it calls (``Client.runs`` lists runs only),
are read as ``gangflow status`` reads them (``Client.status``: the attempts, their ledgers,
engine.runtime.ledger), and summed per tenant, per run, per priority class (the class each call's gang asked
for, read from its run's history; a call that named none counts under the cluster's default class), per node
(each attempt's ledger split over its nodes by their GPUs: ``engine.runtime.ledger.node_shares``), per
flavor (each attempt under the flavor it was admitted on) or per cause. ``wait_s`` is how long the task
calls waited for their first placement (queueing is time, not GPU-seconds). The CSV has one column per cause,
for chargeback. Only runs that started within ``--since`` count, newest first, at most ``--limit`` of them.
``--plot`` also draws GPU use by tenant over time and badput by cause (engine.cli.usage_plot, the ``plots``
extra), beside the rows printed as usual.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from temporalio.service import RPCError

from engine.core.protocol import BADPUT
from engine.errors import GangflowError
from engine.runtime.history import TaskRecord
from engine.runtime.ledger import add_ledgers, node_shares
from engine.scheduling.config import DEFAULT_PRIORITY

from .common import EXIT_BAD_INPUT, EXIT_OK, CliError, client_for
from .render import console, print_json
from .usage_plot import PLOTS_MISSING, matplotlib_missing, plot_usage

__all__ = ["add_usage_parser", "cmd_usage", "parse_since", "usage_rows"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
GROUPS = ("tenant", "run", "priority", "node", "flavor", "cause")
#: the groups a task call belongs to as a whole (its attempts all count there); ``node`` splits each attempt
#: over its nodes, ``flavor`` counts each attempt under the flavor it was admitted on, ``cause`` sums everything
CALL_GROUPS = ("tenant", "run", "priority")
#: runs whose status is read at once (each a few round trips to Temporal and the artifact store)
READ_AT_ONCE = 8
#: how deep usage follows child workflows calling child workflows for their gang calls
CHILD_DEPTH = 8


def parse_since(text: str) -> float:
    """``7d``, ``12h``, ``30m``, ``90s``, ``2w`` as seconds; ValueError naming the problem otherwise."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text or "")
    if not found or float(found.group(1)) <= 0:
        raise ValueError(f"--since must be a positive duration such as 7d, 12h or 30m, got {text!r}")
    return float(found.group(1)) * _UNITS[found.group(2)]


def add_usage_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], connection: Callable[..., Any]) -> None:
    p = sub.add_parser(
        "usage",
        help="GPU-seconds by tenant, run or cause: productive and badput (the goodput ledger), and queue wait",
        allow_abbrev=False,
    )
    connection(p)  # its --tenant also narrows the rows to that tenant's runs
    p.add_argument("--since", default="7d", help="only runs started within this long, e.g. 24h (default 7d)")
    p.add_argument(
        "--by",
        choices=GROUPS,
        default="tenant",
        help="one row per tenant, run, priority class, node, flavor or cause (default tenant)",
    )
    p.add_argument("--limit", type=int, default=1000, help="at most this many runs, newest first (default 1000)")
    p.add_argument(
        "--plot",
        metavar="FILE",
        help="also draw GPU use by tenant over time and badput by cause into FILE (e.g. usage.png; needs "
        "gangflow[plots])",
    )
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--json", action="store_true", help='print {"rows": [...]}')
    shape.add_argument("--csv", action="store_true", help="print CSV: one column per cause (chargeback)")


def _wait_s(task: TaskRecord) -> float:
    """How long the call waited for its first placement: scheduled → its first attempt's start."""
    first = task.attempts[0].get("started_at") if task.attempts else None
    if task.scheduled is None or not isinstance(first, int | float):
        return 0.0
    return max(0.0, float(first) - task.scheduled.timestamp())


def _spans(task: TaskRecord) -> list[tuple[float, float, int]]:
    """Each finished attempt's (placement, release, GPUs): what ``--plot`` draws over time."""
    spans: list[tuple[float, float, int]] = []
    for attempt in task.attempts:
        start, end, ledger = attempt.get("started_at"), attempt.get("ended_at"), attempt.get("ledger")
        if isinstance(start, int | float) and isinstance(end, int | float) and isinstance(ledger, Mapping):
            spans.append((float(start), float(end), int(ledger.get("gpus") or 0)))
    return spans


def usage_rows(entries: Sequence[Mapping[str, Any]], by: str) -> list[dict[str, Any]]:
    """Rows of ``gangflow usage`` from its entries (one per distributed task call: ``tenant``, ``run``,
    ``priority``, ``ledger``, ``attempts`` (their ledgers), ``wait_s``), biggest first. Pure: the unit tests call
    it."""
    if by == "cause":
        total = add_ledgers(e.get("ledger") for e in entries)
        if total is None:
            return []
        whole = total["allocated_gpu_s"]
        parts = [("productive", total["productive_gpu_s"]), *total["badput"].items()]
        return [{"cause": c, "gpu_s": v, "share": round(v / whole, 4) if whole else None} for c, v in parts]
    if by in ("node", "flavor"):
        return _attempt_rows(entries, by)
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for entry in entries:
        groups.setdefault(str(entry[by]), []).append(entry)
    rows: list[dict[str, Any]] = []
    for key, members in groups.items():
        total = add_ledgers(m.get("ledger") for m in members)
        row: dict[str, Any] = {"tenant": str(members[0]["tenant"])}
        if by == "run":
            row["run"] = key
        elif by == "priority":  # a class serves many tenants: the row names them
            row = {"priority": key, "tenants": sorted({str(m["tenant"]) for m in members})}
        row.update(_figures(total), wait_s=round(sum(float(m.get("wait_s") or 0.0) for m in members), 3))
        rows.append(row)
    return sorted(rows, key=lambda r: (-r["allocated_gpu_s"], str(r.get(by, ""))))


def _attempt_rows(entries: Sequence[Mapping[str, Any]], by: str) -> list[dict[str, Any]]:
    """Per node (the share of each attempt it held) or per flavor (each attempt wholly under the flavor it was
    admitted on, its ledger's ``flavor``; ``None`` where the queue file names no flavors: a requeued call may
    run its attempts on different flavors). Queue wait is a task call's, not an attempt's: none here."""
    shares: dict[str | None, list[Mapping[str, Any]]] = {}
    tenants: dict[str | None, set[str]] = {}
    for entry in entries:
        for attempt in entry.get("attempts") or ():
            split: dict[str | None, Mapping[str, Any]] = {attempt.get("flavor"): attempt}
            if by == "node":
                split = {name: share for name, share in node_shares(attempt).items()}
            for name, share in split.items():
                shares.setdefault(name, []).append(share)
                tenants.setdefault(name, set()).add(str(entry["tenant"]))
    rows: list[dict[str, Any]] = []
    for name, held in shares.items():
        rows.append({by: name, "tenants": sorted(tenants[name]), **_figures(add_ledgers(held))})
    return sorted(rows, key=lambda r: (-r["allocated_gpu_s"], str(r[by])))


async def _default_class(client: Any) -> str:
    """The class a gang that names none gets: the queue configuration's ``policy.default_priority``, else
    ``default`` (also where the Scheduler cannot be asked: a tenant's look in the isolated layout)."""
    with contextlib.suppress(GangflowError, RPCError):
        config = (await client.queues()).get("config")
        named = ((config or {}).get("policy") or {}).get("default_priority") if isinstance(config, dict) else None
        if isinstance(named, str):
            return named
    return DEFAULT_PRIORITY.name


def _figures(total: Mapping[str, Any] | None) -> dict[str, Any]:
    """A row's GPU-seconds, badput and goodput from its summed ledger (none: a gang never placed)."""
    return {
        "allocated_gpu_s": total["allocated_gpu_s"] if total else 0.0,
        "productive_gpu_s": total["productive_gpu_s"] if total else 0.0,
        "badput": total["badput"] if total else dict.fromkeys(BADPUT, 0.0),
        "goodput": total["goodput"] if total else None,
    }


async def cmd_usage(args: argparse.Namespace) -> int:
    try:
        since = parse_since(args.since)
    except ValueError as exc:
        raise CliError(str(exc), EXIT_BAD_INPUT) from None
    if args.limit < 1:
        raise CliError(f"--limit must be at least 1, got {args.limit}", EXIT_BAD_INPUT)
    if args.plot and matplotlib_missing():
        raise CliError(PLOTS_MISSING, EXIT_BAD_INPUT)
    client = await client_for(args)
    cutoff = time.time() - since
    try:
        runs = [
            run
            for run in await client.runs(limit=args.limit)
            if run.start_time is not None
            and run.start_time.timestamp() >= cutoff
            and (not args.tenant or run.tenant == args.tenant)
        ]
        # each run's status is a describe, a history fetch and store reads: READ_AT_ONCE of them in flight,
        # in the runs' order (a thousand runs one after another took minutes)
        gate = asyncio.Semaphore(READ_AT_ONCE)

        async def read(workflow_id: str, parent: Any = None, depth: int = 0) -> list[TaskRecord]:
            """The task calls of a run and of the child workflows it called (``gangflow list`` lists runs
            only: a gang called inside a child workflow is its run's), the gate released before going down."""
            async with gate:
                if parent is None:
                    info = await client.status(workflow_id)
                else:  # a child that cannot be read (never started, or gone) adds nothing
                    try:
                        info = await client.status(workflow_id, parent=parent)
                    except (GangflowError, RPCError):
                        return []
            found = list(info.tasks)
            children = [t.child_id for t in found if t.kind == "workflow" and t.child_id]
            if children and depth < CHILD_DEPTH:
                for more in await asyncio.gather(*(read(c, parent or info, depth + 1) for c in children)):
                    found += more
            return found

        calls = await asyncio.gather(*(read(run.run_id) for run in runs))
    except GangflowError as exc:
        raise CliError(str(exc)) from None
    default_class = await _default_class(client) if args.by == "priority" else DEFAULT_PRIORITY.name
    entries: list[dict[str, Any]] = []
    for run, tasks in zip(runs, calls, strict=True):
        for task in tasks:
            if task.kind == "gang" and task.attempts:
                entries.append(
                    {
                        "tenant": run.tenant,
                        "run": run.run_id,
                        "priority": task.priority or default_class,
                        "ledger": add_ledgers(a.get("ledger") for a in task.attempts),
                        # each attempt's ledger, with the flavor it was admitted on where it has one
                        "attempts": [
                            a["ledger"] | ({"flavor": a["flavor"]} if a.get("flavor") else {})
                            for a in task.attempts
                            if a.get("ledger")
                        ],
                        "wait_s": _wait_s(task),
                        "spans": _spans(task),
                    }
                )
    rows = usage_rows(entries, args.by)
    if args.plot:
        try:
            written = plot_usage(entries, args.plot)
        except (OSError, ValueError) as exc:  # an unwritable path, a suffix matplotlib has no format for
            raise CliError(f"--plot {args.plot}: {exc}", EXIT_BAD_INPUT) from None
        print(f"plot: {written} ({len(entries)} gang task call(s))", file=sys.stderr)
    if args.json:
        print_json({"rows": rows})
    elif args.csv:
        _csv(rows, args.by)
    else:
        _table(rows, args.by)
    return EXIT_OK


def _csv(rows: list[dict[str, Any]], by: str) -> None:
    out = csv.writer(sys.stdout)
    if by == "cause":
        out.writerow(["cause", "gpu_s", "share"])
        out.writerows([r["cause"], r["gpu_s"], r["share"]] for r in rows)
        return
    keys, tail = _columns(by)
    out.writerow([*keys, "allocated_gpu_s", "productive_gpu_s", *BADPUT, tail])
    for r in rows:
        last = ";".join(r["tenants"]) if tail == "tenants" else r["wait_s"]
        out.writerow(
            [*(r[k] or "" for k in keys), r["allocated_gpu_s"], r["productive_gpu_s"], *r["badput"].values(), last]
        )


def _columns(by: str) -> tuple[list[str], str]:
    """A row's key columns and its last one: what a task call waited, or (per node) whose gangs it held."""
    if by in ("node", "flavor"):
        return [by], "tenants"
    if by == "priority":
        return ["priority"], "wait_s"
    return (["tenant", "run"] if by == "run" else ["tenant"]), "wait_s"


def _table(rows: list[dict[str, Any]], by: str) -> None:
    from rich.table import Table

    if not rows:
        console.print("no gang attempts in that window")
        return
    table = Table(show_edge=False, header_style="bold")
    if by == "cause":
        for column in ("cause", "GPU-hours", "share"):
            table.add_column(column)
        for r in rows:
            share = "" if r["share"] is None else f"{r['share'] * 100:.1f} %"
            table.add_row(r["cause"], f"{r['gpu_s'] / 3600:.3f}", share)
    else:
        keys, tail = _columns(by)
        for column in (*keys, "GPU-hours", "goodput", "biggest badput", "wait" if tail == "wait_s" else tail):
            table.add_column(column)
        for r in rows:
            worst = max(r["badput"].items(), key=lambda kv: kv[1])
            goodput = "" if r["goodput"] is None else f"{r['goodput'] * 100:.0f} %"
            table.add_row(
                *(str(r[k] or "-") for k in keys),
                f"{r['allocated_gpu_s'] / 3600:.3f}",
                goodput,
                f"{worst[0]} {worst[1] / 3600:.3f} h" if worst[1] else "",
                ", ".join(r["tenants"]) if tail == "tenants" else f"{r['wait_s']:.0f} s",
            )
    console.print(table)
