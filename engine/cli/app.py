"""The ``gangflow`` command's entry point: parse (``parser``), dispatch to the command, turn a
``CliError`` into one line on stderr and its exit code.

The commands live by what they act on: runs (``runs``, ``logs``, ``waits``, ``schedules``, ``cache``),
the cluster (``operators``: cluster, queues, node drain|undrain, release), the stack (``serve``: dev,
worker, node agents, codec-server, demo), the dev stack's tenants (``auth``, ``secrets``).

Exit codes: 0 success, 1 a failed run (or an unreachable server, an unknown run or gang), 2 bad input
(nothing was started).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from rich.markup import escape
from temporalio.service import RPCError

from .auth import cmd_auth
from .cache import cmd_cache
from .common import CliError, refused
from .logs import cmd_logs
from .operators import cmd_cluster, cmd_node_command, cmd_queue, cmd_queues, cmd_release
from .params import RunArgv, split_run_argv
from .parser import build_parser, run_options, workflow_help
from .render import err_console
from .runs import cmd_cancel, cmd_list, cmd_plugins, cmd_run, cmd_status
from .schedules import cmd_schedule
from .secrets import cmd_secret
from .serve import cmd_codec_server, cmd_demo, cmd_dev, cmd_worker
from .usage import cmd_usage
from .waits import cmd_approve, cmd_input

__all__ = ["build_parser", "main", "run_options"]

#: every command but ``run``, which also takes the workflow's parameters split off its own options
_COMMANDS: dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, int]]] = {
    "node": cmd_node_command,
    "plugins": cmd_plugins,
    "codec-server": cmd_codec_server,
    "cluster": cmd_cluster,
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
    "usage": cmd_usage,
}


def _target(own: Sequence[str], options: dict[str, bool]) -> str | None:
    """The FILE.py:WORKFLOW among ``gangflow run``'s own tokens (past the options and their values)."""
    i = 0
    while i < len(own):
        key, eq, _ = own[i].partition("=")
        if key not in options:
            return own[i]
        i += 2 if options[key] and not eq else 1
    return None


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    tokens = list(sys.argv[1:] if argv is None else argv)
    options = run_options(parser)
    split = RunArgv((), (), frozenset(), False)
    if tokens[:1] == ["run"]:  # gangflow's options go to argparse, the workflow's parameters to parse_params
        split = split_run_argv(tokens[1:], options)
        tokens = ["run", *split.own]
        target = _target(split.own, options)
        if target is not None and {"-h", "--help"} & split.given:
            workflow_help(parser, target)
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
