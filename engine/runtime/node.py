"""The node agent (``gangflow node``): the executor on one machine.

It registers the machine's capacity with the Scheduler (and re-registers periodically, which is its
liveness signal), polls its own task queue ``node/<id>``, and runs the ranks GangRun places on it:
one process per rank with the plugin's environment and command, pinned GPUs, one log per rank in the
artifact store, heartbeats while they run, and SIGTERM → grace → SIGKILL of the whole gang on cancel.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import socket
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from temporalio import activity
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from engine.artifacts.loader import LOADER
from engine.artifacts.store import cache_dir
from engine.core.definitions import TaskDefinition
from engine.core.gang import NodeLaunch, base_rank_env
from engine.core.wire import Envelope
from engine.executor.launcher import NodeGang, RankFailure, RankLaunch, runner_command
from engine.runtime.activities import store_for
from engine.runtime.connection import TASK_QUEUE
from engine.types.codec import pack
from workflows.gang import RESERVE_PORT, RUN_RANKS, node_queue
from workflows.scheduler import SCHEDULER_ID, SCHEDULER_TYPE

__all__ = ["NodeActivities", "NodeConfig", "register", "run_node"]

#: how often a node re-registers (its liveness signal to the Scheduler)
REGISTER_EVERY = timedelta(seconds=15)
#: SIGTERM means "save and exit": ranks get this long before SIGKILL
STOP_GRACE_S = 5.0
#: how a rank failure is reported to GangRun: a user error, or a system failure that spends restarts
FAILURE_TYPES = {"user": "RankFailed", "killed": "RankKilled", "hung": "RankHung"}


@dataclass(frozen=True)
class NodeConfig:
    node_id: str
    address: str  # what other nodes use to reach this one (MASTER_ADDR when it hosts rank 0)
    gpus: int
    cpus: float
    mem: int | None = None
    scheduler_queue: str = TASK_QUEUE


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


class NodeActivities:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.workdir = cache_dir() / "nodes" / _safe(config.node_id)

    @activity.defn(name=RESERVE_PORT)
    async def reserve_port(self) -> int:
        """A port free on this node right now, for the gang's rendezvous (fresh for every attempt)."""
        with socket.socket() as sock:
            sock.bind(("", 0))
            return int(sock.getsockname()[1])

    @activity.defn(name=RUN_RANKS)
    async def run_ranks(self, launch: NodeLaunch, envelope_blob: bytes) -> bytes:
        envelope = Envelope.decode(envelope_blob)
        defn = await asyncio.to_thread(LOADER.load, envelope.code)
        if not isinstance(defn, TaskDefinition) or defn.plugin is None:
            raise ApplicationError(
                f"{envelope.code.qualname} is not a distributed task", type="CodeNotFound", non_retryable=True
            )
        store = store_for(envelope.run.artifacts)
        workdir = self.workdir / _safe(f"{launch.gang_id}.a{launch.attempt}.n{launch.node_rank}")
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True)
        spec_path = workdir / "spec.msgpack"
        spec_path.write_bytes(
            pack(
                {
                    "envelope": envelope_blob,
                    "result_path": str(workdir / "result"),
                    "done_dir": str(workdir / "done"),
                    "error_dir": str(workdir / "errors"),
                }
            )
        )
        if "://" not in launch.checkpoint_dir:  # a shared filesystem path: make sure it exists
            os.makedirs(launch.checkpoint_dir, exist_ok=True)
        local_logs = not store.local
        (workdir / "progress").mkdir()
        ranks = []
        for ctx in launch.contexts(envelope.run.run_id):
            own = defn.plugin.command(ctx)
            name = f"{launch.log_name}.rank{ctx.rank}.attempt{launch.attempt}.log"
            progress = str(workdir / "progress" / f"rank{ctx.rank}.json")
            ranks.append(
                RankLaunch(
                    context=ctx,
                    command=own or runner_command(str(spec_path)),
                    env={
                        **os.environ,
                        **base_rank_env(ctx, cpus_per_rank=launch.cpus_per_node / launch.nproc_per_node),
                        **defn.plugin.rank_env(ctx),
                        "GANGFLOW_PROGRESS_FILE": progress,
                    },
                    log_path=str(workdir / name) if local_logs else store.log_path(envelope.run.run_id, name),
                    runner=own is None,
                    progress_path=progress,
                )
            )
        coordinator = getattr(defn.plugin, "coordinator", None)
        spec_of = coordinator(ranks[0].context) if coordinator and launch.node_rank == 0 else None
        if spec_of is not None:  # started first: the ranks connect to it
            name = f"{launch.log_name}.{spec_of.name}.attempt{launch.attempt}.log"
            ranks.insert(
                0,
                RankLaunch(
                    context=ranks[0].context,
                    command=spec_of.command,
                    env={**ranks[0].env, **spec_of.env},
                    log_path=str(workdir / name) if local_logs else store.log_path(envelope.run.run_id, name),
                    runner=False,
                    coordinator=spec_of.name,
                ),
            )
        folder = LOADER.folder_for(envelope.code)
        gang = NodeGang(
            self.config.node_id, ranks, workdir, cwd=str(folder) if folder else None, hang_timeout=launch.hang_timeout_s
        )
        gang.start()  # on the event loop thread: the parent-death signal follows the spawning thread
        try:
            while (state := gang.poll()) is False:
                # heartbeat details: what the Web UI and `gangflow status` show about the ranks
                activity.heartbeat({"node": self.config.node_id, "pids": gang.pids, "progress": gang.progress()})
                await asyncio.sleep(0.2)
            if isinstance(state, RankFailure):
                await asyncio.to_thread(gang.terminate, STOP_GRACE_S)
                raise ApplicationError(
                    state.describe(),
                    {"rank": state.rank, "node": state.node_id, "returncode": state.returncode, "kind": state.kind},
                    type=FAILURE_TYPES[state.kind],
                    non_retryable=True,
                )
            await asyncio.to_thread(gang.terminate, STOP_GRACE_S)  # a coordinator may still be up
            result = workdir / "result"  # written by rank 0's runner; a plugin's own script returns None
            return result.read_bytes() if result.exists() else pack(None)
        except asyncio.CancelledError:
            await asyncio.shield(asyncio.to_thread(gang.terminate, STOP_GRACE_S))
            if activity.is_worker_shutdown():  # this agent is going away, not a cancel from GangRun
                raise ApplicationError(
                    f"node agent {self.config.node_id} shut down", type="NodeShutdown", non_retryable=True
                ) from None
            raise
        finally:
            if local_logs:
                for rank in ranks:
                    name = Path(rank.log_path).name
                    if os.path.exists(rank.log_path):
                        store.fs.put_file(rank.log_path, store.log_path(envelope.run.run_id, name))
            shutil.rmtree(workdir, ignore_errors=True)


async def register(client: Client, config: NodeConfig) -> None:
    """Tell the Scheduler this node exists (starting the Scheduler if it is not running yet)."""
    spec = {
        "node_id": config.node_id,
        "address": config.address,
        "gpus": config.gpus,
        "cpus": config.cpus,
        "mem": config.mem,
    }
    await client.start_workflow(
        SCHEDULER_TYPE,
        id=SCHEDULER_ID,
        task_queue=config.scheduler_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        start_signal="register_node",
        start_signal_args=[spec],
    )


async def run_node(client: Client, config: NodeConfig, stop: asyncio.Event) -> None:
    """Serve this node's queue until ``stop`` is set."""
    activities = NodeActivities(config)
    worker = Worker(
        client,
        task_queue=node_queue(config.node_id),
        activities=[activities.reserve_port, activities.run_ranks],
        max_concurrent_activities=64,
        # heartbeats carry cancellation: keep them frequent so a cancel kills the ranks within ~1 s
        max_heartbeat_throttle_interval=timedelta(seconds=1),
        default_heartbeat_throttle_interval=timedelta(seconds=1),
        graceful_shutdown_timeout=timedelta(seconds=STOP_GRACE_S + 2),
    )
    async with worker:
        while not stop.is_set():
            await register(client, config)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), REGISTER_EVERY.total_seconds())
