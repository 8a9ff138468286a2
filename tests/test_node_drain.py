"""``gangflow node drain|undrain`` as an operator types it, on a stack of its own (a server, a worker and two
node agents with two GPU slots each, a Scheduler that continues as new every few events): a drained idle
node shows in ``gangflow cluster`` with its reason and stays drained across its agent's restart and the
Scheduler's continue-as-new; a gang that needs its GPUs waits with a reason naming it (never
rejected), and starts once the node is undrained; an unknown node and a ``gangflow node`` with neither
``--node-id`` nor an action are refused with exit 2 and a clear message.

The drain of a node under a *running* gang (notice, checkpoint, placed elsewhere) is in
``test_preemption_e2e.py``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import NO_WARM_IMPORTS, Stack, gangflow_cli, stack_fixture

FLOW = """
from dataclasses import dataclass

from engine import GangPlugin, Resources, task, workflow


@dataclass(frozen=True)
class Ranks(GangPlugin):
    nnodes: int = 2
    nproc_per_node: int = 1


@task(plugin=Ranks(), resources=Resources(gpu=1))
def spread(n: int) -> int:
    import os

    return n + int(os.environ["RANK"])


@workflow
async def wide(n: int = 1) -> int:
    return await spread(n=n)
"""


def cli(stack: Stack, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return gangflow_cli(
        *args, cwd=cwd, GANGFLOW_ADDRESS=stack.server.address, GANGFLOW_ARTIFACTS=stack.artifacts, COLUMNS="200"
    )


def cli_json(stack: Stack, *args: str) -> Any:
    done = cli(stack, *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def node_entry(stack: Stack, node_id: str) -> dict[str, Any]:
    entry: dict[str, Any] = next(n for n in cli_json(stack, "cluster")["nodes"] if n["node_id"] == node_id)
    return entry


def wait_until(what: str, check: Any, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.3)


def scheduler_run(stack: Stack) -> str:
    async def describe() -> str:
        from engine.core.protocol import SCHEDULER_ID

        client = await stack.client()
        return str((await client.temporal.get_workflow_handle(SCHEDULER_ID).describe()).run_id)

    return str(asyncio.run(describe()))


# the Scheduler continues as new every few events (the agents' registrations are events): the drain
# must cross it, and updates may arrive while it does; its gang imports no torch, nor do the standbys
stack = stack_fixture("d", count=2, gpus=2, scheduler_events=4, env=NO_WARM_IMPORTS)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("drain-project")
    (folder / "flow.py").write_text(FLOW)
    return folder


def test_gangflow_node_without_node_id_or_action_is_refused() -> None:
    # bad input is refused before anything is contacted: no server is needed to say so
    for args, message in [
        ([], "gangflow node needs --node-id ID to start a node agent on this machine, or an action"),
        (["drain"], "gangflow node drain needs the NODE"),
        (["drain", "n1", "--gpus", "2"], "gangflow node drain takes the node as NODE and no --gpus"),
        (["undrain", "n1", "--reason", "done"], "gangflow node undrain takes no --reason"),
        (["--node-id", "n1", "--reason", "x"], "--reason is for gangflow node drain|undrain NODE"),
        (["drain", "n1", "--reason", "x" * 300], "reason must be at most 200 characters, got 300"),
    ]:
        done = gangflow_cli("node", *args, GANGFLOW_ADDRESS="127.0.0.1:1")
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert message in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)
    assert "usage: gangflow node --node-id ID" in gangflow_cli("node", "--help").stdout


def test_an_unknown_node_is_refused_with_the_known_ones(stack: Stack) -> None:
    for args in (["drain", "nowhere", "--reason", "x"], ["undrain", "nowhere"]):
        done = cli(stack, "node", *args)
        assert done.returncode == 2, done.stderr
        assert "unknown node 'nowhere'; the nodes the Scheduler knows: d0, d1" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    assert cli_json(stack, "cluster")["drained"] == []


def test_drain_an_idle_node_then_a_gang_that_needs_it_waits_until_it_is_undrained(stack: Stack, project: Path) -> None:
    drained = cli_json(stack, "node", "drain", "d1", "--reason", "maintenance")
    assert drained == {
        "node_id": "d1",
        "drained": True,
        "reason": "maintenance",
        "preempted": [],
        "remaining": [],
        "leaving": [],
    }
    entry = node_entry(stack, "d1")
    assert (entry["drained"], entry["drain_reason"], entry["gpus_free"]) == (True, "maintenance", 0)
    assert cli_json(stack, "cluster")["drained"] == ["d1"]
    table = cli(stack, "cluster")
    assert table.returncode == 0 and "drained: maintenance" in table.stdout, table.stdout
    # idle, not busy: its GPUs are not "0/2 free" but drained with both idle
    (row,) = [line for line in table.stdout.splitlines() if line.split()[:1] == ["d1"]]
    assert "drained: 2/2 idle" in row and "0/2" not in row, table.stdout

    # the agent restarts (and registers again), the Scheduler continues as new: the node stays drained
    before = scheduler_run(stack)
    stack.nodes["d1"].restart()
    time.sleep(6)  # past one periodic re-registration as well
    asyncio.run(stack.wait_nodes())
    wait_until("the Scheduler continued as new", lambda: scheduler_run(stack) != before)
    entry = node_entry(stack, "d1")
    assert (entry["alive"], entry["drained"], entry["drain_reason"]) == (True, True, "maintenance")

    try:
        started = cli(stack, "run", "flow.py:wide", "--detach", "--json", "--n", "5", cwd=project)
        assert started.returncode == 0, started.stderr
        run_id = json.loads(started.stdout)["run_id"]

        def waiting() -> dict[str, Any] | None:
            pending = cli_json(stack, "cluster")["pending"]
            return next((p for p in pending if p["gang_id"].startswith(run_id) and p["reason"]), None)

        gang = wait_until("the gang pending", waiting)
        assert "d1 is drained (maintenance): waiting for an operator to undrain it" in gang["reason"], gang
        assert "only 1 offered node is big enough" in gang["reason"]
        detail = wait_until(
            "the reason in the run's status",
            lambda: next((t["detail"] for t in cli_json(stack, "status", run_id)["tasks"] if t["detail"]), None),
        )
        assert "d1 is drained (maintenance)" in detail
        assert cli_json(stack, "status", run_id)["status"] == "RUNNING"  # waits: a drain never rejects it
    finally:
        undrained = cli(stack, "node", "undrain", "d1")
    assert undrained.returncode == 0 and "node d1 undrained: it takes new gangs again" in undrained.stdout
    assert node_entry(stack, "d1")["drained"] is False

    def finished() -> dict[str, Any] | None:
        status: dict[str, Any] = cli_json(stack, "status", run_id)
        return status if status["status"] != "RUNNING" else None

    status = wait_until("the run finished", finished, timeout=120)
    assert (status["status"], status["result"]) == ("COMPLETED", 5), status


def test_drain_and_undrain_print_what_they_did(stack: Stack) -> None:
    done = cli(stack, "node", "drain", "d0")
    assert done.returncode == 0, done.stderr
    assert "node d0 drained: it takes no new gangs" in done.stdout and "no gang was running there" in done.stdout
    assert node_entry(stack, "d0")["drain_reason"] == ""
    again = cli_json(stack, "node", "drain", "d0", "--reason", "firmware")  # a new reason replaces the old
    assert (again["drained"], again["reason"]) == (True, "firmware")
    assert node_entry(stack, "d0")["drain_reason"] == "firmware"
    back = cli_json(stack, "node", "undrain", "d0")
    assert back == {"node_id": "d0", "drained": False, "reason": "", "preempted": [], "remaining": [], "leaving": []}
    assert cli_json(stack, "cluster")["drained"] == []
