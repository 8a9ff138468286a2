"""The task runner: ``python -m engine.executor.task SPEC`` runs one plain task in a process of its own.

A worker runs a task that declares secrets here rather than in one of its threads, so that the secrets
live only in this process (its environment and private files), never in the worker's. It does what the
worker's thread would: load the task from the run's bundle, read the inputs, run the body, validate and
encode the result (uploading File outputs). The result goes to the spec's ``result_path``; a failure to
``error_path`` as JSON (the exception's type name, its message, whether retrying could help), which the
worker turns into the same typed failure an in-thread task gives. Output goes to stdout, which the worker
redacts into the task's log. Nothing here imports Temporal.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import sys
import traceback
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from engine.artifacts.loader import LOADER, CodeNotFoundError
from engine.artifacts.store import ArtifactStore
from engine.core.atomic import write_atomic
from engine.core.definitions import TaskDefinition
from engine.core.wire import Envelope
from engine.errors import GangflowError
from engine.types.codec import check_payload_size, pack, unpack

__all__ = ["call_body", "main"]


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


def _fail(spec: dict[str, Any], kind: str, message: str, non_retryable: bool) -> None:
    error = {"type": kind, "message": message, "non_retryable": non_retryable}
    write_atomic(spec["error_path"], json.dumps(error).encode(), durable=False)


def _run(spec: dict[str, Any]) -> int:
    envelope = Envelope.decode(spec["envelope"])
    try:
        store = ArtifactStore(envelope.run.artifacts)
        defn = LOADER.load(envelope.code, store)  # the store's own cached copy, as the worker's thread loads it
        if not isinstance(defn, TaskDefinition):
            raise CodeNotFoundError(f"{envelope.code.qualname} is not a @task")
        context = store.context()
        inputs = defn.interface.inputs_from_wire(envelope.inputs, context)
    except (GangflowError, CodeNotFoundError) as exc:
        _fail(spec, exc.kind if isinstance(exc, GangflowError) else "CodeNotFound", str(exc), True)
        return 1
    try:
        result = call_body(defn, inputs)
    except Exception as exc:
        traceback.print_exc()  # into the task's log
        # what Temporal makes of an exception raised in the worker: its class name, retried per the task's policy
        _fail(spec, type(exc).__name__, str(exc), False)
        return 1
    try:
        wire = defn.interface.output_to_wire(result, context)
        blob = check_payload_size(pack(wire), f"the return value of task {defn.name!r}")
    except GangflowError as exc:
        _fail(spec, exc.kind, str(exc), True)
        return 1
    write_atomic(spec["result_path"], blob, durable=False)
    return 0


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    spec = unpack(Path(args[0]).read_bytes())
    try:
        code = _run(spec)
    except BaseException as exc:  # SystemExit / KeyboardInterrupt from the body: a failure all the same
        traceback.print_exc()
        _fail(spec, type(exc).__name__, str(exc), False)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
