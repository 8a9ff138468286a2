"""Starting, watching and stopping the ranks a node hosts for one gang attempt.

Each rank is its own process in its own process group (so a kill reaches the workers it forks), pinned
to its GPUs through ``CUDA_VISIBLE_DEVICES``, with stdout and stderr captured to one log file. Ranks get
SIGKILL from Linux if the node agent dies (parent-death signal), so no rank outlives its agent. A stop is
SIGTERM to every rank's group ("save and exit"), a grace period, then SIGKILL. A gang whose task has
secrets gets a ``redact`` function: its processes' output then comes through a pipe, and a thread per
process writes it redacted to the log (and no warm standby is used, its output already goes to a file).

With a ``sandbox`` (engine.executor.sandbox, a node agent running as root) every process gets a cgroup of its
own inside the gang's, joins it and drops to the gang's user before it runs anything, and a rank killed by its
cgroup's memory limit is reported as having exceeded its memory request (a user error), not as killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.core.gang import RankContext
from engine.errors import SYSTEM_ERROR_TYPES
from engine.executor.process import signal_group, spawn, stop_processes
from engine.executor.rankfiles import open_log_for_append, read_rank_file
from engine.executor.sandbox import GangSandbox, enter, memory_text
from engine.executor.standby import RUNNER, StandbyPool

__all__ = ["NodeGang", "ProcessLaunch", "RankFailure", "runner_command"]

_TAIL_LINES = 30
_EXTERNAL_SIGNALS = {signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT}


@dataclass(frozen=True)
class ProcessLaunch:
    """One process a node agent starts for a node launch: a rank, or a plugin's coordinator, launcher or
    launcher helper (what a plugin describes as a ``ProcessSpec``), with everything needed to start it."""

    context: RankContext
    command: list[str]
    env: dict[str, str]
    log_path: str
    runner: bool  # True: gangflow's rank runner (done markers count), False: a plugin's own command
    progress_path: str | None = None  # where engine.report() writes (GANGFLOW_PROGRESS_FILE)
    #: a process that is not one rank: a coordinator (XGBoost's tracker), an MPI launcher or proxy
    role: str | None = None
    #: the gang is done when every must-finish process exited 0; the others (coordinators) must not fail
    #: before that, and are stopped then
    must_finish: bool = True
    #: its output comes back through a pipe to the caller (who logs it), e.g. to read an MPI launcher's
    #: per-node commands
    pipe_output: bool = False


@dataclass(frozen=True)
class RankFailure:
    rank: int
    local_rank: int
    node_id: str
    returncode: int | None  # None: still running, but hung
    error: str | None
    log_tail: str
    hung_for: float | None = None
    role: str | None = None
    #: the memory request its own cgroup enforced, when that is what killed it (a user error, not a kill)
    memory_limit: int | None = None

    @property
    def kind(self) -> str:
        """``killed`` (a signal from outside: the OOM killer, preemption, an operator), ``hung`` (no progress
        report for ``hang_timeout``), ``system`` (the platform could not deliver the rank's code or inputs:
        engine.errors.SYSTEM_ERROR_TYPES), or ``user`` (the body raised, the rank's own command failed, or the
        process crashed by itself: SIGABRT / SIGSEGV, which is also how frameworks abort after a peer died)."""
        if self.hung_for is not None:
            return "hung"
        if self.memory_limit is not None:
            return "user"
        if self.returncode is not None and -self.returncode in _EXTERNAL_SIGNALS:
            return "killed"
        if self.error_type in SYSTEM_ERROR_TYPES:
            return "system"
        return "user"

    @property
    def error_type(self) -> str | None:
        """The exception type the task body raised (its first word; a gangflow error's kind), if any."""
        if not self.error:
            return None
        head = self.error.split(":", 1)[0].strip()
        return head if head.isidentifier() else None

    @property
    def priority(self) -> int:
        """Which of several failures is the root cause: outside kills and hangs first, then an exception
        in the body (a rank that wrote its traceback), then crashes and bare exit codes."""
        if self.memory_limit is not None:  # the others lost a peer that went over its memory
            return 0
        if self.role:  # a coordinator or launcher usually fails because a rank did
            return 4
        return {"killed": 0, "hung": 1, "system": 1}.get(self.kind, 2 if self.error else 3)

    @property
    def how(self) -> str:
        if self.hung_for is not None:
            return f"made no progress for {self.hung_for:.0f} s (hung)"
        if self.memory_limit is not None:
            per = " per rank" if self.role else ""
            limit = memory_text(self.memory_limit)
            return f"exceeded its memory request of {limit}{per} (killed by its own cgroup's memory limit)"
        assert self.returncode is not None
        if self.returncode < 0:
            try:
                return f"was killed by {signal.Signals(-self.returncode).name}"
            except ValueError:
                return f"was killed by signal {-self.returncode}"
        return f"exited with code {self.returncode}"

    def describe(self) -> str:
        who = self.role if self.role else f"rank {self.rank}"
        where = f"node {self.node_id}" + ("" if self.role else f", local rank {self.local_rank}")
        head = f"{who} ({where}) {self.how}"
        if self.error:
            head += f": {self.error.splitlines()[0]}"
        return f"{head}\n--- last lines of {who}'s log ---\n{self.log_tail}"


def _tail(path: str, lines: int = _TAIL_LINES) -> str:
    try:
        text = read_rank_file(path, 16_384, tail=True).decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class NodeGang:
    """The ranks of one gang attempt on this node."""

    def __init__(
        self,
        node_id: str,
        ranks: Sequence[ProcessLaunch],
        workdir: Path,
        cwd: str | None = None,
        hang_timeout: float | None = None,
        standby: StandbyPool | None = None,
        redact: Callable[[str], str] | None = None,
        sandbox: GangSandbox | None = None,
    ) -> None:
        self.node_id = node_id
        self.sandbox = sandbox  # None: the processes run as the agent's user, with no cgroup of their own
        self.redact = redact
        #: the threads that copy a process's output, redacted, to its log (by process index)
        self.pumps: dict[int, threading.Thread] = {}
        self.standby = standby  # warm rank runners to take ranks from (see engine.executor.standby)
        self.ranks = list(ranks)
        self.workdir = workdir
        self.cwd = cwd
        self.hang_timeout = hang_timeout
        self.done_dir = workdir / "done"
        self.error_dir = workdir / "errors"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.started = 0.0
        self.exit_seen: dict[int, float] = {}  # rank -> when poll() first saw it gone (orders failures)
        self.awaiting = 0  # processes still to be added (an MPI proxy whose command has not come yet)

    def start(self) -> None:
        self.done_dir.mkdir(parents=True, exist_ok=True)
        self.error_dir.mkdir(parents=True, exist_ok=True)
        if self.sandbox is not None:
            self.sandbox.setup(self.workdir)
        self.started = time.time()
        launches, self.ranks = self.ranks, []
        for launch in launches:
            self.add(launch)

    def add(self, launch: ProcessLaunch) -> subprocess.Popen[bytes]:
        """Start one more process of this gang: a warm standby rank runner when one waits, else a new one."""
        proc = None
        pumped = self.redact is not None and not launch.pipe_output
        env, preexec, joining = launch.env, None, None
        if (sandbox := self.sandbox) is not None:
            files = sandbox.prepare(len(self.procs), rank=launch.role is None)
            env = {**launch.env, **sandbox.environment(self.workdir)}
            joining = (files, sandbox.user, sandbox.mounts)
            preexec = lambda: enter(files, sandbox.user, None, sandbox.mounts)  # noqa: E731 - the parent-death signal follows
        if self.standby is not None and not launch.pipe_output and not pumped:
            Path(launch.log_path).parent.mkdir(parents=True, exist_ok=True)
            proc = self.standby.take(launch.command, env, self.cwd, launch.log_path, joining)
        if proc is None:
            proc = spawn(
                launch.command,
                log=launch.log_path,
                env=env,
                cwd=self.cwd,
                new_session=True,
                parent_death=signal.SIGKILL,
                pipe_output=launch.pipe_output or pumped,
                preexec=preexec,
            )
        if pumped:
            pump = threading.Thread(target=self._pump, args=(proc, launch.log_path), daemon=True)
            pump.start()
            self.pumps[len(self.procs)] = pump
        self.ranks.append(launch)
        self.procs.append(proc)
        self.awaiting = max(0, self.awaiting - 1)
        return proc

    def _pump(self, proc: subprocess.Popen[bytes], log_path: str) -> None:
        redact = self.redact or str
        if proc.stdout is None:
            return
        with os.fdopen(open_log_for_append(log_path), "a", encoding="utf-8") as log:
            for raw in iter(lambda: proc.stdout.readline(65536) if proc.stdout else b"", b""):
                log.write(redact(raw.decode(errors="replace")))
                log.flush()

    def _join_pumps(self, indexes: Sequence[int], timeout: float = 2.0) -> None:
        """Let the log of these processes catch up with what they wrote (their pipe ends when they exit)."""
        deadline = time.monotonic() + timeout
        for index in indexes:
            if (pump := self.pumps.get(index)) is not None:
                pump.join(max(0.0, deadline - time.monotonic()))

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def _succeeded(self, launch: ProcessLaunch, code: int) -> bool:
        if code == 0:
            return True
        # finished its work (result written) but the framework aborted during interpreter shutdown
        return launch.runner and (self.done_dir / f"rank{launch.context.rank}").exists()

    def progress(self) -> dict[int, dict[str, object]]:
        """The latest ``engine.report`` of each rank on this node that has reported."""
        out: dict[int, dict[str, object]] = {}
        for path in sorted((self.workdir / "progress").glob("rank*.json")):
            with contextlib.suppress(OSError, ValueError):
                out[int(path.stem.removeprefix("rank"))] = json.loads(read_rank_file(path, 65_536))
        return out

    def _last_sign_of_life(self, launch: ProcessLaunch) -> float:
        if launch.progress_path:
            with contextlib.suppress(OSError):
                return os.stat(launch.progress_path).st_mtime
        return self.started

    def poll(self) -> RankFailure | bool:
        """A failure as soon as one rank failed; True once every rank finished; False while running.

        When several ranks failed by the time we look, the one killed by a signal is reported: the
        others usually died of it (a collective's "connection closed by peer").
        """
        finished, failures = 0, []
        now = time.time()
        for launch, proc in zip(self.ranks, self.procs, strict=True):
            code = proc.poll()
            if not launch.must_finish:
                if code not in (None, 0):
                    failures.append(self._failure(launch, code))
                continue
            if code is None:
                if launch.role:
                    continue
                silent = now - self._last_sign_of_life(launch)
                if self.hang_timeout is not None and silent > self.hang_timeout:
                    failures.append(self._failure(launch, None, hung_for=silent))
                continue
            self.exit_seen.setdefault(launch.context.rank, now)
            if not self._succeeded(launch, code):
                failures.append(self._failure(launch, code))
            else:
                finished += 1
        if failures:
            return min(failures, key=lambda f: (f.priority, self.exit_seen.get(f.rank, now)))
        return not self.awaiting and finished == sum(1 for launch in self.ranks if launch.must_finish)

    def _failure(self, launch: ProcessLaunch, code: int | None, hung_for: float | None = None) -> RankFailure:
        if code is not None:  # its last lines, for the tail below
            self._join_pumps([i for i, other in enumerate(self.ranks) if other is launch])
        if launch.role:  # a launcher fails because one of its ranks did: show that rank's exception
            errors = sorted(self.error_dir.glob("rank*"))
            error_file = errors[0] if errors else self.error_dir / "none"
        else:
            error_file = self.error_dir / f"rank{launch.context.rank}"
        error = None
        with contextlib.suppress(OSError):  # none written (or not a file of its own: not read)
            error = read_rank_file(error_file).decode(errors="replace")
        return RankFailure(
            launch.context.rank,
            launch.context.local_rank,
            self.node_id,
            code,
            error,
            _tail(launch.log_path),
            hung_for,
            launch.role,
            self._memory_kill(launch) if code is not None else None,
        )

    def _memory_kill(self, launch: ProcessLaunch) -> int | None:
        """The memory request that killed this process, when its own cgroup did (its oom_kill counter; a rank's
        cgroup holds its request, a launcher's holds the ranks it started within the gang's)."""
        sandbox = self.sandbox
        if sandbox is None or sandbox.mem_per_rank is None:
            return None
        index = next(i for i, other in enumerate(self.ranks) if other is launch)
        if sandbox.oom_killed(index) or (launch.role is not None and sandbox.gang_oom_killed()):
            return sandbox.mem_per_rank
        return None

    def terminate(self, grace: float = 5.0) -> None:
        """SIGTERM every rank's process group, wait up to ``grace`` seconds, then SIGKILL what is left."""
        stop_processes(self.procs, grace, group=True)
        self._join_pumps(list(self.pumps))

    def close(self) -> None:
        """Remove the gang's cgroup (killing what is left in it: a process its rank forked into a new session
        escapes the process group, not its cgroup). Safe to call more than once, and without a sandbox."""
        if self.sandbox is not None:
            self.sandbox.remove()

    def notify(self, sig: int) -> None:
        """Send ``sig`` (a preemption notice) to the process group of every process still running; nothing
        waits for it: the caller watches ``exited()`` up to its own deadline."""
        self.awaiting = 0  # a helper that has not come yet never will: the launcher is stopping
        for proc in self.procs:
            if proc.poll() is None:
                signal_group(proc, sig)

    def exited(self) -> bool:
        """Whether every process that must finish has ended (in any way): a stopped gang's GPUs are free."""
        pairs = zip(self.ranks, self.procs, strict=True)
        return all(proc.poll() is not None for launch, proc in pairs if launch.must_finish)


def runner_command(spec_path: str | None) -> list[str]:
    """The rank runner; without a spec path it reads ``GANGFLOW_RANK_SPEC`` (set per node, so one
    launcher command line serves ranks on every node)."""
    # -P: the rank starts in the bundle's folder, which must not shadow the standard library or gangflow
    # (a user's ``logging.py``); the bundle's own modules are imported through the bundle loader anyway
    return [*RUNNER, *([spec_path] if spec_path else [])]
