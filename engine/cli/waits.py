"""``gangflow approve RUN [--reject] [--comment TEXT]`` and ``gangflow input RUN NAME VALUE``: answer a run
that waits in ``engine.approve(...)`` / ``engine.wait_for_input(...)``.

VALUE is read against the type the run waits for, the way ``gangflow run`` reads a parameter (a ``str`` as
given, otherwise JSON when it parses: ``0.93``, ``[1, 2]``, ``'{"lr": 0.1}'``); the run itself judges it, so
a wrong type or a name the run does not wait for exits 2 with the run's reason and the run keeps waiting.
A run that is not running (or does not exist) exits 1.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from rich.markup import escape

from engine.client import InputRefused, RunNotWaiting, approve, send_input

from .common import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, CliError, client_for
from .render import console, print_json

__all__ = ["add_waits_parser", "cmd_approve", "cmd_input"]


def add_waits_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    connection_args: Callable[[argparse.ArgumentParser], None],
) -> None:
    p = sub.add_parser(
        "approve",
        help="approve (or --reject) what a waiting run asks in engine.approve(...)",
        usage="gangflow approve RUN [--reject] [--comment TEXT] [--question TEXT] [--by NAME] [--json]",
        allow_abbrev=False,
    )
    p.add_argument("run_id", metavar="RUN", help="the waiting run")
    p.add_argument("--reject", action="store_true", help="reject: the run fails (engine.Rejected) with the comment")
    p.add_argument("--comment", help="why; kept with the answer (Approval.comment)")
    p.add_argument("--question", help="which question, when the run waits for several (default: the oldest)")
    p.add_argument("--by", help="who answers (default: this user's name)")
    p.add_argument("--json", action="store_true", help="print the answer as JSON")
    connection_args(p)

    p = sub.add_parser(
        "input",
        help="send the typed value a waiting run asks for in engine.wait_for_input(NAME, type)",
        usage="gangflow input RUN NAME VALUE [--early] [--by NAME] [--json]",
        allow_abbrev=False,
    )
    p.add_argument("run_id", metavar="RUN", help="the waiting run")
    p.add_argument("name", metavar="NAME", help="the input the run waits for (wait_for_input's name)")
    p.add_argument("value", metavar="VALUE", help="read against the input's type; JSON for structured values")
    p.add_argument("--early", action="store_true", help="the run does not wait for NAME yet: keep VALUE until it does")
    p.add_argument("--by", help="who sends it (default: this user's name)")
    p.add_argument("--json", action="store_true", help="print the answer as JSON")
    connection_args(p)


async def _answer(args: argparse.Namespace, send: Callable[[Any], Any]) -> dict[str, Any]:
    client = await client_for(args)
    try:
        answer: dict[str, Any] = await send(client)
    except InputRefused as exc:
        raise CliError(f"run {args.run_id}: {exc} (the run keeps waiting)", EXIT_BAD_INPUT) from None
    except RunNotWaiting as exc:
        raise CliError(str(exc), EXIT_FAILED) from None
    return answer


async def cmd_input(args: argparse.Namespace) -> int:
    answer = await _answer(
        args, lambda client: send_input(client, args.run_id, args.name, text=args.value, early=args.early, by=args.by)
    )
    if args.json:
        print_json({"run_id": args.run_id, **answer})
    elif answer.get("kept"):
        console.print(f"kept {escape(args.name)} = {escape(args.value)} for run {escape(args.run_id)} until it waits")
    else:
        console.print(f"sent {escape(args.name)} = {escape(args.value)} to run {escape(args.run_id)}")
    return EXIT_OK


async def cmd_approve(args: argparse.Namespace) -> int:
    answer = await _answer(
        args,
        lambda client: approve(
            client, args.run_id, reject=args.reject, comment=args.comment, by=args.by, question=args.question
        ),
    )
    if args.json:
        print_json({"run_id": args.run_id, **answer})
    else:
        verb = "approved" if answer.get("approved") else "rejected"
        console.print(f"{verb} {escape(repr(answer.get('question')))} for run {escape(args.run_id)}")
    return EXIT_OK
