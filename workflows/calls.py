"""What every workflow that runs user code shares: the worker's code resolver and tenant route, loading a run's
code pinned to the worker's tenant, and one plain task call with its tries.

The user-workflow shell (``workflows.shell``) and engine.map's chunks (``workflows.mapping``) both run task calls;
keeping the call and its retry rules here gives them one behaviour (and keeps the shell small).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Protocol, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    ChildWorkflowError,
    FailureError,
    NexusOperationError,
    TimeoutError,
    TimeoutType,
    is_cancelled_exception,
)

from engine.core.definitions import TaskDefinition, WorkflowDefinition
from engine.core.protocol import TenantRoute
from engine.core.resources import NEVER_RETRIED, Retry
from engine.core.wire import CodeRef, Envelope, RunContext
from engine.errors import SYSTEM_ERROR_TYPES

__all__ = [
    "SYSTEM_RETRIES",
    "CodeResolver",
    "TaskFailed",
    "code_ref",
    "configure",
    "describe_failure",
    "execute_plain",
    "load_code",
    "retry_policy",
    "route",
]

#: a task whose worker died (heartbeat timeout), or whose input could not be delivered, is started again this
#: many times, apart from its retries
SYSTEM_RETRIES = 3
#: workflow.patched id: from here on a plain task's try that failed to deliver its input (InputUnavailableError,
#: the platform's fault) is tried again without spending one of the task's retries
UNDELIVERED_PATCH = "plain-undelivered-not-a-retry"

D = TypeVar("D", TaskDefinition, WorkflowDefinition)


class CodeResolver(Protocol):
    """Loads code by reference (the worker's bundle cache) and says how to reference a definition."""

    def load(self, ref: CodeRef) -> TaskDefinition | WorkflowDefinition: ...

    def ref_for(self, defn: TaskDefinition | WorkflowDefinition) -> CodeRef: ...


_resolver: CodeResolver | None = None
#: set on a tenant's worker (the isolated layout): its tenant and artifact root win over the client's, and
#: gangs go through the tenant's Nexus endpoint to the platform namespace instead of running as children here
_route: TenantRoute | None = None


def configure(resolver: CodeResolver, route: TenantRoute | None = None) -> None:
    """Called once by the worker assembly (engine.runtime) before the worker starts."""
    global _resolver, _route
    _resolver, _route = resolver, route


def route() -> TenantRoute | None:
    return _route


def _resolver_or_fail() -> CodeResolver:
    if _resolver is None:
        raise ApplicationError("gangflow worker not configured: no code resolver", non_retryable=True)
    return _resolver


def _pinned(run: RunContext) -> RunContext:
    """The run as this worker runs it: on a tenant's worker, its own tenant and root, whatever the client said."""
    if _route is None:
        return run
    return replace(run, tenant=_route.tenant, artifacts=_route.artifacts)


def load_code(envelope: Envelope, kind: type[D]) -> tuple[D, Envelope]:
    """The definition an envelope names, and the envelope with its run pinned to this worker's tenant. A bundle
    outside the tenant's root, or code that cannot be loaded or is not a ``kind``, fails for good."""
    envelope = replace(envelope, run=_pinned(envelope.run))
    bundle = envelope.code.bundle
    if _route is not None and bundle and not bundle.startswith(_route.artifacts.rstrip("/") + "/"):
        raise ApplicationError(
            f"the run's code bundle {bundle} is outside tenant {_route.tenant}'s artifact root "
            f"{_route.artifacts} (set GANGFLOW_ARTIFACTS to it)",
            type="ArtifactOutsideStore",
            non_retryable=True,
        )
    try:
        defn = _resolver_or_fail().load(envelope.code)
    except Exception as exc:
        raise ApplicationError(f"cannot load the run's code: {exc}", type="CodeNotFound", non_retryable=True) from exc
    if not isinstance(defn, kind):
        what = "@task" if kind is TaskDefinition else "@workflow"
        raise ApplicationError(f"{envelope.code.qualname} is not a {what}", type="CodeNotFound", non_retryable=True)
    return defn, envelope


def code_ref(defn: TaskDefinition | WorkflowDefinition, envelope: Envelope) -> CodeRef:
    """How a call in this run names ``defn``'s code. The resolver names the copy of the bundle it first loaded,
    which may lie in another run's store (the same code uploaded by two tenants, or to two roots): a definition
    from the run's own bundle is named by the run's copy, so the task's reference check accepts it."""
    ref = _resolver_or_fail().ref_for(defn)
    own = envelope.code
    if own.bundle and ref.bundle_sha is not None and ref.bundle_sha == own.bundle_sha:
        return replace(ref, bundle=own.bundle)
    return ref


def retry_policy(retry: Retry) -> RetryPolicy:
    """Temporal's policy for what Temporal retries itself: lightweight tasks (local activities), which
    run inside the workflow worker and so cannot lose a worker of their own."""
    return RetryPolicy(
        initial_interval=retry.delay(1),
        backoff_coefficient=2.0,
        maximum_interval=retry.max_interval if isinstance(retry.max_interval, timedelta) else None,
        maximum_attempts=retry.attempts,
        non_retryable_error_types=[*NEVER_RETRIED, *retry.non_retryable_names],
    )


def _failure_type(err: FailureError) -> str | None:
    """The exception type (or gangflow error kind) a task body failed with, as its activity reported it."""
    cause = err.cause
    if isinstance(cause, ApplicationError):
        return cause.type
    return None


class TaskFailed(Exception):
    """A plain task call failed for good after ``tries`` tries of its body."""

    def __init__(self, error: ActivityError, tries: int) -> None:
        super().__init__(str(error))
        self.error, self.tries = error, tries


def _worker_lost(err: ActivityError) -> bool:
    cause = err.cause
    return isinstance(cause, TimeoutError) and cause.type == TimeoutType.HEARTBEAT


def describe_failure(err: FailureError) -> str:
    """The failure a task or child reported, under Temporal's wrappers: ``Type: message``."""
    cause: BaseException | None = err.cause
    while isinstance(cause, ActivityError | ChildWorkflowError | NexusOperationError) and cause.cause is not None:
        cause = cause.cause
    if isinstance(cause, ApplicationError):
        return f"{cause.type or 'Error'}: {cause.message}"
    return str(cause or err)


async def execute_plain(task: TaskDefinition, blob: bytes, call: str | None, summary: str | None = None) -> bytes:
    """One plain or lightweight task call, with its tries; ``call`` names the activity ids (``<call>#<try>``;
    unused for a lightweight task)."""
    if summary is None:
        summary = task.name if task.version is None else f"{task.name} (v{task.version})"
    if task.lightweight:
        return await workflow.execute_local_activity(  # type: ignore[no-any-return]
            task.name,
            blob,
            result_type=bytes,
            start_to_close_timeout=task.timeout,
            retry_policy=retry_policy(task.retry),
            summary=summary,
        )
    # Gangflow retries plain tasks itself, one activity per try, rather than through Temporal's retry
    # policy: Temporal counts a heartbeat timeout (the worker died) as a try, which would spend the
    # user's retries on a system failure. Each try's activity id is "<call>#<try>" (read_tasks joins them).
    failures = lost = undelivered = 0
    while True:
        tries = failures + lost + undelivered + 1
        label = summary if tries == 1 else f"{summary} (try {tries}{': worker lost' if lost and not failures else ''})"
        try:
            return await workflow.execute_activity(  # type: ignore[no-any-return]
                task.name,
                blob,
                result_type=bytes,
                activity_id=f"{call}#{tries}",
                task_queue=workflow.info().task_queue,
                start_to_close_timeout=task.timeout,
                heartbeat_timeout=task.heartbeat_timeout,
                retry_policy=RetryPolicy(maximum_attempts=1),
                summary=label,
            )
        except ActivityError as err:
            if is_cancelled_exception(err):
                raise
            if _worker_lost(err):
                lost += 1
                if lost > SYSTEM_RETRIES:
                    raise TaskFailed(err, failures + 1) from err
                workflow.logger.warning("task %s lost its worker; starting it again", task.name)
                continue
            if _failure_type(err) in SYSTEM_ERROR_TYPES and workflow.patched(UNDELIVERED_PATCH):
                undelivered += 1
                if undelivered > SYSTEM_RETRIES:
                    raise TaskFailed(err, failures + 1) from err
                workflow.logger.warning(
                    "task %s: its input could not be delivered (%s); trying again, not spending a retry",
                    task.name,
                    describe_failure(err),
                )
                await workflow.sleep(task.retry.delay(undelivered))
                continue
            failures += 1
            if not task.retry.retries(_failure_type(err), failures):
                raise TaskFailed(err, failures) from err
            await workflow.sleep(task.retry.delay(failures))
