"""What every ``gangflow`` command shares: exit codes, the error that ends a command, the connection to
Temporal, waiting for Ctrl-C, and following a run to its end."""

from __future__ import annotations

import argparse
import asyncio
import signal
from typing import Any

from engine.client import Client
from engine.runtime import Endpoint, connect

from .render import console

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_FAILED",
    "EXIT_OK",
    "CliError",
    "client_for",
    "follow",
    "stop_event",
    "until_signalled",
]

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


class CliError(Exception):
    """Ends a command with one line on stderr and ``code`` as the exit status."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


async def client_for(args: argparse.Namespace, artifacts: str | None = None) -> Client:
    """A client on the server that ``--address`` / ``--namespace`` (or their environment variables) name."""
    endpoint = Endpoint.resolve(args.address, args.namespace)
    try:
        return Client(await connect(endpoint), artifacts)
    except RuntimeError as exc:
        raise CliError(
            f"cannot reach Temporal at {endpoint.address} ({exc}); start one with 'gangflow dev' "
            "or pass --address / set GANGFLOW_ADDRESS"
        ) from None


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
