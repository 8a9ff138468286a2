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
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ParamSpec, TypeVar, Unpack, overload

from engine.core.dispatch import DirectDispatcher, current_dispatcher, using_dispatcher
from engine.core.gang import GangShape, gang_shape
from engine.core.interface import Interface
from engine.core.options import (
    DEFAULT_LOST_NODE_WAIT,
    MAX_PREEMPTION_GRACE,
    Gang,
    TaskOptions,
    gang_from_keywords,
    warn_deprecated_keywords,
)
from engine.core.placement import Topology
from engine.core.resources import Resources, Retry, to_timedelta
from engine.core.secrets import Secret, check_secrets
from engine.errors import DefinitionError

__all__ = [
    "DEFAULT_HEARTBEAT_TIMEOUT",
    "DEFAULT_LIGHTWEIGHT_TIMEOUT",
    "DEFAULT_LOST_NODE_WAIT",
    "DEFAULT_TASK_TIMEOUT",
    "MAX_PREEMPTION_GRACE",
    "Gang",
    "TaskDefinition",
    "TaskOptions",
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
    #: where the task's gang's nodes may be (``Topology``: one topology domain, or as few as can be); None: anywhere
    placement: Topology | None = None


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
def task(**options: Unpack[TaskOptions]) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def task(fn: Callable[..., Any] | None = None, /, **options: Unpack[TaskOptions]) -> Any:
    """Declare a typed task: ``@task``, ``@task()`` or ``@task(option=...)`` (the options: :class:`TaskOptions`).

    ``name`` (default: the function's) and ``version`` label it. ``resources`` is a :class:`Resources`
    (per node for a distributed task). ``retries`` is an int (that many retries after the first try) or a
    :class:`Retry`. ``timeout`` bounds one attempt (seconds or a timedelta; default 24 h, 1 min for a
    lightweight task); ``heartbeat_timeout`` (default 10 s) is how soon a vanished worker is noticed.
    ``lightweight=True`` runs the task as a Temporal *local activity* inside the workflow worker: still
    durable and retried, but without a round trip through the task queue (a few ms instead of tens); meant
    for short CPU work. ``plugin`` makes it a distributed task run as a gang of ranks, and ``gang`` (a
    :class:`Gang`, with ``plugin`` only) says how its gangs are restarted, watched, queued and preempted.
    ``placement`` (a :class:`Topology`, with ``plugin`` only) keeps a gang's nodes in one topology domain
    (``Topology(required="rack")``) or in as few as the scheduler finds (``Topology(preferred="block")``).
    ``secrets`` lists the :class:`~engine.Secret` names the task needs: a plain task with secrets runs in a
    process of its own that alone gets their values (``engine.secret(name)``); ranks get them likewise.
    ``cache=True`` reuses the result of an earlier successful call with the same inputs (Files and Directories
    by content), across runs and workers of the tenant; ``cache_version`` (a str, default ``"0"``) is bumped
    by hand when the body changes in a way that changes results.

    ``max_restarts``, ``hang_timeout``, ``lost_node_wait``, ``priority``, ``preemptible`` and
    ``preemption_grace`` as keywords of their own are deprecated (a DeprecationWarning each): they are the
    fields of :class:`Gang` now.
    """
    unknown = sorted(set(options) - TaskOptions.__optional_keys__)
    if unknown:
        raise DefinitionError(f"@task() got an unexpected keyword argument {unknown[0]!r}")
    deprecated = warn_deprecated_keywords(options, stacklevel=2)  # warned at the user's decorator line

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(func) or inspect.isclass(func):
            raise DefinitionError(f"@task must decorate a function, got {func!r}")
        return _define(func, options, deprecated)

    return decorate(fn) if fn is not None else decorate


def _define(func: Callable[..., Any], options: TaskOptions, deprecated: dict[str, object]) -> Callable[..., Any]:
    """Check ``options`` for ``func`` and wrap it: a plain call outside a run, a dispatched one inside."""
    task_name = _check_name(options.get("name") or func.__name__, "task")
    owner = f"task {task_name!r}"
    resources, plugin = options.get("resources"), options.get("plugin")
    lightweight = options.get("lightweight", False)
    try:
        retry = Retry.coerce(options.get("retries", 0))
        limit = to_timedelta(options.get("timeout"), "timeout")
        beat = to_timedelta(options.get("heartbeat_timeout"), "heartbeat_timeout")
    except ValueError as exc:
        raise DefinitionError(f"{owner}: {exc}") from None
    if resources is not None and not isinstance(resources, Resources):
        raise DefinitionError(f"{owner}: resources must be a Resources(...), got {resources!r}")
    if lightweight and plugin is not None:
        raise DefinitionError(f"{owner}: a distributed task (plugin=) cannot be lightweight")
    if lightweight and resources is not None and resources.gpu:
        raise DefinitionError(f"{owner}: a lightweight task runs in the workflow worker and cannot ask for GPUs")
    if plugin is None and resources is not None and resources.placed:
        # a plain task runs on a worker's CPU queue, which no flavor or node label describes: refused rather than
        # ignored, so no one believes a plain task ran on an H100 because it asked for one
        raise DefinitionError(
            f"{owner}: Resources(flavor=, node_selector=, tolerations=) choose the nodes of a distributed task "
            "(plugin=...), which run on node agents; a plain task runs on a worker's CPU queue and cannot ask for them"
        )
    shape = gang_shape(plugin, resources or Resources(), owner) if plugin is not None else None
    gang = _gang_options(owner, shape, options.get("gang"), deprecated)
    placement = options.get("placement")
    if placement is not None and not isinstance(placement, Topology):
        raise DefinitionError(
            f"{owner}: placement must be a Topology(required=...) or Topology(preferred=...), got {placement!r}"
        )
    if placement is not None and shape is None:
        raise DefinitionError(
            f"{owner}: placement= applies to distributed tasks (plugin=...) only: a plain task runs on one worker"
        )
    needs = check_secrets(owner, options.get("secrets"))
    cache, cache_version = options.get("cache", False), options.get("cache_version")
    _check_cache(owner, cache, cache_version)
    if needs and lightweight:
        raise DefinitionError(f"{owner}: a lightweight task runs in the workflow worker and cannot have secrets")
    defn = TaskDefinition(
        name=task_name,
        fn=func,
        interface=Interface.from_function(func, owner),
        module=func.__module__,
        qualname=func.__qualname__,
        version=options.get("version"),
        resources=resources or Resources(),
        retry=retry,
        timeout=limit or (DEFAULT_LIGHTWEIGHT_TIMEOUT if lightweight else DEFAULT_TASK_TIMEOUT),
        heartbeat_timeout=beat or DEFAULT_HEARTBEAT_TIMEOUT,
        lightweight=lightweight,
        plugin=plugin,
        gang=shape,
        # the definition keeps the gang options as fields of its own: the workflows read them so (Gang holds
        # timedeltas already: to_timedelta only narrows the type)
        max_restarts=gang.max_restarts,
        hang_timeout=to_timedelta(gang.hang_timeout, "hang_timeout"),
        lost_node_wait=to_timedelta(gang.lost_node_wait, "lost_node_wait") or DEFAULT_LOST_NODE_WAIT,
        is_async=inspect.iscoroutinefunction(func),
        priority=gang.priority,
        preemptible=gang.preemptible,
        preemption_grace=to_timedelta(gang.preemption_grace, "preemption_grace"),
        secrets=needs,
        cache=cache,
        cache_version=(cache_version if cache_version is not None else "0") if cache else None,
        placement=placement,
    )

    @functools.wraps(func)
    def call(*args: Any, **kwargs: Any) -> Any:
        dispatcher = current_dispatcher()
        if dispatcher is None:
            return func(*args, **kwargs)
        return dispatcher.run_task(defn, defn.interface.bind(args, kwargs))

    setattr(call, _ATTR, defn)
    return call


def _gang_options(owner: str, shape: GangShape | None, gang: object, deprecated: dict[str, object]) -> Gang:
    """The task's Gang: ``gang=`` or the deprecated keywords mapped onto one (not both), for a distributed
    task only; a plain task gets the defaults, which nothing reads."""
    if gang is not None and not isinstance(gang, Gang):
        raise DefinitionError(f"{owner}: gang must be a Gang(...), got {gang!r}")
    if gang is not None and deprecated:
        raise DefinitionError(
            f"{owner}: {', '.join(f'{k}=' for k in deprecated)} and gang= both given: "
            "move the former into gang=Gang(...)"
        )
    if deprecated:
        gang = gang_from_keywords(owner, deprecated)
        if shape is None and set(deprecated) == {"max_restarts"}:
            gang = None  # checked and ignored, as before Gang (see warn_deprecated_keywords)
    if shape is None and gang is not None:
        given = [f"{k}=" for k in deprecated] or ["gang="]
        verb = "applies" if len(given) == 1 else "apply"
        raise DefinitionError(f"{owner}: {', '.join(given)} {verb} to distributed tasks (plugin=...) only")
    return gang if gang is not None else Gang()


def _check_cache(owner: str, cache: object, version: object) -> None:
    """``cache_version`` only means something with ``cache=True``; a version is a label, compared as text."""
    if not isinstance(cache, bool):
        raise DefinitionError(f"{owner}: cache must be True or False, got {cache!r}")
    if version is not None and not cache:
        raise DefinitionError(f"{owner}: cache_version applies to cached tasks only (add cache=True)")
    if version is not None and (not isinstance(version, str) or not version.strip()):
        raise DefinitionError(f"{owner}: cache_version must be a non-empty str such as '1', got {version!r}")


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
