"""Schedules: a pipeline started on a cron, on Temporal Schedules (the Web UI's Schedules tab shows them).

A schedule starts exactly what ``gangflow run`` starts: the user's workflow type on the same task queue, with
the same envelope, memo and search attributes (``engine.client.start_options``), so ``gangflow list`` /
``status`` / ``logs`` show a scheduled run like any other. The envelope is built once, when the schedule is
created: the inputs are validated then (not at 3 a.m.), and the code bundle uploaded then pins every run the
schedule starts to the code *as it was when the schedule was created*; a changed file needs
``gangflow schedule create --replace``.

Temporal names each run ``<schedule>-<time>``; the envelope's run id is the schedule's name, and the
workflow shell gives each scheduled run its own id (``workflows.scheduled``), so its logs and checkpoints are
its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import zoneinfo
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from temporalio.client import (
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleDescription,
    ScheduleHandle,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleState,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

from engine.client._client import Client
from engine.client._prepare import prepare_run, start_options
from engine.client._schedule_spec import check_cron
from engine.core.definitions import WorkflowDefinition
from engine.core.wire import Envelope
from engine.errors import GangflowError, InputError
from engine.runtime.connection import PIPELINE, TENANT

__all__ = [
    "MIN_CATCHUP_WINDOW",
    "OVERLAP_POLICIES",
    "PreparedSchedule",
    "ScheduleInfo",
    "ScheduleNotFoundError",
    "ScheduleOptions",
    "Schedules",
    "check_schedule_name",
    "overlap_name",
    "overlap_policy",
    "prepare_schedule",
]

#: ``--overlap`` names → Temporal's policy for a run due while the previous one still runs
OVERLAP_POLICIES: dict[str, ScheduleOverlapPolicy] = {
    "skip": ScheduleOverlapPolicy.SKIP,
    "buffer-one": ScheduleOverlapPolicy.BUFFER_ONE,
    "buffer-all": ScheduleOverlapPolicy.BUFFER_ALL,
    "cancel-other": ScheduleOverlapPolicy.CANCEL_OTHER,
    "terminate-other": ScheduleOverlapPolicy.TERMINATE_OTHER,
    "allow-all": ScheduleOverlapPolicy.ALLOW_ALL,
}
#: how many schedules ``Schedules.list`` describes at once
_DESCRIBES_AT_ONCE = 16
#: Temporal refuses a shorter catch-up window (it would miss runs due while a server restarts)
MIN_CATCHUP_WINDOW = timedelta(seconds=10)
#: the schedule's name starts each of its run ids, and runs ids go into file paths and visibility queries
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


class ScheduleNotFoundError(GangflowError, LookupError):
    """No schedule of that name in this namespace (``gangflow schedule ...``: exit 1)."""

    kind = "ScheduleNotFound"


def check_schedule_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InputError(
            f"schedule name {name!r}: use letters, digits, '.', '_' and '-' (at most 200, starting with a "
            "letter or digit); it starts the id of every run the schedule starts"
        )
    return name


def overlap_policy(name: str) -> ScheduleOverlapPolicy:
    if name not in OVERLAP_POLICIES:
        raise InputError(f"unknown overlap policy {name!r}; expected one of {', '.join(OVERLAP_POLICIES)}")
    return OVERLAP_POLICIES[name]


def overlap_name(policy: ScheduleOverlapPolicy) -> str:
    for name, known in OVERLAP_POLICIES.items():
        if known == policy:
            return name
    return "skip"  # UNSPECIFIED: Temporal's default


@dataclass(frozen=True)
class ScheduleOptions:
    """When and how a schedule starts runs (checked by ``checked()``; Temporal's defaults where None)."""

    cron: tuple[str, ...]
    overlap: str = "skip"
    #: how late a run missed while the server was down may still start; Temporal's default is a year
    catchup_window: timedelta | None = None
    paused: bool = False
    note: str | None = None
    #: the time zone of the cron expressions (IANA name), UTC by default
    time_zone: str | None = None

    def checked(self) -> ScheduleOptions:
        """The same options, validated (InputError naming the option); cron expressions normalized."""
        if not self.cron:
            raise InputError("a schedule needs at least one --cron expression, e.g. --cron '0 3 * * *'")
        cron = tuple(check_cron(expr) for expr in self.cron)
        overlap_policy(self.overlap)
        if self.catchup_window is not None and self.catchup_window < MIN_CATCHUP_WINDOW:
            raise InputError(f"--catchup-window must be at least {MIN_CATCHUP_WINDOW.total_seconds():g}s")
        if self.time_zone is not None:
            try:
                zoneinfo.ZoneInfo(self.time_zone)
            except (zoneinfo.ZoneInfoNotFoundError, ValueError):
                raise InputError(f"unknown time zone {self.time_zone!r} (an IANA name such as Europe/Paris)") from None
        return replace(self, cron=cron)


@dataclass
class ScheduleInfo:
    """A schedule as ``gangflow schedule list`` / ``describe`` show it (``describe`` fills the optional part)."""

    name: str
    workflow: str
    cron: list[str]
    paused: bool
    note: str | None
    next_runs: list[datetime]
    #: (run id, scheduled time) of the latest runs it started, oldest first
    recent_runs: list[tuple[str, datetime]]
    tenant: str | None = None
    time_zone: str | None = None
    overlap: str | None = None
    catchup_window: timedelta | None = None
    running: list[str] = field(default_factory=list)
    runs_started: int | None = None
    target: str | None = None
    inputs: dict[str, Any] | None = None
    code: str | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON (``--json``): what ``describe`` did not fill is left out, times are ISO 8601."""
        data = {k: v for k, v in asdict(self).items() if v is not None or k in ("note", "time_zone", "tenant")}
        data["next_runs"] = [t.isoformat() for t in self.next_runs]
        data["recent_runs"] = [{"run_id": r, "scheduled_at": t.isoformat()} for r, t in self.recent_runs]
        if self.overlap is None:  # from list: no policy, inputs or code
            data.pop("running", None)
        else:
            data["catchup_window_s"] = data.pop("catchup_window").total_seconds() if self.catchup_window else None
        return data


def _schedule(defn: WorkflowDefinition, envelope: Envelope, task_queue: str, options: ScheduleOptions) -> Schedule:
    start = start_options(defn, envelope)
    start["typed_search_attributes"] = start.pop("search_attributes")
    return Schedule(
        action=ScheduleActionStartWorkflow(defn.name, task_queue=task_queue, **start),
        spec=ScheduleSpec(cron_expressions=list(options.cron), time_zone_name=options.time_zone),
        policy=SchedulePolicy(overlap=overlap_policy(options.overlap), catchup_window=options.catchup_window),
        state=ScheduleState(note=options.note, paused=options.paused),
    )


@dataclass(frozen=True)
class PreparedSchedule:
    """A schedule checked and its code bundle uploaded, nothing created yet (``prepare_schedule``)."""

    name: str
    defn: WorkflowDefinition
    envelope: Envelope
    options: ScheduleOptions
    target: str | None = None


def prepare_schedule(
    name: str,
    wf: Callable[..., Any] | WorkflowDefinition,
    inputs: Mapping[str, Any] | None,
    options: ScheduleOptions,
    *,
    artifacts: str | None = None,
    tenant: str | None = None,
    priority: str | None = None,
    target: str | None = None,
) -> PreparedSchedule:
    """Everything checked without Temporal (InputError / TypeMismatchError naming the problem), and the code
    bundle uploaded: what ``prepare_run`` does for a run, plus the name, cron, policy and time zone."""
    check_schedule_name(name)
    checked = options.checked()
    # the envelope's run id is the schedule's name: Temporal starts each run as "<name>-<time>", and the shell
    # gives the run that id (workflows/scheduled.py)
    defn, envelope = prepare_run(wf, inputs, artifacts=artifacts, run_id=name, tenant=tenant, priority=priority)
    return PreparedSchedule(name, defn, envelope, checked, target)


class Schedules:
    """The schedules of a client's namespace: ``Schedules(client).create("nightly", wf, {...}, options)``."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def create(
        self,
        name: str,
        wf: Callable[..., Any] | WorkflowDefinition,
        inputs: Mapping[str, Any] | None,
        options: ScheduleOptions,
        *,
        tenant: str | None = None,
        priority: str | None = None,
        replace_existing: bool = False,
        target: str | None = None,
    ) -> ScheduleInfo:
        """Validate and create a schedule (InputError, TenancyError: nothing created). A name in use is
        InputError, unless ``replace_existing``: then the old schedule is replaced once the new one checks out."""
        prepared = prepare_schedule(
            name, wf, inputs, options, artifacts=self.client.artifacts, tenant=tenant, priority=priority, target=target
        )
        return await self.create_prepared(prepared, replace_existing=replace_existing)

    async def create_prepared(self, prepared: PreparedSchedule, *, replace_existing: bool = False) -> ScheduleInfo:
        name, defn, envelope, options = prepared.name, prepared.defn, prepared.envelope, prepared.options
        await self.client.check_tenancy(defn, envelope.run)
        schedule = _schedule(defn, envelope, self.client.task_queue, options)
        # Temporal gives the cron back as calendars: the memo keeps the expressions as they were written
        memo = {
            "gangflow": {"target": prepared.target, "cron": list(options.cron), "artifacts": envelope.run.artifacts}
        }
        attributes = TypedSearchAttributes(
            [SearchAttributePair(PIPELINE, defn.name), SearchAttributePair(TENANT, envelope.run.tenant)]
        )
        if replace_existing:
            # deleted only now, with the new schedule validated: bad input leaves the old one in place
            with contextlib.suppress(ScheduleNotFoundError):
                await self._handle(name).delete()
        try:
            await self.client.temporal.create_schedule(name, schedule, memo=memo, search_attributes=attributes)
        except ScheduleAlreadyRunningError:
            raise InputError(
                f"a schedule named {name!r} exists already: replace it (gangflow schedule create --replace ...) "
                f"or delete it first (gangflow schedule delete {name})"
            ) from None
        except RPCError as exc:
            if exc.status == RPCStatusCode.INVALID_ARGUMENT:  # a cron expression Temporal reads otherwise
                raise InputError(
                    f"Temporal refused schedule {name!r} (cron {list(options.cron)}): {exc.message}"
                ) from None
            raise
        return await self.describe(name)

    def _handle(self, name: str) -> _Handle:
        return _Handle(self.client.temporal.get_schedule_handle(name), name)

    async def list(self) -> list[ScheduleInfo]:
        """gangflow's schedules (those with a pipeline search attribute) in this namespace, by name.

        Which schedules exist comes from Temporal's visibility store; each one's state from the schedule itself:
        visibility is eventually consistent, and a list right after ``pause`` showed the schedule running."""
        names = [
            entry.id
            async for entry in await self.client.temporal.list_schedules()
            if entry.typed_search_attributes.get(PIPELINE) is not None
        ]
        # one describe per schedule, a few at a time: a namespace's hundred schedules against a remote server
        # take a few round trips, not a hundred in a row
        limit = asyncio.Semaphore(_DESCRIBES_AT_ONCE)

        async def one(name: str) -> ScheduleInfo | None:
            async with limit:
                try:
                    desc = await self._handle(name).call(lambda h: h.describe())
                except ScheduleNotFoundError:  # deleted since the visibility store listed it
                    return None
                return await self._info(name, desc)

        found = [info for info in await asyncio.gather(*map(one, names)) if info is not None]
        return sorted(found, key=lambda s: s.name)

    async def describe(self, name: str) -> ScheduleInfo:
        desc = await self._handle(name).call(lambda h: h.describe())
        schedule, info = desc.schedule, desc.info
        envelope = await self._envelope(schedule.action)
        listed = await self._info(name, desc)
        return replace(
            listed,
            tenant=listed.tenant or (envelope.run.tenant if envelope else None),
            overlap=overlap_name(schedule.policy.overlap),
            catchup_window=schedule.policy.catchup_window,
            running=[r.workflow_id for r in info.running_actions],
            runs_started=info.num_actions,
            inputs=envelope.inputs if envelope else None,
            code=(
                f"{envelope.code.module}.{envelope.code.qualname}"
                + (f" (bundle {envelope.code.bundle_sha[:12]})" if envelope.code.bundle_sha else "")
                if envelope
                else None
            ),
        )

    async def _info(self, name: str, desc: ScheduleDescription) -> ScheduleInfo:
        """What ``list`` shows of a schedule: no inputs decoded (in the isolated layout that needs the
        tenant's key), so listing works for every schedule the caller may see."""
        schedule, info = desc.schedule, desc.info
        action = schedule.action
        memo = (await desc.memo()).get("gangflow") or {}
        return ScheduleInfo(
            name=name,
            workflow=action.workflow if isinstance(action, ScheduleActionStartWorkflow) else "?",
            cron=_cron(memo, schedule.spec),
            paused=schedule.state.paused,
            note=schedule.state.note or None,
            next_runs=list(info.next_action_times),
            recent_runs=_recent(info.recent_actions),
            tenant=desc.typed_search_attributes.get(TENANT),
            time_zone=schedule.spec.time_zone_name or None,
            target=memo.get("target"),
        )

    async def _envelope(self, action: Any) -> Envelope | None:
        """The envelope every run of the schedule gets (what ``describe`` shows of inputs and code)."""
        if not isinstance(action, ScheduleActionStartWorkflow) or not action.args:
            return None
        try:
            raw = action.args[0]
            blob = raw if isinstance(raw, bytes) else (await self.client.temporal.data_converter.decode([raw]))[0]
            return Envelope.decode(blob) if isinstance(blob, bytes) else None
        except Exception:  # not gangflow's envelope (a schedule made elsewhere): show what there is
            return None

    async def pause(self, name: str, note: str | None = None) -> None:
        await self._handle(name).call(lambda h: h.pause(note=note or "paused with gangflow schedule pause"))

    async def resume(self, name: str, note: str | None = None) -> None:
        await self._handle(name).call(lambda h: h.unpause(note=note or "resumed with gangflow schedule resume"))

    async def delete(self, name: str) -> None:
        """Delete the schedule; the runs it started are left as they are."""
        await self._handle(name).delete()

    async def trigger(self, name: str, *, wait_s: float = 10.0) -> str | None:
        """Start a run now (the overlap policy applies); returns its run id once Temporal reports it started,
        None if it did not within ``wait_s`` (skipped by the overlap policy, or the server is slow)."""
        before = {r for r, _ in (await self.describe(name)).recent_runs}
        await self._handle(name).call(lambda h: h.trigger())
        deadline = asyncio.get_running_loop().time() + wait_s
        while asyncio.get_running_loop().time() < deadline:
            info = await self.describe(name)
            started = [r for r, _ in info.recent_runs if r not in before]
            if started:
                return started[-1]
            await asyncio.sleep(0.2)
        return None


class _Handle:
    """A schedule handle whose NOT_FOUND says which schedule, and where to see the others."""

    def __init__(self, handle: ScheduleHandle, name: str) -> None:
        self.handle, self.name = handle, name

    async def call(self, what: Callable[[ScheduleHandle], Any]) -> Any:
        try:
            return await what(self.handle)
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                raise ScheduleNotFoundError(
                    f"no schedule named {self.name!r} here; gangflow schedule list shows them"
                ) from None
            raise

    async def delete(self) -> None:
        await self.call(lambda h: h.delete())


def _cron(memo: Mapping[str, Any], spec: ScheduleSpec) -> list[str]:
    # Temporal gives cron expressions back as calendars: the memo keeps them as they were written
    return [str(c) for c in memo.get("cron") or spec.cron_expressions]


def _recent(actions: Sequence[Any]) -> list[tuple[str, datetime]]:
    out = []
    for result in actions:
        started = getattr(result.action, "workflow_id", None)
        if started:
            out.append((str(started), result.scheduled_at))
    return out
