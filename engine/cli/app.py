"""The ``gangflow`` command: its parser, the commands that talk to a running server (run, status, list,
cancel, logs, queue, queues, release, node drain|undrain, plugins) and ``main``; the ones that run the stack
(dev, worker, node, codec-server, demo) are in ``serve``.

Exit codes: 0 success, 1 a failed run (or an unreachable server, an unknown run or gang), 2 bad input
(nothing was started).

Every parser is built with ``allow_abbrev=False``: argparse's prefix matching would otherwise hand a
workflow parameter such as ``--n`` to ``--namespace``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Sequence
from typing import Any

from rich.markup import escape
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import TemporalError
from temporalio.service import RPCError

from engine.client import TenancyError, load_workflow_file, prepare_run, to_jsonable
from engine.core.plugins import available_plugins, load_plugin
from engine.core.protocol import TASK_QUEUE
from engine.errors import DefinitionError, GangflowError, InputError, NodeNotFoundError
from engine.runtime.node import DRAIN_TIMEOUT_S
from engine.scheduling.config import QueueConfigError
from engine.scheduling.events import drain_request

from .auth import add_auth_parser, cmd_auth
from .cache import add_cache_parser, add_cache_run_options, cache_mode, cmd_cache
from .common import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_OK,
    CliError,
    client_for,
    follow,
    queue_file_error,
    read_queue_file,
    refused,
)
from .logs import add_follow_option, cmd_logs
from .params import RunArgv, check_collisions, check_missing, parse_params, split_run_argv
from .ranks import rank_views, with_ranks
from .render import (
    console,
    err_console,
    print_json,
    run_json,
    show_drain,
    show_failure,
    show_queue,
    show_queues,
    show_ranks,
    show_release,
    show_runs,
    show_status,
)
from .schedules import add_schedule_parser, cmd_schedule
from .secrets import add_secret_parser, add_secrets_dir_option, cmd_secret
from .serve import DEMO_NODES, add_layout_options, cmd_codec_server, cmd_demo, cmd_dev, cmd_node, cmd_worker
from .waits import add_waits_parser, cmd_approve, cmd_input

__all__ = ["build_parser", "main", "run_options"]


def _connection_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", help="Temporal host:port (default $GANGFLOW_ADDRESS or localhost:7233)")
    p.add_argument("--namespace", help="Temporal namespace (default $GANGFLOW_NAMESPACE or default)")
    p.add_argument("--api-key", help="an API key or JWT for Temporal (default $GANGFLOW_API_KEY; never printed)")
    p.add_argument("--tls", action="store_true", help="TLS with the system's roots (default $GANGFLOW_TLS)")
    p.add_argument("--tls-ca", metavar="FILE", help="the server's CA certificate, PEM (default $GANGFLOW_TLS_CA)")
    p.add_argument("--tls-cert", metavar="FILE", help="mutual TLS: our certificate (default $GANGFLOW_TLS_CERT)")
    p.add_argument("--tls-key", metavar="FILE", help="mutual TLS: its private key (default $GANGFLOW_TLS_KEY)")
    p.add_argument(
        "--tenant",
        help="the tenant (default $GANGFLOW_TENANT or default); with GANGFLOW_NAMESPACE='gf-{tenant}' it picks the "
        "tenant's namespace, and the credentials decide whether that is allowed",
    )


NODE_ACTIONS = ("drain", "undrain")
#: the options that start a node agent (``dest`` -> option), refused with a drain or an undrain
_AGENT_OPTIONS = {
    "node_id": "--node-id",
    "gpus": "--gpus",
    "cpus": "--cpus",
    "mem": "--mem",
    "advertise_addr": "--advertise-addr",
    "standby": "--standby",
    "warm": "--warm",
    "drain_timeout": "--drain-timeout",
}
_NODE_EPILOG = """\
A drained node takes no new gangs. Its preemptible gangs get a preemption notice (grace to save a
checkpoint), release their GPUs and are placed elsewhere, resuming from their checkpoints; gangs that are
not preemptible run there to their end. The drain outlives restarts of the node agent and of the
Scheduler; 'gangflow node undrain NODE' offers the node again.

A node agent that gets SIGTERM (systemd, Kubernetes deleting its pod, the end of a Slurm job) drains its
own node the same way and stops once its gangs have left (--drain-timeout); started again, it lifts that
drain itself.
"""

_RUN_EPILOG = """\
The workflow's parameters follow the target as --name value or --name=value (--total-steps and
--total_steps are the same; structured values are JSON). A parameter named like one of the options
above (json, address, namespace, detach, artifacts ...) goes after a '--' separator, which ends
gangflow's own options, or into --input-json:
  gangflow run flow.py:wf --detach -- --json 1 --address x
"""


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def run_options(parser: argparse.ArgumentParser) -> dict[str, bool]:
    """``gangflow run``'s own option strings → whether each takes a value (what ``split_run_argv`` needs)."""
    run = _subcommands(parser)["run"]
    return {option: action.nargs != 0 for action in run._actions for option in action.option_strings}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gangflow", description="Typed, durable ML pipelines on Temporal.", allow_abbrev=False
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, summary: str, **options: Any) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=summary, allow_abbrev=False, **options)

    p = command("dev", "run an embedded Temporal dev server (with Web UI) and a worker")
    p.add_argument("--port", type=int, default=7233)
    p.add_argument("--ui-port", type=int, default=8233)
    p.add_argument("--state-dir", default=".gangflow", help="sqlite state and artifacts (default .gangflow)")
    p.add_argument("--headless", action="store_true", help="no Web UI")
    p.add_argument("--nodes", type=int, default=0, help="node agents to start on this machine (default 0)")
    p.add_argument("--gpus-per-node", type=int, default=0, help="GPU slots per node agent (logical on a CPU box)")
    p.add_argument(
        "--queues", metavar="FILE", help="a queue configuration (YAML: tenants, quotas, priority classes) to apply"
    )
    p.add_argument(
        "--auth",
        action="store_true",
        help="tenants connect through a dev-only gateway that applies Temporal's JWT permissions: a namespace "
        "gf-TENANT and a token per tenant of --queues (needs gangflow[auth])",
    )

    p = command(
        "node",
        "run a node agent (the executor of distributed tasks on this machine), or drain / undrain a node",
        usage="gangflow node --node-id ID [options] | gangflow node drain NODE [--reason TEXT] [--json] | "
        "gangflow node undrain NODE [--json]",
        epilog=_NODE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "action", nargs="?", choices=NODE_ACTIONS, help="drain or undrain NODE (without one: start a node agent)"
    )
    p.add_argument("node", nargs="?", metavar="NODE", help="the node to drain or undrain, as 'gangflow queue' shows it")
    p.add_argument("--node-id", help="the id of the node agent to start (required to start one)")
    p.add_argument("--reason", help="drain: why, shown with the node and to the gangs it moves")
    p.add_argument("--json", action="store_true", help="drain/undrain: print the Scheduler's answer as JSON")
    p.add_argument("--gpus", type=int, help="GPUs to offer (default: what nvidia-smi reports, else 0)")
    p.add_argument("--cpus", type=float, help="CPUs to offer (default: all)")
    p.add_argument("--mem", help="memory to offer, e.g. 64Gi (default: all)")
    p.add_argument("--advertise-addr", help="address other nodes reach this one at (default: this host's IP)")
    p.add_argument("--task-queue", default=TASK_QUEUE, help="the workflow workers' queue (default %(default)s)")
    p.add_argument(
        "--standby",
        type=int,
        help="warm rank processes to keep ready, so a gang (re)starts without waiting for imports "
        "(default: one per GPU, at least 1; 0: none)",
    )
    p.add_argument(
        "--warm",
        help="comma-separated modules the standby processes import ahead (default: torch, if installed)",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        metavar="SECONDS",
        help="on SIGTERM, drain this node and wait this long for its gangs to checkpoint and leave before "
        f"stopping (default {DRAIN_TIMEOUT_S:g}; 0: stop at once). A supervisor's stop timeout must be longer",
    )
    add_secrets_dir_option(p)
    _connection_args(p)

    p = command("codec-server", "serve the Web UI's codec endpoint (shows payloads as JSON)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s: this machine only)")
    p.add_argument("--port", type=int, default=8081)
    p.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="URL",
        help="a browser origin to answer, e.g. the Web UI's https://temporal.example.com (default: this machine's)",
    )
    p.add_argument(
        "--jwks",
        metavar="FILE",
        help="open payloads sealed with $GANGFLOW_ENCRYPTION_KEYS for callers whose token it verifies and whose "
        "permissions cover the namespace asked about (without it, sealed payloads stay sealed)",
    )

    p = command("plugins", "the installed distributed-task plugins (entry points gangflow.plugins)")
    p.add_argument("--json", action="store_true")

    p = command("queue", "nodes, free and used GPUs, running gangs and the pending queue")
    _connection_args(p)
    p.add_argument("--json", action="store_true")

    p = command(
        "queues",
        "tenants and their quotas: apply a queue configuration (YAML), or show usage per tenant",
        usage="gangflow queues apply FILE [--json] | gangflow queues show [--json]",
    )
    p.add_argument("action", choices=("apply", "show"), help="apply FILE, or show what the Scheduler holds")
    p.add_argument("file", nargs="?", metavar="FILE", help="the queue configuration to apply (YAML)")
    _connection_args(p)
    p.add_argument(
        "--task-queue", default=TASK_QUEUE, help="the workers' queue, to start the Scheduler on (default %(default)s)"
    )
    p.add_argument("--json", action="store_true", help='print {"tenants": {NAME: {...}}}')

    p = command("worker", "run a workflow + CPU task worker against a running Temporal")
    _connection_args(p)
    p.add_argument("--load", action="append", default=[], metavar="PKG", help="preload a package of workflows")
    p.add_argument("--task-queue", default=TASK_QUEUE, help=f"queue to poll (default {TASK_QUEUE})")
    add_secrets_dir_option(p)
    add_layout_options(p)

    p = command(
        "run",
        "run FILE.py:WORKFLOW [--param value ...] [-- --param value ...]",
        usage="gangflow run FILE.py:WORKFLOW [options] [--param value ...] [-- --param value ...]",
        epilog=_RUN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("target", metavar="FILE.py:WORKFLOW")
    _connection_args(p)
    p.add_argument("--input-json", help="inputs as one JSON object")
    p.add_argument("--artifacts", help="artifact store URI (default $GANGFLOW_ARTIFACTS or .gangflow/artifacts)")
    p.add_argument("--priority", metavar="CLASS", help="the priority class of the run's gangs (a task's own wins)")
    add_cache_run_options(p)
    p.add_argument("--task-queue", default=TASK_QUEUE, help="the workers' queue (default %(default)s)")
    p.add_argument("--run-id", help="choose the run id (default <workflow>-<random>)")
    p.add_argument("--json", action="store_true", help="print one JSON object: run_id, status, result")
    p.add_argument("--detach", action="store_true", help="start the run and exit")

    p = command("status", "show a run: status, tasks, result or error")
    p.add_argument("run_id")
    _connection_args(p)
    p.add_argument("--json", action="store_true")

    p = command("list", "list runs")
    _connection_args(p)
    p.add_argument("--status", help="running, completed, failed, canceled, terminated, timed_out")
    p.add_argument("--pipeline")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--json", action="store_true")

    p = command("cancel", "cancel a run (its running tasks are cancelled too)")
    p.add_argument("run_id")
    _connection_args(p)

    p = command("logs", "print the captured output of a run's tasks")
    p.add_argument("run_id")
    p.add_argument("--task", help="only this task")
    p.add_argument("--rank", type=int, help="only this rank of a distributed task")
    add_follow_option(p)
    _connection_args(p)

    p = command("release", "operators: free a gang's placement or withdraw its queued request")
    p.add_argument("gang_id", metavar="GANG_ID", help="as 'gangflow queue' shows it (<run>.<task>-<n>)")
    p.add_argument(
        "--force", action="store_true", help="even when the gang's GangRun is still running (its ranks may hold GPUs)"
    )
    _connection_args(p)
    p.add_argument("--json", action="store_true")

    p = command("demo", "run examples/ddp_pipeline.py on a throwaway stack with 2 node agents")
    p.add_argument("--file", help="the pipeline to run (default examples/ddp_pipeline.py:pipeline)")
    p.add_argument("--nodes", type=int, default=DEMO_NODES, help="node agents to start (default %(default)s)")
    p.add_argument("--keep", action="store_true", help="leave the stack up after the run (Ctrl-C stops it)")
    p.add_argument("--headless", action="store_true", help="no Web UI")
    p.add_argument(
        "--tenants",
        action="store_true",
        help="instead: team-a borrows the whole cluster, team-b reclaims its quota, team-a resumes from its "
        "checkpoint (examples/queues.yaml, examples/multitenant.py); prints the timeline",
    )
    add_auth_parser(sub)
    add_secret_parser(sub)
    add_cache_parser(sub)
    add_waits_parser(sub, _connection_args)
    add_schedule_parser(sub, _connection_args)
    return parser


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
    try:
        data = await follow(client, run_id, quiet=args.json)
    except WorkflowFailureError:
        _, error = await client.tasks(run_id)
        if args.json:
            print_json({"run_id": run_id, "status": "FAILED", "error": error})
        else:
            show_failure(run_id, error)
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
        raise CliError(f"run {args.run_id!r}: {exc.message}") from None
    views = await rank_views(client, info)
    if args.json:
        print_json(with_ranks(run_json(info), views))
    else:
        show_status(info)
        show_ranks(info, views)
    return EXIT_OK


async def cmd_list(args: argparse.Namespace) -> int:
    client = await client_for(args)
    try:
        runs = await client.runs(status=args.status, pipeline=args.pipeline, limit=args.limit)
    except GangflowError as exc:
        raise CliError(str(exc), EXIT_BAD_INPUT) from None
    if args.json:
        print_json([run_json(r) for r in runs])
    else:
        show_runs(runs)
    return EXIT_OK


async def cmd_cancel(args: argparse.Namespace) -> int:
    client = await client_for(args)
    try:
        await client.cancel(args.run_id)
    except RPCError as exc:
        raise CliError(f"run {args.run_id!r}: {exc.message}") from None
    console.print(f"cancel requested for {args.run_id}")
    return EXIT_OK


async def cmd_release(args: argparse.Namespace) -> int:
    client = await client_for(args)
    try:
        freed = await client.release(args.gang_id, force=args.force)
    except GangflowError as exc:
        raise CliError(str(exc)) from None
    if args.json:
        print_json(freed)
    else:
        show_release(freed)
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
    action = args.action
    given = [option for dest, option in _AGENT_OPTIONS.items() if getattr(args, dest, None) is not None]
    if given:
        hint = f" (gangflow node {action} {args.node_id})" if args.node_id and not args.node else ""
        raise CliError(
            f"gangflow node {action} takes the node as NODE and no {', '.join(given)}: those start a node agent" + hint,
            EXIT_BAD_INPUT,
        )
    if not args.node:
        raise CliError(f"gangflow node {action} needs the NODE, as 'gangflow queue' shows it", EXIT_BAD_INPUT)
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
    if args.json:
        print_json(answer)
    else:
        show_drain(answer)
    return EXIT_OK


async def cmd_queue(args: argparse.Namespace) -> int:
    client = await client_for(args)
    try:
        data = await client.queue()
    except (RPCError, TemporalError) as exc:
        raise CliError(f"no scheduler answered ({exc}); are node agents running?") from None
    if args.json:
        print_json(data)
    else:
        show_queue(data)
    return EXIT_OK


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
        except GangflowError as exc:
            raise CliError(str(exc)) from None
    if args.json:
        print_json({"tenants": data.get("tenants") or {}})
    else:
        show_queues(data)
    return EXIT_OK


_COMMANDS = {
    "node": cmd_node_command,
    "plugins": cmd_plugins,
    "codec-server": cmd_codec_server,
    "queue": cmd_queue,
    "queues": cmd_queues,
    "status": cmd_status,
    "list": cmd_list,
    "cancel": cmd_cancel,
    "logs": cmd_logs,
    "release": cmd_release,
    "worker": cmd_worker,
    "dev": cmd_dev,
    "demo": cmd_demo,
    "auth": cmd_auth,
    "secret": cmd_secret,
    "cache": cmd_cache,
    "approve": cmd_approve,
    "input": cmd_input,
    "schedule": cmd_schedule,
}


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    tokens = list(sys.argv[1:] if argv is None else argv)
    options = run_options(parser)
    split = RunArgv((), (), frozenset(), False)
    if tokens[:1] == ["run"]:  # gangflow's options go to argparse, the workflow's parameters to parse_params
        split = split_run_argv(tokens[1:], options)
        tokens = ["run", *split.own]
    args = parser.parse_args(tokens)
    try:
        if args.command == "run":
            code = asyncio.run(cmd_run(args, split, options))
        else:
            code = asyncio.run(_COMMANDS[args.command](args))
    except (CliError, RPCError) as exc:
        failure = exc if isinstance(exc, CliError) else refused(exc, args)
        # one line however long: it may quote a command to paste
        err_console.print(f"[bold red]error:[/] {escape(str(failure))}", soft_wrap=True)
        code = failure.code
    except KeyboardInterrupt:
        code = 130
    # The temporalio core can abort during interpreter shutdown (sdk-python#300); exit directly with
    # the real status once all output is flushed.
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)
