"""The operators' commands on a running cluster: ``cluster`` (its live state: nodes, gangs, the pending
queue; ``queue`` is its old name), ``queues`` (the queue configuration: apply or show), ``node`` (start a
node agent, or drain / undrain a node) and ``release`` (free a gang). The ones that run a part of the
stack (``worker``, ``node``'s agent, ``codec-server``, ``dev``, ``demo``) are in ``serve``."""

from __future__ import annotations

import argparse

from rich.markup import escape
from temporalio.exceptions import TemporalError
from temporalio.service import RPCError, RPCStatusCode

from engine.core.protocol import PLATFORM_NAMESPACE
from engine.errors import GangflowError, InputError, NodeNotFoundError
from engine.runtime.connection import call_refused
from engine.scheduling.config import QueueConfigError
from engine.scheduling.events import drain_request

from .common import EXIT_BAD_INPUT, EXIT_OK, CliError, client_for, queue_file_error, read_queue_file, refused
from .render import console, err_console, print_answer, print_json, show_release
from .render_queues import show_drain, show_queue, show_queues
from .serve import cmd_node

__all__ = ["QUEUE_DEPRECATED", "cmd_cluster", "cmd_drain", "cmd_node_command", "cmd_queue", "cmd_queues", "cmd_release"]

#: the options that start a node agent (``dest`` -> option), refused with a drain or an undrain
_AGENT_OPTIONS = {
    "node_id": "--node-id",
    "gpus": "--gpus",
    "cpus": "--cpus",
    "mem": "--mem",
    "advertise_addr": "--advertise-addr",
    "labels": "--labels",
    "standby": "--standby",
    "warm": "--warm",
    "drain_timeout": "--drain-timeout",
}

#: what ``gangflow queue`` says before it answers as ``gangflow cluster`` (on stderr: ``--json`` stays parseable)
QUEUE_DEPRECATED = (
    "warning: 'gangflow queue' is deprecated; use 'gangflow cluster' (the cluster's state; "
    "'gangflow queues' is the queue configuration)"
)


async def cmd_cluster(args: argparse.Namespace) -> int:
    client = await client_for(args)
    try:
        data = await client.queue()
    except RPCError as exc:
        if call_refused(exc):
            raise refused(exc, args) from None
        if exc.status == RPCStatusCode.NOT_FOUND:  # not a tenant's namespace: the Scheduler would be here
            raise CliError(
                f"no Scheduler is running in namespace {client.temporal.namespace}: the platform's worker starts it "
                f"('gangflow worker', 'gangflow dev'); in the isolated layout it runs in {PLATFORM_NAMESPACE}, "
                "which a tenant reaches with GANGFLOW_NAMESPACE='gf-{tenant}' and its own token"
            ) from None
        raise CliError(f"the Scheduler did not answer: {exc.message}") from None
    except GangflowError as exc:  # a tenant's look through its endpoint: the truth of why it got no answer
        raise CliError(str(exc)) from None
    except TemporalError as exc:
        raise CliError(f"the Scheduler did not answer: {exc}") from None
    if args.json:
        print_json(data)
    else:
        show_queue(data)
    return EXIT_OK


async def cmd_queue(args: argparse.Namespace) -> int:
    """``gangflow queue``: the old name of ``gangflow cluster``, kept working with one line on stderr."""
    err_console.print(QUEUE_DEPRECATED, markup=False, soft_wrap=True)
    return await cmd_cluster(args)


async def cmd_queues(args: argparse.Namespace) -> int:
    if args.action == "apply":
        if not args.file:
            raise CliError(
                "gangflow queues apply needs the FILE to apply (a queue configuration, YAML)", EXIT_BAD_INPUT
            )
        config = read_queue_file(args.file)  # before anything is contacted: a bad file changes nothing
        client = await client_for(args)
        try:
            data = await client.apply_queues(config, task_queue=args.task_queue)
        except QueueConfigError as exc:  # the Scheduler refused it: nothing was applied
            raise CliError(queue_file_error(args.file, exc), EXIT_BAD_INPUT) from None
        except GangflowError as exc:
            raise CliError(str(exc)) from None
        if not args.json:
            console.print(f"applied {escape(args.file)}: {len(data.get('tenants') or {})} tenant(s)")
    else:
        if args.file:
            raise CliError(f"gangflow queues show takes no FILE (got {args.file!r})", EXIT_BAD_INPUT)
        client = await client_for(args)
        try:
            data = await client.queues()
        except RPCError as exc:
            raise refused(exc, args) from None
        except GangflowError as exc:
            raise CliError(str(exc)) from None
    if args.json:
        view = {"tenant_view": data["tenant_view"]} if data.get("tenant_view") else {}
        print_json({"tenants": data.get("tenants") or {}, **view})
    else:
        show_queues(data)
    return EXIT_OK


async def cmd_node_command(args: argparse.Namespace) -> int:
    """``gangflow node``: start a node agent (``--node-id``), or drain / undrain a node."""
    if args.action is None:
        if args.reason is not None or args.json:
            option = "--reason" if args.reason is not None else "--json"
            raise CliError(
                f"{option} is for gangflow node drain|undrain NODE, not for starting a node agent", EXIT_BAD_INPUT
            )
        if not args.node_id:
            raise CliError(
                "gangflow node needs --node-id ID to start a node agent on this machine, or an action: "
                "gangflow node drain NODE [--reason TEXT] | gangflow node undrain NODE",
                EXIT_BAD_INPUT,
            )
        return await cmd_node(args)
    return await cmd_drain(args)


async def cmd_drain(args: argparse.Namespace) -> int:
    """``gangflow node drain|undrain NODE``: checked whole before the Scheduler is asked."""
    action = args.action
    given = [option for dest, option in _AGENT_OPTIONS.items() if getattr(args, dest, None) is not None]
    if given:
        hint = f" (gangflow node {action} {args.node_id})" if args.node_id and not args.node else ""
        raise CliError(
            f"gangflow node {action} takes the node as NODE and no {', '.join(given)}: those start a node agent" + hint,
            EXIT_BAD_INPUT,
        )
    if not args.node:
        raise CliError(f"gangflow node {action} needs the NODE, as 'gangflow cluster' shows it", EXIT_BAD_INPUT)
    if action == "undrain" and args.reason is not None:
        raise CliError("gangflow node undrain takes no --reason (the node is offered again)", EXIT_BAD_INPUT)
    drained, reason = action == "drain", args.reason or ""
    try:  # before anything is contacted: bad input changes nothing
        drain_request({"node_id": args.node, "drained": drained, "reason": reason})
    except ValueError as exc:
        raise CliError(f"gangflow node {action}: {exc}", EXIT_BAD_INPUT) from None
    client = await client_for(args)
    try:
        answer = await client.drain_node(args.node, reason=reason, drained=drained)
    except (NodeNotFoundError, InputError) as exc:
        raise CliError(str(exc), EXIT_BAD_INPUT) from None
    except GangflowError as exc:
        raise CliError(str(exc)) from None
    print_answer(args.json, answer, show_drain)
    return EXIT_OK


async def cmd_release(args: argparse.Namespace) -> int:
    client = await client_for(args)
    try:
        freed = await client.release(args.gang_id, force=args.force)
    except GangflowError as exc:
        raise CliError(str(exc)) from None
    print_answer(args.json, freed, show_release)
    return EXIT_OK
