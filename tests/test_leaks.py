"""Nothing leaks, nothing wedges: runs terminated, timed out or cancelled at every phase of their gang free
every GPU and leave no rank process behind; silent nodes expire; a whole-cluster restart resumes the gang
from its checkpoint; the Scheduler survives malformed signals and many continue-as-new cycles mid-traffic.

A dedicated stack: its own dev server, a worker and three node agents with two GPU slots each. Its Scheduler
continues as new every 5 events, so every test here also runs across many continue-as-new cycles.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import leaks
import pytest
from conftest import ROOT, Stack, alive, run, stack_fixture
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
from temporalio.service import RPCError

from engine.client import Client
from engine.core.protocol import NODE_LEASE_TYPE, SCHEDULER_ID

sys.path.insert(0, str(ROOT / "examples"))
import resilient_training

pytestmark = pytest.mark.slow

NODES, GPUS = 3, 2
EVENTS_PER_RUN = 5  # node leases send the Scheduler far fewer events than re-registrations did


class LeakStack(Stack):
    async def all_free(self, timeout: float) -> float:
        def free(q: dict[str, Any]) -> bool:
            totals = q["totals"]
            idle = not q["running"] and not q["pending"]
            return bool(idle and totals["alive_nodes"] == NODES and totals["gpus_free"] == NODES * GPUS)

        return await self.wait_for("every GPU free", free, timeout)


stack = stack_fixture("g", NODES, GPUS, scheduler_events=EVENTS_PER_RUN, kind=LeakStack, ready=lambda s: s.all_free(60))


@pytest.fixture(autouse=True)
def _nothing_left_running(stack: LeakStack) -> Iterator[None]:
    """A test that fails midway may leave its runs holding GPUs, which would fail every test after it: cancel
    what is still running (the Scheduler aside) and wait for the cluster to be whole again."""
    yield

    async def cancel_leftovers() -> None:
        client = await stack.client()
        # the node leases run for as long as their agents do: cancelling them would lose the nodes
        query = f'ExecutionStatus="Running" AND WorkflowId!="{SCHEDULER_ID}" AND WorkflowType!="{NODE_LEASE_TYPE}"'
        left = [wf.id async for wf in client.temporal.list_workflows(query) if "." not in wf.id]
        for run_id in left:
            await client.cancel(run_id)
        if left:
            await stack.all_free(90)

    run(cancel_leftovers())


def _pids(marker_dir: Path) -> list[int]:
    return [int(p.name.split(".")[1]) for p in marker_dir.glob("pid.*")]


async def _wait_ranks(marker_dir: Path, count: int, timeout: float = 60) -> list[int]:
    deadline = time.monotonic() + timeout
    while len(_pids(marker_dir)) < count:
        assert time.monotonic() < deadline, "the gang's ranks did not start"
        await asyncio.sleep(0.1)
    return _pids(marker_dir)


async def _wait_phase(client: Client, gang_id: str, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            # a gang whose first workflow task has not run yet answers no status query: no phase yet
            if text in (await client.gang(gang_id)).get("phase", ""):
                return
        except RPCError:
            pass
        assert time.monotonic() < deadline, f"gang {gang_id} never reached {text!r}"
        await asyncio.sleep(0.1)


async def _no_rank_left(pids: list[int], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while any(alive(pid) for pid in pids):
        assert time.monotonic() < deadline, f"rank processes left behind: {[p for p in pids if alive(p)]}"
        await asyncio.sleep(0.1)


def test_terminating_a_run_mid_gang_frees_every_gpu(stack: LeakStack, tmp_path: Path):
    async def main() -> None:
        client = await stack.client()
        run_id = await client.start(leaks.hold, {"marker_dir": str(tmp_path)})
        pids = await _wait_ranks(tmp_path, 2)
        await client.temporal.get_workflow_handle(run_id).terminate("operator")  # GangTask gets a cancel
        assert await stack.all_free(30) < 30
        await _no_rank_left(pids)

    run(main())


def test_a_run_timing_out_around_a_long_gang_frees_every_gpu(stack: LeakStack, tmp_path: Path):
    async def main() -> None:
        client = await stack.client()
        run_id = await client.start(leaks.short_lived, {"marker_dir": str(tmp_path)})
        with pytest.raises(WorkflowFailureError):  # 5 s after the start: placed, launching or running
            await client.wait(run_id)
        assert (await client.status(run_id)).status == "TIMED_OUT"
        assert await stack.all_free(30) < 30
        await _no_rank_left(_pids(tmp_path))

    run(main())


def test_a_gang_terminated_directly_is_released_by_the_owner_check(stack: LeakStack, tmp_path: Path):
    async def main() -> None:
        client = await stack.client()
        run_id = await client.start(leaks.hold, {"marker_dir": str(tmp_path)})
        pids = await _wait_ranks(tmp_path, 2)
        # nothing runs GangTask's cleanup: only the Scheduler's owner check can find the allocation
        await client.temporal.get_workflow_handle(f"{run_id}.occupy-1").terminate("operator")
        assert await stack.all_free(30) < 30
        await _no_rank_left(pids, 30)  # the node activities learn at their next heartbeat
        await client.cancel(run_id)

    run(main())


@pytest.mark.parametrize("phase", ["queued", "reserving", "running", "stopping"])
def test_cancel_at_every_phase_frees_the_gpus_within_10_s(stack: LeakStack, tmp_path: Path, phase: str):
    async def main() -> None:
        client = await stack.client()
        blocker = None
        stopped = None
        if phase == "queued":  # another gang holds 2 GPUs, so one that needs all 6 waits
            (tmp_path / "blocker").mkdir()
            blocker = await client.start(leaks.hold, {"marker_dir": str(tmp_path / "blocker")})
            try:
                # generous: once in a few CI runs its ranks took over a minute to start here (not understood
                # yet: see the closing note); a blocker left running would fail every test after this one
                await _wait_ranks(tmp_path / "blocker", 2, timeout=150)
            except BaseException:
                await client.cancel(blocker)
                raise
            run_id = await client.start(leaks.queued, {"marker_dir": str(tmp_path)})
            await _wait_phase(client, f"{run_id}.everything-1", "pending")
        elif phase == "reserving":  # node rank 0's agent is frozen, so the port reservation hangs
            stopped = stack.nodes["g0"].proc.pid
            os.kill(stopped, signal.SIGSTOP)
            run_id = await client.start(leaks.hold, {"marker_dir": str(tmp_path)})
            await _wait_phase(client, f"{run_id}.occupy-1", "starting on g0")
        elif phase == "running":
            run_id = await client.start(leaks.hold, {"marker_dir": str(tmp_path)})
            await _wait_ranks(tmp_path, 2)
        else:  # rank 1 failed; rank 0 ignores SIGTERM, so its agent waits out the grace before SIGKILL
            run_id = await client.start(leaks.stopping, {"marker_dir": str(tmp_path)})
            await _wait_phase(client, f"{run_id}.stubborn-1", "a rank failed")
        await client.cancel(run_id)
        if stopped:
            await asyncio.sleep(1)
        try:
            if blocker:
                await client.cancel(blocker)
            with pytest.raises(WorkflowFailureError):
                await client.wait(run_id)
            assert (await client.status(run_id)).status == "CANCELED"
            assert await stack.all_free(10 if not stopped else 20) < 20
        finally:
            if stopped:
                os.kill(stopped, signal.SIGCONT)
        await _no_rank_left(_pids(tmp_path) + _pids(tmp_path / "blocker"))
        await stack.all_free(30)

    run(main())


def test_an_idle_node_agent_killed_is_lost_within_30_s(stack: LeakStack):
    async def main() -> None:
        stack.nodes["g2"].stop(signal.SIGKILL)
        took = await stack.wait_for(
            "g2 lost", lambda q: [n["alive"] for n in q["nodes"] if n["node_id"] == "g2"] == [False], 45
        )
        assert took < 35, took  # ttl 20 s + the Scheduler's 5 s tick, with room for a busy CI
        stack.nodes["g2"].start()
        await stack.all_free(30)

    run(main())


def test_malformed_signals_never_wedge_the_scheduler_or_a_gang(stack: LeakStack, tmp_path: Path):
    junk: list[Any] = [None, 1, "x", "", [], {}, {"gang_id": 5}, {"gang_id": "g"}, {"node_id": ""}, [1, [2]]]

    async def main() -> None:
        client = await stack.client()
        run_id = await client.start(leaks.hold, {"marker_dir": str(tmp_path), "seconds": 20})
        await _wait_ranks(tmp_path, 2)
        gang_id = f"{run_id}.occupy-1"
        scheduler = client.temporal.get_workflow_handle(SCHEDULER_ID)
        gang = client.temporal.get_workflow_handle(gang_id)
        for payload in junk:
            for name in ("register_node", "node_lost", "submit", "release"):
                await scheduler.signal(name, payload)
            for name in ("placement", "rejected", "pending", "remote_command"):
                await gang.signal(name, payload)
        assert (await stack.queue())["totals"]["running"] == 1  # still answers, still holds the gang
        assert await client.result(run_id, leaks.hold) == 0
        for handle in (gang, scheduler):
            async for event in handle.fetch_history_events():
                assert event.event_type != EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED, event
        await stack.all_free(30)

    run(main())


def test_the_scheduler_continued_as_new_many_times_and_lost_nothing(stack: LeakStack):
    async def main() -> None:
        client = await stack.client()
        runs = 0
        async for execution in client.temporal.list_workflows(f"WorkflowId = '{SCHEDULER_ID}'"):
            runs += 1
            assert execution.status in (WorkflowExecutionStatus.RUNNING, WorkflowExecutionStatus.CONTINUED_AS_NEW)
        assert runs > 5, runs  # every test above ran across continue-as-new cycles
        await stack.all_free(30)

    run(main())


def test_whole_cluster_restart_resumes_the_gang_from_its_checkpoint(stack: LeakStack):
    steps = dict(total_steps=150, checkpoint_every=10, step_seconds=0.1)

    async def main() -> None:
        client = await stack.client()
        run_id = await client.start(resilient_training.pipeline, steps)
        gang_id = f"{run_id}.train-1"
        deadline = time.monotonic() + 90
        while True:  # every rank past its first checkpoint
            try:
                gang = await client.gang(gang_id)
                reached = [p.get("step", 0) for n in gang["nodes"] for p in n.get("progress", {}).values()]
                if len(reached) == 2 and min(reached) >= 25:
                    break
            except RPCError:
                pass
            assert time.monotonic() < deadline
            await asyncio.sleep(0.2)
        # a power cut: every node agent (and its ranks), the worker and the server go away at once
        for node in stack.nodes.values():
            node.stop(signal.SIGKILL)
        stack.worker.kill()
        stack.server.stop()
        await asyncio.sleep(2)
        stack.server.start()
        stack.worker.start()
        for node in stack.nodes.values():
            node.start()
        client = await stack.client()
        result = await client.result(run_id, resilient_training.pipeline)
        assert result.attempt >= 1 and result.first_step >= 20  # resumed from a checkpoint, not step 0
        assert result.optimizer_steps == steps["total_steps"]
        await stack.all_free(60)

    run(main())
