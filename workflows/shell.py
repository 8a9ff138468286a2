"""The user-workflow shell: one dynamic Temporal workflow that runs any ``@workflow`` function.

Its workflow type is the user's workflow name (so the Web UI shows ``pipeline``, not a generic name);
its single argument is an :class:`~engine.core.wire.Envelope` naming the code bundle, the encoded inputs
and the run context. Task calls inside the user's function are dispatched here onto activities (plain
and lightweight tasks) or child workflows.

The shell runs *without* Temporal's import sandbox. User modules come from code bundles that the worker
loads once and caches by hash; the sandbox would re-import every such module (torch included, which it
cannot load) on every run. Determinism is kept by gangflow's own guard instead: all I/O happens in
tasks, time, randomness, ids and timers come from ``engine.now()`` / ``random()`` / ``uuid4()`` /
``sleep()`` (answered here from ``workflow.now()`` / ``workflow.random()`` / ``workflow.uuid4()`` /
``workflow.sleep()``), and a body that reads the clock or does I/O anyway fails its run with
``NonDeterministicCall`` (:mod:`engine.core.guard`; the worker's runner installs the hook, ``run``
below marks the body). Pinning each run to its bundle removes the other usual cause of non-determinism
errors (code edited while a run is in flight).
"""

from __future__ import annotations

import asyncio
import traceback
from collections import Counter
from collections.abc import Awaitable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from random import Random
from typing import Any
from uuid import UUID

from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    ChildWorkflowError,
    FailureError,
    NexusOperationError,
    is_cancelled_exception,
)
from temporalio.workflow import ParentClosePolicy

from engine.core.definitions import TaskDefinition, WorkflowDefinition
from engine.core.dispatch import using_dispatcher
from engine.core.gang import scope_of
from engine.core.guard import guarding, rearm
from engine.core.protocol import (
    APPROVE_UPDATE,
    GANG_STATE_SIGNAL,
    GANG_TYPE,
    INPUT_UPDATE,
    KIND_CALL,
    KIND_GANG,
    LEGACY_GANG_TYPE,
    PROGRESS_QUERY,
    USER_MEMO,
)
from engine.core.waits import WaitRequest
from engine.core.wire import Envelope
from engine.errors import GangflowError
from engine.types.codec import check_payload_size, pack, unpack
from workflows.caching import cached_call
from workflows.calls import (
    CodeResolver,
    TaskFailed,
    code_ref,
    configure,
    describe_failure,
    execute_plain,
    load_code,
    route,
)
from workflows.gang_spec import GangSpec
from workflows.glance import RunGlance, call_attributes, goodput_of
from workflows.platform import GangCall, GangService
from workflows.scheduled import scheduled_run_context
from workflows.waits import Waits

__all__ = ["CodeResolver", "UserWorkflow", "configure"]

#: workflow.patched id: from here on a distributed task call starts a GangTask (GangRun before the rename)
GANG_TYPE_PATCH = "gang-task-type"


class _TemporalDispatcher:
    """Schedules the task calls of one workflow run."""

    def __init__(self, shell: UserWorkflow, envelope: Envelope, user: str = "") -> None:
        self.shell = shell
        self.envelope = envelope
        self.user = user  # who started the run: named in its gang requests, handed to its sub-workflows
        self.child_seq = 0
        self.calls: dict[str, int] = {}

    async def run_task(self, task: TaskDefinition, inputs: dict[str, Any]) -> Any:
        rearm()
        wire = task.interface.inputs_to_wire(inputs)
        blob = Envelope(code_ref(task, self.envelope), wire, self.envelope.run).encode(
            f"the inputs of task {task.name!r}"
        )
        self.shell.task_started(task.name)
        try:
            if task.cache:  # the lookup, a hit, or the call and its record: workflows/caching.py
                result = await cached_call(
                    self.envelope.run,
                    task,
                    wire,
                    lambda: f"{task.name}-{self.calls.get(task.name, 0) + 1}",  # the id _call_id gives it next
                    lambda: self._launch(task, blob),
                )
            else:
                result = await self._launch(task, blob)
        except (ActivityError, ChildWorkflowError, NexusOperationError, TaskFailed) as failed:
            self.shell.task_finished(task.name, failed=True)
            err = failed.error if isinstance(failed, TaskFailed) else failed
            if is_cancelled_exception(err):
                raise failed  # the run was cancelled: let Temporal record it as cancelled, not failed
            if isinstance(failed, TaskFailed):
                tries = f" after {failed.tries} attempts" if failed.tries > 1 else ""
            else:
                exhausted = task.retry.attempts > 1 and "MAXIMUM_ATTEMPTS" in str(getattr(err, "retry_state", ""))
                tries = f" after {task.retry.attempts} attempts" if exhausted else ""
            raise ApplicationError(
                f"task {task.name!r} failed{tries}: {describe_failure(err)}", type="TaskFailed", non_retryable=True
            ) from err
        self.shell.task_finished(task.name, failed=False)
        return task.interface.output_from_wire(unpack(result))

    def _launch(self, task: TaskDefinition, blob: bytes) -> Awaitable[bytes]:
        return self._run_gang(task, blob) if task.gang is not None else self._execute(task, blob)

    async def _run_gang(self, task: TaskDefinition, blob: bytes) -> bytes:
        """A distributed task: a GangTask child workflow places and launches its ranks."""
        gang = task.gang
        if gang is None:  # pragma: no cover - run_task routes only gang tasks here
            raise ApplicationError(f"task {task.name!r} is not distributed", non_retryable=True)
        call = self._call_id(task)
        spec = GangSpec(
            task=task.name,
            call=call,
            shape=gang,
            timeout_s=task.timeout.total_seconds(),
            heartbeat_timeout_s=task.heartbeat_timeout.total_seconds(),
            tenant=self.envelope.run.tenant,
            max_restarts=task.max_restarts,
            user_attempts=task.retry.attempts,
            retry_backoff_s=task.retry.delay(1).total_seconds(),
            retry_max_interval_s=(
                task.retry.max_interval.total_seconds() if isinstance(task.retry.max_interval, timedelta) else None
            ),
            non_retryable=list(task.retry.non_retryable_names),
            hang_timeout_s=task.hang_timeout.total_seconds() if task.hang_timeout else None,
            lost_node_wait_s=task.lost_node_wait.total_seconds(),
            # the task's own class wins over the run's (gangflow run --priority)
            priority=task.priority or self.envelope.run.priority,
            preemptible=task.preemptible,
            preemption_grace_s=task.preemption_grace.total_seconds() if task.preemption_grace else None,
            flavors=list(task.resources.flavors),
            node_selector=dict(task.resources.node_selector or {}),
            tolerations=list(task.resources.tolerations),
            topology_required=task.placement.required if task.placement else None,
            topology_preferred=task.placement.preferred if task.placement else None,
            topology_wait_s=task.placement.wait_s if task.placement else None,
            scope=scope_of(workflow.info().workflow_id, self.envelope.run.run_id),
            user=self.user,
        )
        summary = f"{task.name}: {gang.nnodes} node(s) × {gang.nproc_per_node} rank(s)"
        # its state comes by signal (workflows.glance), but from a gang in the platform's namespace (a tenant's,
        # behind Nexus); its ledger once it has ended (of such a gang: from its saved rank reports only)
        gang_id = None if route() is not None else f"{workflow.info().workflow_id}.{call}"
        self.shell.glance.started(call, told=gang_id is not None)
        try:
            result = await self._start_gang(task, blob, spec, call, summary)
        except BaseException as exc:  # (run_task counts it, and so refreshes the details)
            if is_cancelled_exception(exc) or isinstance(exc, asyncio.CancelledError):
                self.shell.glance.finished(call, "cancelled", "cancelled")
            else:
                why = describe_failure(exc) if isinstance(exc, FailureError) else str(exc)
                goodput = await goodput_of(gang_id, self.envelope.run, call, "failed", spec.files_key)
                self.shell.glance.finished(call, "failed", why, goodput)
            raise
        goodput = await goodput_of(gang_id, self.envelope.run, call, "completed", spec.files_key)
        self.shell.glance.finished(call, "completed", goodput=goodput)
        return result

    async def _start_gang(self, task: TaskDefinition, blob: bytes, spec: GangSpec, call: str, summary: str) -> bytes:
        info = workflow.info()
        tenant_route = route()
        if tenant_route is not None:
            # The platform runs the GangTask in its namespace; a cancelled run cancels it (WAIT_COMPLETED: the
            # task ends once the ranks are stopped and the GPUs are back). A *terminated* run cancels nothing:
            # the platform's owner check finds the orphan.
            nexus = workflow.create_nexus_client(service=GangService, endpoint=tenant_route.endpoint)
            return await nexus.execute_operation(
                GangService.run_gang,
                GangCall.of(spec, blob, info.workflow_id, info.run_id),
                headers={"gangflow-task": task.name},
                summary=summary,
            )
        # runs recorded before the rename started "GangRun" children: replaying them must start the same type
        gang_type = GANG_TYPE if workflow.patched(GANG_TYPE_PATCH) else LEGACY_GANG_TYPE
        return await workflow.execute_child_workflow(  # type: ignore[no-any-return]
            gang_type,
            args=[spec, blob],
            id=f"{info.workflow_id}.{call}",
            task_queue=info.task_queue,
            result_type=bytes,
            memo={"gangflow_task": task.name},
            static_summary=summary,
            search_attributes=call_attributes(KIND_GANG, spec.tenant),
            # a terminated or timed-out run cancels its gangs, so they stop their ranks and free their GPUs
            parent_close_policy=ParentClosePolicy.REQUEST_CANCEL,
        )

    def _call_id(self, task: TaskDefinition) -> str:
        """``train-1``, ``train-2``, ...: unique per task call within the run (names logs, checkpoints, tries)."""
        self.calls[task.name] = self.calls.get(task.name, 0) + 1
        return f"{task.name}-{self.calls[task.name]}"

    async def _execute(self, task: TaskDefinition, blob: bytes) -> bytes:
        return await execute_plain(task, blob, None if task.lightweight else self._call_id(task))

    async def map_task(
        self,
        task: TaskDefinition,
        items: list[dict[str, Any]],
        concurrency: int,
        min_success_ratio: float,
        chunk_size: int | None = None,
    ) -> list[Any]:
        from workflows.mapping import run_map  # workflows.mapping builds on this module

        rearm()
        return await run_map(self, task, items, concurrency, min_success_ratio, chunk_size)

    # -- engine.now() / random() / uuid4() / sleep(): answered from history, the same on every replay --
    def now(self) -> datetime:
        return workflow.now()

    def random(self) -> Random:
        return workflow.random()

    def uuid4(self) -> UUID:
        return workflow.uuid4()

    async def sleep(self, seconds: float) -> None:
        rearm()
        if seconds > 0:
            await workflow.sleep(seconds)  # a durable timer
        else:
            await asyncio.sleep(0)  # Temporal has no zero-length timer: just let other tasks run

    async def wait_for(self, request: WaitRequest) -> Any:
        rearm()
        return await self.shell.waits.wait_for(request)  # workflows/waits.py

    async def run_workflow(self, wf: WorkflowDefinition, inputs: dict[str, Any]) -> Any:
        rearm()
        wire = wf.interface.inputs_to_wire(inputs)
        blob = Envelope(code_ref(wf, self.envelope), wire, self.envelope.run).encode(
            f"the inputs of workflow {wf.name!r}"
        )
        self.child_seq += 1
        info = workflow.info()
        self.shell.task_started(wf.name)
        try:
            result = await workflow.execute_child_workflow(
                wf.name,
                blob,
                id=f"{info.workflow_id}.{wf.name}-{self.child_seq}",
                task_queue=info.task_queue,
                result_type=bytes,
                search_attributes=call_attributes(KIND_CALL, self.envelope.run.tenant, info.typed_search_attributes),
                # its gangs name the run's user too (none without one: the command a run without users recorded)
                memo={USER_MEMO: self.user} if self.user else None,
                execution_timeout=wf.timeout,
                parent_close_policy=ParentClosePolicy.REQUEST_CANCEL,
            )
        except ChildWorkflowError as err:
            self.shell.task_finished(wf.name, failed=True)
            if is_cancelled_exception(err):
                raise
            raise ApplicationError(
                f"workflow {wf.name!r} failed: {describe_failure(err)}", type="WorkflowFailed", non_retryable=True
            ) from err
        self.shell.task_finished(wf.name, failed=False)
        return wf.interface.output_from_wire(unpack(result))


def _run_user() -> str:
    """Who started the run: its ``gangflow_user`` memo (engine.core.protocol.USER_MEMO), read once. "" where it
    has none (started before users, or by hand) or one that is not a string: a memo is the starter's to fill,
    and a bad one must not fail the run. Reading a memo adds nothing to the history (replays as before)."""
    try:
        user = workflow.memo_value(USER_MEMO, default="", type_hint=str)
    except (TypeError, ValueError, KeyError, RuntimeError):  # not a JSON string (the converter's errors)
        return ""
    return user if isinstance(user, str) else ""


@workflow.defn(dynamic=True, sandboxed=False)
class UserWorkflow:
    """Runs one user workflow; its type name is the user's workflow name."""

    def __init__(self) -> None:
        self.running: Counter[str] = Counter()  # task name -> calls in flight
        self.done = 0
        self.failed = 0
        self.waits = Waits(self._details)  # engine.approve / engine.wait_for_input (workflows/waits.py)
        self.glance = RunGlance()  # its distributed task calls' states, as their gangs tell them

    def task_started(self, name: str) -> None:
        self.running[name] += 1
        self._details()

    def task_finished(self, name: str, *, failed: bool) -> None:
        self.running[name] -= 1
        if not self.running[name]:
            del self.running[name]
        if failed:
            self.failed += 1
        else:
            self.done += 1
        self._details()

    def _details(self) -> None:
        """The Web UI's current details of the run: its task counts, what it waits for, and each distributed task
        call's state in the words of ``gangflow status`` (engine.core.glance)."""
        now = ", ".join(f"{n} ×{c}" if c > 1 else n for n, c in sorted(self.running.items())) or "—"
        waiting = self.waits.details()
        head = f"**running:** {now} · **done:** {self.done} · **failed:** {self.failed}" + (
            f" · **{waiting}**" if waiting else ""
        )
        workflow.set_current_details(self.glance.details(head))

    @workflow.signal(name=GANG_STATE_SIGNAL)
    def on_gang_state(self, state: Any) -> None:
        if self.glance.told(state):  # a malformed or stale one is dropped, never raised on
            self._details()

    @workflow.query(name=PROGRESS_QUERY)
    def progress(self) -> dict[str, Any]:
        return {
            "running": sorted(self.running),
            "in_flight": sum(self.running.values()),
            "done": self.done,
            "failed": self.failed,
            "waiting": self.waits.describe(),
        }

    # answers to engine.approve / engine.wait_for_input: the validators refuse (the sender gets the reason and
    # the run keeps waiting), the handlers never raise
    @workflow.update(name=INPUT_UPDATE)
    def gangflow_input(self, message: dict[str, Any]) -> dict[str, Any]:
        return self.waits.receive_input(message)

    @gangflow_input.validator
    def _check_input(self, message: dict[str, Any]) -> None:
        self.waits.check_input(message)

    @workflow.update(name=APPROVE_UPDATE)
    def gangflow_approve(self, message: dict[str, Any]) -> dict[str, Any]:
        return self.waits.receive_approval(message)

    @gangflow_approve.validator
    def _check_approval(self, message: dict[str, Any]) -> None:
        self.waits.check_approval(message)

    @workflow.run
    async def run(self, args: Sequence[RawValue]) -> bytes:
        blob = workflow.payload_converter().from_payload(args[0].payload, bytes)
        envelope = Envelope.decode(blob)
        envelope = replace(envelope, run=scheduled_run_context(envelope.run))
        defn, envelope = load_code(envelope, WorkflowDefinition)
        try:
            inputs = defn.interface.inputs_from_wire(envelope.inputs)
            dispatcher = _TemporalDispatcher(self, envelope, _run_user())
            with using_dispatcher(dispatcher), guarding(defn.name, defn.module) as scope:
                result = await defn.fn(**inputs)
            scope.check()  # a forbidden call the body caught and swallowed still fails the run
            return check_payload_size(pack(defn.interface.output_to_wire(result)), f"the result of {defn.name!r}")
        except (FailureError, asyncio.CancelledError):
            raise  # Temporal failures (task failed, cancelled, ...) already say what happened
        except GangflowError as exc:
            raise ApplicationError(str(exc), type=exc.kind, non_retryable=True) from exc
        except Exception as exc:
            # An exception in workflow code fails the run (Temporal's default would retry the workflow
            # task forever, leaving the run hanging). The traceback travels in the failure details.
            raise ApplicationError(
                f"workflow {defn.name!r} raised {type(exc).__name__}: {exc}",
                "".join(traceback.format_exception(exc)),
                type=type(exc).__name__,
                non_retryable=True,
            ) from exc
