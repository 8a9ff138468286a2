"""``gangflow schedule create|list|pause|resume|delete|trigger|describe``: pipelines on a cron, on Temporal
Schedules (engine/client/_schedules.py).

``create`` takes the workflow's parameters on its command line, as ``gangflow run`` does (``--name value``,
after a ``--`` separator, or ``--input-json``): argparse cannot tell them from its own options, so the
``schedule`` parser hands everything after the action to ``cmd_schedule``, which splits it with
``split_run_argv`` and checks it all (inputs, cron, policy) before anything is created.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from rich.markup import escape
from rich.table import Table

from engine.client import TenancyError, load_workflow_file
from engine.client._schedule_spec import parse_duration
from engine.client._schedules import (
    OVERLAP_POLICIES,
    ScheduleInfo,
    ScheduleNotFoundError,
    ScheduleOptions,
    Schedules,
    prepare_schedule,
)
from engine.core.protocol import TASK_QUEUE
from engine.errors import DefinitionError, GangflowError, TypeMismatchError

from .common import EXIT_BAD_INPUT, EXIT_OK, CliError, client_for
from .params import parse_params, split_run_argv
from .render import console, print_answer, print_json

__all__ = ["ACTIONS", "add_schedule_parser", "cmd_schedule", "split_create_argv"]

ACTIONS = ("create", "list", "pause", "resume", "delete", "trigger", "describe")
_USAGE = (
    "gangflow schedule create NAME FILE.py:WORKFLOW --cron EXPR [options] [--param value ...] | "
    "gangflow schedule list [--json] | gangflow schedule pause NAME [--note TEXT] | "
    "gangflow schedule resume|delete|trigger|describe NAME"
)
_EPILOG = """\
A schedule starts what 'gangflow run' starts, with the inputs given here (checked now) and the code as it
is now: its code bundle is uploaded when the schedule is created, so editing the file later changes
nothing until 'gangflow schedule create --replace'. Cron times are UTC unless --time-zone says otherwise.
Each run's id is NAME-<time it was due>, e.g. nightly-2026-12-01T03:00:00Z.
"""


def _options(p: argparse.ArgumentParser, connection_args: Callable[[argparse.ArgumentParser], None]) -> None:
    p.add_argument(
        "--cron", action="append", metavar="EXPR", help="create: when to run, e.g. '0 3 * * *' (repeat for several)"
    )
    p.add_argument(
        "--overlap",
        choices=tuple(OVERLAP_POLICIES),
        default="skip",
        help="create: what to do when a run is due while the last one still runs (default %(default)s)",
    )
    p.add_argument(
        "--catchup-window",
        metavar="DURATION",
        help="create: how late a run missed while Temporal was down may still start, e.g. 1h (default 1 year)",
    )
    p.add_argument("--time-zone", metavar="NAME", help="create: the cron's time zone, e.g. Europe/Paris (default UTC)")
    p.add_argument("--paused", action="store_true", help="create: create it paused (resume starts it)")
    p.add_argument("--note", help="create / pause / resume: why, shown with the schedule")
    p.add_argument("--replace", action="store_true", help="create: replace a schedule of that name")
    p.add_argument("--input-json", help="create: the workflow's inputs as one JSON object")
    p.add_argument(
        "--artifacts", help="create: artifact store URI (default $GANGFLOW_ARTIFACTS or .gangflow/artifacts)"
    )
    p.add_argument("--priority", metavar="CLASS", help="create: the priority class of the runs' gangs")
    p.add_argument("--task-queue", default=TASK_QUEUE, help="create: the workers' queue (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print JSON")
    connection_args(p)


def add_schedule_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    connection_args: Callable[[argparse.ArgumentParser], None],
) -> None:
    common: dict[str, Any] = {
        "usage": _USAGE,
        "epilog": _EPILOG,
        "formatter_class": argparse.RawDescriptionHelpFormatter,
        "allow_abbrev": False,
    }
    # the parser that reads the tokens after the action (cmd_schedule), options and all
    inner = argparse.ArgumentParser(prog="gangflow schedule", **common)
    inner.add_argument("action", choices=ACTIONS)
    inner.add_argument("name", nargs="?", metavar="NAME")
    _options(inner, connection_args)
    p = sub.add_parser("schedule", help="run a pipeline on a cron (Temporal Schedules)", **common)
    p.add_argument("action", choices=ACTIONS, help="what to do")
    p.add_argument("rest", nargs=argparse.REMAINDER, metavar="NAME ...", help=argparse.SUPPRESS)
    _options(p, connection_args)  # for --help (and what the README may show): `inner` reads them
    p.set_defaults(schedule_parser=inner)


def split_create_argv(
    tokens: Sequence[str], options: dict[str, bool]
) -> tuple[list[str], str | None, list[str], bool, set[str]]:
    """``create``'s tokens → (gangflow's own tokens with NAME, the target, the workflow's parameter tokens,
    whether a ``--`` separated them, gangflow's options given)."""
    argv = split_run_argv(tokens, options)
    params = list(argv.params)
    target = params.pop(0) if params and not params[0].startswith("-") else None
    return list(argv.own), target, params, argv.separated, set(argv.given)


def _parse(args: argparse.Namespace) -> tuple[argparse.Namespace, Any, str | None, list[str]]:
    """(options, the workflow definition for create, its target, its parameter tokens)."""
    inner: argparse.ArgumentParser = args.schedule_parser
    defn: Any = None
    target: str | None = None
    params: list[str] = []
    if args.action == "create":
        options = {o: a.nargs != 0 for a in inner._actions for o in a.option_strings}
        own, target, params, separated, given = split_create_argv(args.rest, options)
        parsed = inner.parse_args([args.action, *own])
        defn = load_target(target, parsed.name)
        _check_clashes(defn, options, given, separated, parsed.input_json)
    else:
        parsed = inner.parse_args([args.action, *args.rest])
    for key, value in vars(args).items():  # options given before the action (gangflow schedule --json list)
        if key not in ("command", "action", "rest", "schedule_parser") and value != inner.get_default(key):
            setattr(parsed, key, value)
    return parsed, defn, target, params


def load_target(target: str | None, name: str | None) -> Any:
    if not name:
        raise CliError("gangflow schedule create needs NAME and FILE.py:WORKFLOW", EXIT_BAD_INPUT)
    if not target:
        raise CliError(f"gangflow schedule create {name} needs FILE.py:WORKFLOW after the name", EXIT_BAD_INPUT)
    try:
        return load_workflow_file(target)
    except (GangflowError, DefinitionError) as exc:
        raise CliError(str(exc), EXIT_BAD_INPUT) from None


def _check_clashes(
    defn: Any, options: dict[str, bool], given: set[str], separated: bool, input_json: str | None
) -> None:
    """A parameter named like one of create's options (``--note``) was taken by gangflow: say how to pass it."""
    if separated:
        return
    for param in defn.interface.params:
        for option in (f"--{param.name}", f"--{param.name.replace('_', '-')}"):
            if option in options and option in given and param.name not in (input_json or ""):
                raise CliError(
                    f"{option} is both gangflow schedule create's own option and a parameter of {defn.name}, and "
                    f"gangflow took it: to pass the parameter, give it after a '--' separator or in --input-json",
                    EXIT_BAD_INPUT,
                )


async def cmd_schedule(args: argparse.Namespace) -> int:
    parsed, defn, target, params = _parse(args)
    if parsed.action == "list":
        if parsed.name:
            raise CliError(f"gangflow schedule list takes no NAME (got {parsed.name!r})", EXIT_BAD_INPUT)
    elif not parsed.name:
        raise CliError(f"gangflow schedule {parsed.action} needs the schedule's NAME", EXIT_BAD_INPUT)
    if parsed.action != "create":
        wrong = [
            o for o, d in (("--cron", "cron"), ("--paused", "paused"), ("--replace", "replace")) if getattr(parsed, d)
        ]
        if wrong or (parsed.note is not None and parsed.action not in ("pause", "resume")):
            raise CliError(f"gangflow schedule {parsed.action} takes no {(wrong or ['--note'])[0]}", EXIT_BAD_INPUT)
    if parsed.action == "create":
        return await _create(parsed, defn, target, params)
    schedules = Schedules(await client_for(parsed))
    try:
        if parsed.action == "list":
            found = await schedules.list()
            print_answer(parsed.json, found, _show_list, lambda found: [s.to_json() for s in found])
        elif parsed.action == "describe":
            info = await schedules.describe(parsed.name)
            print_answer(parsed.json, info, _show_one, lambda info: info.to_json())
        elif parsed.action == "trigger":
            run_id = await schedules.trigger(parsed.name)
            if parsed.json:
                print_json({"name": parsed.name, "run_id": run_id})
            elif run_id:
                console.print(f"triggered {parsed.name}: run {run_id}; follow it with: gangflow status {run_id}")
            else:
                console.print(
                    f"triggered {parsed.name}, but no run started yet: the overlap policy may have skipped it "
                    f"(gangflow schedule describe {parsed.name})"
                )
        else:
            action = getattr(schedules, parsed.action)
            await (action(parsed.name) if parsed.action == "delete" else action(parsed.name, parsed.note))
            done = {"pause": "paused", "resume": "resumed", "delete": "deleted"}[parsed.action]
            if parsed.json:
                print_json({"name": parsed.name, "action": done})
            else:
                tail = " (the runs it started are left as they are)" if parsed.action == "delete" else ""
                console.print(f"{done} schedule {parsed.name}{tail}", markup=False, highlight=False)
    except ScheduleNotFoundError as exc:
        raise CliError(str(exc)) from None
    return EXIT_OK


async def _create(parsed: argparse.Namespace, defn: Any, target: str | None, params: list[str]) -> int:
    try:
        options = ScheduleOptions(
            cron=tuple(parsed.cron or ()),
            overlap=parsed.overlap,
            catchup_window=parse_duration(parsed.catchup_window, "--catchup-window") if parsed.catchup_window else None,
            paused=parsed.paused,
            note=parsed.note,
            time_zone=parsed.time_zone,
        )
        inputs = parse_params(defn.interface, params, parsed.input_json)
        # everything checked (and the code bundle uploaded) before Temporal is contacted
        prepared = prepare_schedule(
            parsed.name,
            defn,
            inputs,
            options,
            artifacts=parsed.artifacts,
            tenant=parsed.tenant,
            priority=parsed.priority,
            target=target,
        )
        client = await client_for(parsed, prepared.envelope.run.artifacts)
        client.task_queue = parsed.task_queue
        info = await Schedules(client).create_prepared(prepared, replace_existing=parsed.replace)
    except CliError:  # client_for's (bad credentials options: exit 2) is a GangflowError too: kept as it is
        raise
    except (TypeMismatchError, TenancyError, DefinitionError) as exc:  # InputError is one
        raise CliError(str(exc), EXIT_BAD_INPUT) from None
    except GangflowError as exc:
        raise CliError(str(exc)) from None
    if parsed.json:
        print_json(info.to_json())
        return EXIT_OK
    state = "paused" if info.paused else f"next run {_when(info.next_runs[0]) if info.next_runs else '-'}"
    console.print(
        f"created schedule [bold]{escape(info.name)}[/]: {escape(defn.name)} on {escape(', '.join(info.cron))} "
        f"({escape(info.time_zone or 'UTC')}), {state}. Its runs use the code as it is now ({escape(info.code or '')})."
    )
    return EXIT_OK


def _when(t: datetime) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S %Z")


def _show_list(found: list[ScheduleInfo]) -> None:
    if not found:
        console.print("no schedules (gangflow schedule create NAME FILE.py:WORKFLOW --cron EXPR)")
        return
    table = Table(show_edge=False, header_style="bold")
    table.add_column("schedule", no_wrap=True)  # the name the other commands take: never cut short
    for column in ("pipeline", "cron", "state", "next run (UTC)", "last run (UTC)", "tenant"):
        table.add_column(column, no_wrap="run" in column)
    for s in found:
        state = "paused" + (f" ({s.note})" if s.note else "") if s.paused else "active"
        # a run's id is "<schedule>-<time it was due>": the time names it (describe shows the ids)
        last = s.recent_runs[-1][1].strftime("%Y-%m-%d %H:%M:%S") if s.recent_runs else "-"
        nxt = "-" if s.paused or not s.next_runs else s.next_runs[0].strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(*map(escape, (s.name, s.workflow, ", ".join(s.cron), state, nxt, last, s.tenant or "-")))
    console.print(table)


def _show_one(s: ScheduleInfo) -> None:
    rows = [
        ("schedule", s.name),
        ("pipeline", s.workflow + (f" ({s.target})" if s.target else "")),
        ("code", s.code or "-"),
        ("inputs", str(s.inputs) if s.inputs is not None else "-"),
        ("cron", ", ".join(s.cron) + f" ({s.time_zone or 'UTC'})"),
        ("state", ("paused" if s.paused else "active") + (f": {s.note}" if s.note else "")),
        ("overlap", s.overlap or "-"),
        ("catch-up window", str(s.catchup_window) if s.catchup_window else "-"),
        ("tenant", s.tenant or "-"),
        ("next runs" + (" (once resumed)" if s.paused else ""), ", ".join(_when(t) for t in s.next_runs[:3]) or "-"),
        ("runs started", str(s.runs_started)),
        ("running", ", ".join(s.running) or "-"),
        ("recent runs", ", ".join(r for r, _ in s.recent_runs[-5:]) or "-"),
    ]
    for key, value in rows:
        console.print(f"[bold]{key:>16}[/]  {escape(value)}", soft_wrap=True)
