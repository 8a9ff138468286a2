"""The ``gangflow`` command's parser: one builder per command of the core set (the stack, runs, the
cluster), in the order ``gangflow --help`` lists them, then the feature modules' own (auth, secret,
cache, approve / input, schedule).

Every parser is built with ``allow_abbrev=False``: argparse's prefix matching would otherwise hand a
workflow parameter such as ``--n`` to ``--namespace``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
from collections.abc import Callable
from typing import Any

from engine.core.protocol import TASK_QUEUE
from engine.errors import DefinitionError, GangflowError
from engine.runtime.node import DRAIN_TIMEOUT_S

from .auth import add_auth_parser
from .cache import add_cache_parser, add_cache_run_options
from .common import connection_args
from .logs import add_follow_option
from .schedules import add_schedule_parser
from .secrets import add_secret_parser, add_secrets_dir_option
from .serve import DEMO_NODES, add_layout_options
from .usage import add_usage_parser
from .waits import add_waits_parser

__all__ = ["NODE_ACTIONS", "build_parser", "run_options", "workflow_help"]

#: what ``gangflow node ACTION NODE`` does to a node (without an action it starts a node agent)
NODE_ACTIONS = ("drain", "undrain")

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

#: adds one subcommand: its name, its one-line summary for ``gangflow --help``, add_parser's other options
Command = Callable[..., argparse.ArgumentParser]


def _dev(command: Command) -> None:
    p = command("dev", "run an embedded Temporal dev server (with Web UI) and a worker")
    p.add_argument(
        "--port", type=int, default=7233, help="Temporal's gRPC port, what clients connect to (default %(default)s)"
    )
    p.add_argument("--ui-port", type=int, default=8233, help="the Web UI's port (default %(default)s)")
    p.add_argument("--state-dir", default=".gangflow", help="sqlite state and artifacts (default .gangflow)")
    p.add_argument("--headless", action="store_true", help="no Web UI")
    p.add_argument("--nodes", type=int, default=0, help="node agents to start on this machine (default 0)")
    p.add_argument("--gpus-per-node", type=int, default=0, help="GPU slots per node agent (logical on a CPU box)")
    p.add_argument(
        "--node-labels",
        metavar="K=V,...;...",
        help="labels of the node agents, one group per node in order, separated by ';' (node-0's first), e.g. "
        "'gpu=h100,rack=r1;gpu=a100,rack=r2'",
    )
    p.add_argument(
        "--queues", metavar="FILE", help="a queue configuration (YAML: tenants, quotas, priority classes) to apply"
    )
    p.add_argument(
        "--auth",
        action="store_true",
        help="tenants connect through a dev-only gateway that applies Temporal's JWT permissions: a namespace "
        "gf-TENANT and a token per tenant of --queues (needs gangflow[auth])",
    )
    _metrics_option(p, "127.0.0.1")


def _node(command: Command) -> None:
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
    p.add_argument(
        "node", nargs="?", metavar="NODE", help="the node to drain or undrain, as 'gangflow cluster' shows it"
    )
    p.add_argument("--node-id", help="the id of the node agent to start (required to start one)")
    p.add_argument("--reason", help="drain: why, shown with the node and to the gangs it moves")
    p.add_argument("--json", action="store_true", help="drain/undrain: print the Scheduler's answer as JSON")
    p.add_argument("--gpus", type=int, help="GPUs to offer (default: what nvidia-smi reports, else 0)")
    p.add_argument("--cpus", type=float, help="CPUs to offer (default: all)")
    p.add_argument("--mem", help="memory to offer, e.g. 64Gi (default: all)")
    p.add_argument("--advertise-addr", help="address other nodes reach this one at (default: this host's IP)")
    p.add_argument(
        "--labels",
        metavar="K=V,...",
        help="the node's labels, e.g. gpu=h100,zone=a,capacity=spot (Kubernetes label syntax), for flavors and node "
        "selectors; added to the GPU model and memory nvidia-smi reports (gangflow.io/gpu.product, gpu.memory)",
    )
    p.add_argument("--task-queue", default=TASK_QUEUE, help="the workflow workers' queue (default %(default)s)")
    _metrics_option(p, "0.0.0.0")
    p.add_argument(
        "--standby",
        type=int,
        help="warm rank processes to keep ready, so a gang (re)starts without waiting for imports "
        "(default: one per GPU, at least 1; 0: none)",
    )
    p.add_argument(
        "--warm",
        help="comma-separated modules the standby processes import ahead (default: $GANGFLOW_WARM if set, else "
        "torch, if installed)",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        metavar="SECONDS",
        help="on SIGTERM, drain this node and wait this long for its gangs to checkpoint and leave before "
        f"stopping (default {DRAIN_TIMEOUT_S:g}; 0: stop at once). A supervisor's stop timeout must be longer",
    )
    add_secrets_dir_option(p)
    connection_args(p)


def _codec_server(command: Command) -> None:
    p = command("codec-server", "serve the Web UI's codec endpoint (shows payloads as JSON)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s: this machine only)")
    p.add_argument("--port", type=int, default=8081, help="port to listen on (default %(default)s)")
    p.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="URL",
        help="a browser origin to answer: the Web UI's, e.g. https://temporal.example.com (default: none, no browser)",
    )
    p.add_argument(
        "--jwks",
        metavar="FILE",
        help="open payloads sealed with $GANGFLOW_ENCRYPTION_KEYS for callers whose token it verifies and whose "
        "permissions cover the namespace asked about (without it, sealed payloads stay sealed)",
    )


def _plugins(command: Command) -> None:
    p = command("plugins", "the installed distributed-task plugins (entry points gangflow.plugins)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")


def _cluster(command: Command) -> None:
    # the cluster's live state; its old name `queue` read too much like `queues` (the configuration)
    for name, summary in (
        ("cluster", "nodes, free and used GPUs, running gangs and the pending queue"),
        ("queue", "deprecated: the old name of 'gangflow cluster'"),
    ):
        p = command(name, summary)
        connection_args(p)
        p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def _queues(command: Command) -> None:
    p = command(
        "queues",
        "tenants and their quotas: apply a queue configuration (YAML), or show usage per tenant",
        usage="gangflow queues apply FILE [--json] | gangflow queues show [--json]",
    )
    p.add_argument("action", choices=("apply", "show"), help="apply FILE, or show what the Scheduler holds")
    p.add_argument("file", nargs="?", metavar="FILE", help="the queue configuration to apply (YAML)")
    connection_args(p)
    p.add_argument(
        "--task-queue", default=TASK_QUEUE, help="the workers' queue, to start the Scheduler on (default %(default)s)"
    )
    p.add_argument("--json", action="store_true", help='print {"tenants": {NAME: {...}}}')


def _worker(command: Command) -> None:
    p = command("worker", "run a workflow + CPU task worker against a running Temporal")
    connection_args(p)
    p.add_argument("--load", action="append", default=[], metavar="PKG", help="preload a package of workflows")
    p.add_argument("--task-queue", default=TASK_QUEUE, help=f"queue to poll (default {TASK_QUEUE})")
    add_secrets_dir_option(p)
    add_layout_options(p)
    _metrics_option(p, "0.0.0.0")


def _run(command: Command) -> None:
    p = command(
        "run",
        "run FILE.py:WORKFLOW [--param value ...] [-- --param value ...]",
        usage="gangflow run FILE.py:WORKFLOW [options] [--param value ...] [-- --param value ...]",
        epilog=_RUN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "target", metavar="FILE.py:WORKFLOW", help="the workflow to run; with --help, its parameters are listed too"
    )
    connection_args(p)
    p.add_argument("--input-json", help="inputs as one JSON object")
    p.add_argument("--artifacts", help="artifact store URI (default $GANGFLOW_ARTIFACTS or .gangflow/artifacts)")
    p.add_argument("--priority", metavar="CLASS", help="the priority class of the run's gangs (a task's own wins)")
    add_cache_run_options(p)
    p.add_argument("--task-queue", default=TASK_QUEUE, help="the workers' queue (default %(default)s)")
    p.add_argument("--run-id", help="choose the run id (default <workflow>-<random>)")
    p.add_argument("--json", action="store_true", help="print one JSON object: run_id, status, result")
    p.add_argument("--detach", action="store_true", help="start the run and exit")
    _verbose_option(p)


def _verbose_option(p: argparse.ArgumentParser) -> None:
    """``--verbose`` of the commands that show a failure (run, status)."""
    p.add_argument(
        "--verbose",
        action="store_true",
        help="a failure's every frame (Temporal's and gangflow's too), not only your code's",
    )


def _status(command: Command) -> None:
    p = command("status", "show a run: status, tasks, result or error")
    p.add_argument("run_id", metavar="RUN", help="the run id (gangflow list shows them)")
    connection_args(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    _verbose_option(p)


def _list(command: Command) -> None:
    p = command("list", "list runs")
    connection_args(p)
    p.add_argument("--status", help="running, completed, failed, canceled, terminated, timed_out")
    p.add_argument("--pipeline", help="only runs of this workflow")
    p.add_argument("--limit", type=int, default=20, help="at most this many runs, newest first (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")


def _cancel(command: Command) -> None:
    p = command("cancel", "cancel a run (its running tasks are cancelled too)")
    p.add_argument("run_id", metavar="RUN", help="the run id (gangflow list shows them)")
    connection_args(p)


def _logs(command: Command) -> None:
    p = command("logs", "print the captured output of a run's tasks")
    p.add_argument("run_id", metavar="RUN", help="the run id (gangflow list shows them)")
    p.add_argument("--task", help="only this task")
    p.add_argument("--rank", type=int, help="only this rank of a distributed task")
    add_follow_option(p)
    connection_args(p)


def _release(command: Command) -> None:
    p = command("release", "operators: free a gang's placement or withdraw its queued request")
    p.add_argument("gang_id", metavar="GANG_ID", help="as 'gangflow cluster' shows it (<run>.<task>-<n>)")
    p.add_argument(
        "--force", action="store_true", help="even when the gang's GangTask is still running (its ranks may hold GPUs)"
    )
    connection_args(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")


def _demo(command: Command) -> None:
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


#: the core commands, in the order of ``gangflow --help``
_CORE = (
    _dev,
    _node,
    _codec_server,
    _plugins,
    _cluster,
    _queues,
    _worker,
    _run,
    _status,
    _list,
    _cancel,
    _logs,
    _release,
    _demo,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gangflow", description="Typed, durable ML pipelines on Temporal.", allow_abbrev=False
    )
    parser.add_argument("--version", action="version", version=f"gangflow {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, summary: str, **options: Any) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=summary, allow_abbrev=False, **options)

    for add in _CORE:
        add(command)
    add_auth_parser(sub)
    add_secret_parser(sub)
    add_cache_parser(sub)
    add_waits_parser(sub, connection_args)
    add_schedule_parser(sub, connection_args)
    add_usage_parser(sub, connection_args)
    return parser


def _version() -> str:
    """The installed distribution's version (what pip shows), or "unknown" for a bare source tree."""
    try:
        return importlib.metadata.version("gangflow")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def workflow_help(parser: argparse.ArgumentParser, target: str) -> None:
    """``gangflow run FILE.py:WF --help``: the run options, then the workflow's own parameters with their
    types and defaults (as ``pyflyte run`` shows them), or why the file could not be read."""
    from engine.client import load_workflow_file, to_jsonable  # the file is imported only when help asks

    run = _subcommands(parser)["run"]
    try:
        interface = load_workflow_file(target).interface
    except (GangflowError, DefinitionError) as exc:
        run.epilog = f"{run.epilog}\n{target}: cannot list its parameters: {exc}\n"
        return
    lines = [f"{target} parameters (--name value; structured values are JSON):"]
    for p in interface.params:
        default = "required" if p.required else f"default {json.dumps(to_jsonable(p.default), default=str)}"
        lines.append(f"  --{p.name.replace('_', '-'):<22} {p.codec.name} ({default})")
    run.epilog = "\n".join([*lines, "", run.epilog or ""])


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def run_options(parser: argparse.ArgumentParser) -> dict[str, bool]:
    """``gangflow run``'s own option strings → whether each takes a value (what ``split_run_argv`` needs)."""
    run = _subcommands(parser)["run"]
    return {option: action.nargs != 0 for action in run._actions for option in action.option_strings}


def _metrics_option(p: argparse.ArgumentParser, what: str) -> None:
    """``--metrics-port`` of the commands that serve Prometheus metrics (engine.runtime.metrics)."""
    p.add_argument(
        "--metrics-port",
        type=int,
        metavar="N",
        help=f"serve Prometheus metrics on http://{what}:N/metrics (gangflow's and the Temporal SDK's)",
    )
