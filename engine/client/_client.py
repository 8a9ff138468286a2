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
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from temporalio.client import Client as TemporalClient
from temporalio.client import (
    WorkflowExecutionStatus,
    WorkflowHandle,
)
from temporalio.exceptions import TemporalError
from temporalio.service import RPCError, RPCStatusCode

from engine.artifacts import ArtifactStore, default_artifact_root
from engine.client._cluster import ClusterClient, NoScheduler
from engine.client._fleet import check_fleet, fleet_asks, fleet_facts, label_sets
from engine.client._prepare import (
    check_tenancy,
    prepare_run,
    start_options,
    task_priorities,
)
from engine.core.definitions import TaskDefinition, WorkflowDefinition, definition_of
from engine.core.gang import rank_files_key, scope_of
from engine.core.glance import gang_line
from engine.core.protocol import (
    ATTEMPTS_MEMO,
    DEFAULT_TENANT,
    DESCRIBE_QUERY,
    PROGRESS_QUERY,
    QUEUES_QUERY,
    RUNS_ONLY,
    STATUS_QUERY,
    TASK_QUEUE,
    USER_MEMO,
    tenant_namespace,
)
from engine.core.wire import Envelope, RunContext
from engine.errors import GangflowError, InputError
from engine.runtime.connection import PIPELINE, SCHEDULED_BY, TENANT, Endpoint, connect
from engine.runtime.history import TaskRecord, failure_attempts, read_tasks
from engine.runtime.ranks import attempt_ranks, merge_attempts
from engine.types.codec import unpack

__all__ = ["Client", "RunInfo", "log_rank"]

_TRANSIENT = (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.UNKNOWN)
#: how long ``status`` waits for a worker to replay a finished gang that predates its attempt memo
_REPLAY_QUERY_TIMEOUT = timedelta(seconds=5)


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
    #: who started it (its ``gangflow_user`` memo: the token's subject behind the gateway, else the client's
    #: login name; the user fair share orders its gangs by, engine.scheduling.users); None before it was kept
    user: str | None = None

    @property
    def finished(self) -> bool:
        return self.status != "RUNNING"


def _run_user(memo: Mapping[str, Any]) -> str | None:
    """Who started the run (its ``USER_MEMO``); None where its memo names no one (a run from before it)."""
    user = memo.get(USER_MEMO)
    return user if isinstance(user, str) and user else None


class Client(ClusterClient):
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
        (a task's own ``Gang(priority=...)`` wins). An unknown tenant or class raises TenancyError, nothing started.
        ``cache``: "use" (default), "skip" (neither read nor write the task cache) or "overwrite" (do not read it,
        replace its entries on success)."""
        defn, envelope = self.prepare(
            wf, inputs, run_id=run_id, tenant=tenant, priority=priority, bundle=bundle, cache=cache
        )
        return await self.start_prepared(defn, envelope)

    async def check_tenancy(self, defn: WorkflowDefinition, run: RunContext) -> None:
        """Refuse (TenancyError) a tenant or priority class the cluster's queue configuration lacks: the
        run's own, and those of the tasks the workflow calls (``task_priorities``); and a flavor, node selector
        or topology level of those tasks the cluster does not have (engine.client._fleet). A Scheduler that does
        not answer (GangflowError) lets only what needs no configuration through: tenant "default", no class.
        A run in its tenant's own namespace (the isolated layout) cannot see the Scheduler: the platform judges
        its tenant and classes when its gangs ask for a placement; its flavors and node labels are checked
        through the tenant's look (``tenant_view``) when a task names any."""
        asks = fleet_asks(defn)
        with contextlib.suppress(ValueError):
            if self.temporal.namespace == tenant_namespace(run.tenant):
                if asks:
                    await self._check_fleet_as_tenant(asks, run.tenant)
                return
        try:
            queues = await self._scheduler_query(QUEUES_QUERY)
        except NoScheduler:
            queues = None
        except GangflowError:
            if run.tenant == DEFAULT_TENANT and run.priority is None and not task_priorities(defn) and not asks:
                return  # what runs without any configuration: the Scheduler judges it when it answers again
            raise
        check_tenancy(queues, run, task_priorities(defn))
        if asks:
            nodes = None
            if any(task.resources.node_selector for task in asks.values()):
                described = await self._scheduler_query(DESCRIBE_QUERY) if queues is not None else {}
                nodes = label_sets(described.get("nodes") or [])
            check_fleet(asks, fleet_facts(queues, run.tenant), nodes, run.tenant)

    async def _check_fleet_as_tenant(self, asks: Mapping[str, TaskDefinition], tenant: str) -> None:
        """``check_fleet`` with what the tenant's look shows (flavor and level names, the nodes' label sets);
        a look that gets no answer lets the run through, for the platform to judge."""
        selectors = any(task.resources.node_selector for task in asks.values())
        try:
            view = await self.tenant_view(queues=True, cluster=selectors)
        except GangflowError:
            return
        queues, cluster = view.get("queues"), view.get("cluster")
        if view.get("scheduler") is not None or not isinstance(queues, Mapping):
            return
        sets = cluster.get("label_sets") if isinstance(cluster, Mapping) else None
        nodes = label_sets({"labels": s} for s in sets) if isinstance(sets, list) else None
        check_fleet(asks, fleet_facts(queues, tenant), nodes, tenant)

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
    async def status(self, run_id: str, *, with_tasks: bool = True, parent: RunInfo | None = None) -> RunInfo:
        """A run's status (``parent``: the run that ``run_id``, a child workflow call, belongs to: its calls
        saved their ranks in that run's store, under that run's id)."""
        handle = self.handle(run_id)
        desc = await handle.describe()
        memos = await desc.memo()
        memo = memos.get("gangflow") or {}
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
            user=_run_user(memos),
        )
        if with_tasks:
            info.tasks, info.error = await read_tasks(handle, self.temporal.data_converter.payload_codec)
            store = ArtifactStore((parent.artifacts if parent else None) or info.artifacts or self.artifacts)
            saved_under = parent.run_id if parent else run_id
            scope = scope_of(run_id, parent.run_id) if parent else ""  # its calls' rank files say whose they are
            looked = await self._platform_gangs(run_id, info.tasks) if status == "RUNNING" else {}
            for record in info.tasks:
                if record.kind == "gang" and record.status != "cached":  # a cache hit launched no gang
                    await self._gang_attempts(record, saved_under, store, looked.get(record.call or ""), scope)
        if desc.status == WorkflowExecutionStatus.COMPLETED:
            info.result = unpack(await handle.result())
        elif desc.status == WorkflowExecutionStatus.RUNNING:
            info.progress = await self.progress(run_id)
        return info

    async def _platform_gangs(self, run_id: str, tasks: list[TaskRecord]) -> dict[str, dict[str, Any]]:
        """The open gangs of a run in a tenant's namespace, which live in the platform's (behind the tenant's
        Nexus endpoint, so no child id here): their GangTasks' status by call, read through ``tenant_view``.
        A look that gets no answer says why in each such record's detail, and leaves its status as it is."""
        calls = [
            r.call
            for r in tasks
            if r.kind == "gang" and r.child_id is None and r.call and r.status in ("scheduled", "running")
        ]
        if not calls or self.tenant() is None:
            return {}
        try:
            view = await self.tenant_view(run_id=run_id, calls=calls)
        except GangflowError as exc:
            for record in tasks:
                if record.call in calls:
                    record.detail = f"its state is unknown: {exc}"
            return {}
        gangs: dict[str, dict[str, Any]] = view.get("gangs") or {}
        return gangs

    async def _gang_attempts(
        self,
        record: TaskRecord,
        run_id: str,
        store: ArtifactStore,
        looked: dict[str, Any] | None = None,
        scope: str = "",
    ) -> None:
        """A distributed task call's attempts (``record.attempts``, its last one ``record.attempt``) and, while
        it runs, its gang's phase (``record.detail``) and whether it holds a placement (status "waiting" until
        it does). ``looked``: its status as the platform answered the tenant's look (``_platform_gangs``).

        How each attempt ended is the GangTask's judgement: a running gang answers its status query; a finished
        one keeps the list in its memo, read by ``describe`` with no worker to replay it (a gang from before the
        memo: the query, if a worker answers). A tenant's gang in the isolated layout lives in the platform's
        namespace: while it runs, the tenant's look through its endpoint answers for it; once it has finished,
        its failure, in the run's own history, names its failed attempts.
        Steps, and times where nothing else says, come from what the node agents saved in the run's store
        (``engine.runtime.ranks``), which every layout can read."""
        recorded: list[dict[str, Any]] | None = None
        live: dict[str, Any] | None = looked
        if record.child_id:
            gang = self.temporal.get_workflow_handle(record.child_id)
            if record.status in ("scheduled", "running"):
                with contextlib.suppress(RPCError, TemporalError):
                    live = await gang.query(STATUS_QUERY)
            else:
                with contextlib.suppress(RPCError, TemporalError):
                    recorded = await (await gang.describe()).memo_value(ATTEMPTS_MEMO, None)
                if recorded is None:  # a gang from before the memo: a worker replays it, if one runs
                    with contextlib.suppress(RPCError, TemporalError):
                        answer = await gang.query(STATUS_QUERY, rpc_timeout=_REPLAY_QUERY_TIMEOUT)
                        recorded = answer.get("attempts")
        if isinstance(live, dict) and record.status in ("scheduled", "running"):
            record.detail = gang_line(live)  # the words of the run's current details (engine.core.glance)
            recorded = live.get("attempts")
            if record.status == "running" and not live.get("placement"):
                record.status = "waiting"  # its GangTask runs, its ranks do not: it waits for the Scheduler
        if not isinstance(recorded, list):
            recorded = failure_attempts(record.error)
        saved: dict[int, list[dict[str, Any]]] = {}
        if record.call:
            with contextlib.suppress(OSError, ValueError):
                saved = attempt_ranks(store, run_id, rank_files_key(scope, record.call))
        record.attempts = merge_attempts([a for a in recorded if isinstance(a, dict)], saved, record.status)
        if record.attempts:
            record.attempt = record.attempts[-1]["attempt"]

    async def runs(self, *, status: str | None = None, pipeline: str | None = None, limit: int = 20) -> list[RunInfo]:
        """The runs (``RUNS_ONLY``: not their child workflow calls, map chunks or gangs), newest first."""
        clauses = [RUNS_ONLY]
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
                    user=_run_user(await wf.memo()),  # the listing carries the memo: no call per run
                )
            )
        return found

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
            # "<task>" for plain tasks, "<task>-<n>" for distributed ones, after "<sub-workflow>~" in one
            stem = name.split(".", 1)[0].rsplit("~", 1)[-1]
            if (task is None or task in (stem, stem.rsplit("-", 1)[0])) and (rank is None or log_rank(name) == rank):
                with store.fs.open(entry["name"], "r") as handle:
                    out.append((name, handle.read()))
        return out


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
