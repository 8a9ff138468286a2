"""The gangflow client: start, wait for, inspect, list and cancel runs.

``start`` validates the inputs against the workflow's signature and packs the workflow's code into a
content-addressed bundle *before* anything is sent to Temporal, so bad input leaves nothing behind and
the run is pinned to the exact code it started with. It also asks the Scheduler for the cluster's queue
configuration and refuses a tenant or priority class it does not have (``TenancyError``), so a run that
could never be queued is not started either.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from temporalio.client import Client as TemporalClient
from temporalio.client import (
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError, TemporalError
from temporalio.service import RPCError, RPCStatusCode

from engine.artifacts import ArtifactStore, default_artifact_root
from engine.core.definitions import WorkflowDefinition, definition_of
from engine.core.wire import Envelope, RunContext
from engine.errors import GangflowError, InputError, NodeNotFoundError
from engine.runs import (  # re-exported: engine.client has always offered them
    DEFAULT_TENANT,
    NO_QUEUE_CONFIG,
    TenancyError,
    check_tenancy,
    default_tenant,
    load_workflow_file,
    prepare_run,
    start_options,
    task_priorities,
    to_jsonable,
)
from engine.runtime.connection import PIPELINE, TASK_QUEUE, TENANT, Endpoint, connect
from engine.runtime.history import TaskRecord, read_tasks
from engine.scheduling.config import QueueConfig, QueueConfigError, dump_queue_config, load_queue_config
from engine.scheduling.events import drain_request
from engine.types.codec import unpack
from workflows.gang import RUN_RANKS
from workflows.platform import tenant_namespace
from workflows.scheduled import SCHEDULED_BY
from workflows.scheduler import SCHEDULER_ID, SCHEDULER_TYPE
from workflows.shell import PROGRESS_QUERY

__all__ = [
    "DEFAULT_TENANT",
    "NO_QUEUE_CONFIG",
    "Client",
    "RunInfo",
    "TenancyError",
    "check_tenancy",
    "default_tenant",
    "load_workflow_file",
    "log_rank",
    "prepare_run",
    "start_options",
    "task_priorities",
    "to_jsonable",
]

_TRANSIENT = (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.UNKNOWN)
#: how long a query to the Scheduler may take before it counts as not answering (no worker runs it)
_SCHEDULER_RPC_TIMEOUT = timedelta(seconds=10)


@dataclass
class RunInfo:
    run_id: str
    workflow: str
    status: str
    start_time: datetime | None
    close_time: datetime | None
    pipeline: str | None = None
    tenant: str | None = None
    priority: str | None = None
    tasks: list[TaskRecord] = field(default_factory=list)
    error: str | None = None
    result: Any = None  # wire data (JSON-like), present when completed
    progress: dict[str, Any] | None = None
    artifacts: str | None = None
    schedule: str | None = None  # the schedule that started the run (gangflow schedule), if one did

    @property
    def finished(self) -> bool:
        return self.status != "RUNNING"


class Client:
    """A connection to Temporal plus the artifact store runs write to."""

    def __init__(self, temporal: TemporalClient, artifacts: str | None = None, task_queue: str = TASK_QUEUE) -> None:
        self.temporal = temporal
        self.artifacts = artifacts or default_artifact_root()
        self.task_queue = task_queue

    @classmethod
    async def connect(
        cls, address: str | None = None, namespace: str | None = None, artifacts: str | None = None
    ) -> Client:
        return cls(await connect(Endpoint.resolve(address, namespace)), artifacts)

    # -- starting -------------------------------------------------------------------------------
    def prepare(
        self,
        wf: Callable[..., Any] | WorkflowDefinition,
        inputs: Mapping[str, Any] | None = None,
        *,
        run_id: str | None = None,
        tenant: str | None = None,
        priority: str | None = None,
        bundle: bool = True,
        cache: str = "use",
    ) -> tuple[WorkflowDefinition, Envelope]:
        """``prepare_run`` with this client's artifact store: validated and packed, nothing started."""
        return prepare_run(
            wf,
            inputs,
            artifacts=self.artifacts,
            run_id=run_id,
            tenant=tenant,
            priority=priority,
            bundle=bundle,
            cache=cache,
        )

    async def start(
        self,
        wf: Callable[..., Any] | WorkflowDefinition,
        inputs: Mapping[str, Any] | None = None,
        *,
        run_id: str | None = None,
        tenant: str | None = None,
        priority: str | None = None,
        bundle: bool = True,
        cache: str = "use",
    ) -> str:
        """Validate, pack and start a run; returns its id (the Temporal workflow id). ``tenant`` defaults
        to ``$GANGFLOW_TENANT``, else ``default``; ``priority`` names a priority class for the run's gangs
        (a task's own ``priority=`` wins). An unknown tenant or class raises TenancyError, nothing started.
        ``cache``: "use" (default), "skip" (neither read nor write the task cache) or "overwrite" (do not read it,
        replace its entries on success)."""
        defn, envelope = self.prepare(
            wf, inputs, run_id=run_id, tenant=tenant, priority=priority, bundle=bundle, cache=cache
        )
        return await self.start_prepared(defn, envelope)

    async def check_tenancy(self, defn: WorkflowDefinition, run: RunContext) -> None:
        """Refuse (TenancyError) a tenant or priority class the cluster's queue configuration lacks: the
        run's own, and those of the tasks the workflow calls (``task_priorities``). A Scheduler that does
        not answer (GangflowError) lets only what needs no configuration through: tenant "default", no class.
        A run in its tenant's own namespace (the isolated layout) cannot see the Scheduler: the platform judges
        its gangs when they ask for a placement."""
        with contextlib.suppress(ValueError):
            if self.temporal.namespace == tenant_namespace(run.tenant):
                return
        try:
            queues = await self._scheduler_query("queues")
        except _NoScheduler:
            queues = None
        except GangflowError:
            if run.tenant == DEFAULT_TENANT and run.priority is None and not task_priorities(defn):
                return  # what runs without any configuration: the Scheduler judges it when it answers again
            raise
        check_tenancy(queues, run, task_priorities(defn))

    async def start_prepared(self, defn: WorkflowDefinition, envelope: Envelope) -> str:
        await self.check_tenancy(defn, envelope.run)
        await self.temporal.start_workflow(defn.name, task_queue=self.task_queue, **start_options(defn, envelope))
        return envelope.run.run_id

    # -- waiting --------------------------------------------------------------------------------
    def handle(self, run_id: str) -> WorkflowHandle[Any, Any]:
        return self.temporal.get_workflow_handle(run_id, result_type=bytes)

    async def tasks(self, run_id: str) -> tuple[list[TaskRecord], str | None]:
        """The run's task records and its failure text, read from its history (sealed failures opened)."""
        return await read_tasks(self.handle(run_id), self.temporal.data_converter.payload_codec)

    async def wait(self, run_id: str, *, outage_timeout: timedelta = timedelta(minutes=10)) -> Any:
        """The run's result as wire data; waits through a Temporal outage (server restart) rather than
        failing. Raises ``temporalio.client.WorkflowFailureError`` if the run failed."""
        deadline = asyncio.get_running_loop().time() + outage_timeout.total_seconds()
        while True:
            try:
                blob = await self.handle(run_id).result()
                return unpack(blob)
            except RPCError as exc:
                if exc.status not in _TRANSIENT or asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(1.0)

    async def result(self, run_id: str, wf: Callable[..., Any] | WorkflowDefinition | None = None) -> Any:
        """The run's result, decoded to its declared type when the workflow is given."""
        data = await self.wait(run_id)
        defn = wf if isinstance(wf, WorkflowDefinition) else definition_of(wf)
        if isinstance(defn, WorkflowDefinition):
            store = ArtifactStore(self.artifacts)
            return defn.interface.output_from_wire(data, store.context(upload=False))
        return data

    async def progress(self, run_id: str) -> dict[str, Any] | None:
        try:
            progress: dict[str, Any] | None = await self.handle(run_id).query(PROGRESS_QUERY)
            return progress
        except (RPCError, TemporalError):
            return None

    # -- inspecting -----------------------------------------------------------------------------
    async def status(self, run_id: str, *, with_tasks: bool = True) -> RunInfo:
        handle = self.handle(run_id)
        desc = await handle.describe()
        memo = (await desc.memo()).get("gangflow") or {}
        status = desc.status.name if desc.status else "UNKNOWN"
        info = RunInfo(
            run_id=run_id,
            workflow=desc.workflow_type,
            status=status,
            start_time=desc.start_time,
            close_time=desc.close_time,
            pipeline=desc.typed_search_attributes.get(PIPELINE),
            tenant=desc.typed_search_attributes.get(TENANT),
            priority=memo.get("priority"),
            artifacts=memo.get("artifacts"),
            schedule=desc.typed_search_attributes.get(SCHEDULED_BY),
        )
        if with_tasks:
            info.tasks, info.error = await read_tasks(handle, self.temporal.data_converter.payload_codec)
            for record in info.tasks:
                if record.kind == "gang" and record.child_id and record.status in ("scheduled", "running"):
                    with contextlib.suppress(RPCError, TemporalError):
                        gang = await self.temporal.get_workflow_handle(record.child_id).query("status")
                        record.detail = gang.get("phase")
        if desc.status == WorkflowExecutionStatus.COMPLETED:
            info.result = unpack(await handle.result())
        elif desc.status == WorkflowExecutionStatus.RUNNING:
            info.progress = await self.progress(run_id)
        return info

    async def runs(self, *, status: str | None = None, pipeline: str | None = None, limit: int = 20) -> list[RunInfo]:
        clauses = [f"{PIPELINE.name} IS NOT NULL"]
        if status:
            clauses.append(f"ExecutionStatus = '{_status_name(status)}'")
        if pipeline:
            if not re.fullmatch(r"[A-Za-z0-9_\-]+", pipeline):  # it goes into a visibility query
                raise InputError(f"pipeline {pipeline!r} is not a workflow name")
            clauses.append(f"{PIPELINE.name} = '{pipeline}'")
        found: list[RunInfo] = []
        async for wf in self.temporal.list_workflows(" AND ".join(clauses), limit=limit):
            found.append(
                RunInfo(
                    run_id=wf.id,
                    workflow=wf.workflow_type,
                    status=wf.status.name if wf.status else "UNKNOWN",
                    start_time=wf.start_time,
                    close_time=wf.close_time,
                    pipeline=wf.typed_search_attributes.get(PIPELINE),
                    tenant=wf.typed_search_attributes.get(TENANT),
                )
            )
        return found

    async def gang(self, gang_id: str) -> dict[str, Any]:
        """A distributed task call (its GangRun id, ``<run>.<task>-<n>``): phase, placement, failed
        attempts, and per node the rank pids and latest ``engine.report`` of each rank."""
        handle = self.temporal.get_workflow_handle(gang_id)
        info: dict[str, Any] = {}
        with contextlib.suppress(RPCError, TemporalError):
            info = await handle.query("status")
        nodes = []
        desc = await handle.describe()
        for pending in desc.raw_description.pending_activities:
            if pending.activity_type.name != RUN_RANKS or not pending.heartbeat_details.payloads:
                continue
            details = await self.temporal.data_converter.decode(pending.heartbeat_details.payloads)
            if details and isinstance(details[0], dict):
                nodes.append(details[0])
        info["nodes"] = nodes
        info["status"] = desc.status.name if desc.status else "UNKNOWN"
        return info

    async def queue(self) -> dict[str, Any]:
        """The Scheduler's view: nodes, free and used GPUs, running gangs, the pending queue."""
        handle = self.temporal.get_workflow_handle(SCHEDULER_ID)
        described: dict[str, Any] = await handle.query("describe")
        return described

    async def _scheduler_query(self, name: str) -> dict[str, Any]:
        """A query to the Scheduler; _NoScheduler when none runs here (or it predates the query),
        GangflowError when it does not answer."""
        try:
            answer: dict[str, Any] = await self.temporal.get_workflow_handle(SCHEDULER_ID).query(
                name, rpc_timeout=_SCHEDULER_RPC_TIMEOUT
            )
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                raise _NoScheduler(_NO_SCHEDULER) from None
            raise GangflowError(f"the Scheduler did not answer ({exc.message}); is a worker running?") from None
        except WorkflowQueryFailedError as exc:
            if "expected but not found" in str(exc):  # a Scheduler from before this query existed
                raise _NoScheduler(
                    f"the Scheduler here has no query {name!r}: it predates queue configurations"
                ) from None
            raise GangflowError(f"the Scheduler failed to answer: {exc}") from None
        except TemporalError as exc:
            raise GangflowError(f"the Scheduler did not answer: {exc}") from None
        return answer

    async def queues(self) -> dict[str, Any]:
        """Per tenant: nominal quota, used, borrowed and lent resources, pending gangs and fair share
        (``{"tenants": {NAME: {...}}, "config": {...}}``, the Scheduler's "queues" query). Raises
        GangflowError when no Scheduler runs or answers."""
        return await self._scheduler_query("queues")

    async def apply_queues(
        self, config: QueueConfig | Mapping[str, Any] | str | Path, *, task_queue: str | None = None
    ) -> dict[str, Any]:
        """Validate a queue configuration here (a QueueConfig, a mapping, YAML text or a YAML file as a
        Path; QueueConfigError naming the field), start the Scheduler if none runs (on ``task_queue``,
        default this client's), and apply it there in one update: the Scheduler checks it again and
        applies all of it or none (QueueConfigError with its reason). Returns the resulting ``queues()``."""
        parsed = config if isinstance(config, QueueConfig) else load_queue_config(config)
        await self.temporal.start_workflow(
            SCHEDULER_TYPE,
            _scheduler_input(),
            id=SCHEDULER_ID,
            task_queue=task_queue or self.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        handle = self.temporal.get_workflow_handle(SCHEDULER_ID)
        try:
            applied: dict[str, Any] = await handle.execute_update(
                "apply_queues", dump_queue_config(parsed), result_type=dict, rpc_timeout=_APPLY_TIMEOUT
            )
        except WorkflowUpdateFailedError as exc:
            cause = exc.cause
            raise QueueConfigError(cause.message if isinstance(cause, ApplicationError) else str(cause)) from None
        except (WorkflowUpdateRPCTimeoutOrCancelledError, RPCError) as exc:
            raise GangflowError(
                f"the Scheduler did not take the configuration within {_APPLY_TIMEOUT.total_seconds():.0f} s ({exc}); "
                f"is a gangflow worker running on queue {task_queue or self.task_queue!r}?"
            ) from None
        return applied

    async def drain_node(self, node_id: str, reason: str = "", drained: bool = True) -> dict[str, Any]:
        """Operators: drain a node (it takes no new gangs; each of its preemptible gangs gets a preemption
        notice, checkpoints, and is placed elsewhere; the others run there to their end), or bring it back
        with ``drained=False``. The flag outlives the node agent's restarts and the Scheduler's.

        Returns the Scheduler's answer: ``node_id``, ``drained``, ``reason``, ``preempted`` (gangs preempted
        now), ``remaining`` (gangs still running there that are not preemptible) and ``leaving`` (gangs
        preempted earlier that have not released yet). Raises InputError for a malformed request (before
        anything is sent), NodeNotFoundError for a node the Scheduler does not know (its message lists the
        known ones), GangflowError when the Scheduler does not answer."""
        payload = {"node_id": node_id, "drained": drained, "reason": reason}
        try:
            drain_request(payload)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        handle = self.temporal.get_workflow_handle(SCHEDULER_ID)
        try:
            answer: dict[str, Any] = await handle.execute_update(
                "drain_node", payload, result_type=dict, rpc_timeout=_APPLY_TIMEOUT
            )
        except WorkflowUpdateFailedError as exc:
            cause = exc.cause
            message = cause.message if isinstance(cause, ApplicationError) else str(cause)
            kind = cause.type if isinstance(cause, ApplicationError) else None
            if kind == "UnknownNode":
                raise NodeNotFoundError(message) from None
            if kind == "BadRequest":
                raise InputError(message) from None
            raise GangflowError(f"the Scheduler refused to drain node {node_id!r}: {message}") from None
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                raise NodeNotFoundError(f"unknown node {node_id!r}: {_NO_SCHEDULER}") from None
            raise GangflowError(f"the Scheduler did not answer: {exc.message}") from None
        except WorkflowUpdateRPCTimeoutOrCancelledError:
            raise GangflowError(
                f"the Scheduler did not answer within {_APPLY_TIMEOUT.total_seconds():.0f} s; is a gangflow worker "
                "running?"
            ) from None
        return answer

    async def release(self, gang_id: str, *, force: bool = False, confirm_s: float = 10.0) -> dict[str, Any]:
        """Operators: make the Scheduler free a gang's placement, or withdraw its queued request, and wait
        until it has. Returns the Scheduler's entry for the gang as ``queue()`` showed it, plus ``state``
        (``"running"`` or ``"pending"``). Raises GangflowError when no Scheduler answers, when it holds no
        such gang, and (unless ``force``) when the gang's GangRun still runs: its ranks may be using the
        GPUs, and a placement given away under them would be handed to another gang."""
        scheduler = self.temporal.get_workflow_handle(SCHEDULER_ID)

        async def describe() -> dict[str, Any]:
            try:
                described: dict[str, Any] = await scheduler.query("describe", rpc_timeout=timedelta(seconds=10))
                return described
            except RPCError as exc:
                if exc.status == RPCStatusCode.NOT_FOUND:
                    raise GangflowError(
                        "no Scheduler is running here: it starts when the first node agent registers (gangflow node)"
                    ) from None
                raise GangflowError(f"the Scheduler did not answer: {exc.message}") from None
            except TemporalError as exc:
                raise GangflowError(f"the Scheduler did not answer: {exc}") from None

        state = await describe()
        entry = _held(state, gang_id)
        if entry is None:
            totals = state.get("totals", {})
            raise GangflowError(
                f"the Scheduler holds no gang {gang_id!r} ({totals.get('running', 0)} running, "
                f"{totals.get('pending', 0)} pending); 'gangflow cluster' lists them"
            )
        if not force:
            try:
                owner = await self.temporal.get_workflow_handle(gang_id).describe()
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND:  # not knowing is no reason to free GPUs in use
                    raise GangflowError(f"cannot tell whether gang {gang_id!r} is in use: {exc.message}") from None
            else:
                if owner.status == WorkflowExecutionStatus.RUNNING:
                    run = owner.parent_id or gang_id
                    raise GangflowError(
                        f"gang {gang_id!r} is still in use: its GangRun runs (run {run}), so its ranks may hold "
                        f"the GPUs; cancel the run instead (gangflow cancel {run}), or force the release (--force)"
                    )
        await scheduler.signal("release", gang_id)
        deadline = asyncio.get_running_loop().time() + confirm_s
        while _held(await describe(), gang_id) is not None:
            if asyncio.get_running_loop().time() > deadline:
                raise GangflowError(
                    f"asked the Scheduler to release {gang_id!r}, but it still holds it after {confirm_s:g} s; "
                    "is a gangflow worker running?"
                )
            await asyncio.sleep(0.2)
        return entry

    async def cancel(self, run_id: str) -> None:
        await self.handle(run_id).cancel()

    async def logs(self, run_id: str, task: str | None = None, rank: int | None = None) -> list[tuple[str, str]]:
        """(file name, text) of each captured task log of a run, oldest first; ``rank`` picks one rank's
        log of a distributed task."""
        desc = await self.handle(run_id).describe()
        root = ((await desc.memo()).get("gangflow") or {}).get("artifacts") or self.artifacts
        store = ArtifactStore(root)
        folder = store.log_path(run_id)
        if not store.fs.exists(folder):
            return []
        entries = sorted(store.fs.ls(folder, detail=True), key=lambda e: (e.get("mtime") or 0, e["name"]))
        out = []
        for entry in entries:
            name = entry["name"].rsplit("/", 1)[-1]
            stem = name.split(".", 1)[0]  # "<task>" for plain tasks, "<task>-<call>" for distributed ones
            if (task is None or task in (stem, stem.rsplit("-", 1)[0])) and (rank is None or log_rank(name) == rank):
                with store.fs.open(entry["name"], "r") as handle:
                    out.append((name, handle.read()))
        return out


class _NoScheduler(GangflowError):
    """No Scheduler runs here (or it has no such query): there is no queue configuration to read."""


_NO_SCHEDULER = (
    "no Scheduler is running here: it starts when the first node agent registers (gangflow node), "
    "or with gangflow queues apply FILE"
)
#: how long ``apply_queues`` waits for the Scheduler to take a configuration (its worker may be starting)
_APPLY_TIMEOUT = timedelta(seconds=30)


def _scheduler_input() -> dict[str, Any] | None:
    """What the Scheduler starts with when a client starts it: as ``engine.runtime.node.register`` gives
    it, how many events one of its runs handles before it continues as new (tests set a small number)."""
    events = os.environ.get("GANGFLOW_SCHEDULER_EVENTS_PER_RUN", "")
    return {"max_events": int(events)} if events.isdigit() else None


def log_rank(log_name: str) -> int | None:
    """The rank whose output a task log holds: ``train-1.rank3.attempt0.log`` → 3; a plain task's log
    (``prep.<activity>.attempt1.log``) has none."""
    for part in log_name.split("."):
        if part.startswith("rank") and part[4:].isdigit():
            return int(part[4:])
    return None


def _status_name(status: str) -> str:
    names = {s.name.lower(): s for s in WorkflowExecutionStatus}
    names.update({"cancelled": WorkflowExecutionStatus.CANCELED, "failed": WorkflowExecutionStatus.FAILED})
    key = status.lower().replace("-", "_")
    if key not in names:
        raise InputError(f"unknown status {status!r}; expected one of {', '.join(sorted(names))}")
    return "".join(part.capitalize() for part in names[key].name.lower().split("_"))


def _held(state: Mapping[str, Any], gang_id: str) -> dict[str, Any] | None:
    """The Scheduler's entry for a gang (``describe``'s shape), with ``state``: running or pending."""
    for where in ("running", "pending"):
        for entry in state.get(where, []):
            if entry.get("gang_id") == gang_id:
                return {"state": where, **entry}
    return None
