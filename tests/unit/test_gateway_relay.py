"""engine.runtime.relay: a tenant worker's TCP port inside its network namespace, relayed byte for byte to the
gateway's Unix socket; before the gateway listens, a connection is closed at once (the client retries)."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from engine.runtime.relay import start_relay


def test_the_relay_copies_both_ways_and_closes_when_nothing_listens() -> None:
    async def scenario() -> None:
        folder = Path(tempfile.mkdtemp(prefix="relay-"))  # short: a socket path has 108 bytes at most
        path = str(folder / "gw.sock")
        relay, address = await start_relay(path)
        host, port = address.split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        assert await reader.read() == b""  # no gateway yet: closed
        writer.close()

        async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            while data := await r.read(1 << 16):
                w.write(data.upper())
                await w.drain()
            w.close()

        gateway = await asyncio.start_unix_server(echo, path)
        reader, writer = await asyncio.open_connection(host, int(port))
        payload = b"x" * 200_000
        writer.write(payload)
        await writer.drain()
        got = await reader.readexactly(len(payload))
        assert got == payload.upper()
        writer.close()
        gateway.close()
        relay.close()

    asyncio.run(scenario())
