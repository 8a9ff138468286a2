"""Warm standby rank processes: a rank that starts in tenths of a second instead of seconds.

Starting a rank costs seconds before the first line of the task body runs, most of it importing the
framework (torch: about 1.5 s on a busy 2-core machine). After a node is lost, that start-up is most of
the way back to training. A node agent therefore keeps a few *standby* rank runners that have already
imported gangflow and the warm modules (torch by default, when it is installed) and wait on their stdin.
A launch hands one its command line, environment, working directory and log file, and it becomes that
rank; the agent starts a replacement on its next registration tick, not at once, so the new gang's ranks
do not share the CPU with a fresh torch import while they start.

A standby is given everything a freshly spawned rank is given at exec time, before any task code runs:
the environment (replaced whole), the working directory, stdout and stderr. What differs is only what a
module read from the environment while it was imported, i.e. in the agent's environment. For torch that
is the OpenMP thread count, which the standby sets from ``OMP_NUM_THREADS`` with
``torch.set_num_threads``; ``CUDA_VISIBLE_DEVICES`` and the NCCL settings are read when CUDA and NCCL
initialise, which importing torch does not do.

A standby starts with the environment its agent gives it (``env``: the agent's less its credentials and any
secrets directory, the same base a rank gets before its task's own secrets), never the agent's own. On a
sandboxing agent (engine.executor.sandbox) it waits as root, in no gang's cgroup; the launch that adopts it
names the gang's cgroup files and user, and the standby joins that cgroup and drops to that user before it
reads the rank's spec or runs any of its code: it is then confined exactly as a freshly spawned rank.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence

from engine.executor.namespace import MountPlan
from engine.executor.process import set_parent_death_signal, spawn, stop_processes
from engine.executor.rankfiles import open_log_for_append
from engine.executor.sandbox import SandboxUser, enter

__all__ = ["RUNNER", "WARM_ENV", "StandbyPool", "become_rank", "default_warm_modules"]

#: the rank runner's command line, without its arguments (see ``launcher.runner_command``)
RUNNER = (sys.executable, "-P", "-m", "engine.executor.rank")
#: what ``gangflow node`` without ``--warm`` reads first: comma-separated modules, empty for none (a machine
#: whose gangs never use torch need not spend a core-second or two on each standby's torch import)
WARM_ENV = "GANGFLOW_WARM"


def default_warm_modules() -> tuple[str, ...]:
    """What standbys import ahead of time when the operator does not say (no ``--warm``): ``GANGFLOW_WARM``
    when set, else torch, if it is installed."""
    named = os.environ.get(WARM_ENV)
    if named is not None:
        return tuple(m.strip() for m in named.split(",") if m.strip())
    return ("torch",) if importlib.util.find_spec("torch") is not None else ()


class StandbyPool:
    """Up to ``size`` standby rank runners of one node agent.

    Call ``fill`` and ``take`` from the agent's event-loop thread: a child's parent-death signal follows
    the thread that spawned it, and that thread lives as long as the agent.
    """

    def __init__(self, size: int, warm: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        self.size, self.warm = size, tuple(warm)
        #: what a standby starts with (None: this process's own environment; the node agent passes its own less
        #: credentials and secrets directories)
        self.env = None if env is None else dict(env)
        self.ready: list[subprocess.Popen[bytes]] = []

    def fill(self) -> None:
        """Start standbys until ``size`` are waiting (dead ones are dropped)."""
        self.ready = [proc for proc in self.ready if proc.poll() is None]
        while len(self.ready) < self.size:
            # its own process group and SIGKILL on the agent's death, as every rank (see NodeGang.add)
            command = [*RUNNER, "--standby", ",".join(self.warm)]
            proc = spawn(command, env=self.env, new_session=True, parent_death=signal.SIGKILL, pipe_input=True)
            self.ready.append(proc)

    def take(
        self,
        command: Sequence[str],
        env: dict[str, str],
        cwd: str | None,
        log_path: str,
        sandbox: tuple[Sequence[str], SandboxUser | None, MountPlan | None] | None = None,
    ) -> subprocess.Popen[bytes] | None:
        """A standby turned into the rank ``command`` runs, or None: not a rank runner command line, or
        no standby left (the caller then spawns the rank as usual). ``sandbox``: the ``cgroup.procs`` files
        it joins, the user it becomes and its mount namespace (engine.executor.sandbox)."""
        if tuple(command[: len(RUNNER)]) != RUNNER:
            return None
        files, user, mounts = sandbox if sandbox is not None else ((), None, None)
        order = json.dumps(
            {
                "argv": list(command[len(RUNNER) :]),
                "env": env,
                "cwd": cwd,
                "log": log_path,
                "cgroups": list(files),
                "user": None if user is None else [user.name, user.uid],
                "mounts": None if mounts is None else mounts.to_json(),
            }
        )
        while self.ready:
            proc = self.ready.pop(0)
            if proc.poll() is not None or proc.stdin is None:
                continue
            try:
                proc.stdin.write(order.encode() + b"\n")
                proc.stdin.close()
            except OSError:  # it died meanwhile (an OOM kill): try the next one
                with contextlib.suppress(OSError):
                    proc.kill()
                proc.wait()
                continue
            return proc
        return None

    def close(self) -> None:
        """Stop the standbys still waiting."""
        stop_processes(self.ready, grace=5, group=True)
        self.ready = []


def become_rank(warm: str) -> list[str]:
    """The standby's side (``python -m engine.executor.rank --standby torch``): import the warm modules,
    wait for a launch on stdin, take on the rank's environment, working directory and log, and return the
    rank runner's arguments. Exits quietly when stdin closes without a launch (the pool was closed)."""
    for name in filter(None, warm.split(",")):
        with contextlib.suppress(Exception):  # a framework that fails to import: the task body will say so
            importlib.import_module(name)
    line = sys.stdin.buffer.readline()
    if not line:
        os._exit(0)
    order = json.loads(line)
    # the log is opened while still the agent's user (a log in the store may not be the gang user's to open),
    # then the standby takes the gang's sandbox before anything of the rank is read
    log = open_log_for_append(order["log"])  # (in the gang's working folder: no symlink followed)
    user = SandboxUser(order["user"][0], int(order["user"][1])) if order.get("user") else None
    mounts = MountPlan.from_json(order["mounts"]) if order.get("mounts") else None
    if order.get("cgroups") or user is not None or mounts is not None:
        enter(order.get("cgroups") or (), user, None, mounts)
        set_parent_death_signal(signal.SIGKILL)  # a change of uid cleared the one spawn set
    os.environ.clear()
    os.environ.update(order["env"])
    if order["cwd"]:
        os.chdir(order["cwd"])
    null = os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((log, 1), (log, 2), (null, 0)):
        os.dup2(fd, target)
    os.close(log)
    os.close(null)
    # a fresh rank gets these from its environment at start-up (PYTHONUNBUFFERED, OMP_NUM_THREADS)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    sys.stderr.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    threads = os.environ.get("OMP_NUM_THREADS", "")
    torch = sys.modules.get("torch")
    if torch is not None and threads.isdigit():
        torch.set_num_threads(int(threads))
    sys.argv = [sys.argv[0], *order["argv"]]  # what a freshly spawned rank would see
    return list(order["argv"])
