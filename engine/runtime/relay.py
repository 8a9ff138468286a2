"""A tenant worker's one way out of its network namespace: a local TCP port relayed to the gateway's socket.

``gangflow dev --auth`` run as root starts each tenant's worker in a network namespace of its own, where
nothing of the host's loopback answers: not the Temporal dev server's gRPC and HTTP ports, not the node
agents, not another tenant's worker. The worker (and every task of it) reaches Temporal only through the
authorizing gateway, whose Unix socket is given in ``$GANGFLOW_GATEWAY_SOCKET``: the worker listens on
``127.0.0.1`` inside its namespace and copies bytes both ways (gRPC's HTTP/2 passes through untouched), since
Temporal's client takes a TCP address only.
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["GATEWAY_SOCKET_ENV", "start_relay"]

GATEWAY_SOCKET_ENV = "GANGFLOW_GATEWAY_SOCKET"
_CHUNK = 1 << 16


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()


async def start_relay(socket_path: str) -> tuple[asyncio.Server, str]:
    """A listener on 127.0.0.1 (a free port) relaying each connection to ``socket_path``; returns it and its
    ``host:port``. A connection made before the gateway listens is closed at once (the client retries)."""

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_unix_connection(socket_path)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    return server, f"{host}:{port}"
