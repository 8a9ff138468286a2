"""What happened in a run, read from its Temporal history: one record per task call, and the failure.

Used by ``gangflow status`` and the tests; works on finished runs and without any worker running.

Attempts are 0-based everywhere (DESIGN.md, "Names"): a plain task's first try is attempt 0 (Temporal counts
from 1, and a retried call's activity id ends ``#<try>`` counting from 1), and a distributed task's
attempts are its gang's (``GANGFLOW_ATTEMPT``), filled in by ``Client.status`` from the gang's attempt list.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.api.failure.v1 import Failure
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHandle
from temporalio.converter import DataConverter, PayloadCodec

from engine.core.protocol import CACHE_HIT, CACHE_LOOKUP, CACHE_RECORD, GANG_GOODPUT, MAP_CHUNK_TYPE, parse_hit_id

__all__ = ["TaskRecord", "failure_attempts", "format_failure", "read_tasks"]


@dataclass
class TaskRecord:
    name: str
    kind: str  # "task", "lightweight", "gang", "map" (an engine.map chunk: ``name`` is its items' task) or "workflow"
    status: str = "scheduled"  # scheduled, running, completed, failed, timed out, cancelled
    attempt: int = 0  # 0-based: the try (plain task) or gang attempt (distributed task) that ran last
    scheduled: datetime | None = None
    started: datetime | None = None
    finished: datetime | None = None
    error: str | None = None
    child_id: str | None = None  # the child workflow (GangTask for a distributed task)
    detail: str | None = None  # live state, e.g. why a distributed task is still pending
    cached_from: str | None = None  # status "cached": the run whose result this call reused
    call: str | None = None  # a distributed task call's name in the run ("train-1": its logs, ranks, checkpoints)
    #: a distributed task call's attempts, oldest first: {"attempt", "ended", "kind", "duration_s", "first_step",
    #: "last_step", ...} (``Client.status``)
    attempts: list[dict[str, Any]] = field(default_factory=list)
    #: a distributed task call's priority class as its gang asked for it (its GangSpec, in the run's own history);
    #: None: it named none (the cluster's default class) or it could not be read
    priority: str | None = None

    @property
    def seconds(self) -> float | None:
        begin = self.started or self.scheduled
        return (self.finished - begin).total_seconds() if begin and self.finished else None


def format_failure(failure: Failure, *, traces: bool = True) -> str:
    """The failure chain as text: each cause on its own line, with stack traces when asked."""
    lines: list[str] = []
    current: Failure | None = failure
    while current is not None and current.ByteSize():
        kind = current.application_failure_info.type if current.HasField("application_failure_info") else ""
        lines.append(f"{kind + ': ' if kind else ''}{current.message}")
        if traces and current.stack_trace:
            lines.append("  " + current.stack_trace.strip().replace("\n", "\n  "))
        current = current.cause if current.HasField("cause") else None
    return "\n".join(lines)


def _local_activity_data(event: HistoryEvent) -> dict[str, Any]:
    try:
        data = json.loads(event.marker_recorded_event_attributes.details["data"].payloads[0].data)
    except (KeyError, IndexError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _local_activity_name(event: HistoryEvent) -> str:
    return str(_local_activity_data(event).get("activity_type") or "lightweight task")


def _cache_marker(event: HistoryEvent, when: datetime) -> TaskRecord | bool | None:
    """A task cache local activity (workflows/caching.py): False when it is none; None for a lookup or a record
    (bookkeeping, not a task call, as the run's goodput look is); a "cached" record for a hit, whose id names the
    task and the source run."""
    data = _local_activity_data(event)
    kind = str(data.get("activity_type") or "")
    if kind == GANG_GOODPUT:  # the run's look at a finished gang's ledger (engine.runtime.gang_goodput): no task
        return None
    if kind not in (CACHE_LOOKUP, CACHE_RECORD, CACHE_HIT):
        return False
    hit = parse_hit_id(str(data.get("activity_id") or "")) if kind == CACHE_HIT else None
    if hit is None:
        return None
    task_kind, name, source = hit
    return TaskRecord(name, task_kind, status="cached", scheduled=when, finished=when, cached_from=source)


async def _spec_priority(payload: Payload | None, codec: PayloadCodec | None, *, nexus: bool) -> str | None:
    """The priority class in a gang's input as the run sent it: a GangTask child's first argument (a GangSpec)
    or a Nexus ``run_gang`` call's (a GangCall holding it: ``nexus``). None where it names none or cannot be
    read (a codec it needs that this client lacks): usage counts it under the default class then."""
    if payload is None:
        return None
    try:
        if codec is not None:
            payload = (await codec.decode([payload]))[0]
        value = DataConverter.default.payload_converter.from_payload(payload)
    except Exception:  # sealed with a key this client lacks, or not JSON: the priority is worth less than the rest
        return None
    spec = value.get("spec") if nexus and isinstance(value, dict) else value
    priority = spec.get("priority") if isinstance(spec, dict) else None
    return priority if isinstance(priority, str) else None


async def _open(failure: Failure, codec: PayloadCodec | None) -> Failure:
    """The failure as its sender wrote it: with encryption on (engine.runtime.encryption) its message and stack
    trace travel sealed in ``encoded_attributes``, for each cause of the chain."""
    if codec is None:
        return failure
    opened = Failure()
    opened.CopyFrom(failure)
    await codec.decode_failure(opened)
    current: Failure | None = opened
    while current is not None:
        if current.HasField("encoded_attributes"):
            with contextlib.suppress(Exception):  # not the default converter's form: leave it as it is
                attributes = DataConverter.default.payload_converter.from_payload(current.encoded_attributes)
                current.message = str(attributes.get("message", current.message))
                current.stack_trace = str(attributes.get("stack_trace", current.stack_trace))
        current = current.cause if current.HasField("cause") else None
    return opened


async def read_tasks(
    handle: WorkflowHandle[Any, Any], codec: PayloadCodec | None = None
) -> tuple[list[TaskRecord], str | None]:
    """Task records in scheduling order, and the run's failure text if it failed (``codec``: the client's, to
    open sealed failures)."""
    records: dict[int, TaskRecord] = {}
    calls: dict[str, TaskRecord] = {}  # "<call>" of activity ids "<call>#<try>": one record per task call
    failure: str | None = None
    async for event in handle.fetch_history_events():
        et, when = event.event_type, event.event_time.ToDatetime()
        if et == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled = event.activity_task_scheduled_event_attributes
            call, sep, tries = scheduled.activity_id.rpartition("#")
            earlier = calls.get(call) if sep else None
            if earlier is not None and tries.isdigit():  # the shell tried this call again
                earlier.status, earlier.attempt, earlier.finished = "scheduled", int(tries) - 1, None
                records[event.event_id] = earlier
                continue
            records[event.event_id] = TaskRecord(scheduled.activity_type.name, "task", scheduled=when)
            if sep:
                calls[call] = records[event.event_id]
        elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started = event.activity_task_started_event_attributes
            rec = records[started.scheduled_event_id]
            rec.status, rec.started = "running", when
            rec.attempt = max(rec.attempt, started.attempt - 1)
            if started.HasField("last_failure"):
                rec.error = format_failure(await _open(started.last_failure, codec), traces=False)
        elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            rec = records[event.activity_task_completed_event_attributes.scheduled_event_id]
            rec.status, rec.finished, rec.error = "completed", when, None
        elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
            failed = event.activity_task_failed_event_attributes
            rec = records[failed.scheduled_event_id]
            rec.status, rec.finished, rec.error = "failed", when, format_failure(await _open(failed.failure, codec))
        elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
            timed_out = event.activity_task_timed_out_event_attributes
            rec = records[timed_out.scheduled_event_id]
            rec.status, rec.finished = "timed out", when
            rec.error = format_failure(await _open(timed_out.failure, codec), traces=False)
        elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED:
            rec = records[event.activity_task_canceled_event_attributes.scheduled_event_id]
            rec.status, rec.finished = "cancelled", when
        elif (
            et == EventType.EVENT_TYPE_MARKER_RECORDED
            and event.marker_recorded_event_attributes.marker_name.startswith("core_local_activity")
        ):
            marker = event.marker_recorded_event_attributes
            cached = _cache_marker(event, when)
            if cached is not False:
                if isinstance(cached, TaskRecord):
                    records[event.event_id] = cached
                continue
            rec = TaskRecord(_local_activity_name(event), "lightweight", scheduled=when, finished=when)
            rec.status = "failed" if marker.HasField("failure") else "completed"
            rec.error = format_failure(await _open(marker.failure, codec)) if marker.HasField("failure") else None
            records[event.event_id] = rec
        elif et == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED:
            child = event.start_child_workflow_execution_initiated_event_attributes
            task = child.memo.fields.get("gangflow_task")
            name, kind = (json.loads(task.data), "gang") if task is not None else (child.workflow_type.name, "workflow")
            chunk = _MAP_CHUNK_ID.search(child.workflow_id) if name == MAP_CHUNK_TYPE else None
            detail = None
            if chunk:  # an engine.map chunk: named after its items' task, as the author wrote it and its logs are
                name, kind, detail = chunk["task"], "map", f"chunk {chunk['chunk']}"
            records[event.event_id] = TaskRecord(name, kind, scheduled=when, child_id=child.workflow_id, detail=detail)
            if kind == "gang":
                first = child.input.payloads[0] if child.input.payloads else None
                records[event.event_id].priority = await _spec_priority(first, codec, nexus=False)
        elif et == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED:
            rec = records[event.child_workflow_execution_started_event_attributes.initiated_event_id]
            rec.status, rec.started = "running", when
        elif et in _CHILD_CLOSED:
            status, attr = _CHILD_CLOSED[et]
            closed = getattr(event, attr)
            rec = records[closed.initiated_event_id]
            rec.status, rec.finished = status, when
            if et == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_FAILED:
                rec.error = format_failure(await _open(closed.failure, codec))
        elif et == EventType.EVENT_TYPE_NEXUS_OPERATION_SCHEDULED:  # a gang in the platform (isolated layout)
            op = event.nexus_operation_scheduled_event_attributes
            name = op.nexus_header.get("gangflow-task") or op.operation
            records[event.event_id] = TaskRecord(name, "gang", scheduled=when)
            given = op.input if op.HasField("input") else None
            records[event.event_id].priority = await _spec_priority(given, codec, nexus=True)
        elif et == EventType.EVENT_TYPE_NEXUS_OPERATION_STARTED:
            rec = records[event.nexus_operation_started_event_attributes.scheduled_event_id]
            rec.status, rec.started = "running", when
        elif et in _NEXUS_CLOSED:
            status, attr = _NEXUS_CLOSED[et]
            closed = getattr(event, attr)
            rec = records[closed.scheduled_event_id]
            rec.status, rec.finished = status, when
            if et in (EventType.EVENT_TYPE_NEXUS_OPERATION_FAILED, EventType.EVENT_TYPE_NEXUS_OPERATION_TIMED_OUT):
                rec.error = format_failure(await _open(closed.failure, codec))
        elif et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
            failure = format_failure(await _open(event.workflow_execution_failed_event_attributes.failure, codec))
        elif et in _RUN_ENDED:
            # the run was cancelled, terminated or timed out with calls open: their own end is never recorded
            # here (the run does not wait for it), and they were stopped with it, not left "scheduled"
            for rec in records.values():
                if rec.status in ("scheduled", "running"):
                    rec.status, rec.finished = _RUN_ENDED[et], when
    tasks = list({id(r): r for r in records.values()}.values())
    _name_calls(tasks, handle.id)
    return tasks, failure


def _name_calls(tasks: list[TaskRecord], run_id: str) -> None:
    """Each distributed task call's name in the run: its GangTask's id less the run's, or (a gang behind a
    Nexus operation, whose id this namespace does not see) the task's name and its call number, as the run's
    workflow numbers them (a cache hit launched no gang and takes no number)."""
    counts: dict[str, int] = {}
    for record in tasks:
        if record.kind != "gang" or record.status == "cached":
            continue
        counts[record.name] = counts.get(record.name, 0) + 1
        prefix = f"{run_id}."
        if record.child_id and record.child_id.startswith(prefix):
            record.call = record.child_id[len(prefix) :]
        elif record.child_id is None:
            record.call = f"{record.name}-{counts[record.name]}"


#: one attempt of a gang's failure text (workflows/gang.py ``_summary``): "  attempt 1 [system] node n1 lost ..."
_ATTEMPT_LINE = re.compile(r"^\s+attempt (\d+) \[(\w+)\] (.*)$")


def failure_attempts(error: str | None) -> list[dict[str, Any]]:
    """The failed attempts a gang's failure lists (where its own attempt list cannot be read: a tenant's gang
    lives in the platform's namespace), as ``{"attempt", "kind", "reason"}``."""
    found: dict[int, dict[str, Any]] = {}
    for line in (error or "").splitlines():
        match = _ATTEMPT_LINE.match(line)
        if match:  # the innermost cause repeats the list: the first mention of each attempt is enough
            found.setdefault(int(match[1]), {"attempt": int(match[1]), "kind": match[2], "reason": match[3]})
    return [found[a] for a in sorted(found)]


#: an engine.map chunk's workflow id: ``<run>.map-<task>-<n>.<chunk>`` (``workflows.mapping``)
_MAP_CHUNK_ID = re.compile(r"\.map-(?P<task>.+)-\d+\.(?P<chunk>\d+)$")
_CHILD_CLOSED = {
    EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED: (
        "completed",
        "child_workflow_execution_completed_event_attributes",
    ),
    EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_FAILED: (
        "failed",
        "child_workflow_execution_failed_event_attributes",
    ),
    EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_CANCELED: (
        "cancelled",
        "child_workflow_execution_canceled_event_attributes",
    ),
    EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_TIMED_OUT: (
        "timed out",
        "child_workflow_execution_timed_out_event_attributes",
    ),
    EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_TERMINATED: (
        "terminated",
        "child_workflow_execution_terminated_event_attributes",
    ),
}
#: how a run's open calls end when the run itself ends so (``read_tasks``)
_RUN_ENDED = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED: "cancelled",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED: "terminated",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT: "timed out",
}
_NEXUS_CLOSED = {
    EventType.EVENT_TYPE_NEXUS_OPERATION_COMPLETED: ("completed", "nexus_operation_completed_event_attributes"),
    EventType.EVENT_TYPE_NEXUS_OPERATION_FAILED: ("failed", "nexus_operation_failed_event_attributes"),
    EventType.EVENT_TYPE_NEXUS_OPERATION_CANCELED: ("cancelled", "nexus_operation_canceled_event_attributes"),
    EventType.EVENT_TYPE_NEXUS_OPERATION_TIMED_OUT: ("timed out", "nexus_operation_timed_out_event_attributes"),
}
