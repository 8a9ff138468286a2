"""A first week without surprises: gangs wait for capacity, they never fail because the cluster is not up yet.

``gangflow dev --nodes 2 & gangflow run ...`` used to fail at random: the Scheduler existed only once a node
agent had registered, and a gang no registered node could hold was rejected at once. Now the platform's worker
keeps the Scheduler running, and such a gang waits (bounded by its ``lost_node_wait``) with a reason.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import gangs
from conftest import NodeAgent, Stack, gangflow_cli, run


def test_a_gang_submitted_before_any_node_agent_runs_when_they_register(tmp_path: Path) -> None:
    stack = Stack(tmp_path, "early", count=0, gpus=2)  # a server and a worker: no node agent yet
    markers = tmp_path / "markers"
    markers.mkdir()
    try:

        async def main() -> None:
            client = await stack.client()
            # the worker starts the Scheduler itself: it answers though no node agent ever registered
            await stack.wait_for("the Scheduler answers", lambda q: q["totals"]["alive_nodes"] == 0, timeout=30)
            # plain-python ranks of ddp's shape (2 nodes x 2 ranks, 2 GPUs each): this is about gangs waiting, not
            # torch (a torch import costs each rank seconds of CPU)
            meet = {"marker_dir": str(markers)}
            run_id = await client.start(gangs.meet, meet)
            reason = ""
            deadline = time.monotonic() + 30
            while "no alive node is registered" not in reason:
                assert time.monotonic() < deadline, f"no pending reason naming the missing nodes: {reason!r}"
                pending = (await client.queue())["pending"]
                reason = pending[0]["reason"] if pending else ""
                await asyncio.sleep(0.5)
            assert "waiting up to 600 s for a node that can hold it to register" in reason
            # the agents come up late, as on a slow machine or a scaling node pool (the gang already waits, with its
            # reason, above: a few more seconds show it stays waiting; the bound is its lost_node_wait, 600 s)
            await asyncio.sleep(5)
            assert (await client.status(run_id)).status == "RUNNING"
            for i in range(2):
                stack.nodes[f"early{i}"] = NodeAgent(stack.server.address, f"early{i}", 2, tmp_path / "nodes")
            result = await client.wait(run_id)
            assert [env["RANK"] for env in result["envs"]] == ["0", "1", "2", "3"], result

            # the platform's worker stopped for 30 s mid-traffic: the gangs wait, nothing fails
            first = await client.start(gangs.meet, meet)
            stack.worker.stop()
            second = await client.start(gangs.meet, meet)  # accepted by Temporal while no worker runs
            await asyncio.sleep(30)
            stack.worker.start()
            for run_id in (first, second):
                assert len((await client.wait(run_id))["envs"]) == 4
            await stack.wait_for("every GPU free", lambda q: q["totals"]["gpus_free"] == 4 and not q["running"])

        run(main())
    finally:
        stack.close()


WROTE = """
import tempfile
from pathlib import Path

from engine import File, task, workflow


@task
def write(text: str = "hi") -> File:
    path = Path(tempfile.mkdtemp()) / "out.txt"
    path.write_text(text)
    return File(path)


@workflow
async def wrote() -> File:
    return await write()
"""


def test_the_demos_closing_lines_name_nothing_it_has_deleted(tmp_path: Path) -> None:
    """``gangflow demo`` runs on a throwaway stack and deletes it as it exits: its result's files are gone then,
    so the last lines name them (name, size) but no path in the deleted folder."""
    (tmp_path / "flow.py").write_text(WROTE)
    done = gangflow_cli("demo", "--headless", "--nodes", "0", "--file", "flow.py:wrote", cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    found = re.search(r"state in (\S+)", done.stdout)
    assert found, done.stdout
    state = found.group(1)
    assert not Path(state).exists()
    closing = done.stdout.split(state, 1)[1]  # what it printed after its banner
    assert state not in closing and "gangflow-demo-" not in closing, done.stdout
    assert '"File out.txt (2 bytes)"' in closing, done.stdout
    assert "the demo's throwaway stack and its files are deleted as it exits" in closing
