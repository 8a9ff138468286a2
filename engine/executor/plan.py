"""What a node agent starts for one node launch, and how those processes are told to stop.

``NodePlan`` turns a node launch (engine.core.gang.NodeLaunch) and the task's plugin into the processes to
start: one per rank (plus the plugin's coordinator on node rank 0), or, for a plugin with its own launcher
(MPI), the launcher on node rank 0 and the launcher's per-node helpers, which arrive later through
``LauncherRelay``. ``DeliveredNotice`` is a preemption notice handed to the running processes: the notice
file every rank can read (``engine.preemption()``), then the plugin's notice signal.

Nothing here imports Temporal: the node agent (engine.runtime.node) owns the activities and turns what
these report (``LaunchRefused``, ``DeliveredNotice.report``) into activity failures.
"""

from __future__ import annotations

import json
import queue
import re
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from engine.core.atomic import write_atomic
from engine.core.gang import NodeLaunch, rank_env
from engine.executor.launcher import NodeGang, ProcessLaunch, runner_command
from engine.rank import NOTICE_FILE_ENV, NOTICE_SIGNAL_ENV
from engine.scheduling import Preempted

__all__ = ["DeliveredNotice", "LaunchRefused", "LauncherRelay", "NodePlan", "safe_name"]


def safe_name(name: str) -> str:
    """``name`` as one file-name component (node ids and gang ids may hold ``/`` or ``:``)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


class NodePlan:
    """Which processes this node starts for one attempt: one per rank (plus the plugin's coordinator on
    node rank 0), or, for a plugin with its own launcher (MPI), the launcher on node rank 0 and the
    launcher's per-node helpers, which arrive later.

    ``base_env`` is what every process starts from (the agent's environment less its credentials, plus the
    task's secrets); ``rank_logs=False`` keeps a launcher's ranks from writing their own log, which would
    bypass the redaction of a task with secrets (their output then goes through the launcher's).
    """

    def __init__(
        self,
        launch: NodeLaunch,
        plugin: Any,
        run_id: str,
        workdir: Path,
        spec_path: Path,
        log_path: Callable[[str], str],
        base_env: dict[str, str],
        *,
        rank_logs: bool = True,
    ) -> None:
        self.launch, self.plugin, self.log_path = launch, plugin, log_path
        contexts = launch.contexts(run_id)
        self.rank0 = contexts[0]
        cpus = launch.cpus_per_node / launch.nproc_per_node
        progress_dir = workdir / "progress"
        self.notice_path = workdir / "notice.json"
        self.notice_signal: str = getattr(plugin, "notice_signal", "SIGTERM")
        notice_env = {NOTICE_FILE_ENV: str(self.notice_path), NOTICE_SIGNAL_ENV: self.notice_signal}
        hosts = [(safe_name(h), launch.nproc_per_node) for h in launch.hosts]
        launcher = getattr(plugin, "launcher", None)
        spec = launcher(self.rank0, hosts, runner_command(None)) if launcher is not None else None
        self.launcher_mode = spec is not None
        self.processes: list[ProcessLaunch] = []
        if spec is not None:
            # One environment for the node; the ranks learn their own rank from the launcher.
            node_ctx = replace(self.rank0, gpu_ids=tuple(launch.gpu_ids))
            self.node_env = {
                **base_env,
                **rank_env(plugin, node_ctx, cpus_per_rank=cpus, launcher=True),
                "GANGFLOW_RANK_SPEC": str(spec_path),
                "GANGFLOW_PROGRESS_FILE": str(progress_dir / "rank{rank}.json"),
                "GANGFLOW_RANK_LOG": log_path("rank{rank}"),
                **notice_env,
            }
            if not rank_logs:
                del self.node_env["GANGFLOW_RANK_LOG"]
            if launch.node_rank == 0:
                self.processes.append(replace(self.helper(spec.name, spec.command, spec.env), pipe_output=True))
            return
        for ctx in contexts:
            own = plugin.command(ctx)
            progress = str(progress_dir / f"rank{ctx.rank}.json")
            env = {**base_env, **rank_env(plugin, ctx, cpus_per_rank=cpus), **notice_env}
            self.processes.append(
                ProcessLaunch(
                    context=ctx,
                    command=own or runner_command(str(spec_path)),
                    env={**env, "GANGFLOW_PROGRESS_FILE": progress},
                    log_path=log_path(f"rank{ctx.rank}"),
                    runner=own is None,
                    progress_path=progress,
                )
            )
        coordinator = getattr(plugin, "coordinator", None)
        extra = coordinator(self.rank0) if coordinator is not None and launch.node_rank == 0 else None
        if extra is not None:  # started first: the ranks connect to it
            self.processes.insert(
                0,
                ProcessLaunch(
                    context=self.rank0,
                    command=extra.command,
                    env={**self.processes[0].env, **extra.env},
                    log_path=log_path(extra.name),
                    runner=False,
                    role=f"{extra.name} of the gang",
                    must_finish=False,
                ),
            )

    def helper(self, name: str, command: list[str], env: dict[str, str] | None = None) -> ProcessLaunch:
        """The launcher, or one of its per-node helpers (an MPI proxy): it must finish, and it is
        reported by name rather than as a rank."""
        return ProcessLaunch(
            context=self.rank0,
            command=command,
            env={**self.node_env, **(env or {})},
            log_path=self.log_path(safe_name(name.replace(" ", "-"))),
            runner=False,
            role=f"{name} on node rank {self.launch.node_rank}",
        )


class DeliveredNotice:
    """A preemption notice delivered to this node's processes: the notice file written, the notice signal
    sent, and the grace deadline (by this machine's clock, from when the notice came). ``notice`` is None
    when its payload could not be read: it stops the ranks all the same, with no grace."""

    def __init__(self, notice: Preempted | None, plan: NodePlan, gang: NodeGang) -> None:
        self.at = time.time()
        self.grace = max(0.0, notice.grace_s) if notice is not None else 0.0
        self.deadline = self.at + self.grace
        fields = {k: getattr(notice, k) if notice is not None else "" for k in ("reason", "cause", "by", "by_tenant")}
        data = {**fields, "deadline": self.deadline, "grace_s": self.grace}
        # the file first: a rank woken by the signal finds it (engine.preemption())
        write_atomic(plan.notice_path, json.dumps(data).encode(), durable=False)
        gang.notify(getattr(signal, plan.notice_signal, signal.SIGTERM))

    def report(self, node_id: str, *, killed: bool) -> tuple[str, dict[str, Any]]:
        """What the attempt on this node reports (message, details): always a preemption, saying whether the
        ranks left in time."""
        seconds = time.time() - self.at
        if killed:
            message = f"node {node_id}: the ranks had not exited when the {self.grace:.0f} s grace ended: killed"
        else:
            message = f"node {node_id}: the ranks exited {seconds:.1f} s after the preemption notice"
        return message, {"node": node_id, "killed": killed, "seconds": round(seconds, 3)}


class LaunchRefused(Exception):
    """A launcher's helper cannot be started on this node (a command that is not the plugin's, or none came):
    the attempt fails as a rank failure would."""


class LauncherRelay:
    """Carries a launcher's per-node commands (MPICH's ``HYDRA_LAUNCH:`` lines) from node rank 0 to the
    node agents that must run them, through the gang's workflow: no ssh between machines. ``send`` delivers
    one command (a ``{"attempt", "node_rank", "command"}`` payload) to the workflow; ``fetch`` asks it for
    this node's command (None until it came)."""

    def __init__(
        self,
        plan: NodePlan,
        gang: NodeGang,
        send: Callable[[dict[str, Any]], Awaitable[None]],
        fetch: Callable[[int, int], Awaitable[list[str] | None]],
    ) -> None:
        self.plan, self.gang, self.send, self.fetch = plan, gang, send, fetch
        self.launch = plan.launch
        self.lines: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.started = False
        self.deadline = time.monotonic() + 120
        self.reader: threading.Thread | None = None
        if self.launch.node_rank == 0:
            self.reader = threading.Thread(target=self._read, args=(gang.procs[0], gang.ranks[0].log_path), daemon=True)
            self.reader.start()

    def _read(self, proc: Any, log_path: str) -> None:
        with open(log_path, "a") as log:
            for raw in proc.stdout:
                line = raw.decode(errors="replace")
                log.write(self.gang.redact(line) if self.gang.redact else line)
                log.flush()
                self.lines.put(line)

    async def step(self) -> None:
        if self.launch.node_rank == 0:
            while not self.lines.empty():
                found = self.plan.plugin.remote_command(self.lines.get(), self.plan.rank0)
                if found is None:
                    continue
                node_rank, command = found
                if node_rank == 0:
                    self.gang.add(self.plan.helper(f"proxy {node_rank}", command))
                else:
                    await self.send({"attempt": self.launch.attempt, "node_rank": node_rank, "command": command})
            return
        if self.started:
            return
        command = await self.fetch(self.launch.attempt, self.launch.node_rank)
        if command and not self.plan.plugin.accepts_remote(list(command), self.plan.rank0, self.launch.node_rank):
            raise LaunchRefused(
                f"refusing a launcher command for node rank {self.launch.node_rank} that is not this gang's "
                f"{type(self.plan.plugin).__name__} helper: {' '.join(command)[:200]}"
            )
        if command:
            self.started = True
            self.gang.add(self.plan.helper(f"proxy {self.launch.node_rank}", list(command)))
        elif time.monotonic() > self.deadline:
            raise LaunchRefused("the launcher on node rank 0 never sent this node its command")

    def close(self) -> None:
        if self.reader is not None:
            self.reader.join(timeout=2)
