"""The determinism guard: wall-clock, randomness and I/O calls inside a workflow body fail loudly.

A workflow body is replayed from history, so every value it computes must come out the same on every
replay. User workflows run *unsandboxed* (bundles are loaded once per worker; Temporal's sandbox would
re-import every user module, torch included, on every run), so nothing stops ``time.time()`` from
silently returning a different value on replay. This module is gangflow's own guard.

How it works. A profile function (``sys.setprofile``, which sees every call of a C function and every
entry into a Python function on one thread) is installed on the thread that runs a user workflow, only
while that workflow runs: the worker installs it around each activation of the user-workflow shell
(never around GangTask or the Scheduler), ``run_local`` around its event loop. It compares each C function
being called with a table of forbidden callables. Builtin bound methods compare by their ``__self__``
and method, so ``datetime.datetime.now`` matches however it was reached, and ``random.random`` (a bound
method of the ``random`` module's hidden instance) matches while ``workflow.random()``'s own instance,
or any seeded ``random.Random(42)``, does not. A forbidden call raises only when

* the code being run belongs to a workflow body (a context variable set by the shell around the body;
  asyncio tasks the body starts inherit it; task bodies that ``run_local`` runs inline clear it), and
* its caller is user code: frames inside the implementation modules (``random``, ``uuid``, ``pathlib``,
  ``socket``, ``urllib``, ...) are skipped to find the caller, and a caller in the standard library,
  site-packages or gangflow itself is allowed, so ``logging`` stamping a record with ``time.time()``
  or ``traceback`` reading a source line keeps working inside a workflow.

The error names the call the user wrote (``random.randint()``, not the ``getrandbits`` it ended in) and
its replacement. An exception raised by a profile function propagates into the calling code, and Python
removes the hook; the dispatcher installs it again (:func:`rearm`) at the body's next task call, timer or
child workflow, and the worker at the next activation. The first violation is also kept on the run's
scope, so a body that catches and swallows it still fails when it returns.

Why this design. Temporal's sandbox cannot be used (see above). Installing the hook around each step of
the user's coroutine instead of each activation would miss the tasks a body starts with
``asyncio.gather`` (the event loop steps them, not the body's coroutine); narrowing it to the event
loop's callbacks would save only a fifth of the profiled calls (measured on a chain of 100 tasks).
Patching ``time.time`` and friends is not possible for the C types (``datetime.datetime.now``) and
would slow every thread. Cost of the hook: 0.1-0.3 ms of worker CPU per task call (about 1,000 profiled
calls, most of them Temporal's own command building); nothing measurable on a chain of activities, about
a tenth on a chain of lightweight tasks (see the README). ``time.monotonic()`` / ``perf_counter()`` are
refused too: a body that branches on a measured duration diverges on replay like one that reads the
wall clock.
"""

from __future__ import annotations

import _random
import _socket
import contextvars
import datetime
import functools
import os
import random
import socket
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

from engine.errors import GangflowError

try:
    import _uuid
except ImportError:  # pragma: no cover - CPython builds without libuuid
    _uuid = None

__all__ = [
    "GuardScope",
    "NonDeterministicCall",
    "forbidden_calls",
    "guarding",
    "hooked",
    "rearm",
    "unguarded",
]


class NonDeterministicCall(GangflowError, RuntimeError):
    """A workflow body called something whose result differs on replay (clock, randomness, I/O)."""

    kind = "NonDeterministicCall"


_NOW = "use engine.now()"
_RANDOM = "use engine.random()"
_UUID = "use engine.uuid4()"
_SLEEP = "use await engine.sleep()"
_FILES = "read and write files in a @task"
_NETWORK = "do network I/O in a @task"
_PROCESS = "run commands in a @task"


def _c_calls() -> dict[Any, tuple[str, str]]:
    """C functions (compared by equality, see the module docstring) -> (name the user knows, advice)."""
    calls: dict[Any, tuple[str, str]] = {}
    for name in ("time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns"):
        calls[getattr(time, name)] = (f"time.{name}()", _NOW)
    calls[time.sleep] = ("time.sleep()", _SLEEP)
    for name in ("now", "utcnow", "today"):
        calls[getattr(datetime.datetime, name)] = (f"datetime.datetime.{name}()", _NOW)
    calls[datetime.date.today] = ("datetime.date.today()", _NOW)
    # The module-level functions of ``random`` are bound methods of one hidden instance; its C methods
    # are where every one of them ends (randint, choice, shuffle, ... are named from the frame above).
    # Bound from the C base class: ``random.Random`` overrides seed() in Python and calls the C one.
    for name in ("random", "getrandbits", "seed", "setstate"):
        calls[getattr(_random.Random, name).__get__(random._inst)] = (f"random.{name}()", _RANDOM)
    calls[os.urandom] = ("os.urandom()", _RANDOM)
    if _uuid is not None:  # uuid1() through libuuid, where the platform has it
        calls[_uuid.generate_time_safe] = ("uuid.uuid1()", _UUID)
    calls[open] = ("open()", _FILES)
    for name in ("getaddrinfo", "gethostbyname", "gethostbyname_ex", "gethostbyaddr", "getnameinfo"):
        calls[getattr(_socket, name)] = (f"socket.{name}()", _NETWORK)
    calls[os.system] = ("os.system()", _PROCESS)
    return calls


def _python_calls() -> dict[CodeType, tuple[str, str]]:
    """Python functions (compared by code object on entry) whose C work the table above cannot see."""
    return {
        socket.socket.__init__.__code__: ("socket.socket()", _NETWORK),
        subprocess.Popen.__init__.__code__: ("subprocess.Popen()", _PROCESS),
    }


_C_CALLS = _c_calls()
_PY_CALLS = _python_calls()

#: modules whose frames are skipped to find who made a forbidden call (by top-level package name), each
#: with the advice for a call that entered it: advice for what the user called, not for the C function it
#: ended in (``uuid.uuid4()`` ends in ``os.urandom()``, ``requests.get()`` first reads the clock)
_IMPLEMENTATION = {
    "random": _RANDOM,
    "secrets": _RANDOM,
    "uuid": _UUID,
    "pathlib": _FILES,
    "codecs": _FILES,
    "subprocess": _PROCESS,
    **dict.fromkeys(
        ("socket", "ssl", "http", "urllib", "urllib3", "requests", "httpx", "httpcore", "aiohttp"), _NETWORK
    ),
}


def forbidden_calls() -> list[tuple[str, str]]:
    """(call, advice) for everything the guard refuses, for documentation and tests."""
    return sorted({*_C_CALLS.values(), *_PY_CALLS.values()})


@dataclass
class GuardScope:
    """One workflow body being guarded: its name (for messages), the top-level packages that count as
    user code even where installed beside the libraries, and the first violation."""

    workflow: str
    user_packages: frozenset[str] = frozenset()
    violation: NonDeterministicCall | None = field(default=None, repr=False)

    def check(self) -> None:
        """Raise the first violation, if any (for a body that caught the error and carried on)."""
        if self.violation is not None:
            raise self.violation


_scope: contextvars.ContextVar[GuardScope | None] = contextvars.ContextVar("gangflow_guard", default=None)


@contextmanager
def guarding(workflow: str, module: str = "") -> Iterator[GuardScope]:
    """Mark the code run inside (and the asyncio tasks it starts) as the body of ``workflow``."""
    scope = GuardScope(workflow, frozenset({module.partition(".")[0]} - {""}))
    token = _scope.set(scope)
    try:
        yield scope
    finally:
        _scope.reset(token)


@contextmanager
def unguarded() -> Iterator[None]:
    """Code inside is not workflow code (a task body ``run_local`` runs on the workflow's loop)."""
    token = _scope.set(None)
    try:
        yield
    finally:
        _scope.reset(token)


# -- who is calling -------------------------------------------------------------------------------
@functools.cache
def _library_roots() -> tuple[str, ...]:
    # on first use, not at import: ``import engine`` should not pay for sysconfig
    roots = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots |= {sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix})["stdlib"]}
    here = Path(__file__).resolve().parents[2]  # gangflow's own packages
    roots |= {str(here / package) for package in ("engine", "workflows", "plugins")}
    return tuple(sorted({os.path.join(os.path.realpath(r), "") for r in roots}))


@functools.cache
def _is_library_file(filename: str) -> bool:
    if filename.startswith("<"):
        return filename.startswith("<frozen ")  # importlib's bootstrap; other <...> is exec'd user code
    return os.path.realpath(filename).startswith(_library_roots())


def _package(frame: FrameType) -> str:
    """The top-level package of the module the frame's code belongs to."""
    name = frame.f_globals.get("__name__")
    return name.partition(".")[0] if isinstance(name, str) else ""


def _is_user(frame: FrameType, scope: GuardScope) -> bool:
    # The module's own file, not the code's: a dataclass __init__ generated with exec() belongs to
    # the module that declared the dataclass.
    filename = frame.f_globals.get("__file__") or frame.f_code.co_filename
    return not _is_library_file(str(filename)) or _package(frame) in scope.user_packages


def _name_of(frame: FrameType) -> str:
    """How the user spelled the call that entered an implementation module: ``random.randint``, not
    ``random.Random.randint`` (the module functions are methods of a hidden instance)."""
    module, code = frame.f_globals.get("__name__"), frame.f_code
    if module == "random" and frame.f_locals.get("self") is random._inst:
        return f"random.{code.co_name}()"
    return f"{module}.{code.co_qualname}()"


def _violation(frame: FrameType | None, call: tuple[str, str]) -> None:
    scope = _scope.get()
    if scope is None:
        return
    name, advice = call
    entry: FrameType | None = None
    while frame is not None and _package(frame) in _IMPLEMENTATION:
        entry, frame = frame, frame.f_back
    if frame is None or not _is_user(frame, scope):
        return
    if entry is not None:
        name = _name_of(entry)
        advice = _IMPLEMENTATION[_package(entry)]
    error = NonDeterministicCall(f"{name} inside workflow {scope.workflow!r} is not replayable; {advice}")
    if scope.violation is None:
        scope.violation = error
    raise error


def _profile(
    frame: FrameType,
    event: str,
    arg: Any,
    _c: Callable[[Any], tuple[str, str] | None] = _C_CALLS.get,
    _py: Callable[[CodeType], tuple[str, str] | None] = _PY_CALLS.get,
) -> None:
    # Called for every call and return on the thread: keep the common path to one comparison and
    # one dict lookup.
    if event == "c_call":
        hit = _c(arg)
        if hit is not None:
            _violation(frame, hit)
    elif event == "call":
        hit = _py(frame.f_code)
        if hit is not None:
            _violation(frame.f_back, hit)


_thread = threading.local()


@contextmanager
def hooked() -> Iterator[None]:
    """Watch the calls made on this thread while inside (restoring any profiler that was there); a
    thread-local depth tells :func:`rearm` that the hook belongs here."""
    previous = sys.getprofile()
    depth = getattr(_thread, "depth", 0)
    _thread.depth = depth + 1
    sys.setprofile(_profile)
    try:
        yield
    finally:
        _thread.depth = depth
        sys.setprofile(previous)


def rearm() -> None:
    """Install the hook again where a violation removed it (Python drops a profile function that
    raised); called at the dispatcher's entry points, so a body that caught the error stays watched."""
    if getattr(_thread, "depth", 0) and sys.getprofile() is None:
        sys.setprofile(_profile)
