"""The node agent (``gangflow node``): the executor on one machine.

It registers the machine's capacity with the Scheduler through its lease (workflows.node_lease: a heartbeated
activity it holds on its own queue; the Scheduler hears of the node when it comes and goes, nothing
between), polls its own task queue ``node/<id>``, and runs the ranks GangTask places on it:
one process per rank with the plugin's environment and command, pinned GPUs, one log per rank in the
artifact store, heartbeats while they run, and SIGTERM → grace → SIGKILL of the whole gang on cancel.
A task's secrets are resolved here for the envelope's tenant (engine/runtime/secrets.py), given to its
processes only, and redacted from their logs and failure messages. Which processes start, with which
environment, and how a notice reaches them is the executor's (engine.executor.plan); this module holds the
Temporal side: the activities, registration and drain.

A *preemption notice* (the activity ``gangflow.notice``, sent by GangTask when the Scheduler preempts the
gang) is different from a cancel: the agent writes the notice file every rank can read
(``engine.preemption()``), sends the plugin's notice signal, and waits until the ranks have exited (they
checkpoint and return: the GPUs are free at once) or the grace deadline passes (then they are killed). The
attempt then ends as ``RankPreempted``, whatever the ranks' exit codes: GangTask queues the gang again
without spending a restart. Ranks that had all finished before the notice came return their result.

A node agent asked to stop (SIGTERM: systemd, Kubernetes deleting its pod, a Slurm job ending) first
*drains its own node* in the Scheduler: its gangs get that notice, checkpoint and are placed elsewhere. It
keeps serving (notices, its lease) until they have left or ``drain_timeout_s`` has passed, then
stops. Starting again, it lifts a drain it set itself; an operator's ``gangflow node drain`` stays.

An agent running as root *sandboxes* its gangs (engine.executor.sandbox): each attempt's processes in a cgroup of
their own (the task's memory per rank, its CPUs, a pids limit, its GPUs' device nodes only), as the gang's own
user where the attempt's files can be reached by one (else as root, in the cgroup, said once in the log). The
cgroup is removed when the attempt ends, however it ends; one left by an agent that was killed is removed at
the agent's next start. An agent that is not root keeps its ranks as its own user and says so once at start.
It registers ``sandboxed`` with the Scheduler (``gangflow cluster`` shows it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.client import Client, WorkflowQueryFailedError, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory, TemporalError
from temporalio.service import RPCError
from temporalio.worker import Worker

import engine
import plugins
from engine.artifacts.loader import LOADER
from engine.artifacts.store import cache_dir
from engine.core.definitions import TaskDefinition
from engine.core.gang import NodeLaunch, notice_of
from engine.core.labels import node_env
from engine.core.protocol import (
    DESCRIBE_QUERY,
    DRAIN_NODE_UPDATE,
    NODE_QUERY,
    NOTICE,
    PING,
    PREEMPTED_TYPE,
    REMOTE_COMMAND,
    RESERVE_PORT,
    RUN_RANKS,
    SCHEDULER_ID,
    TASK_QUEUE,
    node_queue,
)
from engine.core.secrets import VALUES_ENV, SecretError
from engine.core.wire import Envelope
from engine.errors import InputUnavailableError
from engine.executor.body import deliver_code
from engine.executor.cgroups import CgroupDriver, device_rules, gpu_devices, weigh_node
from engine.executor.launcher import NodeGang, RankFailure
from engine.executor.namespace import supported as namespace_supported
from engine.executor.plan import DeliveredNotice, LauncherRelay, LaunchRefused, NodePlan, safe_name
from engine.executor.ports import free_port
from engine.executor.rankfiles import read_rank_file
from engine.executor.sandbox import CGROUPS_ONLY, SANDBOX_ENV, GangSandbox, detect, gang_user, unreachable
from engine.executor.standby import StandbyPool
from engine.runtime.activities import store_for
from engine.runtime.connection import CREDENTIAL_ENV, call_refused
from engine.runtime.gang_progress import ProgressTeller
from engine.runtime.leases import LeaseHolder, start_lease
from engine.runtime.rank_logs import RankLogs
from engine.runtime.ranks import RankSaver, rank_details
from engine.runtime.secrets import Redactor, materialize, resolve, task_environment
from engine.scheduling import Preempted
from engine.types.codec import pack

__all__ = ["DRAIN_TIMEOUT_S", "SELF_DRAIN_REASON", "NodeActivities", "NodeConfig", "register", "run_node"]

log = logging.getLogger("gangflow.node")

#: how often the agent looks at its lease (and fills its standby pool): a lease that ended while the agent
#: could not heartbeat it is started again this soon (engine.runtime.leases)
CHECK_EVERY = timedelta(seconds=5)
#: SIGTERM means "save and exit": ranks get this long before SIGKILL
STOP_GRACE_S = 5.0
#: how a rank failure is reported to GangTask: a user error, or a system failure that spends restarts
FAILURE_TYPES = {"user": "RankFailed", "killed": "RankKilled", "hung": "RankHung", "system": "RankUndelivered"}
#: a notice for an attempt this agent never ran (it ended, or never came) is forgotten after this long
NOTICE_TTL_S = 3600.0
#: how long a stopping agent waits for its gangs to checkpoint and leave: the default preemption grace (120 s)
#: and the time to release; a supervisor's stop timeout must exceed it (terminationGracePeriodSeconds: 180)
DRAIN_TIMEOUT_S = 150.0
#: the reason of the drain a stopping agent sets on its own node (and lifts when it starts again)
SELF_DRAIN_REASON = "node agent stopping (SIGTERM)"
#: a Scheduler that does not answer a drain this fast is not there (no worker): the agent stops without it
_DRAIN_ANSWER_S = 5.0


@dataclass(frozen=True)
class NodeConfig:
    node_id: str
    address: str  # what other nodes use to reach this one (MASTER_ADDR when it hosts rank 0)
    gpus: int
    cpus: float
    mem: int | None = None
    scheduler_queue: str = TASK_QUEUE
    #: warm standby rank runners to keep (engine.executor.standby), and the modules they import ahead
    standby: int = 0
    warm: tuple[str, ...] = ()
    #: on stop, how long to wait for the node's gangs to leave after draining it; 0: stop at once (their
    #: ranks are stopped with 5 s of grace, and the gangs restart elsewhere, spending a restart)
    drain_timeout_s: float = DRAIN_TIMEOUT_S
    #: long polls the agent keeps on its queue (the SDK's default); a benchmark simulating a thousand agents
    #: in one process gives each fewer (tests/perf/bench_liveness.py)
    activity_polls: int = 5
    #: the node's labels (``--labels`` over what the agent detects, engine.executor.gpus.node_labels)
    labels: dict[str, str] = field(default_factory=dict)


class NodeActivities:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.workdir = cache_dir() / "nodes" / safe_name(config.node_id)
        self.cgroups = _sandbox_driver(config.node_id)
        self.cgroup_root = f"gangflow/{safe_name(config.node_id)}"
        if self.cgroups is not None:  # a killed agent's gangs' cgroups (and what still runs in them)
            self.cgroups.remove(self.cgroup_root)
            weigh_node(self.cgroups, self.cgroup_root, config.cpus)  # its ranks' CPU share on a busy machine
        self.logged: set[str] = set()  # what was said once already (why a gang is not dropped to its user)
        self.lease = LeaseHolder()  # this node's liveness (engine.runtime.leases)
        # standbys start as ranks do: without the agent's credentials or any secrets directory
        self.standby = (
            StandbyPool(config.standby, config.warm, task_environment(_own_env(), {})) if config.standby else None
        )
        #: preemption notices by (gang id, attempt), with when they came (None: one that could not be read); a
        #: notice can arrive before the attempt's ranks start here (it is then never started)
        self.notices: dict[tuple[str, int], tuple[Preempted | None, float]] = {}
        self.running: set[tuple[str, int]] = set()

    @activity.defn(name=NOTICE)
    async def notice(self, gang_id: str, attempt: int, notice: Any) -> bool:
        """A preemption notice for one attempt of a gang (see the module docstring). True when its ranks run
        here now; the notice is kept either way, for ranks still to start."""
        now = time.time()
        for key, (_, at) in list(self.notices.items()):
            if key not in self.running and now - at > NOTICE_TTL_S:
                del self.notices[key]
        read = notice_of(notice, gang_id)
        if read is None:
            log.warning(
                "node %s: a preemption notice for %s that cannot be read: %r", self.config.node_id, gang_id, notice
            )
        self.notices[(gang_id, attempt)] = (read, now)
        return (gang_id, attempt) in self.running

    @activity.defn(name=PING)
    async def ping(self) -> str:
        """GangTask's liveness probe: a live agent answers at once (see workflows.gang)."""
        return self.config.node_id

    @activity.defn(name=RESERVE_PORT)
    async def reserve_port(self) -> int:
        """A port free on this node right now, for the gang's rendezvous (fresh for every attempt)."""
        return free_port("")  # every interface: the other nodes' ranks connect to it

    @activity.defn(name=RUN_RANKS)
    async def run_ranks(self, launch: NodeLaunch, envelope_blob: bytes) -> bytes:
        envelope = Envelope.decode(envelope_blob)
        store = store_for(envelope.run.artifacts)
        # the bundle must be in the run's store, and the ranks run in that store's (tenant's) cached copy
        try:
            await asyncio.to_thread(deliver_code, envelope.code, store)
        except InputUnavailableError as exc:  # the platform's fault: a system failure, a restart (not a retry)
            why = {"error_type": type(exc).__name__, "kind": "system"}
            raise ApplicationError(str(exc), why, type=FAILURE_TYPES["system"], non_retryable=True) from None
        defn = await asyncio.to_thread(LOADER.load, envelope.code, store)
        if not isinstance(defn, TaskDefinition) or defn.plugin is None:
            raise ApplicationError(
                f"{envelope.code.qualname} is not a distributed task", type="CodeNotFound", non_retryable=True
            )
        if self.cgroups is not None:  # a sandboxed rank reads its inputs from the agent's cache, never the store
            try:
                await asyncio.to_thread(_deliver_inputs, defn, envelope, store)
            except InputUnavailableError as exc:
                why = {"error_type": type(exc).__name__, "kind": "system"}
                raise ApplicationError(str(exc), why, type=FAILURE_TYPES["system"], non_retryable=True) from None
        run_id = envelope.run.run_id
        try:  # the run's tenant is the one the platform pinned in the envelope (never the client's say)
            values = resolve(defn.secrets, envelope.run.tenant)
        except SecretError as exc:
            raise ApplicationError(str(exc), {"error_type": exc.kind}, type=exc.kind, non_retryable=True) from None
        redact = Redactor(values)
        workdir = self.workdir / safe_name(f"{launch.gang_id}.a{launch.attempt}.n{launch.node_rank}")
        shutil.rmtree(workdir, ignore_errors=True)
        (workdir / "progress").mkdir(parents=True)
        spec_path = workdir / "spec.msgpack"
        spec = {
            "envelope": envelope_blob,
            "result_path": str(workdir / "result"),
            "done_dir": str(workdir / "done"),
            "error_dir": str(workdir / "errors"),
        }
        spec_path.write_bytes(pack(spec))
        if "://" not in launch.checkpoint_dir:  # a shared filesystem path: make sure it exists
            os.makedirs(launch.checkpoint_dir, exist_ok=True)
        folder = await asyncio.to_thread(LOADER.folder_for, envelope.code, store)
        sandbox = self._sandbox(launch, envelope.run.tenant, workdir, defn.resources.mem_bytes, folder, store)
        # a gang's own user cannot open logs in the store: they are written here and mirrored there (RankLogs)
        local_logs = not store.local or (sandbox is not None and sandbox.user is not None)
        mirror = RankLogs(store, run_id, workdir) if local_logs else None

        def log_path(what: str) -> str:
            name = f"{launch.log_name}.{what}.attempt{launch.attempt}.log"
            return str(workdir / name) if local_logs else store.log_path(run_id, name)

        secrets = contextlib.ExitStack()  # the ranks' private secret files: removed when the attempt ends
        try:
            secret_env = secrets.enter_context(materialize(defn.secrets, values)) if defn.secrets else {}
            # what every process of the gang starts from: the agent's environment less its credentials and where
            # secrets come from, plus this task's own secrets and its node's id and labels (GANGFLOW_NODE_*)
            base_env = {**task_environment(_own_env(), secret_env), **node_env(self.config.node_id, self.config.labels)}
            plan = NodePlan(
                launch, defn.plugin, run_id, workdir, spec_path, log_path, base_env, rank_logs=not secret_env
            )
            if sandbox is not None and VALUES_ENV in secret_env:
                sandbox.secret_dirs = (str(Path(secret_env[VALUES_ENV]).parent),)
            gang = NodeGang(
                self.config.node_id,
                plan.processes,
                workdir,
                cwd=str(folder) if folder else None,
                hang_timeout=launch.hang_timeout_s,
                standby=self.standby,
                redact=redact if redact else None,
                sandbox=sandbox,
            )
        except SecretError as exc:
            secrets.close()
            raise ApplicationError(str(exc), {"error_type": exc.kind}, type=exc.kind, non_retryable=True) from None
        except BaseException:
            secrets.close()
            raise
        key = (launch.gang_id, launch.attempt)
        saver = RankSaver(store, run_id, launch.log_name, launch.attempt, launch.node_rank)
        teller = ProgressTeller(launch.attempt, told=launch.node_rank == 0)  # node rank 0 tells the gang its step
        relay: LauncherRelay | None = None
        noticed: DeliveredNotice | None = None
        self.running.add(key)
        try:
            if key in self.notices:  # preempted before its ranks started here: start none
                raise _preempted(DeliveredNotice(self.notices[key][0], plan, gang), self.config.node_id, killed=False)
            gang.start()  # on the event loop thread: the parent-death signal follows the spawning thread
            relay = _relay(plan, gang) if plan.launcher_mode else None
            if relay is not None and launch.node_rank:
                gang.awaiting = 1  # this node's helper comes once node rank 0's launcher asks for it
            while True:
                if noticed is None:
                    state = gang.poll()
                    if state is not False:
                        break
                    if key in self.notices:  # still running: from now on the attempt ends as a preemption
                        noticed = DeliveredNotice(self.notices[key][0], plan, gang)
                        continue
                    if relay is not None:
                        try:
                            await relay.step()
                        except LaunchRefused as exc:
                            raise ApplicationError(str(exc), type="RankFailed", non_retryable=True) from None
                elif gang.exited():
                    await asyncio.to_thread(gang.terminate, STOP_GRACE_S)  # a coordinator may still be up
                    raise _preempted(noticed, self.config.node_id, killed=False)
                elif time.time() >= noticed.deadline:
                    await asyncio.to_thread(gang.terminate, 0.0)  # the grace is over: SIGKILL what is left
                    raise _preempted(noticed, self.config.node_id, killed=True)
                # heartbeat details: what the Web UI and `gangflow status` show about the ranks
                details = rank_details(self.config.node_id, gang, len(launch.gpu_ids))
                if noticed is not None:
                    details["preempted_for_s"] = round(time.time() - noticed.at, 1)
                activity.heartbeat(details)
                await teller.maybe(details)
                if mirror is not None and mirror.due():  # `gangflow logs` while the ranks run
                    await asyncio.to_thread(mirror.sync)
                if saver.due():  # for `gangflow status` where the heartbeats cannot be read
                    await asyncio.to_thread(saver.save, details)
                await asyncio.sleep(0.2)
            await teller.last(rank_details(self.config.node_id, gang, len(launch.gpu_ids)))  # their last step
            if isinstance(state, RankFailure):
                await asyncio.to_thread(gang.terminate, STOP_GRACE_S)
                raise ApplicationError(
                    redact(state.describe()),
                    {
                        "rank": state.rank,
                        "node": state.node_id,
                        "returncode": state.returncode,
                        "kind": state.kind,
                        "error_type": state.error_type,
                        "memory_limit": state.memory_limit,
                    },
                    type=FAILURE_TYPES[state.kind],
                    non_retryable=True,
                )
            await asyncio.to_thread(gang.terminate, STOP_GRACE_S)  # a coordinator may still be up
            if sandbox is not None and sandbox.user is not None:  # rank 0's outputs, once nothing can change them
                await asyncio.to_thread(gang.close)
                await asyncio.to_thread(store.publish_outbox, workdir / "outbox")
            result = workdir / "result"  # written by rank 0's runner; a plugin's own script returns None
            if not (result.exists() or result.is_symlink()):
                return pack(None)
            try:  # read without following a symlink: the working folder is the gang's (engine.executor.rankfiles)
                return read_rank_file(result)
            except OSError as exc:  # what rank 0 left there is not its result: the task's fault, not retried
                raise ApplicationError(str(exc), type="RankFailed", non_retryable=True) from None
        except asyncio.CancelledError:
            await asyncio.shield(asyncio.to_thread(gang.terminate, STOP_GRACE_S))
            if activity.is_worker_shutdown():  # this agent is going away, not a cancel from GangTask
                raise ApplicationError(
                    f"node agent {self.config.node_id} shut down", type="NodeShutdown", non_retryable=True
                ) from None
            raise
        finally:
            self.running.discard(key)
            self.notices.pop(key, None)
            if relay is not None:
                relay.close()
            gang.close()  # the cgroup, and anything a rank left running in it
            secrets.close()
            if mirror is not None:
                mirror.finish()
            saver.save(rank_details(self.config.node_id, gang, len(launch.gpu_ids)))  # a finished gang's last reports
            shutil.rmtree(workdir, ignore_errors=True)

    def _sandbox(
        self, launch: NodeLaunch, tenant: str, workdir: Path, mem: int | None, folder: Path | None, store: Any
    ) -> GangSandbox | None:
        """This attempt's sandbox (None: the agent is not root). Its ranks run as the gang's own user in a mount
        namespace that reaches what they read (this Python, their code, the cache of the run's store: delivered
        there by the agent) and write (their working and checkpoint folders; outputs go to the outbox). Where the
        node cannot make a mount namespace, they run as root, in their cgroups, unless all that is reachable."""
        if self.cgroups is None:
            return None
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(":") if p]
        python = [sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))]
        # gangflow's own packages, where this agent imports them from: an editable install's source tree may lie
        # below /tmp (a clone there), hidden by the rank's private /tmp, and a standby imports most of them only
        # once it is in the sandbox (`make demo` from a clone in /tmp: "No module named 'plugins'")
        own = [os.path.dirname(str(m.__file__)) for m in (engine, plugins)]
        reads: list[str] = [*python, *paths, str(store.cache_path("bundles", "0" * 64).parent.parent), *own]
        if folder is not None:
            reads.append(str(folder))
        devices = gpu_devices(self.config.gpus)
        as_root = os.environ.get(SANDBOX_ENV) == CGROUPS_ONLY  # the operator's choice, said once at start
        mounts = not as_root and namespace_supported()
        blocked = None if mounts else unreachable([workdir.parent, sys.executable, *paths, *reads[3:]])
        if as_root:
            blocked = None
        user = None if blocked or as_root else gang_user(tenant, launch.gang_id)
        # a distributed task's Resources(mem=) is per node (what the Scheduler reserved): each rank gets its share
        per_rank = None if mem is None else max(1, mem // launch.nproc_per_node)
        if blocked and blocked not in self.logged:
            self.logged.add(blocked)
            log.warning(
                "node %s: ranks run in their cgroups but as root: another user cannot reach %s, and this node "
                "cannot give ranks a mount namespace of their own",
                self.config.node_id,
                blocked,
            )
        return GangSandbox(
            self.cgroups,
            f"{self.cgroup_root}/{safe_name(f'{launch.gang_id}.a{launch.attempt}.n{launch.node_rank}')}",
            user,
            per_rank,
            launch.cpus_per_node,
            launch.nproc_per_node,
            device_rules(devices, launch.gpu_ids),
            checkpoint_dir=launch.checkpoint_dir,
            reads=tuple(reads) if mounts else None,
            gpu_nodes=tuple(devices[i] for i in launch.gpu_ids if i < len(devices)),
            hides=(str(cache_dir()),),
        )


def _deliver_inputs(defn: TaskDefinition, envelope: Envelope, store: Any) -> None:
    """Fetch the call's File / Directory inputs into this node's cache (root-owned, read-only to others), where
    its sandboxed ranks read them. A store that cannot deliver one is the platform's failure; any other error
    (a value that does not match its type) is left for the rank to report as the user's, as without a sandbox."""
    try:
        defn.interface.inputs_from_wire(envelope.inputs, store.context(upload=False))
    except OSError as exc:
        raise InputUnavailableError(f"cannot deliver the inputs of {defn.name}: {exc}") from exc
    except Exception:
        return


def _sandbox_driver(node_id: str) -> CgroupDriver | None:
    """This machine's cgroups when the agent can sandbox its ranks; says once why not otherwise."""
    driver = detect()
    if driver is None:
        if os.environ.get(SANDBOX_ENV) == "0":
            why = f"{SANDBOX_ENV}=0"
        elif os.geteuid():
            why = "the node agent is not running as root"
        else:
            why = "no cgroup memory controller was found"
        log.warning(
            "node %s: ranks are NOT sandboxed (%s): they run as this agent's user, with no memory, CPU, process "
            "or device limits",
            node_id,
            why,
        )
    elif os.environ.get(SANDBOX_ENV) == CGROUPS_ONLY:
        log.warning("node %s: %s=%s: ranks run in their cgroups but as root", node_id, SANDBOX_ENV, CGROUPS_ONLY)
    elif not namespace_supported():
        log.warning(
            "node %s: no mount namespaces here: ranks keep the node's /dev%s",
            node_id,
            " and, on cgroup v2, may open every GPU device node their user may (no eBPF device program)"
            if driver.version == 2
            else "",
        )
    return driver


def _own_env() -> dict[str, str]:
    """The agent's environment as its ranks inherit it: without the agent's own Temporal credentials, which
    are the platform's, not the tenant's code's."""
    return {k: v for k, v in os.environ.items() if k not in CREDENTIAL_ENV}


def _preempted(noticed: DeliveredNotice, node_id: str, *, killed: bool) -> ApplicationError:
    """How a preempted attempt ends on this node, whatever the ranks' exit codes: GangTask requeues it."""
    message, details = noticed.report(node_id, killed=killed)
    # benign: the SDK logs it at debug, not as a warning with a traceback (a drain or a reclaim is no fault;
    # the Scheduler and the gang's attempts say why it ended)
    return ApplicationError(
        message, details, type=PREEMPTED_TYPE, non_retryable=True, category=ApplicationErrorCategory.BENIGN
    )


def _relay(plan: NodePlan, gang: NodeGang) -> LauncherRelay:
    """A launcher's per-node commands, through this activity's gang workflow (a signal out, a query in)."""
    handle = activity.client().get_workflow_handle(activity.info().workflow_id or "")

    async def send(payload: dict[str, Any]) -> None:
        await handle.signal(REMOTE_COMMAND, payload)

    async def fetch(attempt: int, node_rank: int) -> list[str] | None:
        command = await handle.query(REMOTE_COMMAND, args=[attempt, node_rank])
        return list(command) if command else None

    return LauncherRelay(plan, gang, send, fetch)


async def register(
    client: Client, config: NodeConfig, *, sandboxed: bool = False, lease: LeaseHolder | None = None
) -> None:
    """Tell the Scheduler this node exists: start its lease, which registers it (retrying until a Scheduler
    takes it) and reports it lost when it ends. The agent no longer starts the Scheduler itself: the platform
    worker keeps it running and runs the lease, so nothing happens before that worker is up anyway, and a
    thousand agents starting at once each starting the one Scheduler made its execution "busy" (refused)."""
    spec: dict[str, Any] = {
        "node_id": config.node_id,
        "address": config.address,
        "gpus": config.gpus,
        "cpus": config.cpus,
        "mem": config.mem,
    }
    if sandboxed:  # only then: a Scheduler of an older version refuses an unknown key
        spec["sandboxed"] = True
    if config.labels:  # likewise
        spec["labels"] = dict(config.labels)
    spec["leased"] = True  # the Scheduler does not expire this node: its lease reports it lost
    await start_lease(client, spec, config.scheduler_queue)
    if lease is not None:  # only once started: a start refused is tried again at the next check
        lease.started = time.monotonic()


async def run_node(
    client: Client, config: NodeConfig, stop: asyncio.Event, activities: NodeActivities | None = None
) -> None:
    """Serve this node's queue until ``stop`` is set; then drain the node and wait for its gangs to leave (up to
    ``config.drain_timeout_s``) before the worker stops. ``activities``: made by the caller that also reads
    them (the agent's metrics), else here."""
    activities = activities or NodeActivities(config)
    worker = Worker(
        client,
        task_queue=node_queue(config.node_id),
        activities=[
            activities.ping,
            activities.reserve_port,
            activities.run_ranks,
            activities.notice,
            activities.lease.hold,
        ],
        max_concurrent_activities=64,
        max_concurrent_activity_task_polls=config.activity_polls,
        # heartbeats carry cancellation: keep them frequent so a cancel kills the ranks within ~1 s
        max_heartbeat_throttle_interval=timedelta(seconds=1),
        default_heartbeat_throttle_interval=timedelta(seconds=1),
        # drain_timeout_s 0 stops at once (gangflow dev stopping whole): the ranks are stopped now, not after this
        graceful_shutdown_timeout=timedelta(seconds=STOP_GRACE_S + 2 if config.drain_timeout_s > 0 else 0),
    )
    try:
        async with worker:
            sandboxed, lease = activities.cgroups is not None, activities.lease
            # Temporal refusing the first start (overloaded: a whole cluster starting) is no reason to exit
            await _register_again(client, config, sandboxed, lease)
            await _lift_own_drain(client, config)
            while not stop.is_set():
                if activities.standby is not None:  # on this (the event loop's) thread: see StandbyPool
                    activities.standby.fill()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), CHECK_EVERY.total_seconds())
                if not stop.is_set() and lease.lapsed():  # it ended while this agent could not heartbeat it
                    log.warning("node %s: holds no lease (it ended, or never came); registering again", config.node_id)
                    await _register_again(client, config, sandboxed, lease)
            if config.drain_timeout_s > 0:  # also when idle: no gang is placed here while it is gone
                await _drain_and_wait(client, config, activities)
    finally:
        if activities.standby is not None:
            activities.standby.close()


async def _register_again(client: Client, config: NodeConfig, sandboxed: bool, lease: LeaseHolder) -> None:
    """Start a new lease; a Temporal that does not answer now is asked again at the next check. Credentials
    Temporal refuses (a tenant's token in the platform's namespace) are raised: asking again cannot help, and
    the agent exits naming the refusal (else it depended on whether its worker's polls failed first)."""
    try:
        await register(client, config, sandboxed=sandboxed, lease=lease)
    except TemporalError as exc:
        if call_refused(exc):
            raise
        log.warning("node %s: could not start its lease (%s); trying again", config.node_id, exc)


async def _set_drain(client: Client, config: NodeConfig, drained: bool) -> bool:
    """Drain or undrain this node (the Scheduler's ``drain_node`` update); False when no Scheduler answered."""
    payload = {"node_id": config.node_id, "drained": drained, "reason": SELF_DRAIN_REASON if drained else ""}
    try:
        handle = client.get_workflow_handle(SCHEDULER_ID)
        await asyncio.wait_for(handle.execute_update(DRAIN_NODE_UPDATE, payload), _DRAIN_ANSWER_S)
    except (TimeoutError, RPCError, TemporalError, WorkflowUpdateFailedError) as exc:
        log.warning(
            "node %s: the Scheduler did not take the %s: %s", config.node_id, "drain" if drained else "undrain", exc
        )
        return False
    return True


async def _scheduler_view(client: Client, config: NodeConfig) -> dict[str, Any] | None:
    """What the Scheduler says of this node (its row of ``gangflow cluster``), or None when it cannot say.
    One node's row (``NODE_QUERY``), not the whole cluster's view: a thousand agents start at once."""
    handle = client.get_workflow_handle(SCHEDULER_ID)
    try:
        try:
            answer = await asyncio.wait_for(handle.query(NODE_QUERY, config.node_id), _DRAIN_ANSWER_S)
            return answer if isinstance(answer, dict) else None
        except WorkflowQueryFailedError:  # a Scheduler from before NODE_QUERY: its whole view
            described = await asyncio.wait_for(handle.query(DESCRIBE_QUERY), _DRAIN_ANSWER_S)
    except (TimeoutError, RPCError, TemporalError) as exc:
        log.warning("node %s: could not read the Scheduler's view of this node: %s", config.node_id, exc)
        return None
    nodes = described.get("nodes", []) if isinstance(described, dict) else []
    return next((n for n in nodes if isinstance(n, dict) and n.get("node_id") == config.node_id), None)


async def _lift_own_drain(client: Client, config: NodeConfig) -> None:
    """A drain this agent set when it last stopped ends now that it is back; an operator's drain stays."""
    node = await _scheduler_view(client, config)
    if node is not None and node.get("drained") and node.get("drain_reason") == SELF_DRAIN_REASON:
        await _set_drain(client, config, False)


async def _drain_and_wait(client: Client, config: NodeConfig, activities: NodeActivities) -> None:
    """Drain this node and keep serving (preemption notices reach the ranks through this worker; the node keeps
    holding its lease, so it is not declared lost) until its gangs have left or the drain timeout passes."""
    node = await _scheduler_view(client, config)
    # an operator's drain (and its reason) stays as it is: the agent must not lift it when it comes back
    if not (node is not None and node.get("drained")) and not await _set_drain(client, config, True):
        return
    deadline = time.monotonic() + config.drain_timeout_s
    log.warning(
        "node %s: drained; waiting up to %.0f s for its gangs to checkpoint and leave",
        config.node_id,
        config.drain_timeout_s,
    )
    while activities.running and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
