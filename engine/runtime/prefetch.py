"""Load a run's code before its workflow task is timed: heavy imports never trip the deadlock detector.

Temporal fails a workflow task whose activation does not yield within 2 s ("Potential deadlock
detected"). The shell loads the user's module during its first activation, and a module with
``import torch`` at the top takes longer than that (1.2 s on an idle machine, several seconds under
load). Before each activation the worker decodes its payloads on the worker's event loop, outside the
timed part, through the client's payload codec. :class:`PrefetchCodec` is a codec that changes nothing:
for a payload that carries a gangflow envelope it loads the envelope's code in a thread (the event loop
keeps serving other runs), so the activation finds the module already imported.

Only workers prefetch: the CLI and the client never import user code from payloads they read.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.converter import DataConverter, PayloadCodec

from engine.artifacts.loader import LOADER
from engine.core.wire import CodeRef, Envelope

__all__ = ["PrefetchCodec", "prefetching_client", "prefetching_converter"]

#: how every envelope payload starts: a msgpack map of three entries whose first key is "code"
_ENVELOPE_PREFIX = b"\x83\xa4code"
_BINARY = b"binary/plain"


def _code_of(payload: Payload) -> CodeRef | None:
    """The code an envelope payload names, or None for any other payload (cheap for those)."""
    if not payload.data.startswith(_ENVELOPE_PREFIX) or payload.metadata.get("encoding") != _BINARY:
        return None
    try:
        return Envelope.decode(payload.data).code
    except Exception:  # not an envelope after all: the shell reports a malformed one itself
        return None


class PrefetchCodec(PayloadCodec):
    """Passes payloads through unchanged (after ``inner``, if given) and loads the code of envelopes."""

    def __init__(self, inner: PayloadCodec | None = None) -> None:
        self.inner = inner
        self._loaded: set[CodeRef] = set()

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return await self.inner.encode(payloads) if self.inner is not None else list(payloads)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        decoded = await self.inner.decode(payloads) if self.inner is not None else list(payloads)
        for payload in decoded:
            ref = _code_of(payload)
            if ref is not None and ref not in self._loaded:
                await self._prefetch(ref)
        return decoded

    async def _prefetch(self, ref: CodeRef) -> None:
        try:
            await asyncio.to_thread(LOADER.load, ref)
        except Exception:
            # Leave the error to the shell, which loads again and fails the run with a clear message.
            return
        self._loaded.add(ref)


def prefetching_converter(converter: DataConverter = DataConverter.default) -> DataConverter:
    """``converter`` with a codec that prefetches code (kept as is if it already does)."""
    if isinstance(converter.payload_codec, PrefetchCodec):
        return converter
    return dataclasses.replace(converter, payload_codec=PrefetchCodec(converter.payload_codec))


def prefetching_client(client: Client) -> Client:
    """The same connection, with a data converter whose codec prefetches code (for a worker)."""
    config = client.config()
    converter = prefetching_converter(config["data_converter"])
    if converter is config["data_converter"]:
        return client
    config["data_converter"] = converter
    return Client(**config)
