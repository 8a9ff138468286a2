"""The task-body runner: the one place a task's body is called, wherever it runs.

A plain task runs in a worker's thread (engine.runtime.activities) or, when it has secrets, in a process of
its own (engine.executor.task); a distributed task runs in each of its rank processes (engine.executor.rank).
All three go through ``TaskBody``: load the task from the run's code bundle, read its inputs (downloading
File / Directory values), call the body (with its own event loop if it is async), and validate and encode
the result (uploading File / Directory outputs). What differs between them is only how a failure is
reported and where the result goes, so a sandbox around the body has exactly one place to go.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from engine.artifacts.loader import LOADER, CodeNotFoundError
from engine.artifacts.store import OUTBOX_ENV, ArtifactStore
from engine.core.definitions import TaskDefinition
from engine.core.wire import CodeRef, Envelope
from engine.errors import InputUnavailableError
from engine.types.codec import check_payload_size, pack
from engine.types.files import Artifact

__all__ = ["TaskBody", "call_body", "deliver_code"]


def deliver_code(code: CodeRef, store: ArtifactStore) -> None:
    """Fetch, verify and extract the call's code bundle into the store's cache, before anything imports it: a
    failure here (OSError) is the platform's, ``InputUnavailableError``, while an OSError raised by the user's
    module when it is imported stays the user's."""
    try:
        LOADER.folder_for(code, store)
    except OSError as exc:
        raise InputUnavailableError(f"cannot deliver the code bundle {code.bundle}: {exc}") from exc


def call_body(defn: TaskDefinition, inputs: dict[str, Any]) -> Any:
    """The task body, with its own event loop if it is async."""
    if defn.is_async:
        return asyncio.run(defn.fn(**inputs))
    result = defn.fn(**inputs)
    if inspect.isawaitable(result):
        return asyncio.run(_awaited(result))
    return result


async def _awaited(value: Awaitable[Any]) -> Any:
    """asyncio.run takes a coroutine; a sync body may return any awaitable."""
    return await value


class TaskBody:
    """One task call's body, loaded from the envelope's code bundle in the run's store.

    Loading raises ``CodeNotFoundError`` (no such task) and ``inputs`` / ``encode`` raise ``GangflowError``
    (a value that does not match its type): the callers report both as never worth retrying. A bundle or input
    the store cannot deliver (unreachable, missing, corrupt, a cache that cannot be written) raises
    ``InputUnavailableError``: the platform's fault, a system failure in a rank (engine.errors).
    """

    def __init__(self, envelope: Envelope, store: ArtifactStore | None = None) -> None:
        self.envelope = envelope
        self.store = store if store is not None else ArtifactStore(envelope.run.artifacts)
        if outbox := os.environ.get(OUTBOX_ENV):  # a sandboxed rank: the node agent publishes its outputs
            self.store.outbox = Path(outbox)
        # the store's own cached copy of the bundle: the same code in a worker's thread and in a rank
        deliver_code(envelope.code, self.store)
        defn = LOADER.load(envelope.code, self.store)
        if not isinstance(defn, TaskDefinition):
            raise CodeNotFoundError(f"{envelope.code.qualname} is not a @task")
        self.defn = defn
        self._context: dict[str, Any] | None = None

    @property
    def context(self) -> dict[str, Any]:
        if self._context is None:
            self._context = {**self.store.context(), "fetch": self._fetch}
        return self._context

    def _fetch(self, art: Artifact) -> str:
        try:
            return self.store.fetch(art)
        except OSError as exc:
            raise InputUnavailableError(f"cannot deliver the input {art.name!r} ({art.uri}): {exc}") from exc

    def inputs(self) -> dict[str, Any]:
        """The call's inputs as the body's parameters (File / Directory values downloaded)."""
        return self.defn.interface.inputs_from_wire(self.envelope.inputs, self.context)

    def call(self, inputs: dict[str, Any]) -> Any:
        return call_body(self.defn, inputs)

    def encode(self, result: Any) -> bytes:
        """The result, validated against the declared output type and encoded (File / Directory uploaded)."""
        wire = self.defn.interface.output_to_wire(result, self.context)
        return check_payload_size(pack(wire), f"the return value of task {self.defn.name!r}")
