"""What every ``gangflow`` command shares: exit codes, the error that ends a command, the connection to
Temporal, reading a queue configuration, waiting for Ctrl-C, and following a run to its end."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from pathlib import Path
from typing import Any

from rich.markup import escape
from temporalio.service import RPCError

from engine.client import Client
from engine.errors import GangflowError, InputError
from engine.runtime import Endpoint, connect
from engine.runtime.connection import CredentialsRefused, call_refused, token_problem
from engine.scheduling.config import QueueConfig, QueueConfigError, load_queue_config

from .render import console, waiting_lines

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_FAILED",
    "EXIT_OK",
    "CliError",
    "client_for",
    "connection_args",
    "endpoint_for",
    "follow",
    "queue_file_error",
    "read_queue_file",
    "refused",
    "stop_event",
    "until_signalled",
]

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


class CliError(GangflowError):
    """Ends a command with one line on stderr and ``code`` as the exit status.

    A ``GangflowError`` like every error raised on purpose; it never crosses Temporal. A command that turns
    the ``GangflowError`` of a call into a ``CliError`` of its own must let a ``CliError`` from the same
    block through unchanged (it already carries its exit code)."""

    kind = "CliError"

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def connection_args(p: argparse.ArgumentParser) -> None:
    """The options that name the server and the credentials (what ``endpoint_for`` reads)."""
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


def endpoint_for(args: argparse.Namespace) -> Endpoint:
    """The server and credentials that the connection options (or their environment variables) name; bad
    credentials options exit 2 before anything connects."""
    try:
        return Endpoint.resolve(
            args.address,
            args.namespace,
            api_key=args.api_key,
            tls=args.tls,
            tls_ca=args.tls_ca,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            tenant=getattr(args, "tenant", None),
        )
    except InputError as exc:
        raise CliError(str(exc), EXIT_BAD_INPUT) from None


def refused(exc: RPCError, args: argparse.Namespace) -> CliError:
    """Temporal refused a call for the caller's credentials (a token of another tenant, a read token, none):
    one line naming the namespace. Any other RPC error is not for this: raised again."""
    if not call_refused(exc):
        raise exc
    where, endpoint = "this namespace", None
    with contextlib.suppress(CliError):
        endpoint = endpoint_for(args) if hasattr(args, "api_key") else None
    if endpoint is not None:
        where = f"namespace {endpoint.namespace}"
        problem = token_problem(endpoint.api_key)
        if endpoint.api_key and problem is not None:
            # the token itself is at fault (it expired since the connection, say), not its permissions
            return CliError(f"Temporal refused the credentials: {problem}")
    return CliError(
        f"Temporal refused: {exc.message} Your credentials (--api-key / GANGFLOW_API_KEY) do not allow this in {where}."
    )


async def client_for(args: argparse.Namespace, artifacts: str | None = None) -> Client:
    """A client on the server that ``--address`` / ``--namespace`` (or their environment variables) name."""
    endpoint = endpoint_for(args)
    try:
        return Client(await connect(endpoint), artifacts)
    except CredentialsRefused as exc:  # reached, and refused: not a server to start
        raise CliError(str(exc)) from None
    except RuntimeError as exc:
        raise CliError(
            f"cannot reach Temporal at {endpoint.address} ({exc}); start one with 'gangflow dev' "
            "or pass --address / set GANGFLOW_ADDRESS"
        ) from None


def read_queue_file(path: str) -> QueueConfig:
    """A queue configuration file, validated (``load_queue_config``) before anything is contacted or
    started; a bad one ends the command with exit 2 and the field it gets wrong."""
    file = Path(path)
    if not file.is_file():
        raise CliError(f"{path}: no such file (expected a queue configuration, YAML)", EXIT_BAD_INPUT)
    try:
        return load_queue_config(file)
    except QueueConfigError as exc:
        raise CliError(queue_file_error(path, exc), EXIT_BAD_INPUT) from None


def queue_file_error(path: str, exc: Exception) -> str:
    """``FILE: field: problem`` (errors about the file itself already name it)."""
    text = str(exc)
    return text if text.startswith(f"{path}:") else f"{path}: {text}"


def stop_event() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def until_signalled() -> None:
    await stop_event().wait()


async def follow(client: Client, run_id: str, quiet: bool) -> Any:
    """Wait for the result, showing live progress; returns wire data or raises WorkflowFailureError.

    What the run waits for (``engine.approve``, ``engine.wait_for_input``) is printed once as a line with the
    command that answers it, not only in the spinner: the spinner is gone after Ctrl-C and never drawn where
    the output is not a terminal (a script's log), and a run that waits for a person would look hung."""
    waiter = asyncio.ensure_future(client.wait(run_id))
    if quiet:
        return await waiter
    told: set[str] = set()
    with console.status(f"{run_id}: starting") as spinner:
        while not waiter.done():
            progress = await client.progress(run_id)
            if progress:
                for line in waiting_lines(progress, run_id):
                    if line not in told:
                        told.add(line)
                        console.print(escape(line), soft_wrap=True)  # one line: it ends in a command to paste
                running = ", ".join(progress["running"]) or "—"
                waits = " · waiting for an answer" if progress.get("waiting") else ""
                spinner.update(f"{run_id}: running [bold]{escape(running)}[/] · {progress['done']} done{waits}")
            await asyncio.wait({waiter}, timeout=0.5)
    return waiter.result()
