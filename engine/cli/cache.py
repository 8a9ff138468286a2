"""The task cache on the command line: ``gangflow cache list|clear [--task T]`` and ``gangflow run``'s
``--no-cache`` / ``--overwrite-cache``.

``list`` and ``clear`` read the artifact store directly (``--artifacts``, default ``$GANGFLOW_ARTIFACTS`` or
``.gangflow/artifacts``), the tenant's entries only (``--tenant``, default ``$GANGFLOW_TENANT`` or ``default``);
no server is needed. ``clear`` removes entries, never the artifacts they refer to (runs may share them).
"""

from __future__ import annotations

import argparse
import re

from rich.markup import escape
from rich.table import Table

from engine.artifacts import cache_index
from engine.artifacts.store import ArtifactStore, default_artifact_root
from engine.client import default_tenant

from .common import EXIT_BAD_INPUT, EXIT_OK, CliError
from .render import console, print_json

__all__ = ["add_cache_parser", "add_cache_run_options", "cache_mode", "cmd_cache"]

_TASK = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")


def add_cache_run_options(parser: argparse.ArgumentParser) -> None:
    """``gangflow run``'s cache options (Flyte's semantics for overwrite)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--no-cache",
        action="store_true",
        help="run every cache=True task: do not read the task cache, and leave it as it is",
    )
    group.add_argument(
        "--overwrite-cache",
        action="store_true",
        help="run every cache=True task and replace its cache entry with the new result (Flyte's overwrite_cache)",
    )


def cache_mode(args: argparse.Namespace) -> str:
    """The run's cache mode (engine.core.cache_key.CACHE_MODES) from ``gangflow run``'s options."""
    if getattr(args, "no_cache", False):
        return "skip"
    return "overwrite" if getattr(args, "overwrite_cache", False) else "use"


def add_cache_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "cache",
        help="list or clear the task cache's entries (@task(cache=True)) in the artifact store",
        usage="gangflow cache list [--task T] [--json] | gangflow cache clear [--task T]",
        allow_abbrev=False,
    )
    p.add_argument("action", choices=("list", "clear"), help="list the cache entries, or clear them")
    p.add_argument("--task", metavar="T", help="only this task's entries")
    p.add_argument("--artifacts", help="artifact store URI (default $GANGFLOW_ARTIFACTS or .gangflow/artifacts)")
    p.add_argument("--tenant", help="the tenant whose entries (default $GANGFLOW_TENANT or default)")
    p.add_argument("--json", action="store_true", help="list: one JSON array of entries")


def _size(amount: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if amount >= scale:
            return f"{amount / scale:.1f} {unit}"
    return f"{amount} B"


async def cmd_cache(args: argparse.Namespace) -> int:
    if args.task is not None and not _TASK.match(args.task):
        raise CliError(f"--task {args.task!r} is not a task name", EXIT_BAD_INPUT)
    tenant = args.tenant or default_tenant()
    store = ArtifactStore(args.artifacts or default_artifact_root())
    try:
        if args.action == "clear":
            removed = cache_index.clear(store, tenant, args.task)
            what = f"task {args.task}" if args.task else f"tenant {tenant}"
            if args.json:
                print_json({"removed": removed})
            else:
                console.print(f"removed {removed} cache entr{'y' if removed == 1 else 'ies'} of {escape(what)}")
            return EXIT_OK
        entries = cache_index.list_entries(store, tenant, args.task)
    except ValueError as exc:  # a tenant name that is no path component
        raise CliError(str(exc), EXIT_BAD_INPUT) from None
    if args.json:
        print_json([e.summary() for e in entries])
        return EXIT_OK
    if not entries:
        console.print("no cache entries")
        return EXIT_OK
    table = Table(show_edge=False, header_style="bold")
    for column in ("task", "version", "key", "from run", "created", "size"):
        table.add_column(column)
    for e in entries:
        table.add_row(escape(e.task), escape(e.version), e.key[:12], escape(e.run_id), e.created, _size(e.size))
    console.print(table)
    return EXIT_OK
