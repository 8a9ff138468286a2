"""``@task`` and ``@workflow``: validate eagerly, attach a frozen definition, stay callable as Python.

The decorated function keeps its name, docstring and signature. Called inside a workflow run it is
*dispatched* (scheduled durably); called anywhere else it simply runs, so unit tests can call tasks as
plain functions and ``await my_workflow(...)`` runs a whole pipeline in-process.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ParamSpec, TypeVar, overload

from engine.core.dispatch import DirectDispatcher, current_dispatcher, using_dispatcher
from engine.core.gang import GangShape, gang_shape
from engine.core.interface import Interface
from engine.core.resources import Resources, Retry, to_timedelta
from engine.core.secrets import Secret, check_secrets
from engine.errors import DefinitionError

__all__ = [
    "TaskDefinition",
    "WorkflowDefinition",
    "definition_of",
    "source_file",
    "task",
    "workflow",
]

P = ParamSpec("P")
R = TypeVar("R")

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")
_ATTR = "__gangflow__"

#: default limit for one attempt of a plain task; long work should set ``timeout=`` explicitly
DEFAULT_TASK_TIMEOUT = timedelta(hours=24)
#: a heartbeating task whose worker vanished is noticed within this time
DEFAULT_HEARTBEAT_TIMEOUT = timedelta(seconds=10)
#: lightweight tasks run as local activities: short CPU work only
DEFAULT_LIGHTWEIGHT_TIMEOUT = timedelta(minutes=1)
#: how long a gang waits for lost nodes to come back (a cluster restarting after maintenance)
DEFAULT_LOST_NODE_WAIT = timedelta(minutes=10)
#: a preempted gang holds GPUs that another gang waits for: a grace longer than a day is a mistake
MAX_PREEMPTION_GRACE = timedelta(days=1)


def _check_name(name: str, what: str) -> str:
    if not _NAME.match(name):
        raise DefinitionError(f"{what} name {name!r} must start with a letter and use letters, digits, _ and -")
    return name


@dataclass(frozen=True)
class TaskDefinition:
    """Everything the engine needs to run a task, fixed at decoration time."""

    name: str
    fn: Callable[..., Any]
    interface: Interface
    module: str
    qualname: str
    version: str | None
    resources: Resources
    retry: Retry
    timeout: timedelta
    heartbeat_timeout: timedelta
    lightweight: bool
    plugin: Any
    gang: GangShape | None
    max_restarts: int
    hang_timeout: timedelta | None
    lost_node_wait: timedelta
    is_async: bool
    #: the priority class of the task's gangs (checked against the cluster's queue configuration when a
    #: run starts); None: the run's priority. Distributed tasks only.
    priority: str | None = None
    #: False: the task's gangs are never preempted, whatever their priority class says
    preemptible: bool = True
    #: how long a preempted gang has between the notice and SIGKILL; None: the cluster's default (120 s)
    preemption_grace: timedelta | None = None
    #: the secrets the task's process gets (names only: values are resolved where it runs)
    secrets: tuple[Secret, ...] = ()
    #: successful results are cached by (name, cache_version, interface, inputs): see engine.core.cache_key
    cache: bool = False
    cache_version: str | None = None


@dataclass(frozen=True)
class WorkflowDefinition:
    name: str
    fn: Callable[..., Any]
    interface: Interface
    module: str
    qualname: str
    version: str | None
    timeout: timedelta | None


def source_file(defn: TaskDefinition | WorkflowDefinition) -> str | None:
    """The file the task or workflow was defined in: its function's own, which stays right when another file
    of the same module name was imported since (two projects with a ``flows.py`` each in one process); else its
    module's file, else None."""
    code = getattr(inspect.unwrap(defn.fn), "__code__", None)
    if code is not None and os.path.isfile(code.co_filename):
        return str(code.co_filename)
    origin = getattr(sys.modules.get(defn.module), "__file__", None)
    return origin if isinstance(origin, str) else None


def definition_of(obj: Any) -> TaskDefinition | WorkflowDefinition | None:
    """The definition attached by ``@task`` / ``@workflow``, or None for anything else."""
    defn = getattr(obj, _ATTR, None)
    return defn if isinstance(defn, TaskDefinition | WorkflowDefinition) else None


@overload
def task(fn: Callable[P, R], /) -> Callable[P, R]: ...


@overload
def task(
    *,
    name: str | None = None,
    version: str | None = None,
    resources: Resources | None = None,
    retries: int | Retry = 0,
    timeout: float | timedelta | None = None,
    heartbeat_timeout: float | timedelta | None = None,
    lightweight: bool = False,
    plugin: Any = None,
    max_restarts: int = 3,
    hang_timeout: float | timedelta | None = None,
    lost_node_wait: float | timedelta | None = None,
    priority: str | None = None,
    preemptible: bool | None = None,
    preemption_grace: float | timedelta | None = None,
    secrets: Sequence[Secret] | None = None,
    cache: bool = False,
    cache_version: str | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def task(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    version: str | None = None,
    resources: Resources | None = None,
    retries: int | Retry = 0,
    timeout: float | timedelta | None = None,
    heartbeat_timeout: float | timedelta | None = None,
    lightweight: bool = False,
    plugin: Any = None,
    max_restarts: int = 3,
    hang_timeout: float | timedelta | None = None,
    lost_node_wait: float | timedelta | None = None,
    priority: str | None = None,
    preemptible: bool | None = None,
    preemption_grace: float | timedelta | None = None,
    secrets: Sequence[Secret] | None = None,
    cache: bool = False,
    cache_version: str | None = None,
) -> Any:
    """Declare a typed task.

    ``retries`` is an int (that many retries after the first try) or a :class:`Retry`. ``timeout`` bounds
    one attempt (seconds or a timedelta). ``lightweight=True`` runs the task as a Temporal *local
    activity* inside the workflow worker: still durable and retried, but without a round trip through
    the task queue (a few ms instead of tens); meant for short CPU work. ``plugin`` makes it a
    distributed task run as a gang of ranks.

    For distributed tasks: ``max_restarts`` is the budget for *system* failures (a node lost, a rank
    killed from outside, a hung gang); each restart relaunches every rank from the latest checkpoint.
    ``hang_timeout`` (seconds) treats a gang as hung when a rank has not called ``engine.report`` for
    that long (the clock starts at launch, so it must cover start-up too); off by default.
    ``lost_node_wait`` (seconds, default 600) is how long a gang that only lost nodes could hold waits for
    them to come back (a whole-cluster restart) before it fails as unschedulable.
    ``priority`` names the priority class of its gangs (one of the cluster's ``priority_classes``; checked
    when a run starts, since the classes belong to the cluster, not to the code); it wins over the run's
    ``--priority``. ``preemptible=False`` keeps its gangs from ever being preempted, whatever their class.
    ``preemption_grace`` (seconds) is how long a preempted gang's ranks have to checkpoint and exit after
    the notice before they are killed (default: the cluster's ``policy.preemption_grace``, 120 s); ranks
    that exit earlier release the GPUs at once.
    ``secrets`` lists the :class:`~engine.Secret` names the task needs: a plain task with secrets runs in a
    process of its own that alone gets their values (``engine.secret(name)``); ranks get them likewise.
    ``cache=True`` reuses the result of an earlier successful call with the same inputs (Files and Directories
    by content), across runs and workers of the tenant; ``cache_version`` (a str, default ``"0"``) is bumped
    by hand when the body changes in a way that changes results.
    """

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(func) or inspect.isclass(func):
            raise DefinitionError(f"@task must decorate a function, got {func!r}")
        task_name = _check_name(name or func.__name__, "task")
        owner = f"task {task_name!r}"
        try:
            retry = Retry.coerce(retries)
            limit = to_timedelta(timeout, f"{owner}: timeout")
            beat = to_timedelta(heartbeat_timeout, f"{owner}: heartbeat_timeout")
            hang = to_timedelta(hang_timeout, f"{owner}: hang_timeout")
            node_wait = to_timedelta(lost_node_wait, f"{owner}: lost_node_wait")
            grace = to_timedelta(preemption_grace, f"{owner}: preemption_grace")
        except ValueError as exc:
            raise DefinitionError(f"{owner}: {exc}") from None
        if resources is not None and not isinstance(resources, Resources):
            raise DefinitionError(f"{owner}: resources must be a Resources(...), got {resources!r}")
        if lightweight and plugin is not None:
            raise DefinitionError(f"{owner}: a distributed task (plugin=) cannot be lightweight")
        if lightweight and resources is not None and resources.gpu:
            raise DefinitionError(f"{owner}: a lightweight task runs in the workflow worker and cannot ask for GPUs")
        shape = gang_shape(plugin, resources or Resources(), owner) if plugin is not None else None
        if shape is None and hang is not None:
            raise DefinitionError(f"{owner}: hang_timeout applies to distributed tasks (plugin=...) only")
        if shape is None and node_wait is not None:
            raise DefinitionError(f"{owner}: lost_node_wait applies to distributed tasks (plugin=...) only")
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
            raise DefinitionError(f"{owner}: max_restarts must be a non-negative int, got {max_restarts!r}")
        _check_scheduling(owner, shape, priority, preemptible)
        if shape is None and grace is not None:
            raise DefinitionError(f"{owner}: preemption_grace applies to distributed tasks (plugin=...) only")
        if grace is not None and grace > MAX_PREEMPTION_GRACE:
            raise DefinitionError(f"{owner}: preemption_grace must be at most {MAX_PREEMPTION_GRACE}, got {grace}")
        needs = check_secrets(owner, secrets)
        _check_cache(owner, cache, cache_version)
        if needs and lightweight:
            raise DefinitionError(f"{owner}: a lightweight task runs in the workflow worker and cannot have secrets")
        defn = TaskDefinition(
            name=task_name,
            fn=func,
            interface=Interface.from_function(func, owner),
            module=func.__module__,
            qualname=func.__qualname__,
            version=version,
            resources=resources or Resources(),
            retry=retry,
            timeout=limit or (DEFAULT_LIGHTWEIGHT_TIMEOUT if lightweight else DEFAULT_TASK_TIMEOUT),
            heartbeat_timeout=beat or DEFAULT_HEARTBEAT_TIMEOUT,
            lightweight=lightweight,
            plugin=plugin,
            gang=shape,
            max_restarts=max_restarts,
            hang_timeout=hang,
            lost_node_wait=node_wait or DEFAULT_LOST_NODE_WAIT,
            is_async=inspect.iscoroutinefunction(func),
            priority=priority,
            preemptible=preemptible is not False,
            preemption_grace=grace,
            secrets=needs,
            cache=cache,
            cache_version=(cache_version if cache_version is not None else "0") if cache else None,
        )

        @functools.wraps(func)
        def call(*args: Any, **kwargs: Any) -> Any:
            dispatcher = current_dispatcher()
            if dispatcher is None:
                return func(*args, **kwargs)
            return dispatcher.run_task(defn, defn.interface.bind(args, kwargs))

        setattr(call, _ATTR, defn)
        return call

    return decorate(fn) if fn is not None else decorate


def _check_cache(owner: str, cache: object, version: object) -> None:
    """``cache_version`` only means something with ``cache=True``; a version is a label, compared as text."""
    if not isinstance(cache, bool):
        raise DefinitionError(f"{owner}: cache must be True or False, got {cache!r}")
    if version is not None and not cache:
        raise DefinitionError(f"{owner}: cache_version applies to cached tasks only (add cache=True)")
    if version is not None and (not isinstance(version, str) or not version.strip()):
        raise DefinitionError(f"{owner}: cache_version must be a non-empty str such as '1', got {version!r}")


def _check_scheduling(owner: str, shape: GangShape | None, priority: object, preemptible: object) -> None:
    """``priority`` and ``preemptible`` shape how gangs are queued and preempted: distributed tasks only."""
    if shape is None:
        for option, value in (("priority", priority), ("preemptible", preemptible)):
            if value is not None:
                raise DefinitionError(f"{owner}: {option} applies to distributed tasks (plugin=...) only")
    # a class name as the queue configuration spells it: a stray space would only fail later, at run start
    if priority is not None and (not isinstance(priority, str) or not priority or priority != priority.strip()):
        raise DefinitionError(
            f"{owner}: priority must name a priority class (a non-empty str without surrounding spaces), "
            f"got {priority!r}"
        )
    if preemptible is not None and not isinstance(preemptible, bool):
        raise DefinitionError(f"{owner}: preemptible must be True or False, got {preemptible!r}")


def workflow(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    version: str | None = None,
    timeout: float | timedelta | None = None,
) -> Any:
    """Declare a typed workflow: an ``async def`` whose body awaits tasks and other workflows.

    The body is plain Python (``if``/``for``/``try``, ``asyncio.gather`` for parallel calls) and runs
    durably: on Temporal it is replayed from history, so it must be deterministic. Do I/O in tasks.
    """

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        wf_name = _check_name(name or str(getattr(func, "__name__", "")), "workflow")
        owner = f"workflow {wf_name!r}"
        if not inspect.iscoroutinefunction(func):
            raise DefinitionError(f"{owner}: a workflow must be an 'async def' function")
        try:
            limit = to_timedelta(timeout, f"{owner}: timeout")
        except ValueError as exc:
            raise DefinitionError(str(exc)) from None
        defn = WorkflowDefinition(
            name=wf_name,
            fn=func,
            interface=Interface.from_function(func, owner),
            module=func.__module__,
            qualname=func.__qualname__,
            version=version,
            timeout=limit,
        )

        @functools.wraps(func)
        def call(*args: Any, **kwargs: Any) -> Any:
            inputs = defn.interface.bind(args, kwargs)
            dispatcher = current_dispatcher()
            if dispatcher is not None:
                return dispatcher.run_workflow(defn, inputs)
            return _run_direct(defn, inputs)

        setattr(call, _ATTR, defn)
        return call

    return decorate(fn) if fn is not None else decorate


async def _run_direct(defn: WorkflowDefinition, inputs: dict[str, Any]) -> Any:
    with using_dispatcher(DirectDispatcher()):
        return await defn.fn(**inputs)
