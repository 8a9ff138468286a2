"""The commands on runs: ``run`` (start one and follow it to its end), ``status``, ``list``, ``cancel``;
and ``plugins``, which lists what a distributed task can run on. (``logs`` is in ``logs``, the waits'
answers in ``waits``, schedules in ``schedules``.)"""

from __future__ import annotations

import argparse
import contextlib

from rich.markup import escape
from temporalio.client import WorkflowFailureError
from temporalio.service import RPCError

from engine.client import RunInfo, TenancyError, load_workflow_file, prepare_run, to_jsonable
from engine.core.plugins import available_plugins, load_plugin
from engine.errors import DefinitionError, GangflowError
from engine.runtime.connection import call_refused

from .cache import cache_mode
from .common import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, CliError, client_for, follow, refused
from .params import RunArgv, check_collisions, check_missing, parse_params
from .ranks import rank_views, with_ranks
from .render import console, print_answer, print_json, run_json, show_failure, show_ranks, show_runs, show_status

__all__ = ["cmd_cancel", "cmd_list", "cmd_plugins", "cmd_run", "cmd_status"]


async def cmd_run(args: argparse.Namespace, argv: RunArgv, options: dict[str, bool]) -> int:
    try:
        defn = load_workflow_file(args.target)
        check_collisions(defn.interface, options, argv, args.target, args.input_json)
        inputs = parse_params(defn.interface, argv.params, args.input_json)
        check_missing(defn.interface, options, inputs, args.target)
        defn, envelope = prepare_run(
            defn,
            inputs,
            artifacts=args.artifacts,
            run_id=args.run_id,
            tenant=args.tenant,
            priority=args.priority,
            cache=cache_mode(args),
        )
    except (GangflowError, DefinitionError) as exc:
        raise CliError(str(exc), EXIT_BAD_INPUT) from None
    client = await client_for(args, envelope.run.artifacts)
    client.task_queue = args.task_queue
    try:
        run_id = await client.start_prepared(defn, envelope)
    except TenancyError as exc:  # an unknown tenant or priority class: bad input, nothing started
        raise CliError(str(exc), EXIT_BAD_INPUT) from None
    except GangflowError as exc:  # the Scheduler could not be asked
        raise CliError(str(exc)) from None
    if args.detach:
        if args.json:
            print_json({"run_id": run_id, "status": "RUNNING"})
        else:
            console.print(f"started [bold]{run_id}[/]; follow it with: gangflow status {run_id}")
        return EXIT_OK
    if not args.json:  # the id stays on screen (the spinner does not after Ctrl-C, nor in a script's log)
        console.print(f"started [bold]{run_id}[/]; Ctrl-C stops following it, not the run", soft_wrap=True)
    try:
        data = await follow(client, run_id, quiet=args.json)
    except WorkflowFailureError:
        _, error = await client.tasks(run_id)
        if args.json:
            print_json({"run_id": run_id, "status": "FAILED", "error": error})
        else:
            show_failure(run_id, error, verbose=args.verbose)
        return EXIT_FAILED
    if args.json:
        print_json({"run_id": run_id, "status": "COMPLETED", "result": to_jsonable(data)})
    else:
        result = defn.interface.output_from_wire(data)
        console.print(f"[green]{run_id} completed[/]")
        console.print(result)
    return EXIT_OK


async def cmd_status(args: argparse.Namespace) -> int:
    client = await client_for(args)
    try:
        info = await client.status(args.run_id)
    except RPCError as exc:
        if call_refused(exc):
            raise refused(exc, args) from None
        raise CliError(f"run {args.run_id!r}: {exc.message}") from None
    views = await rank_views(client, info)

    def show(info: RunInfo) -> None:
        show_status(info, verbose=args.verbose)
        show_ranks(info, views)

    print_answer(args.json, info, show, lambda info: with_ranks(run_json(info), views))
    return EXIT_OK


async def cmd_list(args: argparse.Namespace) -> int:
    client = await client_for(args)
    try:
        runs = await client.runs(status=args.status, pipeline=args.pipeline, limit=args.limit)
    except GangflowError as exc:
        raise CliError(str(exc), EXIT_BAD_INPUT) from None
    print_answer(args.json, runs, show_runs, lambda runs: [run_json(r) for r in runs])
    return EXIT_OK


async def cmd_cancel(args: argparse.Namespace) -> int:
    client = await client_for(args)
    try:
        # Temporal takes a cancel request for a run that has ended and does nothing with it: say so instead
        status = (await client.status(args.run_id, with_tasks=False)).status
        if status != "RUNNING":
            raise CliError(f"run {args.run_id!r} is {status}: there is nothing to cancel")
        await client.cancel(args.run_id)
    except RPCError as exc:
        raise CliError(f"run {args.run_id!r}: {exc.message}") from None
    console.print(f"cancel requested for {args.run_id}")
    return EXIT_OK


async def cmd_plugins(args: argparse.Namespace) -> int:
    found = available_plugins()
    if args.json:
        print_json(found)
        return EXIT_OK
    for name, target in found.items():
        doc = ""
        with contextlib.suppress(Exception):
            doc = (load_plugin(name).__doc__ or "").strip().splitlines()[0]
        console.print(f"[bold]{name}[/]  {target}  {escape(doc)}")
    return EXIT_OK
