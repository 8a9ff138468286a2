"""Child processes: one way to start them and one way to stop them.

Used for the embedded dev server, the node agents ``gangflow dev`` starts, the ranks of a gang, a local
run's coordinator and the test fixtures, so they all get the same guarantees: stdin closed, output
appended to a log, no orphan when the parent dies (a parent-death signal), and a stop that is SIGTERM,
a grace period, then SIGKILL, never a hang.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeAlias

from engine.executor.rankfiles import open_log_for_append

__all__ = ["set_parent_death_signal", "signal_group", "spawn", "stop_processes"]

_PR_SET_PDEATHSIG = 1

#: a path as str or pathlib.Path
_StrPath: TypeAlias = str | os.PathLike[str]


def set_parent_death_signal(sig: int = signal.SIGTERM) -> None:
    """Ask Linux to send ``sig`` to this process when its parent dies (call it in a preexec_fn).

    The signal follows the *thread* that forked the child, so spawn from a long-lived thread (the
    agent's event loop thread), never from a short-lived pool thread.
    """
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, sig)


def _load_prctl() -> Any:
    # Looked up once, in the parent: a dlopen in a forked child can deadlock on the loader's lock when another
    # thread held it at the fork (seen with gRPC's threads running: a child that never reached exec)
    with contextlib.suppress(OSError, AttributeError):
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    return None


_prctl = _load_prctl()


def spawn(
    command: Sequence[str],
    *,
    log: _StrPath | None = None,
    env: Mapping[str, str] | None = None,
    cwd: _StrPath | None = None,
    new_session: bool = False,
    parent_death: int | None = signal.SIGTERM,
    pipe_output: bool = False,
    pipe_input: bool = False,
    preexec: Callable[[], None] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``command`` with stdin closed and stdout and stderr appended to ``log``.

    Without ``log`` the output goes where this process's goes; with ``pipe_output`` to a pipe the caller
    reads (``proc.stdout``; the log is still created, for the caller to copy the output into).
    ``new_session`` gives the process its own process group, so that :func:`stop_processes` with
    ``group=True`` also reaches what it forks. ``parent_death`` is the signal it gets when the spawning
    thread's process dies (see :func:`set_parent_death_signal`); None for none. ``pipe_input`` gives it a
    stdin the caller writes to (``proc.stdin``) instead of a closed one. ``preexec`` runs in the child before
    exec and before the parent-death signal is set (a sandbox joining its cgroup and changing its uid, which
    clears that signal: engine.executor.sandbox).
    """

    def child() -> None:
        if preexec is not None:
            preexec()
        if parent_death is not None:
            set_parent_death_signal(parent_death)

    handle = None
    if log is not None:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        handle = os.fdopen(open_log_for_append(log), "ab")  # closed below: the child holds its own copy
    try:
        return subprocess.Popen(
            list(command),
            env=None if env is None else dict(env),
            cwd=cwd,
            stdin=subprocess.PIPE if pipe_input else subprocess.DEVNULL,
            stdout=subprocess.PIPE if pipe_output else handle,
            stderr=subprocess.STDOUT,
            start_new_session=new_session,
            preexec_fn=child if preexec is not None or parent_death is not None else None,
        )
    finally:
        if handle is not None:
            handle.close()


def _send(proc: subprocess.Popen[Any], sig: int, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)


def signal_group(proc: subprocess.Popen[Any], sig: int) -> None:
    """Send ``sig`` to the process group of ``proc`` (spawned with ``new_session``), and SIGCONT after it
    (a stopped process handles a signal only once resumed); a group already gone is not an error."""
    _send(proc, sig, True)
    _send(proc, signal.SIGCONT, True)


def stop_processes(
    procs: Iterable[subprocess.Popen[Any]], grace: float = 10.0, *, sig: int = signal.SIGTERM, group: bool = False
) -> None:
    """Send ``sig`` to each live process (to its whole process group with ``group``: it must have been
    spawned with ``new_session``), wait up to ``grace`` seconds for all of them together, then SIGKILL
    what is left and reap everything."""
    procs = list(procs)
    live = [p for p in procs if p.poll() is None]
    for proc in live:
        _send(proc, sig, group)
        _send(proc, signal.SIGCONT, group)  # a stopped (SIGSTOP) process handles SIGTERM only once resumed
    deadline = time.monotonic() + grace
    for proc in live:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.0, deadline - time.monotonic()))
    # a group may hold children even when its leader has exited
    for proc in procs if group else live:
        _send(proc, signal.SIGKILL, group)
    for proc in live:
        proc.wait()
