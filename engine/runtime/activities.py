"""The task activity: one dynamic Temporal activity that runs any plain ``@task``.

Its activity type is the task's name (what the Web UI shows). It loads the task's code from the run's
bundle, downloads File / Directory inputs, runs the body in a thread while heartbeating (so a worker
that dies is noticed within the heartbeat timeout and a cancel arrives promptly), captures the task's
output into the run's log folder, validates and encodes the result, and uploads File / Directory outputs.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import os
import tempfile
from collections.abc import Sequence
from typing import Any

from temporalio import activity
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

from engine.artifacts.store import ArtifactStore
from engine.core.definitions import TaskDefinition
from engine.core.wire import Envelope
from engine.errors import GangflowError
from engine.runtime import logs
from engine.runtime.code import LOADER, CodeNotFoundError
from engine.types.codec import check_payload_size, pack

__all__ = ["run_task", "store_for"]


@functools.lru_cache(maxsize=32)
def store_for(root: str) -> ArtifactStore:
    return ArtifactStore(root)


def _call(defn: TaskDefinition, inputs: dict[str, Any]) -> Any:
    """Runs in a worker thread: the task body, with its own event loop if it is async."""
    if defn.is_async:
        return asyncio.run(defn.fn(**inputs))
    result = defn.fn(**inputs)
    if inspect.isawaitable(result):
        return asyncio.run(result)  # type: ignore[arg-type]
    return result


async def _run_heartbeating(defn: TaskDefinition, inputs: dict[str, Any], log: Any) -> Any:
    info = activity.info()
    with logs.capture(log):  # the copied context carries the log into the task's thread
        context = contextvars.copy_context()
    work = asyncio.ensure_future(asyncio.to_thread(context.run, _call, defn, inputs))
    if info.is_local:
        return await work
    interval = max(0.5, min(5.0, defn.heartbeat_timeout.total_seconds() / 4))
    while True:
        done, _ = await asyncio.wait({work}, timeout=interval)
        if done:
            return work.result()
        activity.heartbeat()


def _open_log(store: ArtifactStore, envelope: Envelope, defn: TaskDefinition) -> tuple[Any, str | None]:
    info = activity.info()
    name = f"{defn.name}.{info.activity_id}.attempt{info.attempt}.log"
    if store.local:
        path = store.log_path(envelope.run.run_id, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return open(path, "w", encoding="utf-8", buffering=1), None
    handle = tempfile.NamedTemporaryFile("w", suffix=".log", delete=False, encoding="utf-8")  # noqa: SIM115
    return handle, store.log_path(envelope.run.run_id, name)


@activity.defn(dynamic=True)
async def run_task(args: Sequence[RawValue]) -> bytes:
    envelope = Envelope.decode(activity.payload_converter().from_payload(args[0].payload, bytes))
    try:
        defn = LOADER.load(envelope.code)
    except CodeNotFoundError as exc:
        raise ApplicationError(str(exc), type="CodeNotFound", non_retryable=True) from exc
    if not isinstance(defn, TaskDefinition):
        raise ApplicationError(f"{envelope.code.qualname} is not a @task", type="CodeNotFound", non_retryable=True)
    store = store_for(envelope.run.artifacts)
    context = store.context()
    try:
        inputs = defn.interface.inputs_from_wire(envelope.inputs, context)
    except GangflowError as exc:
        raise ApplicationError(str(exc), type=exc.kind, non_retryable=True) from exc
    log, remote = _open_log(store, envelope, defn)
    try:
        result = await _run_heartbeating(defn, inputs, log)
    finally:
        log.close()
        if remote is not None:
            store.fs.put_file(log.name, remote)
            os.unlink(log.name)
    try:
        return check_payload_size(
            pack(defn.interface.output_to_wire(result, context)), f"the return value of task {defn.name!r}"
        )
    except GangflowError as exc:
        raise ApplicationError(str(exc), type=exc.kind, non_retryable=True) from exc
