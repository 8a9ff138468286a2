"""The task activity: one dynamic Temporal activity that runs any plain ``@task``.

Its activity type is the task's name (what the Web UI shows). It loads the task's code from the run's
bundle, downloads File / Directory inputs, runs the body in a thread while heartbeating (so a worker
that dies is noticed within the heartbeat timeout and a cancel arrives promptly), captures the task's
output into the run's log folder, validates and encodes the result, and uploads File / Directory outputs.
A task that declares secrets runs in a process of its own instead (engine.runtime.task_process).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import IO

from temporalio import activity
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from engine.artifacts.store import ArtifactStore
from engine.core.wire import Envelope
from engine.errors import GangflowError
from engine.executor.body import TaskBody
from engine.runtime import logs
from engine.runtime.task_process import TaskProcess, run_in_process

__all__ = ["configure_threads", "run_task", "store_for"]


@functools.lru_cache(maxsize=32)
def store_for(root: str) -> ArtifactStore:
    return ArtifactStore(root)


_threads: ThreadPoolExecutor | None = None


def configure_threads(count: int) -> None:
    """Size the pool that runs task bodies to the worker's activity limit (asyncio's default pool has
    only cores + 4 threads, which would cap a 2-core worker at 6 concurrent tasks)."""
    global _threads
    if _threads is None or _threads._max_workers != count:
        _threads = ThreadPoolExecutor(max_workers=count, thread_name_prefix="gangflow-task")


class _TaskLog:
    """A task attempt's log file, created on the first write (most tasks print nothing; opening a file
    per task would be the biggest per-task cost of a fan-out). Remote stores get the file on close."""

    def __init__(self, store: ArtifactStore, run_id: str, task: str, info: activity.Info) -> None:
        self.store = store
        self.target = store.log_path(run_id, f"{task}.{info.activity_id}.attempt{info.attempt}.log")
        self.handle: IO[str] | None = None

    def write(self, text: str) -> int:
        if self.handle is None:
            if self.store.local:
                os.makedirs(os.path.dirname(self.target), exist_ok=True)
                self.handle = open(self.target, "w", encoding="utf-8", buffering=1)  # noqa: SIM115
            else:
                self.handle = tempfile.NamedTemporaryFile("w", suffix=".log", delete=False, encoding="utf-8")  # noqa: SIM115
        return self.handle.write(text)

    def flush(self) -> None:
        if self.handle is not None:
            self.handle.flush()

    def close(self) -> None:
        if self.handle is None:
            return
        self.handle.close()
        if not self.store.local:
            self.store.fs.put_file(self.handle.name, self.target)
            os.unlink(self.handle.name)


def _non_retryable(exc: GangflowError) -> ApplicationError:
    """A gangflow error as its activity failure: its kind, never retried unless it is (an undelivered input)."""
    return ApplicationError(str(exc), type=exc.kind, non_retryable=not exc.retryable)


def _execute(envelope: Envelope, info: activity.Info, blob: bytes, child: TaskProcess) -> bytes:
    """Everything that blocks, on a task thread, so the worker's event loop (which also runs workflows
    and heartbeats) never waits on code loading, downloads, the task body or uploads."""
    try:
        body = TaskBody(envelope, store_for(envelope.run.artifacts))  # the bundle must be in the run's store
        defn, store = body.defn, body.store
        if defn.secrets:  # its own process, the only one that gets the values (engine.runtime.task_process)
            log = _TaskLog(store, envelope.run.run_id, defn.name, info)
            try:
                return run_in_process(envelope, blob, defn, log, child)
            finally:
                log.close()
        inputs = body.inputs()
    except GangflowError as exc:  # CodeNotFoundError among them
        raise _non_retryable(exc) from exc
    log = _TaskLog(store, envelope.run.run_id, defn.name, info)
    try:
        with logs.capture(log):
            result = body.call(inputs)
    finally:
        log.close()
    try:
        return body.encode(result)
    except GangflowError as exc:
        raise _non_retryable(exc) from exc


@activity.defn(dynamic=True)
async def run_task(args: Sequence[RawValue]) -> bytes:
    blob = activity.payload_converter().from_payload(args[0].payload, bytes)
    envelope = Envelope.decode(blob)
    info = activity.info()
    loop = asyncio.get_running_loop()
    child = TaskProcess()  # a task with secrets runs in it: a cancel stops it (a thread cannot be stopped)
    work = loop.run_in_executor(_threads, contextvars.copy_context().run, _execute, envelope, info, blob, child)
    try:
        if info.is_local or not info.heartbeat_timeout:
            return await work
        interval = max(0.5, min(5.0, info.heartbeat_timeout.total_seconds() / 4))
        while True:
            done, _ = await asyncio.wait({work}, timeout=interval)
            if done:
                return work.result()
            activity.heartbeat()
    except asyncio.CancelledError:
        await asyncio.shield(asyncio.to_thread(child.stop))
        details = activity.cancellation_details()
        if details is not None and details.not_found:
            # the run is gone (cancelled or terminated: a run does not wait for its tasks' cancel), and the
            # server drops what this activity answers; benign, so the SDK does not log it as a task's failure
            # with a traceback at every cancelled run
            raise ApplicationError(
                "the run ended: its task was stopped", non_retryable=True, category=ApplicationErrorCategory.BENIGN
            ) from None
        raise
