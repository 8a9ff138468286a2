"""What every ``gangflow`` command shares: exit codes, the error that ends a command, the connection to
Temporal, reading a queue configuration, waiting for Ctrl-C, and following a run to its end."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from pathlib import Path
from typing import Any

from temporalio.service import RPCError, RPCStatusCode

from engine.client import Client
from engine.errors import InputError
from engine.runtime import Endpoint, connect
from engine.scheduling.config import QueueConfig, QueueConfigError, load_queue_config

from .render import console

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_FAILED",
    "EXIT_OK",
    "CliError",
    "client_for",
    "endpoint_for",
    "follow",
    "queue_file_error",
    "read_queue_file",
    "refused",
    "stop_event",
    "until_signalled",
]

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


class CliError(Exception):
    """Ends a command with one line on stderr and ``code`` as the exit status."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


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
    if exc.status not in (RPCStatusCode.PERMISSION_DENIED, RPCStatusCode.UNAUTHENTICATED):
        raise exc
    where = "this namespace"
    with contextlib.suppress(CliError):
        where = f"namespace {endpoint_for(args).namespace}" if hasattr(args, "api_key") else where
    return CliError(
        f"Temporal refused: {exc.message} Your credentials (--api-key / GANGFLOW_API_KEY) do not allow this in {where}."
    )


async def client_for(args: argparse.Namespace, artifacts: str | None = None) -> Client:
    """A client on the server that ``--address`` / ``--namespace`` (or their environment variables) name."""
    endpoint = endpoint_for(args)
    try:
        return Client(await connect(endpoint), artifacts)
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
    """Wait for the result, showing live progress; returns wire data or raises WorkflowFailureError."""
    waiter = asyncio.ensure_future(client.wait(run_id))
    if quiet:
        return await waiter
    with console.status(f"{run_id}: starting") as spinner:
        while not waiter.done():
            progress = await client.progress(run_id)
            if progress:
                running = ", ".join(progress["running"]) or "—"
                spinner.update(f"{run_id}: running [bold]{running}[/] · {progress['done']} done")
            await asyncio.wait({waiter}, timeout=0.5)
    return waiter.result()
