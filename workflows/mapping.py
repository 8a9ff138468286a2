"""``engine.map`` on Temporal: the items run in chunks, one :class:`MapChunk` child workflow per chunk.

One workflow running 10,000 activities would pass Temporal's history limits (10 K events warns, 50 K fails;
each activity costs ~3 events plus the workflow tasks around it). So the run's workflow starts one child per
``chunk_size`` items (default 1000: ~3,700 events per chunk measured, at most ~6,000 even if every completion
got a workflow task of its own) and waits for it; the run's own history grows by ~9 events per chunk. A chunk is
sized so that it never needs continue-as-new.

Chunks run **one after another**, each with the map's full ``concurrency``: the limit the author set holds
exactly (running chunks side by side would have to divide it, and a small remainder would leave chunks nearly
serial), at the cost of a short drain at each chunk boundary (under 1 % of a 1000-item chunk at concurrency 16).

Each item is one task call in the chunk, with the task's own tries (``workflows.calls.execute_plain``, the same
code as a task call in the run; a ``cache=True`` task looks each item up in the cache and records it, as
``workflows.caching`` does for a call), activity ids ``<task>-<item>#<try>``. A chunk returns its items' outcomes,
``[ok, result bytes | error text]``, in one payload; results that do not fit fail the chunk with a message that
says what to do. A cancelled run cancels the chunk it waits for (and so the chunk's activities); the chunks after
it never start. Child ids: ``<run>.map-<task>-<n>.<chunk>`` (``n`` counts the run's maps of that task, from 1;
chunks count from 0, chunk ``c`` holding items ``c * chunk_size`` onwards).
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError, is_cancelled_exception
from temporalio.workflow import ParentClosePolicy

from engine.core.definitions import TaskDefinition
from engine.core.mapping import DEFAULT_CHUNK_SIZE, settle
from engine.core.protocol import KIND_CALL, MAP_CHUNK_TYPE
from engine.core.wire import Envelope
from engine.errors import PayloadTooLargeError
from engine.types.codec import MAX_PAYLOAD_BYTES, check_payload_size, pack, unpack
from workflows.caching import cached_call
from workflows.calls import TaskFailed, code_ref, describe_failure, execute_plain, load_code
from workflows.glance import call_attributes

if TYPE_CHECKING:
    from workflows.shell import _TemporalDispatcher

__all__ = ["MapChunk", "run_map"]


def _too_large(what: str, size: int, items: int) -> ApplicationError:
    return ApplicationError(
        f"{what} are {size / 1e6:.1f} MB encoded, over Temporal's {MAX_PAYLOAD_BYTES / 1e6:.1f} MB payload limit: "
        f"pass a smaller chunk_size to engine.map (this chunk holds {items} items), or pass and return Files / "
        "Directories (they travel by reference)",
        type=PayloadTooLargeError.kind,
        non_retryable=True,
    )


async def run_map(
    dispatcher: _TemporalDispatcher,
    task: TaskDefinition,
    items: list[dict[str, Any]],
    concurrency: int,
    min_success_ratio: float,
    chunk_size: int | None,
) -> list[Any]:
    """The run's side of a map: encode the items, run the chunks in order, gather the outcomes."""
    size = chunk_size or DEFAULT_CHUNK_SIZE
    where = f"engine.map({task.name})"
    wires = [task.interface.inputs_to_wire(item) for item in items]
    key = f"map {task.name}"  # a space: never a task name, so this count is apart from the task's own calls
    dispatcher.calls[key] = number = dispatcher.calls.get(key, 0) + 1
    info = workflow.info()
    code, run = asdict(code_ref(task, dispatcher.envelope)), dispatcher.envelope.run.to_wire()
    results: list[Any] = [None] * len(items)
    failures: list[tuple[int, str]] = []
    for chunk, start in enumerate(range(0, len(items), size)):
        end = min(start + size, len(items))
        # an envelope, as a task call's is: the worker's prefetch loads the task's code before the chunk's first
        # workflow task is timed (engine.runtime.prefetch), so a heavy import cannot trip the deadlock detector
        chunk_inputs = {"start": start, "items": wires[start:end], "concurrency": concurrency}
        spec = pack({"code": code, "inputs": chunk_inputs, "run": run})
        if len(spec) > MAX_PAYLOAD_BYTES:
            raise _too_large(f"the inputs of {where} chunk {chunk} (items {start}-{end - 1})", len(spec), end - start)
        dispatcher.shell.task_started(task.name)
        try:
            blob = await workflow.execute_child_workflow(
                MAP_CHUNK_TYPE,
                spec,
                id=f"{info.workflow_id}.map-{task.name}-{number}.{chunk}",
                task_queue=info.task_queue,
                result_type=bytes,
                static_summary=f"engine.map({task.name}): items {start}-{end - 1} of {len(items)}",
                search_attributes=call_attributes(KIND_CALL, dispatcher.envelope.run.tenant),
                # a terminated or timed-out run cancels its chunks (a cancelled one does so by cancelling the wait)
                parent_close_policy=ParentClosePolicy.REQUEST_CANCEL,
            )
        except ChildWorkflowError as err:
            dispatcher.shell.task_finished(task.name, failed=True)
            if is_cancelled_exception(err):
                raise
            raise ApplicationError(
                f"{where} chunk {chunk} failed: {describe_failure(err)}", type="MapFailed", non_retryable=True
            ) from err
        dispatcher.shell.task_finished(task.name, failed=False)
        for offset, (ok, value) in enumerate(unpack(blob)):
            if ok:
                results[start + offset] = task.interface.output_from_wire(unpack(value))
            else:
                failures.append((start + offset, str(value)))
    return settle(task.name, results, failures, min_success_ratio)


async def _item(task: TaskDefinition, envelope: Envelope, index: int) -> list[Any]:
    """One item's outcome: ``[True, result bytes]`` or ``[False, what went wrong]``."""
    call = f"{task.name}-{index}"
    blob = envelope.encode(f"the inputs of task {task.name!r} (item {index})")
    try:
        if task.cache:  # as a call of the task in the run would (workflows/caching.py)
            result = await cached_call(
                envelope.run,
                task,
                envelope.inputs,
                lambda: call,
                lambda: execute_plain(task, blob, call, f"{task.name} [item {index}]"),
            )
        else:
            result = await execute_plain(task, blob, call, f"{task.name} [item {index}]")
        return [True, result]
    except (ActivityError, TaskFailed) as failed:
        err = failed.error if isinstance(failed, TaskFailed) else failed
        if is_cancelled_exception(err):
            raise
        tries = failed.tries if isinstance(failed, TaskFailed) else 1
        after = f" after {tries} attempts" if tries > 1 else ""
        return [False, f"task {task.name!r} failed{after}: {describe_failure(err)}"]


@workflow.defn(name=MAP_CHUNK_TYPE, sandboxed=False)
class MapChunk:
    """Runs one chunk of an engine.map: its items as task calls, ``concurrency`` at a time."""

    @workflow.run
    async def run(self, spec: bytes) -> bytes:
        # pinned as a run is: on a tenant's worker a chunk started by hand still runs as that tenant, in its root
        defn, envelope = load_code(Envelope.decode(spec), TaskDefinition)
        code, run, data = envelope.code, envelope.run, envelope.inputs
        start, inputs, concurrency = int(data["start"]), list(data["items"]), int(data["concurrency"])
        outcomes: list[list[Any]] = [[False, "not run"]] * len(inputs)
        pending = iter(range(len(inputs)))

        async def worker() -> None:
            for k in pending:  # one shared iterator: each item goes to exactly one worker, in input order
                outcomes[k] = await _item(defn, Envelope(code, inputs[k], run), start + k)

        try:
            await asyncio.gather(*(worker() for _ in range(min(concurrency, len(inputs)))))
        except PayloadTooLargeError as exc:
            raise ApplicationError(str(exc), type=exc.kind, non_retryable=True) from exc
        blob = pack(outcomes)
        try:
            return check_payload_size(blob, "")
        except PayloadTooLargeError:
            last = start + len(inputs) - 1
            raise _too_large(
                f"the results of engine.map({defn.name}) items {start}-{last}", len(blob), len(inputs)
            ) from None
