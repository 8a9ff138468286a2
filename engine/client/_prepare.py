"""Preparing a run, before anything is sent to Temporal: load the workflow file, validate the inputs against its
signature, pack its code into a content-addressed bundle, and check the tenant and priority classes against the
cluster's queue configuration (``check_tenancy``). ``Client.start`` and schedules (engine.client.Schedules) start what
``prepare_run`` returns, with the options ``start_options`` gives.
"""

from __future__ import annotations

import base64
import contextlib
import getpass
import importlib
import inspect
import os
import sys
import sysconfig
import traceback
import types
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from temporalio.common import SearchAttributePair, TypedSearchAttributes

from engine.artifacts import ArtifactStore, default_artifact_root, pack_code
from engine.core.cache_key import check_cache_mode
from engine.core.definitions import TaskDefinition, WorkflowDefinition, definition_of, source_file
from engine.core.protocol import DEFAULT_TENANT, KIND_RUN, USER_MEMO
from engine.core.wire import CodeRef, Envelope, RunContext
from engine.errors import GangflowError, InputError
from engine.runtime.connection import KIND, PIPELINE, TENANT

__all__ = [
    "NO_QUEUE_CONFIG",
    "TenancyError",
    "check_tenancy",
    "default_tenant",
    "load_workflow_file",
    "prepare_run",
    "start_options",
    "task_priorities",
    "to_jsonable",
    "workflow_tasks",
]

#: the tenant of a run that names none (and no GANGFLOW_TENANT): the only one a cluster without a queue
#: configuration has
NO_QUEUE_CONFIG = "no queue configuration is applied here: gangflow queues apply FILE"


class TenancyError(GangflowError, ValueError):
    """A run names a tenant or priority class that the cluster's queue configuration does not have, or a task
    of it a flavor the configuration does not declare or node labels no registered node carries (refused
    before the run starts; ``gangflow run`` exits 2)."""

    kind = "TenancyError"


def default_tenant() -> str:
    """The tenant of a run that names none: ``$GANGFLOW_TENANT``, else ``default``."""
    return os.environ.get("GANGFLOW_TENANT") or DEFAULT_TENANT


def load_workflow_file(target: str) -> WorkflowDefinition:
    """``path/to/file.py:workflow_name`` → the workflow definition, importing the file the way its code
    bundle will be imported (same module name, same root), so what runs locally is what ships."""
    file, sep, name = target.rpartition(":")
    if not sep or not file or not name:
        raise InputError(f"expected FILE.py:WORKFLOW, got {target!r}")
    if not Path(file).is_file():
        raise InputError(f"{file}: no such file")
    bundle = pack_code(file)
    _import_from(Path(bundle.root))
    try:
        module = importlib.import_module(bundle.module)
    except Exception as exc:  # the author's code: their error and frames, not gangflow's and importlib's
        raise InputError(f"{file} could not be imported:\n{_import_failure(exc, Path(bundle.root))}") from None
    defn = definition_of(getattr(module, name, None))
    if not isinstance(defn, WorkflowDefinition):
        found = sorted(k for k, v in vars(module).items() if isinstance(definition_of(v), WorkflowDefinition))
        raise InputError(f"{file} has no @workflow named {name!r}; it has: {', '.join(found) or 'none'}")
    return defn


def _import_failure(exc: Exception, root: Path) -> str:
    """``exc`` raised importing a project as a traceback of the project's own frames (paths from ``root``),
    where the line a SyntaxError points at is one of them."""
    root = root.resolve()

    def frame(filename: str, lineno: int | None, where: str, line: str | None) -> list[str]:
        path = Path(filename).resolve()  # "<frozen importlib._bootstrap>" is no file
        if not path.is_file() or not path.is_relative_to(root):
            return []
        return [f'  File "{path.relative_to(root)}", line {lineno}{where}'] + ([f"    {line.strip()}"] if line else [])

    lines = []
    for f in traceback.extract_tb(exc.__traceback__):
        lines += frame(f.filename, f.lineno, f", in {f.name}", f.line)
    if isinstance(exc, SyntaxError) and exc.filename:
        lines += frame(exc.filename, exc.lineno, "", exc.text)
        return "\n".join([*lines, f"{type(exc).__name__}: {exc.msg}"])
    return "\n".join([*lines, f"{type(exc).__name__}: {exc}"])


def _installed() -> list[Path]:
    """Where the standard library, installed packages and gangflow's own packages live: never a project's."""
    paths = sysconfig.get_paths()
    folders = {Path(paths[k]).resolve() for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    here = Path(__file__).resolve().parents[1]  # the folder holding gangflow's own packages
    folders |= {here / package for package in ("engine", "workflows", "plugins")}
    return sorted(folders)


def _import_from(root: Path) -> None:
    """Make ``root`` the first place imports look, and forget the modules of the same top-level names that
    came from another project folder: a process that loads two projects (a notebook, a test session) each
    with its own ``flows.py`` and ``tasks.py`` must get the file it names, not the first one again. The
    standard library, installed packages and gangflow itself are never forgotten (a project's ``logging.py``
    does not displace the real one)."""
    root = root.resolve()
    with contextlib.suppress(ValueError):
        sys.path.remove(str(root))
    sys.path.insert(0, str(root))
    names = {p.stem for p in root.glob("*.py")} | {p.parent.name for p in root.glob("*/__init__.py")}
    installed = _installed()
    for name in list(sys.modules):
        origin = getattr(sys.modules[name], "__file__", None) if name.partition(".")[0] in names else None
        if origin is None:
            continue
        where = Path(origin).resolve()
        if not where.is_relative_to(root) and not any(where.is_relative_to(folder) for folder in installed):
            del sys.modules[name]


def to_jsonable(data: Any) -> Any:
    """Wire data (msgpack) → JSON: bytes become base64 strings."""
    if isinstance(data, bytes):
        return base64.b64encode(data).decode()
    if isinstance(data, dict):
        return {str(k): to_jsonable(v) for k, v in data.items()}
    if isinstance(data, list):
        return [to_jsonable(v) for v in data]
    return data


def prepare_run(
    wf: Callable[..., Any] | WorkflowDefinition,
    inputs: Mapping[str, Any] | None = None,
    *,
    artifacts: str | None = None,
    run_id: str | None = None,
    tenant: str | None = None,
    priority: str | None = None,
    bundle: bool = True,
    cache: str = "use",
) -> tuple[WorkflowDefinition, Envelope]:
    """Validate the inputs and pack the code, without contacting Temporal: raises InputError (or
    TypeMismatchError) for bad input, so nothing is started. ``tenant`` defaults to ``default_tenant()``;
    whether the cluster has that tenant (and the ``priority`` class) is checked by ``Client.start``.
    ``cache``: how ``@task(cache=True)`` calls use the cache, "use", "skip" or "overwrite" (engine.core.cache_key)."""
    defn = wf if isinstance(wf, WorkflowDefinition) else definition_of(wf)
    if not isinstance(defn, WorkflowDefinition):
        raise InputError(f"{wf!r} is not a @workflow")
    tenant = default_tenant() if tenant is None else tenant
    for option, value in (("tenant", tenant), ("priority", priority)):
        if value is not None and (not isinstance(value, str) or not value or value != value.strip()):
            raise InputError(f"{option} must be a name (a non-empty str without surrounding spaces), got {value!r}")
    cache = check_cache_mode(cache)
    root = artifacts or default_artifact_root()
    with _usable(root):
        store = ArtifactStore(root)
    wire = defn.interface.inputs_to_wire(dict(inputs or {}), store.context(fetch=False))
    code = CodeRef(defn.module, defn.qualname)
    source = source_file(defn)
    if bundle and source:
        packed = pack_code(source)
        with _usable(root):  # the first write: a root that exists but cannot be written fails here
            uri, sha = store.put_bytes(packed.data)
        code = CodeRef(packed.module, defn.qualname, uri, sha)
    run = RunContext(
        run_id or f"{defn.name}-{uuid.uuid4().hex[:8]}", defn.name, tenant, store.uri_root, priority, cache
    )
    return defn, Envelope(code, wire, run)


@contextlib.contextmanager
def _usable(root: str) -> Iterator[None]:
    """A root the store cannot open or write is bad input, said in one line before anything starts (a path
    under a file, an unknown URI scheme, no permission), not a traceback from fsspec or os.makedirs."""
    try:
        yield
    except (OSError, ValueError, ImportError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InputError(
            f"artifact root {root!r} cannot be used: {reason} (--artifacts or $GANGFLOW_ARTIFACTS)"
        ) from None


def start_options(defn: WorkflowDefinition, envelope: Envelope) -> dict[str, Any]:
    """Temporal's start options for a prepared run (argument, id, memo, search attributes, summary), apart from
    the workflow type and task queue: one place, so a scheduled run (engine.client.Schedules) starts what
    ``start`` does."""
    memo: dict[str, Any] = {"artifacts": envelope.run.artifacts, "bundle": envelope.code.bundle_sha}
    if envelope.run.priority is not None:
        memo["priority"] = envelope.run.priority
    return {
        "arg": envelope.encode(f"the inputs of workflow {defn.name!r}"),
        "id": envelope.run.run_id,
        "execution_timeout": defn.timeout,
        # who starts it: nothing authenticates the login name; behind the dev gateway the token's subject replaces
        # it (engine.runtime.gateway)
        "memo": {"gangflow": memo, USER_MEMO: _login()},
        "search_attributes": TypedSearchAttributes(
            [
                SearchAttributePair(PIPELINE, defn.name),
                SearchAttributePair(TENANT, envelope.run.tenant),
                SearchAttributePair(KIND, KIND_RUN),
            ]
        ),
        "static_summary": f"gangflow pipeline {defn.name}",
        "static_details": f"code: {envelope.code.module}.{envelope.code.qualname}"
        + (f" (bundle {envelope.code.bundle_sha[:12]})" if envelope.code.bundle_sha else ""),
    }


def _login() -> str:
    """The local login name, "" where there is none to be had (no passwd entry for the uid, no $USER)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError, ImportError):  # KeyError up to 3.12, OSError from 3.13; no pwd module
        return ""


def task_priorities(defn: WorkflowDefinition) -> dict[str, str]:
    """Task name → priority class of the distributed tasks with ``Gang(priority=...)`` among ``workflow_tasks``."""
    return {name: t.priority for name, t in workflow_tasks(defn).items() if t.priority is not None}


def workflow_tasks(defn: WorkflowDefinition) -> dict[str, TaskDefinition]:
    """Task name → definition of the tasks that the workflow's body names (``train(...)``, ``lib.train(...)``),
    also inside the child workflows it names and the helper functions of its own file it calls: what can be
    checked before the run starts (priority classes, flavors, node selectors). Read from the code's names, not
    by running it, so a task reached another way (a task passed in as a value) is checked by the Scheduler
    only, when its gang is submitted."""
    found: dict[str, TaskDefinition] = {}
    seen: set[int] = set()

    def visit(fn: Any) -> None:
        code, scope = getattr(fn, "__code__", None), getattr(fn, "__globals__", None)
        if not isinstance(code, types.CodeType) or not isinstance(scope, dict) or id(code) in seen:
            return
        seen.add(id(code))
        names = _code_names(code)
        for name in names:
            value = scope.get(name)
            # ``lib.train``: the attribute names are among the code's names too
            for candidate in [getattr(value, n, None) for n in names] if inspect.ismodule(value) else [value]:
                found_defn = definition_of(candidate)
                if isinstance(found_defn, TaskDefinition):
                    found[found_defn.name] = found_defn
                elif isinstance(found_defn, WorkflowDefinition):
                    visit(found_defn.fn)
                elif inspect.isfunction(candidate) and candidate.__module__ == defn.module:
                    visit(candidate)  # a helper of the workflow's own file

    visit(defn.fn)
    return dict(sorted(found.items()))


def _code_names(code: types.CodeType) -> set[str]:
    """The global and attribute names a function's code uses, nested functions and comprehensions included."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _known(names: Sequence[str]) -> str:
    return ", ".join(names) if names else "none"


def check_tenancy(queues: Mapping[str, Any] | None, run: RunContext, tasks: Mapping[str, str]) -> None:
    """Refuse (TenancyError) a run whose tenant, priority class or tasks' priority classes the queue
    configuration lacks, or whose tenant may not use them (``tenants[].priority_classes``). ``queues`` is the
    Scheduler's "queues" answer, None when no configuration can be had (no Scheduler runs, or one from
    before queue configurations): then only tenant "default" and no priority class exist."""
    config = queues.get("config") if queues is not None else None
    allowed: list[str] | None = None  # the classes the run's tenant may name; None: every class
    if isinstance(config, Mapping):
        entries = [t for t in config.get("tenants") or [] if isinstance(t, Mapping)]
        tenants = [str(t.get("name")) for t in entries]
        classes: list[str] | None = [
            str(c.get("name")) for c in config.get("priority_classes") or [] if isinstance(c, Mapping)
        ]
        own = next((t.get("priority_classes") for t in entries if t.get("name") == run.tenant), None)
        allowed = [str(name) for name in own] if isinstance(own, list | tuple) else None
    elif queues is not None and isinstance(queues.get("tenants"), Mapping):
        tenants, classes = sorted(queues["tenants"]), None  # names only: the Scheduler checks classes itself
    else:
        tenants, classes = [DEFAULT_TENANT], []
    # a cluster that only knows the default tenant and no class has no configuration applied (yet)
    unconfigured = tenants == [DEFAULT_TENANT] and not classes
    hint = f"; {NO_QUEUE_CONFIG}" if unconfigured else " (gangflow queues show)"
    if run.tenant not in tenants:
        raise TenancyError(f"unknown tenant {run.tenant!r}: the cluster's tenants are {_known(tenants)}{hint}")
    if classes is None:
        return
    wanted = ([("the run", run.priority)] if run.priority is not None else []) + [
        (f"task {name!r}", priority) for name, priority in tasks.items()
    ]
    for who, priority in wanted:
        if priority not in classes:
            raise TenancyError(
                f"unknown priority class {priority!r} ({who}): the cluster's priority classes are "
                f"{_known(classes)}{hint}"
            )
        if allowed is not None and priority not in allowed:
            raise TenancyError(
                f"priority class {priority!r} ({who}) is not allowed for tenant {run.tenant!r}: its priority "
                f"classes are {_known(allowed)} (tenants[].priority_classes in the queue configuration; "
                "gangflow queues show)"
            )
