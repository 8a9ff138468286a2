"""``gangflow logs RUN [--task T] [--rank N] [-f]``: the captured output of a run's tasks and ranks.

Every task attempt and every rank writes its own log file into the run's log folder in the artifact store
(``<root>/logs/<run>/``: ``<task>.<activity>.attempt<n>.log`` for a plain task, ``<call>.rank<r>.attempt<a>
.log`` for a rank, written as the ranks print when the store is a local folder). Without ``-f`` each
matching file is printed whole, oldest first. With ``-f`` (like ``tail -f`` and ``kubectl logs -f``) the
folder is polled: what exists is printed, then each file's new complete lines as they are written, with a
header whenever a new file appears (a task starting, a rank of a new attempt) or the output switches to
another file. It stops when the run ends (or, with ``--task``, when every call of that task the run has
made has ended) and exits 0 whatever the run's outcome, as ``kubectl logs -f`` does: the run's status is
said on stderr, ``gangflow status`` has the rest. Ctrl-C exits 130 quietly.

Object stores (``s3://``...) get a task's or a node's log files when that attempt ends, so there ``-f``
shows each file once it is uploaded.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from rich.markup import escape
from rich.rule import Rule
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError

from engine.artifacts.store import ArtifactStore
from engine.client import Client, log_rank

from .common import EXIT_BAD_INPUT, EXIT_OK, CliError, client_for
from .render import console, err_console

__all__ = ["LogTail", "add_follow_option", "cmd_logs", "wanted"]

#: the width of a log file's header rule where the output is not a terminal
_RULE_WIDTH = 100
#: how often the log folder is listed and the files' sizes looked at
POLL_S = 0.5
#: how often ``--task`` asks the run's history whether that task's calls have ended (a whole history read)
_TASK_CHECK_S = 2.0
_FINISHED_TASK = ("completed", "failed", "timed out", "cancelled", "cached")


def add_follow_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="keep printing new output as it is written, until the run (or --task's task) ends",
    )


def wanted(name: str, task: str | None, rank: int | None) -> bool:
    """Whether log file ``name`` belongs to ``task`` (a task name, or one call of a distributed task such as
    ``train-2``) and ``rank``; the same choice ``Client.logs`` makes."""
    if not name.endswith(".log"):
        return False
    stem = name.split(".", 1)[0]  # "<task>" for plain tasks, "<task>-<call>" for distributed ones
    return (task is None or task in (stem, stem.rsplit("-", 1)[0])) and (rank is None or log_rank(name) == rank)


@dataclass
class _File:
    path: str
    offset: int = 0  # bytes printed so far: always just after a newline, unless the file was finished


class LogTail:
    """Follows the log files of one run's folder: each :meth:`poll` writes what was appended since the last
    one, whole lines only (a line still being written waits for its newline, or for ``final``)."""

    def __init__(self, store: ArtifactStore, folder: str, task: str | None, rank: int | None) -> None:
        self.store, self.folder, self.task, self.rank = store, folder, task, rank
        self.files: dict[str, _File] = {}
        self.current: str | None = None  # the file the last output came from

    def _listing(self) -> list[tuple[str, str, int]]:
        """(name, path, size) of every matching file, oldest first."""
        if not self.store.fs.exists(self.folder):
            return []
        entries = [e for e in self.store.fs.ls(self.folder, detail=True) if e.get("type") == "file"]
        entries.sort(key=lambda e: (e.get("mtime") or 0, e["name"]))
        found = []
        for entry in entries:
            name = str(entry["name"]).rsplit("/", 1)[-1]
            if wanted(name, self.task, self.rank):
                found.append((name, str(entry["name"]), int(entry.get("size") or 0)))
        return found

    def poll(self, header: Callable[[str], None], write: Callable[[str], None], *, final: bool = False) -> bool:
        """Write new output; True when anything (a header included) was written."""
        wrote = False
        for name, path, size in self._listing():
            known = self.files.get(name)
            if known is None:
                known = self.files[name] = _File(path)
                header(name)  # a new task attempt or rank: said even before it prints
                self.current, wrote = name, True
            if size <= known.offset:
                continue
            with self.store.fs.open(path, "rb") as handle:
                handle.seek(known.offset)
                data = handle.read(size - known.offset)
            end = len(data) if final else data.rfind(b"\n") + 1
            if end <= 0:
                continue
            if self.current != name:
                header(name)
                self.current = name
            write(data[:end].decode("utf-8", errors="replace"))
            known.offset += end
            wrote = True
        return wrote


async def cmd_logs(args: argparse.Namespace) -> int:
    if args.rank is not None and args.rank < 0:
        raise CliError(f"--rank {args.rank}: a rank is a number from 0", EXIT_BAD_INPUT)
    client = await client_for(args)
    if args.follow:
        return await _follow(client, args)
    try:
        files = await client.logs(args.run_id, args.task, args.rank)
    except RPCError as exc:
        raise CliError(f"run {args.run_id!r}: {exc.message}") from None
    if not any(text for _, text in files):
        # Three different answers hide behind "no output": a task the run does not have, one that has not
        # started, and one that ran and printed nothing (its log file is only created on the first write).
        err_console.print(escape(await _why_no_output(client, args, bool(files))))
        return EXIT_OK
    for name, text in files:
        _header(name)
        sys.stdout.write(text)
    sys.stdout.flush()
    return EXIT_OK


def _header(name: str) -> None:
    """A rule naming the log file: as wide as a terminal, ``_RULE_WIDTH`` in a pipe or a file (whose console is
    as wide as the longest line, ``render._console``: a rule there would be 10,000 characters)."""
    sys.stdout.flush()
    console.print(Rule(escape(name)), width=console.width if console.is_terminal else _RULE_WIDTH)


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


async def _follow(client: Client, args: argparse.Namespace) -> int:
    try:
        desc = await client.handle(args.run_id).describe()
    except RPCError as exc:
        raise CliError(f"run {args.run_id!r}: {exc.message}") from None
    root = ((await desc.memo()).get("gangflow") or {}).get("artifacts") or client.artifacts
    store = ArtifactStore(root)
    tail = LogTail(store, store.log_path(args.run_id), args.task, args.rank)
    printed, status, checked = False, desc.status, 0.0
    while True:
        # looked at before reading, so the read after the end sees everything the run wrote
        ended = status != WorkflowExecutionStatus.RUNNING
        if not ended and args.task and time.monotonic() - checked >= _TASK_CHECK_S:
            checked = time.monotonic()
            ended = await _task_ended(client, args.run_id, args.task)
        printed = await asyncio.to_thread(tail.poll, _header, _write, final=ended) or printed
        if ended:
            break
        await asyncio.sleep(POLL_S)
        status = (await client.handle(args.run_id).describe()).status
    if not any(f.offset for f in tail.files.values()):
        err_console.print(escape(await _why_no_output(client, args, printed)))
    name = status.name.lower() if status else "unknown"
    what = f"task {args.task!r} ended" if args.task and status == WorkflowExecutionStatus.RUNNING else f"run {name}"
    err_console.print(f"[dim]{escape(args.run_id)}: {escape(what)}[/]")
    return EXIT_OK


async def _task_ended(client: Client, run_id: str, task: str) -> bool:
    """Every call of ``task`` the run has made so far has ended (a later call is not waited for)."""
    tasks, _ = await client.tasks(run_id)
    calls = [t for t in tasks if t.name == task]
    return bool(calls) and all(t.status in _FINISHED_TASK for t in calls)


async def _why_no_output(client: Client, args: argparse.Namespace, empty_files: bool) -> str:
    """Why ``logs`` found no output (raising CliError when the question named something that is not
    there); ``empty_files``: log files were found but all were empty."""
    tasks, _ = await client.tasks(args.run_id)
    names = list(dict.fromkeys(t.name for t in tasks))
    if args.task and args.task not in names:
        known = ", ".join(names) or "none has started yet"
        raise CliError(f"run {args.run_id!r} has no task {args.task!r}; its tasks: {known}")
    chosen = [t for t in tasks if not args.task or t.name == args.task]
    what = f"task {args.task!r} of run {args.run_id}" if args.task else f"run {args.run_id}"
    if not chosen:
        return f"{what}: no task has started yet, so nothing was printed yet"
    gangs = [t for t in chosen if t.kind == "gang"]
    if args.rank is not None and not gangs:
        raise CliError(f"{what} has no ranks: --rank is for distributed tasks")
    if all(t.status == "scheduled" for t in chosen):
        return f"{what}: not started yet, so nothing was printed yet"
    if not empty_files and len(gangs) == len(chosen):
        # a rank's log file is created when the rank starts, however little it prints
        if args.rank is not None:  # (without --rank, every rank's log was looked for already)
            ranks = {n for name, _ in await client.logs(args.run_id, args.task) if (n := log_rank(name)) is not None}
            if ranks:
                raise CliError(f"{what} has no rank {args.rank}; its ranks: {', '.join(map(str, sorted(ranks)))}")
        return f"{what}: no rank has started yet, so nothing was printed yet"
    who = f"rank {args.rank}" if args.rank is not None else ("it" if args.task else "its tasks")
    return f"{what}: {who} ran and printed nothing (no output on stdout or stderr)"
