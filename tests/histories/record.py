"""Record the workflow histories that ``tests/test_replay.py`` replays against the current workflow code.

    .venv/bin/python tests/histories/record.py                      # every scenario (about 5 min on 2 cores)
    .venv/bin/python tests/histories/record.py node_loss cancel_gang   # only these
    .venv/bin/python tests/histories/record.py --list               # what each scenario exercises

Rerun it after changing workflow code (workflows/) *deliberately* in a way old runs cannot replay, and
commit the result with the change. Each scenario gets a throwaway stack of its own: a Temporal dev server on
free ports, a ``gangflow worker`` process and, for distributed tasks, node agent processes (2 GPU slots
each). The scenario runs for real (real ranks, real SIGKILLs, real cancels), every workflow execution it
produced is exported (user runs, child workflows, GangTask, the Scheduler and any continue-as-new run of
it), and its folder is replaced as a whole, so nothing stale stays behind. Code bundles the histories
reference are saved under ``bundles/``; bundles no history references any more are deleted.

A scenario that fails (or does not end the way it should, e.g. a node loss that caused no restart) leaves
its previous recording in place, prints the stack's logs, and makes the command exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for _path in (ROOT, ROOT / "tests", ROOT / "tests" / "fixtures", ROOT / "examples", HERE):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import approval_pipeline  # noqa: E402
import cached_pipeline  # noqa: E402
import catalog  # noqa: E402
import ddp_pipeline  # noqa: E402
import flows  # noqa: E402
import gangs  # noqa: E402
import jax_pipeline  # noqa: E402
import map_pipeline  # noqa: E402
import mpi_pipeline  # noqa: E402
import multitenant  # noqa: E402
import quickstart  # noqa: E402
import resilient_training  # noqa: E402
import scheduled_report  # noqa: E402
import xgboost_pipeline  # noqa: E402
from conftest import NodeAgent, WorkerProcess  # noqa: E402
from temporalio.client import WorkflowFailureError  # noqa: E402
from temporalio.service import RPCError  # noqa: E402

from engine.client import (  # noqa: E402
    Client,
    approve,
    send_input,
    waiting,
)
from engine.client._schedules import ScheduleOptions, Schedules  # noqa: E402
from engine.core.protocol import (  # noqa: E402
    NODE_LEASE_TYPE,
    NODE_LOST_SIGNAL,
    PING,
    PLATFORM_NAMESPACE,
    SCHEDULER_ID,
    lease_id,
    tenant_namespace,
)
from engine.runtime import DevServer, Endpoint, connect  # noqa: E402

#: the tenant of the isolated scenario
TENANT = "team-a"

SCENARIO_TIMEOUT_S = 300.0
SETTLE_TIMEOUT_S = 60.0


class RecordingError(Exception):
    """The scenario did not end the way it is meant to: its history would not show what it claims."""


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise RecordingError(message)


# -- the stack -------------------------------------------------------------------------------------
class Stack:
    """A dev server, a worker process and ``nodes`` node agents (2 GPU slots each), all throwaway. ``isolated``:
    the isolated layout instead (a tenant's worker in gf-team-a, the platform's worker and the node agents in
    gangflow-system, gangs through team-a's Nexus endpoint)."""

    def __init__(self, root: Path, nodes: int, isolated: bool = False) -> None:
        self.root = root
        self.isolated = isolated
        self.artifacts = str(root / "artifacts" / TENANT) if isolated else str(root / "artifacts")
        #: where the user's runs are, and where the Scheduler and the gangs are
        self.namespace = tenant_namespace(TENANT) if isolated else "default"
        self.platform_namespace = PLATFORM_NAMESPACE if isolated else "default"
        spaces = (self.namespace, PLATFORM_NAMESPACE) if isolated else ()
        self.server = DevServer(root / "server", ui=False, namespaces=spaces).start()
        self.nodes: dict[str, NodeAgent] = {}
        self.workers: list[WorkerProcess] = []
        platform = {"GANGFLOW_NAMESPACE": self.platform_namespace}
        try:
            # node agents first: they load while the worker starts (their registrations wait for it)
            self.nodes = {
                f"node-{i}": NodeAgent(self.server.address, f"node-{i}", 2, root / "nodes", env=platform)
                for i in range(nodes)
            }
            if isolated:
                roots = ["--tenant-artifacts", f"{root / 'artifacts'}/{{tenant}}"]
                self._worker("platform", env=platform, args=["--platform", "--tenants", TENANT, *roots])
                self._worker("worker", args=["--tenant", TENANT, "--artifacts", self.artifacts])
            else:
                self._worker("worker")
        except BaseException:
            self.close()
            raise

    def _worker(self, home: str, env: dict[str, str] | None = None, args: Sequence[str] = ()) -> None:
        self.workers.append(WorkerProcess(self.server.address, "gangflow", self.root / home, env, args).start())

    async def client(self, namespace: str | None = None) -> Client:
        endpoint = Endpoint.resolve(self.server.address, namespace or self.namespace)
        return Client(await connect(endpoint), self.artifacts)

    async def wait_nodes(self) -> None:
        if not self.nodes:
            return
        client = await self.client(self.platform_namespace)
        deadline = time.monotonic() + 60
        while True:
            try:
                if (await client.queue())["totals"]["alive_nodes"] >= len(self.nodes):
                    return
            except Exception:  # the Scheduler is not started yet
                pass
            _check(time.monotonic() < deadline, "the node agents did not register within 60 s")
            await asyncio.sleep(0.3)

    def logs(self) -> str:
        parts = []
        for log in sorted(self.root.rglob("*.log")):
            text = log.read_text(errors="replace")
            parts.append(f"--- {log.relative_to(self.root)} (last 3000 characters)\n{text[-3000:]}")
        return "\n".join(parts)

    def close(self) -> None:
        for node in self.nodes.values():
            try:
                node.stop()
            except Exception:
                node.stop(signal.SIGKILL)
        for worker in self.workers:
            try:
                worker.stop()
            except Exception:
                worker.kill()
        self.server.stop()


@dataclass
class Context:
    stack: Stack
    client: Client
    scratch: Path  # a folder for marker files


Scenario = Callable[[Context], Awaitable[None]]


@dataclass(frozen=True)
class Spec:
    run: Scenario
    nodes: int
    env: dict[str, str]  # for the stack's processes
    isolated: bool = False


SCENARIOS: dict[str, Spec] = {}


def scenario(
    name: str, nodes: int = 0, env: dict[str, str] | None = None, isolated: bool = False
) -> Callable[[Scenario], Scenario]:
    def register(fn: Scenario) -> Scenario:
        SCENARIOS[name] = Spec(fn, nodes, dict(env or {}), isolated)
        return fn

    return register


# -- helpers -----------------------------------------------------------------------------------------
async def _gang_running(client: Client, gang_id: str, ranks: int, min_step: int = -1) -> dict[str, Any]:
    """Wait until every rank of the gang runs (and reported ``min_step``); returns the gang's details."""
    deadline = time.monotonic() + 120
    while True:
        try:
            gang = await client.gang(gang_id)
        except RPCError:  # the GangTask child is not started yet
            gang = {"nodes": []}
        pids = [pid for node in gang["nodes"] for pid in node.get("pids", [])]
        steps = [p.get("step", -1) for node in gang["nodes"] for p in node.get("progress", {}).values()]
        if len(pids) == ranks and (min_step < 0 or (len(steps) == ranks and min(steps) >= min_step)):
            return gang
        _check(time.monotonic() < deadline, f"gang {gang_id} did not reach step {min_step}: {gang}")
        await asyncio.sleep(0.2)


async def _must_fail(ctx: Context, run_id: str, status: str) -> None:
    try:
        await ctx.client.wait(run_id)
    except WorkflowFailureError:
        pass
    else:
        raise RecordingError(f"run {run_id} completed; it should have ended {status}")
    got = (await ctx.client.status(run_id, with_tasks=False)).status
    _check(got == status, f"run {run_id} ended {got}, not {status}")


async def _wait_files(folder: Path, pattern: str, count: int) -> None:
    deadline = time.monotonic() + 120
    while len(list(folder.glob(pattern))) < count:
        _check(time.monotonic() < deadline, f"no {count} × {pattern} in {folder} within 120 s")
        await asyncio.sleep(0.1)


# -- the scenarios -------------------------------------------------------------------------------------
# Small inputs: the shape of a history (which tasks, which gangs, which failures) is what replay checks,
# not how long the training ran. Fixed run ids keep the file names stable from one recording to the next.
@scenario("quickstart")
async def _quickstart(ctx: Context) -> None:
    run_id = await ctx.client.start(quickstart.pipeline, {"rows": 2000, "target_accuracy": 0.99}, run_id="quickstart")
    report = await ctx.client.result(run_id, quickstart.pipeline)
    _check(report.retrained, "quickstart should take its retrain branch (more of the workflow in the history)")


@scenario("ddp_pipeline", nodes=2)
async def _ddp(ctx: Context) -> None:
    run_id = await ctx.client.start(ddp_pipeline.pipeline, {"rows": 2000, "epochs": 1}, run_id="ddp")
    report = await ctx.client.result(run_id, ddp_pipeline.pipeline)
    _check(report.metrics.world_size == 4, f"ddp: world size {report.metrics.world_size}")


@scenario("isolated", nodes=2, isolated=True)
async def _isolated(ctx: Context) -> None:
    platform = await ctx.stack.client(PLATFORM_NAMESPACE)
    await platform.apply_queues(_QUEUES)
    run_id = await ctx.client.start(ddp_pipeline.pipeline, {"rows": 2000, "epochs": 1}, run_id="iso", tenant=TENANT)
    report = await ctx.client.result(run_id, ddp_pipeline.pipeline)
    _check(report.metrics.world_size == 4, f"isolated: world size {report.metrics.world_size}")
    cancelled = await ctx.client.start(
        ddp_pipeline.pipeline, {"rows": 2000, "epochs": 50}, run_id="iso-cancel", tenant=TENANT
    )
    await _gang_running(platform, f"{TENANT}:{cancelled}.train-1", 4)
    await ctx.client.cancel(cancelled)
    await _must_fail(ctx, cancelled, "CANCELED")


@scenario("jax_pipeline", nodes=2)
async def _jax(ctx: Context) -> None:
    run_id = await ctx.client.start(jax_pipeline.pipeline, {"rows": 1000, "steps": 20}, run_id="jax")
    fit, _ = await ctx.client.result(run_id, jax_pipeline.pipeline)
    _check(fit.processes == 2, f"jax: {fit.processes} processes")


@scenario("xgboost_pipeline", nodes=2)
async def _xgboost(ctx: Context) -> None:
    run_id = await ctx.client.start(xgboost_pipeline.pipeline, {"rows": 2000, "rounds": 5}, run_id="xgboost")
    await ctx.client.result(run_id, xgboost_pipeline.pipeline)


@scenario("mpi_pipeline", nodes=2)
async def _mpi(ctx: Context) -> None:
    run_id = await ctx.client.start(mpi_pipeline.pipeline, {"samples": 100_000}, run_id="mpi")
    estimate = await ctx.client.result(run_id, mpi_pipeline.pipeline)
    _check(estimate.ranks == 4, f"mpi: {estimate.ranks} ranks")


@scenario("resilient_training", nodes=2)
async def _resilient(ctx: Context) -> None:
    inputs = {"total_steps": 20, "checkpoint_every": 5, "step_seconds": 0.05}
    run_id = await ctx.client.start(resilient_training.pipeline, inputs, run_id="resilient")
    summary = await ctx.client.result(run_id, resilient_training.pipeline)
    _check(summary.attempt == 0 and summary.steps == 20, f"resilient_training: {summary}")


@scenario("child_workflows")
async def _children(ctx: Context) -> None:
    run_id = await ctx.client.start(flows.parent, {"n": 3}, run_id="parent")
    _check(await ctx.client.result(run_id, flows.parent) == 5, "parent: wrong sum")


_TRAINING = {"total_steps": 60, "checkpoint_every": 10, "step_seconds": 0.1}


@scenario("node_loss", nodes=3)  # 2 nodes for the gang and a spare to move to
async def _node_loss(ctx: Context) -> None:
    run_id = await ctx.client.start(resilient_training.pipeline, _TRAINING, run_id="node-loss")
    gang_id = f"{run_id}.train-1"
    gang = await _gang_running(ctx.client, gang_id, ranks=2, min_step=15)
    victim = sorted(node["node"] for node in gang["nodes"])[-1]
    ctx.stack.nodes[victim].stop(signal.SIGKILL)  # the whole "server" goes away, its ranks with it
    summary = await ctx.client.result(run_id, resilient_training.pipeline)
    info = await ctx.client.gang(gang_id)
    _check(summary.attempt >= 1 and summary.first_step > 0, f"node_loss: did not resume: {summary}")
    _check(info["failed_attempts"][0]["kind"] == "system", f"node_loss: {info['failed_attempts']}")
    _check(f"node {victim} lost" in info["failed_attempts"][0]["reason"], f"node_loss: {info['failed_attempts']}")


@scenario("rank_kill", nodes=2)
async def _rank_kill(ctx: Context) -> None:
    run_id = await ctx.client.start(resilient_training.pipeline, _TRAINING, run_id="rank-kill")
    gang_id = f"{run_id}.train-1"
    gang = await _gang_running(ctx.client, gang_id, ranks=2, min_step=15)
    os.kill(min(pid for node in gang["nodes"] for pid in node["pids"]), signal.SIGKILL)
    summary = await ctx.client.result(run_id, resilient_training.pipeline)
    info = await ctx.client.gang(gang_id)
    _check(summary.attempt >= 1, f"rank_kill: no restart: {summary}")
    _check("killed by SIGKILL" in info["failed_attempts"][0]["reason"], f"rank_kill: {info['failed_attempts']}")


@scenario("cancel_task")
async def _cancel_task(ctx: Context) -> None:
    inputs = {"marker_dir": str(ctx.scratch), "count": 3, "seconds": 30.0}
    run_id = await ctx.client.start(flows.steps, inputs, run_id="cancel-task")
    await _wait_files(ctx.scratch, "step0.*", 1)
    await ctx.client.cancel(run_id)
    await _must_fail(ctx, run_id, "CANCELED")


@scenario("cancel_gang", nodes=2)
async def _cancel_gang(ctx: Context) -> None:
    run_id = await ctx.client.start(
        gangs.hold, {"marker_dir": str(ctx.scratch), "seconds": 120.0}, run_id="cancel-gang"
    )
    await _wait_files(ctx.scratch, "pid.*", 4)
    await _gang_running(ctx.client, f"{run_id}.sleepy-1", ranks=4)
    await ctx.client.cancel(run_id)
    await _must_fail(ctx, run_id, "CANCELED")


@scenario("user_error_task")
async def _user_error_task(ctx: Context) -> None:
    run_id = await ctx.client.start(flows.failing, {"message": "the data is bad"}, run_id="user-error-task")
    await _must_fail(ctx, run_id, "FAILED")


@scenario("user_error_rank", nodes=2)
async def _user_error_rank(ctx: Context) -> None:
    run_id = await ctx.client.start(gangs.user_bug, {}, run_id="user-error-rank")
    await _must_fail(ctx, run_id, "FAILED")
    info = await ctx.client.gang(f"{run_id}.raises_on_rank1-1")
    _check(info["restarts"] == 0 and len(info["failed_attempts"]) == 1, f"user_error_rank: {info}")


@scenario("task_retries")
async def _task_retries(ctx: Context) -> None:
    inputs = {"counter": str(ctx.scratch / "tries"), "failures": 2}
    run_id = await ctx.client.start(flows.retrying, inputs, run_id="retries")
    _check(await ctx.client.result(run_id, flows.retrying) == 3, "task_retries: the third try should succeed")


@scenario("worker_lost")
async def _worker_lost(ctx: Context) -> None:
    inputs = {"marker_dir": str(ctx.scratch), "count": 2, "seconds": 3.0}
    run_id = await ctx.client.start(flows.steps, inputs, run_id="worker-lost")
    await _wait_files(ctx.scratch, "step0.*", 1)
    worker = ctx.stack.worker
    if worker is None:
        raise RecordingError("worker_lost: the stack has no worker")
    worker.kill()  # SIGKILL: the workflow worker and the task running in it die together
    worker.start()
    _check(await ctx.client.wait(run_id) == [0, 1], "worker_lost: wrong result")
    _check(len(list(ctx.scratch.glob("step0.*"))) == 2, "worker_lost: step 0 should have run again, once")


SCHEDULER_EVENTS_PER_RUN = 3


@scenario(
    "scheduler_continue_as_new", nodes=2, env={"GANGFLOW_SCHEDULER_EVENTS_PER_RUN": str(SCHEDULER_EVENTS_PER_RUN)}
)
async def _scheduler_cycles(ctx: Context) -> None:
    inputs = {"total_steps": 10, "checkpoint_every": 5, "step_seconds": 0.05}
    for n in (1, 2):
        run_id = await ctx.client.start(resilient_training.pipeline, inputs, run_id=f"cycles-{n}")
        await ctx.client.result(run_id, resilient_training.pipeline)
    runs = [wf async for wf in ctx.client.temporal.list_workflows(f"WorkflowId = '{SCHEDULER_ID}'")]
    _check(len(runs) >= 3, f"the Scheduler continued as new only {len(runs) - 1} time(s)")


_QUEUES = """
cohorts: [{name: research}]
tenants:
  - {name: team-a, cohort: research, quota: {gpu: 2}}
  - {name: team-b, cohort: research, quota: {gpu: 2}}
policy: {min_runtime: 1s}
"""


@scenario("reclaim", nodes=2)  # 4 GPU slots: team-a borrows 2, team-b takes them back
async def _reclaim(ctx: Context) -> None:
    await ctx.client.apply_queues(_QUEUES)
    inputs = {"steps": 60, "checkpoint_every": 10, "step_seconds": 0.1}
    runs = [await ctx.client.start(multitenant.pipeline, inputs, run_id=f"a-{n}", tenant="team-a") for n in (1, 2)]
    for run_id in runs:
        await _gang_running(ctx.client, f"{run_id}.train-1", ranks=2, min_step=5)
    runs.append(await ctx.client.start(multitenant.pipeline, inputs, run_id="b-1", tenant="team-b"))
    results = [await ctx.client.result(run_id, multitenant.pipeline) for run_id in runs]
    _check(all(r.optimizer_steps == r.steps for r in results), f"reclaim: a step ran twice: {results}")
    kinds = [a["kind"] for run_id in runs[:2] for a in (await ctx.client.gang(f"{run_id}.train-1"))["failed_attempts"]]
    _check(kinds == ["preempted"], f"reclaim: one team-a gang should have been preempted once, got {kinds}")


@scenario("drain", nodes=2)  # the gang's node is drained under it: notice, checkpoint, moved to the other node
async def _drain(ctx: Context) -> None:
    inputs = {"steps": 80, "checkpoint_every": 1000, "step_seconds": 0.1}  # no periodic checkpoint: only the notice's
    run_id = await ctx.client.start(multitenant.pipeline, inputs, run_id="drained")
    gang = await _gang_running(ctx.client, f"{run_id}.train-1", ranks=2, min_step=10)
    await ctx.client.drain_node(gang["nodes"][0]["node"], reason="maintenance")
    result = await ctx.client.result(run_id, multitenant.pipeline)
    _check(result.attempt == 1 and result.first_step > 0, f"drain: did not resume: {result}")
    kinds = [a["kind"] for a in (await ctx.client.gang(f"{run_id}.train-1"))["failed_attempts"]]
    _check(kinds == ["preempted"], f"drain: the gang should have been preempted once, got {kinds}")


@scenario("cached")
async def _cached(ctx: Context) -> None:
    log = ctx.scratch / "executed"
    inputs = {"rows": 60, "epochs": 2, "log": str(log)}
    for run_id, changes, cache, executed in (
        ("cache-fill", {}, "use", 3),  # every task runs and is recorded
        ("cache-hit", {}, "use", 3),  # every task is a hit
        ("cache-partial", {"epochs": 3}, "use", 5),  # prepare hits; train and evaluate run and are recorded
        ("cache-skip", {}, "skip", 8),  # --no-cache: no cache activity at all
    ):
        await ctx.client.start(cached_pipeline.pipeline, {**inputs, **changes}, run_id=run_id, cache=cache)
        await ctx.client.result(run_id, cached_pipeline.pipeline)
        ran = len(log.read_text().split())
        _check(ran == executed, f"cached: {run_id} left {ran} task executions, not {executed}")


async def _node_alive(client: Client, node_id: str, alive: bool, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while [n["alive"] for n in (await client.queue())["nodes"] if n["node_id"] == node_id] != [alive]:
        _check(time.monotonic() < deadline, f"{node_id} not {'alive' if alive else 'lost'} within {timeout:.0f} s")
        await asyncio.sleep(0.2)


@scenario("node_lease", nodes=2)
async def _node_lease(ctx: Context) -> None:
    await _node_alive(ctx.client, "node-1", True, 60)
    # as a gang whose activities on node-1 timed out (its agent was frozen a while) would report it
    scheduler = ctx.client.temporal.get_workflow_handle(SCHEDULER_ID)
    await scheduler.signal(NODE_LOST_SIGNAL, "node-1")
    lease = ctx.client.temporal.get_workflow_handle(lease_id("node-1"))
    deadline = time.monotonic() + 30
    while PING not in [
        e.activity_task_scheduled_event_attributes.activity_type.name async for e in lease.fetch_history_events()
    ]:
        _check(time.monotonic() < deadline, "node_lease: the lease never pinged its agent")
        await asyncio.sleep(0.2)
    await _node_alive(ctx.client, "node-1", True, 30)  # it answered: registered again
    ctx.stack.nodes["node-1"].stop(signal.SIGKILL)
    await _node_alive(ctx.client, "node-1", False, 60)  # its lease timed out (20 s) and said so


async def _until_waiting(ctx: Context, run_id: str, kind: str) -> None:
    deadline = time.monotonic() + 60
    while not any(w["kind"] == kind for w in await waiting(ctx.client, run_id)):
        _check(time.monotonic() < deadline, f"run {run_id} never waited for {kind}")
        await asyncio.sleep(0.1)


@scenario("map")
async def _map(ctx: Context) -> None:
    inputs = {"n": 30, "min_success_ratio": 0.9, "chunk_size": 10}  # 3 chunks; item 13 fails
    run_id = await ctx.client.start(map_pipeline.squares, inputs, run_id="map-squares")
    squares = await ctx.client.result(run_id, map_pipeline.squares)
    _check(squares[13] is None and squares[29] == 29 * 29, f"map: {squares}")
    run_id = await ctx.client.start(map_pipeline.scaled, {"n": 4, "by": 5}, run_id="map-scaled")  # local activities
    _check(await ctx.client.result(run_id, map_pipeline.scaled) == [0, 5, 10, 15], "map: scaled")
    run_id = await ctx.client.start(
        map_pipeline.naps, {"n": 20, "seconds": 30.0, "chunk_size": 10}, run_id="map-cancel"
    )
    chunk = ctx.client.temporal.get_workflow_handle(f"{run_id}.map-nap-1.0")
    deadline = time.monotonic() + 60
    while True:
        with contextlib.suppress(RPCError):
            if (await chunk.describe()).raw_description.pending_activities:
                break
        _check(time.monotonic() < deadline, "map: the first chunk's naps never started")
        await asyncio.sleep(0.1)
    await ctx.client.cancel(run_id)
    await _must_fail(ctx, run_id, "CANCELED")


@scenario("waits")
async def _waits(ctx: Context) -> None:
    run_id = await ctx.client.start(approval_pipeline.pipeline, {"name": "resnet"}, run_id="waits-approved")
    await _until_waiting(ctx, run_id, "input")
    await send_input(ctx.client, run_id, "threshold", text="0.9", by="recorder")
    await _until_waiting(ctx, run_id, "approval")
    await approve(ctx.client, run_id, comment="ok", by="recorder")
    promotion = await ctx.client.result(run_id, approval_pipeline.pipeline)
    _check(promotion.promoted and promotion.comment == "ok", f"waits: {promotion}")
    run_id = await ctx.client.start(approval_pipeline.pipeline, {"name": "resnet"}, run_id="waits-rejected")
    await _until_waiting(ctx, run_id, "input")
    await send_input(ctx.client, run_id, "threshold", 0.5, by="recorder")
    await _until_waiting(ctx, run_id, "approval")
    await approve(ctx.client, run_id, reject=True, comment="stale eval set", by="recorder")
    await _must_fail(ctx, run_id, "FAILED")
    run_id = await ctx.client.start(approval_pipeline.pipeline, {"input_timeout_s": 1.0}, run_id="waits-timeout")
    await _must_fail(ctx, run_id, "FAILED")


@scenario("scheduled")
async def _scheduled(ctx: Context) -> None:
    schedules = Schedules(ctx.client)
    await schedules.create(
        "nightly", scheduled_report.report, {"region": "eu", "top": 2}, ScheduleOptions(("0 3 * * *",))
    )
    try:
        run_id = await schedules.trigger("nightly", wait_s=30)
        _check(run_id is not None, "scheduled: the triggered run never started")
        report = await ctx.client.result(str(run_id), scheduled_report.report)
        _check(len(report.top) == 2, f"scheduled: {report}")
    finally:
        await schedules.delete("nightly")


# -- export -------------------------------------------------------------------------------------------
async def _clients(ctx: Context) -> list[Any]:
    """The Temporal clients of every namespace the stack uses (one, or the tenant's and the platform's)."""
    spaces = dict.fromkeys((ctx.stack.namespace, ctx.stack.platform_namespace))
    return [(await ctx.stack.client(space)).temporal for space in spaces]


async def _settle(ctx: Context) -> None:
    """Wait until every execution but the Scheduler has closed and the Scheduler has handled its last
    signals (the releases of the gangs), so the exported histories end where the scenario did."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    for temporal in await _clients(ctx):
        while True:
            query = "ExecutionStatus = 'Running'"
            # the Scheduler and the node leases run for as long as the stack does
            running = [wf async for wf in temporal.list_workflows(query)]
            open_ = [wf.id for wf in running if wf.id != SCHEDULER_ID and wf.workflow_type != NODE_LEASE_TYPE]
            if not open_:
                break
            _check(time.monotonic() < deadline, f"still running {SETTLE_TIMEOUT_S:.0f} s after the scenario: {open_}")
            await asyncio.sleep(0.2)
    if not ctx.stack.nodes:
        return
    scheduler = (await ctx.stack.client(ctx.stack.platform_namespace)).temporal.get_workflow_handle(SCHEDULER_ID)
    quiet_since: float | None = None
    while time.monotonic() < deadline:
        raw = (await scheduler.describe()).raw_description
        if raw.HasField("pending_workflow_task"):
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since > 0.5:
            return
        await asyncio.sleep(0.1)


async def _export(ctx: Context, folder: Path) -> dict[str, str]:
    """Write every execution's history into ``folder``; returns the bundles they reference (sha → uri)."""
    bundles: dict[str, str] = {}
    for temporal in await _clients(ctx):
        runs: dict[str, list[tuple[Any, str]]] = {}
        async for wf in temporal.list_workflows():
            runs.setdefault(wf.id, []).append((wf.start_time, wf.run_id))
        for workflow_id, found in sorted(runs.items()):
            found.sort()
            _check(not set(workflow_id) & set("+~\\"), f"workflow id {workflow_id!r} cannot be a file name here")
            stem = workflow_id.replace("/", "+")  # a node lease's (catalog.workflow_id_of reads it back)
            for n, (_, run_id) in enumerate(found, start=1):
                history = await temporal.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
                _check(bool(history.events), f"{workflow_id} ({run_id}) has an empty history")
                name = stem if len(found) == 1 else f"{stem}~{n}"
                (folder / f"{name}.json").write_text(history.to_json())
                bundles.update(catalog.bundle_refs(history))
    return bundles


def _save_bundles(bundles: dict[str, str]) -> None:
    catalog.BUNDLES.mkdir(exist_ok=True)
    for sha, uri in bundles.items():
        target = catalog.BUNDLES / f"{sha}.zip"
        if target.exists():
            continue
        data = Path(uri).read_bytes()  # the stack's local artifact store
        _check(hashlib.sha256(data).hexdigest() == sha, f"bundle {uri} does not match its sha256")
        partial = target.with_suffix(".partial")
        partial.write_bytes(data)
        partial.replace(target)


def _collect_garbage(full: bool) -> None:
    """Delete bundles no history references, and (after a full recording) folders of scenarios that no
    longer exist."""
    if full:
        for folder in HERE.iterdir():
            keep = folder.name in catalog.SCENARIOS or folder.name in ("bundles", "__pycache__")
            if folder.is_dir() and not keep:
                shutil.rmtree(folder)
    used: set[str] = set()
    for recorded in catalog.recorded():
        used |= set(catalog.bundle_refs(recorded.history()))
    for zipped in catalog.BUNDLES.glob("*.zip"):
        if zipped.stem not in used:
            zipped.unlink()


# -- running -------------------------------------------------------------------------------------------
async def _run(name: str, spec: Spec, stack: Stack, scratch: Path, out: Path) -> int:
    await stack.wait_nodes()
    ctx = Context(stack, await stack.client(), scratch)
    await asyncio.wait_for(spec.run(ctx), SCENARIO_TIMEOUT_S)
    await _settle(ctx)
    bundles = await _export(ctx, out)
    _save_bundles(bundles)
    return len(list(out.glob("*.json")))


def record(name: str, work: Path) -> bool:
    spec = SCENARIOS[name]
    root = work / name
    scratch = root / "scratch"
    scratch.mkdir(parents=True)
    partial = HERE / f".{name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    started = time.monotonic()
    stack: Stack | None = None
    saved = {key: os.environ.get(key) for key in spec.env}
    os.environ.update(spec.env)  # the stack's processes inherit it
    try:
        stack = Stack(root, spec.nodes, spec.isolated)
        count = asyncio.run(_run(name, spec, stack, scratch, partial))
    except Exception as exc:
        print(f"FAILED {name} after {time.monotonic() - started:.0f} s: {type(exc).__name__}: {exc}", flush=True)
        if not isinstance(exc, RecordingError):
            traceback.print_exc()
        if stack is not None:
            print(stack.logs(), flush=True)
        shutil.rmtree(partial, ignore_errors=True)
        return False
    finally:
        if stack is not None:
            stack.close()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    final = HERE / name
    shutil.rmtree(final, ignore_errors=True)  # replaced as a whole: no stale history survives
    partial.rename(final)
    size = sum(p.stat().st_size for p in final.glob("*.json"))
    print(f"recorded {name}: {count} histories, {size / 1024:.0f} kB, {time.monotonic() - started:.0f} s", flush=True)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("scenarios", nargs="*", metavar="SCENARIO", help="the scenarios to record (default: all)")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    args = parser.parse_args(argv)
    if set(SCENARIOS) != set(catalog.SCENARIOS):  # the test checks catalog.SCENARIOS was recorded
        parser.error(f"record.py and catalog.SCENARIOS disagree: {sorted(set(SCENARIOS) ^ set(catalog.SCENARIOS))}")
    if args.list:
        width = max(map(len, catalog.SCENARIOS))
        for name, what in catalog.SCENARIOS.items():
            print(f"{name:{width}}  {what}")
        return 0
    unknown = [s for s in args.scenarios if s not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    chosen = list(dict.fromkeys(args.scenarios)) or list(SCENARIOS)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="gangflow-record-"))
    os.environ["GANGFLOW_CACHE"] = str(work / "client-cache")  # keep the client's downloads out of ~/.cache
    try:
        failed = [name for name in chosen if not record(name, work)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _collect_garbage(full=not args.scenarios and not failed)
    total = sum(p.stat().st_size for p in HERE.rglob("*") if p.is_file() and p.suffix in (".json", ".zip"))
    print(
        f"{len(chosen) - len(failed)}/{len(chosen)} scenario(s) recorded in {time.monotonic() - started:.0f} s; "
        f"tests/histories now holds {total / 1e6:.2f} MB of histories and bundles",
        flush=True,
    )
    if failed:
        print(f"FAILED: {', '.join(failed)} (their previous recordings were kept)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the temporalio core can abort the interpreter at exit (sdk-python#300)
