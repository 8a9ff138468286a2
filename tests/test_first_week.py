"""A first week without surprises: gangs wait for capacity, they never fail because the cluster is not up yet.

``gangflow dev --nodes 2 & gangflow run ...`` used to fail at random: the Scheduler existed only once a node
agent had registered, and a gang no registered node could hold was rejected at once. Now the platform's worker
keeps the Scheduler running, and such a gang waits (bounded by its ``lost_node_wait``) with a reason.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import gangs
from conftest import NodeAgent, Stack, run


def test_a_gang_submitted_before_any_node_agent_runs_when_they_register(tmp_path: Path) -> None:
    stack = Stack(tmp_path, "early", count=0, gpus=2)  # a server and a worker: no node agent yet
    try:

        async def main() -> None:
            client = await stack.client()
            # the worker starts the Scheduler itself: it answers though no node agent ever registered
            await stack.wait_for("the Scheduler answers", lambda q: q["totals"]["alive_nodes"] == 0, timeout=30)
            run_id = await client.start(gangs.ddp, {"steps": 2})
            reason = ""
            deadline = time.monotonic() + 30
            while "no alive node is registered" not in reason:
                assert time.monotonic() < deadline, f"no pending reason naming the missing nodes: {reason!r}"
                pending = (await client.queue())["pending"]
                reason = pending[0]["reason"] if pending else ""
                await asyncio.sleep(0.5)
            assert "waiting up to 600 s for a node that can hold it to register" in reason
            await asyncio.sleep(15)  # the agents come up late, as on a slow machine or a scaling node pool
            assert (await client.status(run_id)).status == "RUNNING"
            for i in range(2):
                stack.nodes[f"early{i}"] = NodeAgent(stack.server.address, f"early{i}", 2, tmp_path / "nodes")
            result = await client.wait(run_id)
            assert result["identical"] is True and len(result["envs"]) == 4

            # the platform's worker stopped for 30 s mid-traffic: the gangs wait, nothing fails
            first = await client.start(gangs.ddp, {"steps": 2})
            stack.worker.stop()
            second = await client.start(gangs.ddp, {"steps": 2})  # accepted by Temporal while no worker runs
            await asyncio.sleep(30)
            stack.worker.start()
            for run_id in (first, second):
                assert (await client.wait(run_id))["identical"] is True
            await stack.wait_for("every GPU free", lambda q: q["totals"]["gpus_free"] == 4 and not q["running"])

        run(main())
    finally:
        stack.close()
