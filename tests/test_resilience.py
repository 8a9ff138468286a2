"""Resumption across failures, with real kills: node agents, ranks, a hung rank, the workflow worker and
the Temporal server itself. A dedicated stack: its own dev server, a worker and three node agents
(two for the gang and a spare)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from typing import Any

import gangs
import pytest
from conftest import ROOT, Stack, alive, failure_of, gang_task, gangflow_cli, run, stack_fixture, status_json
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError
from temporalio.service import RPCError

from engine.client import Client

sys.path.insert(0, str(ROOT / "examples"))
import resilient_training

pytestmark = pytest.mark.slow

STEPS = dict(total_steps=80, checkpoint_every=10, step_seconds=0.1)


stack = stack_fixture("r")


async def _running_gang(client: Client, gang_id: str, min_step: int) -> dict[str, Any]:
    """Wait until every rank of the gang reported at least ``min_step``; returns the gang's details."""
    deadline = time.monotonic() + 90
    while True:
        try:
            gang = await client.gang(gang_id)
        except RPCError:  # the GangTask child is not started yet
            await asyncio.sleep(0.2)
            continue
        steps = [p.get("step", -1) for node in gang["nodes"] for p in node.get("progress", {}).values()]
        if len(steps) == 2 and min(steps) >= min_step:
            return gang
        assert time.monotonic() < deadline, gang
        await asyncio.sleep(0.2)


async def _run_ranks_started(client: Client, gang_id: str) -> int:
    count = 0
    async for event in client.temporal.get_workflow_handle(gang_id).fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED and (
            event.activity_task_scheduled_event_attributes.activity_type.name == "gangflow.run_ranks"
        ):
            count += 1
    return count


async def _start_training(stack: Stack) -> tuple[Client, str, str]:
    """Start the resilient-training example; returns the client, the run id and its gang's id."""
    client = await stack.client()
    run_id = await client.start(resilient_training.pipeline, STEPS)
    return client, run_id, f"{run_id}.train-1"


def _pids(gang: dict[str, Any]) -> dict[str, list[int]]:
    return {node["node"]: node["pids"] for node in gang["nodes"]}


def _restarted_once(stack: Stack, run_id: str, ended: str, first_step: int) -> None:
    """``gangflow status`` of a finished run whose gang ran twice: the attempts (0-based, the same in the
    task table, the attempt list and the rank table), how the first ended, each one's steps and duration;
    the rank table's reports are the final step's."""
    task = gang_task(status_json(stack.server.address, run_id))
    first, second = task["attempts"]
    assert (first["attempt"], second["attempt"], task["attempt"], task["ranks"]["attempt"]) == (0, 1, 1, 1), task
    assert first["kind"] == "system" and first["ended"].startswith(ended), first
    assert second["kind"] == "completed" and second["ended"] == "completed", second
    assert first["first_step"] == 0 and first_step <= first["last_step"] < STEPS["total_steps"], first
    assert second["first_step"] == first_step and second["last_step"] == STEPS["total_steps"], second
    assert all(a["duration_s"] > 0 and len(a["nodes"]) == 2 for a in (first, second)), task["attempts"]
    # the goodput ledger (CPU-only ranks: no GPU-seconds, the ratio is by seconds): the failed attempt lost the
    # work since its last checkpoint, the next one spent time restoring
    assert 0 <= first["ledger"]["goodput"] < 1 and 0 < second["ledger"]["goodput"] < 1, task["attempts"]
    assert [r["step"] for r in task["ranks"]["ranks"]] == [STEPS["total_steps"]] * 2, task["ranks"]
    shown = gangflow_cli("status", run_id, GANGFLOW_ADDRESS=stack.server.address, COLUMNS="200")
    assert shown.returncode == 0 and "train-1 attempts" in shown.stdout and ended in shown.stdout, shown.stdout
    assert "train ranks (attempt 1, last reports)" in shown.stdout, shown.stdout
    assert "  goodput " in shown.stdout, shown.stdout


def test_node_agent_killed_mid_training_resumes_from_checkpoint(stack: Stack):
    async def main() -> None:
        client, run_id, gang_id = await _start_training(stack)
        gang = await _running_gang(client, gang_id, min_step=25)
        pids = _pids(gang)
        victim = sorted(pids)[-1]
        stack.nodes[victim].stop(signal.SIGKILL)  # the whole "server" goes away, ranks included
        result = await client.result(run_id, resilient_training.pipeline)
        assert result.attempt == 1 and result.first_step >= 20  # resumed from a checkpoint, not step 0
        assert result.optimizer_steps == STEPS["total_steps"] and result.steps == STEPS["total_steps"]
        info = await client.gang(gang_id)
        assert info["restarts"] == 1 and info["failed_attempts"][0]["kind"] == "system"
        assert f"node {victim} lost" in info["failed_attempts"][0]["reason"]
        assert await _run_ranks_started(client, gang_id) == 4  # 2 nodes × 2 attempts, in the history
        assert not any(alive(pid) for node in pids.values() for pid in node)  # no orphan of attempt 0
        _restarted_once(stack, run_id, f"node {victim} lost", result.first_step)
        stack.nodes[victim].restart()
        await stack.wait_nodes()

    run(main())


def test_a_slow_but_alive_node_agent_is_never_declared_lost(stack: Stack):
    async def main() -> None:
        client, run_id, gang_id = await _start_training(stack)
        gang = await _running_gang(client, gang_id, min_step=10)
        frozen = stack.nodes[sorted(_pids(gang))[-1]].proc.pid
        os.kill(frozen, signal.SIGSTOP)  # the agent stalls (swapping, a debugger); its ranks train on
        await asyncio.sleep(2)
        os.kill(frozen, signal.SIGCONT)
        result = await client.result(run_id, resilient_training.pipeline)
        assert result.attempt == 0 and result.optimizer_steps == STEPS["total_steps"]
        info = await client.gang(gang_id)
        assert info["restarts"] == 0 and info["failed_attempts"] == []
        assert all(node["alive"] for node in (await client.queue())["nodes"])

    run(main())


def test_killed_rank_restarts_the_gang(stack: Stack):
    async def main() -> None:
        client, run_id, gang_id = await _start_training(stack)
        gang = await _running_gang(client, gang_id, min_step=15)
        pids = _pids(gang)
        os.kill(sorted(pid for node in pids.values() for pid in node)[0], signal.SIGKILL)
        result = await client.result(run_id, resilient_training.pipeline)
        assert result.attempt == 1 and result.first_step >= 10 and result.optimizer_steps == STEPS["total_steps"]
        info = await client.gang(gang_id)
        assert "killed by SIGKILL" in info["failed_attempts"][0]["reason"]
        assert not any(alive(pid) for node in pids.values() for pid in node)
        _restarted_once(stack, run_id, "rank ", result.first_step)
        assert gang_task(status_json(stack.server.address, run_id))["attempts"][0]["ended"].endswith(
            "was killed by SIGKILL"
        )

    run(main())


def test_hung_rank_is_detected_and_restarted(stack: Stack):
    hang_timeout = 20  # what resilient_training.train declares

    async def main() -> None:
        client, run_id, gang_id = await _start_training(stack)
        gang = await _running_gang(client, gang_id, min_step=15)
        pids = _pids(gang)
        stopped = sorted(pid for node in pids.values() for pid in node)[-1]
        os.kill(stopped, signal.SIGSTOP)
        frozen = time.monotonic()
        while (await client.gang(gang_id))["restarts"] < 1:
            assert time.monotonic() - frozen < hang_timeout + 10, "the hung rank was not detected in time"
            await asyncio.sleep(0.2)
        result = await client.result(run_id, resilient_training.pipeline)
        assert result.attempt == 1 and result.optimizer_steps == STEPS["total_steps"]
        info = await client.gang(gang_id)
        assert "made no progress" in info["failed_attempts"][0]["reason"]
        assert not alive(stopped)

    run(main())


def test_user_error_is_not_restarted(stack: Stack):
    async def main() -> None:
        client = await stack.client()
        run_id = await client.start(gangs.user_bug, {})
        with pytest.raises(WorkflowFailureError):
            await client.wait(run_id)
        error = str((await client.status(run_id)).error)
        assert "user error in the task body, not restarted (1 attempt(s) allowed" in error
        assert "attempt 0 [user] rank 1 (node" in error and "KeyError" in error
        assert "attempt 1" not in error  # max_restarts=3 is for system failures only
        # a failed run's status lists its one attempt and how it ended, in a few words
        task = gang_task(status_json(stack.server.address, run_id))
        (attempt,) = task["attempts"]
        assert (attempt["attempt"], attempt["kind"], task["attempt"]) == (0, "user", 0), task
        assert attempt["ended"].startswith("rank 1 (node ") and attempt["ended"].endswith("exited with code 1")
        assert attempt["duration_s"] > 0 and attempt["reason"].startswith(attempt["ended"] + ": KeyError"), attempt

    run(main())


def test_exhausted_restart_budget_lists_every_attempt(stack: Stack):
    async def main() -> None:
        error = await failure_of(await stack.client(), gangs.doomed, {})
        assert "restart budget exhausted (1 restarts) after system failures" in error
        assert "attempt 0 [system] rank 1" in error and "attempt 1 [system] rank 1" in error
        assert "killed by SIGKILL" in error

    run(main())


def test_worker_killed_and_server_restarted_mid_gang(stack: Stack):
    async def main() -> None:
        client, run_id, gang_id = await _start_training(stack)
        await _running_gang(client, gang_id, min_step=10)
        stack.worker.kill()  # the workflow worker dies; the ranks keep training on the node agents
        await asyncio.sleep(1.0)
        stack.worker.start()
        await _running_gang(client, gang_id, min_step=30)
        stack.server.stop()  # and now Temporal itself goes away for a moment
        await asyncio.sleep(1.0)
        stack.server.start()
        result = await client.result(run_id, resilient_training.pipeline)  # waits through the outage
        assert result.steps == STEPS["total_steps"] and result.optimizer_steps == STEPS["total_steps"]

    run(main())
