"""A gang's checkpoint reaches the policy through the real Scheduler workflow (issue 22, lost work).

The Scheduler runs in this process on the suite's dev server, under its own id and task queue; the gang it
admits is a stand-in workflow that takes every signal (the Scheduler releases an admitted gang whose
workflow is gone). The ``gang_checkpointed`` signal becomes a ``GangCheckpointed`` event, and the running
gang's row in ``describe`` shows it; a malformed one is dropped, never raised. The parsers on the gang's side
(what node rank 0's agent sends, what GangTask reads of it) are checked here too.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from conftest import run, until
from temporalio import workflow
from temporalio.common import RawValue
from temporalio.worker import Worker

from engine.core.glance import checkpoint_of as reported
from engine.core.protocol import CHECKPOINTED_SIGNAL, DESCRIBE_QUERY, REGISTER_NODE_SIGNAL, SUBMIT_SIGNAL
from engine.runtime import DevServer, Endpoint, connect
from engine.scheduling import Policy
from workflows.gang_checkpoint import checkpoint_of
from workflows.scheduler import Scheduler


@workflow.defn(name="checkpoint-test-gang", sandboxed=False)
class StandInGang:
    """Takes whatever the Scheduler signals it (placement, pending reasons) and waits."""

    def __init__(self) -> None:
        self.done = False

    @workflow.signal(dynamic=True)
    def any_signal(self, name: str, args: Sequence[RawValue]) -> None:
        del name, args

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: self.done)


async def scenario(server: DevServer) -> dict[str, Any]:
    client = await connect(Endpoint.resolve(server.address))
    tag = uuid.uuid4().hex[:8]
    queue, scheduler_id, gang_id = f"ckpt-{tag}", f"scheduler-ckpt-{tag}", f"gang-ckpt-{tag}"
    async with Worker(client, task_queue=queue, workflows=[Scheduler, StandInGang]):
        gang = await client.start_workflow("checkpoint-test-gang", id=gang_id, task_queue=queue)
        # carried state (an empty policy's snapshot): not a fresh run, so it does not look for node leases
        scheduler = await client.start_workflow(
            Scheduler.run, {"policy": Policy().snapshot()}, id=scheduler_id, task_queue=queue
        )
        try:
            spec = {"node_id": "n1", "address": "n1:0", "gpus": 8, "cpus": 16}
            await scheduler.signal(REGISTER_NODE_SIGNAL, spec)
            request = {"gang_id": gang_id, "nnodes": 1, "gpus_per_node": 4, "cpus_per_node": 1.0, "tenant": "default"}
            await scheduler.signal(SUBMIT_SIGNAL, request)

            async def running() -> dict[str, Any] | None:
                rows = (await scheduler.query(DESCRIBE_QUERY))["running"]
                return rows[0] if rows else None

            await until("the gang runs", running, timeout=60)
            await scheduler.signal(CHECKPOINTED_SIGNAL, {"gang_id": gang_id, "step": "not a step", "at": 1.0})
            report = {"gang_id": gang_id, "step": 120, "at": 1.7e9, "save_s": 4.5, "relaunch_s": 12.0}
            await scheduler.signal(CHECKPOINTED_SIGNAL, report)

            async def checkpointed() -> dict[str, Any] | None:
                row = await running()
                return row if row is not None and row["checkpoint"] is not None else None

            return await until("the checkpoint reaches the policy", checkpointed, timeout=60)
        finally:
            await scheduler.terminate("test over")
            await gang.terminate("test over")


def test_a_checkpoint_signal_reaches_the_policy_and_a_malformed_one_is_dropped(server: DevServer) -> None:
    row = run(scenario(server))
    assert row["checkpoint"] == {"step": 120, "at": 1.7e9, "save_s": 4.5}


def test_what_the_agent_sends_and_what_the_gang_reads_of_it() -> None:
    details = {
        "progress": {
            "1": {"step": 9, "ckpt_step": 8, "ckpt_time": 100.0, "ckpt_s": 3.0},
            "0": {"step": 9, "ckpt_step": 8, "ckpt_time": 101.0, "ckpt_s": 2.0, "since": 40.0, "first_step": 5},
        }
    }
    sent = reported(details)
    assert sent == {"step": 8, "at": 101.0, "s": 2.0, "since": 40.0, "first_step": 5}  # rank 0 speaks for it
    assert reported({"progress": {"0": {"step": 3}}}) is None  # no checkpoint yet
    assert reported({"progress": "nonsense"}) is None
    assert checkpoint_of({"attempt": 0, "step": 9, "ckpt": sent}) == sent
    for bad in (None, {"ckpt": "x"}, {"ckpt": {"step": True, "at": 1.0}}, {"ckpt": {"step": 1, "at": float("nan")}}):
        assert checkpoint_of(bad) is None
