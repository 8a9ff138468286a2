"""Tenants, quotas and preemption end to end, on real node agents: a stack of its own (its own dev server,
worker and two node agents with two GPU slots each, 4 slots in all), since the queue configuration is the
Scheduler's and shared by every run on a server.

- team-b reclaims the quota team-a borrowed: a team-a gang is preempted, resumes from its checkpoint, and
  every run completes with no step applied twice and no restart spent;
- a team-a gang of a higher priority class preempts one of team-a's own lower ones;
- a gang whose tenant the Scheduler does not have (the configuration changed after the run started) is
  rejected, naming the tenants, and so is a pending one whose tenant a new configuration drops; a gang
  bigger than its tenant may ever hold is rejected at once, naming the limit;
- a waiting gang's tenant, priority class and reason, in tenant terms, show in ``gangflow cluster`` and in
  ``gangflow status`` of its run.

The training runs use examples/multitenant.py (2 ranks of torch on CPU with gloo, 2 GPU slots per gang);
the others a small two-module project whose ranks only wait for a marker file, so they cost little.
"""

from __future__ import annotations

import asyncio
import functools
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, Stack, gangflow_cli, run, stack_fixture, until
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import WorkflowFailureError

from engine.client import Client, load_workflow_file

sys.path.insert(0, str(ROOT / "examples"))
import multitenant

pytestmark = pytest.mark.slow


EXAMPLE = "examples/multitenant.py:pipeline"
#: long enough to still run when the preemptor arrives; checkpoints every 10 steps
TRAIN = dict(steps=120, checkpoint_every=10, step_seconds=0.1)
SHORT = dict(steps=30, checkpoint_every=10, step_seconds=0.1)
#: how long a gang may take to start, be preempted, or finish on a busy 2-core machine
BOUND = 90.0

TENANTS = [
    {"name": "team-a", "cohort": "research", "quota": {"gpu": 2}},
    {"name": "team-b", "cohort": "research", "quota": {"gpu": 2}},
]
CONFIG: dict[str, Any] = {
    "cohorts": [{"name": "research"}],
    "tenants": TENANTS,
    "priority_classes": [
        {"name": "low", "value": 10, "preemptible": True},
        {"name": "high", "value": 100, "preemptible": False},
    ],
    # a small minimum runtime: preemption is allowed soon after a gang starts
    "policy": {"reclaim_within_cohort": "any", "within_tenant": "lower_priority", "min_runtime": "2s"},
}
#: the same plus team-c, which lends nothing and may only borrow
WITH_TEAM_C: dict[str, Any] = {
    **CONFIG,
    "tenants": [*TENANTS, {"name": "team-c", "cohort": "research", "quota": {"gpu": 0}}],
}

# A user's project of two modules: the tasks in one, the workflows in the other.
TASKS = """
import os
import time
from dataclasses import dataclass

from engine import GangPlugin, Resources, task


@dataclass(frozen=True)
class OneNode(GangPlugin):
    nnodes: int = 1
    nproc_per_node: int = 1


def _wait(marker: str) -> None:
    # a minute and a half at most: a test that fails leaves nothing running for long
    deadline = time.monotonic() + 90
    while not os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.1)


@task
def gate(marker: str) -> bool:
    _wait(marker)
    return True


@task(plugin=OneNode(), resources=Resources(gpu=2))
def hold(marker: str) -> int:
    _wait(marker)
    return int(os.environ["RANK"])
"""

FLOWS = """
from engine import workflow

from lab_tasks import gate, hold


@workflow
async def holding(marker: str) -> int:
    return await hold(marker=marker)


@workflow
async def gated(marker: str, x: int = 1) -> int:
    await gate(marker=marker)  # the gang is asked for only once the marker exists
    return await hold(marker=marker) + x
"""


stack = stack_fixture("t", count=2, gpus=2)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tenancy-project")
    (folder / "lab_tasks.py").write_text(TASKS)
    (folder / "lab_flows.py").write_text(FLOWS)
    return folder


def cli(stack: Stack, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """``gangflow ARGS`` against the stack, storing artifacts (checkpoints) where the stack's runs do."""
    return gangflow_cli(
        *args, cwd=cwd, GANGFLOW_ADDRESS=stack.server.address, GANGFLOW_ARTIFACTS=stack.artifacts, COLUMNS="200"
    )


def cli_json(stack: Stack, *args: str, cwd: Path = ROOT) -> Any:
    done = cli(stack, *args, "--json", cwd=cwd)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def training(client: Client, gang_id: str, min_step: int) -> bool:
    """Both ranks of a multitenant.py gang reported at least ``min_step`` (so a checkpoint exists)."""
    gang = await client.gang(gang_id)
    steps = [p.get("step", -1) for node in gang["nodes"] for p in node.get("progress", {}).values()]
    return len(steps) == 2 and min(steps) >= min_step


async def preempted(client: Client, gang_ids: list[str]) -> str | None:
    for gang_id in gang_ids:
        if (await client.gang(gang_id)).get("preemptions"):
            return gang_id
    return None


async def current_details(client: Client, workflow_id: str) -> str:
    """What the Temporal UI shows as the workflow's current details."""
    metadata = await client.temporal.get_workflow_handle(workflow_id).query(
        "__temporal_workflow_metadata", result_type=WorkflowMetadata
    )
    return str(metadata.current_details)


def gang_of(run_id: str, task: str = "train") -> str:
    return f"{run_id}.{task}-1"


def pending_entry(queue: dict[str, Any], gang_id: str) -> dict[str, Any] | None:
    return next((g for g in queue["pending"] if g["gang_id"] == gang_id), None)


def running_ids(queue: dict[str, Any]) -> set[str]:
    return {g["gang_id"] for g in queue["running"]}


async def check_resumed(client: Client, run_id: str, victim: str, *, by: str, tenant: str, cause: str) -> None:
    """The preempted run completed from its checkpoint, with no step applied twice and no restart spent."""
    result = await client.result(run_id, multitenant.pipeline)
    assert result.attempt == 1 and result.first_step > 0, result  # attempt 1 resumed from a checkpoint
    assert result.optimizer_steps == result.steps == TRAIN["steps"], result
    info = await client.gang(victim)
    assert info["status"] == "COMPLETED" and info["restarts"] == 0 and info["preemptions"] == 1, info
    (attempt,) = info["failed_attempts"]
    assert attempt["kind"] == "preempted" and attempt["attempt"] == 0, attempt
    # the ranks saved a checkpoint at the notice and exited: the GPUs were free within seconds
    assert attempt["reason"].startswith(f"preempted by {by} of {tenant} ({cause}): the ranks exited "), attempt


def test_a_tenant_reclaims_its_quota_and_the_borrower_resumes_from_its_checkpoint(stack: Stack) -> None:
    async def main() -> None:
        client = await stack.client()
        await client.apply_queues(CONFIG)
        a_runs = [await client.start(multitenant.pipeline, TRAIN, tenant="team-a") for _ in range(2)]
        a_gangs = [gang_of(r) for r in a_runs]
        for gang_id in a_gangs:  # both admitted: 2 GPUs within team-a's quota, 2 borrowed from team-b
            await until(f"{gang_id} training", functools.partial(training, client, gang_id, 12))
        tenants = (await client.queues())["tenants"]
        assert tenants["team-a"]["used"]["gpu"] == 4 and tenants["team-a"]["borrowed"]["gpu"] == 2, tenants
        assert tenants["team-b"]["lent"]["gpu"] == 2 and tenants["team-b"]["used"]["gpu"] == 0, tenants

        # team-b asks for its quota back, from the command line as a user would
        started = cli_json(stack, "run", EXAMPLE, "--tenant", "team-b", "--detach", "--steps", "40")
        b_run = started["run_id"]
        b_gang = gang_of(b_run)
        victim = await until("a team-a gang preempted", lambda: preempted(client, a_gangs))
        assert await preempted(client, [g for g in a_gangs if g != victim]) is None  # one gang is enough

        async def b_running() -> dict[str, Any] | None:
            queue = await client.queue()
            return queue if b_gang in running_ids(queue) else None

        queue = await until("team-b's gang admitted", b_running)
        tenants = (await client.queues())["tenants"]
        assert tenants["team-a"]["borrowed"]["gpu"] == 0 and tenants["team-b"]["used"]["gpu"] == 2, tenants
        waiting = pending_entry(queue, victim)
        if waiting is not None:  # still waiting (not yet back on GPUs the other runs gave back)
            assert waiting["tenant"] == "team-a" and waiting["reason"].startswith("pending: team-a is at its quota")
        b_gang_info = await client.gang(b_gang)
        assert b_gang_info["failed_attempts"] == [] and b_gang_info["preemptions"] == 0

        b_result = await client.result(b_run, multitenant.pipeline)
        assert (b_result.attempt, b_result.optimizer_steps) == (0, 40), b_result
        for run_id, gang_id in zip(a_runs, a_gangs, strict=True):
            if gang_id == victim:
                await check_resumed(client, run_id, victim, by=b_gang, tenant="team-b", cause="reclaim")
            else:
                result = await client.result(run_id, multitenant.pipeline)
                assert (result.attempt, result.first_step, result.optimizer_steps) == (0, 0, TRAIN["steps"]), result
        # a GangTask's release reaches the Scheduler as a signal, possibly just after its run's result
        await stack.wait_for("every gang released", lambda q: q["totals"]["running"] == q["totals"]["pending"] == 0)
        status = cli_json(stack, "status", b_run)
        assert status["tenant"] == "team-b" and status["status"] == "COMPLETED", status

    run(main())


def test_a_higher_priority_gang_preempts_a_lower_one_of_its_own_tenant(stack: Stack) -> None:
    async def main() -> None:
        client = await stack.client()
        await client.apply_queues(CONFIG)
        low_runs = [await client.start(multitenant.pipeline, TRAIN, tenant="team-a", priority="low") for _ in range(2)]
        low_gangs = [gang_of(r) for r in low_runs]
        for gang_id in low_gangs:  # team-a's low gangs fill the cluster
            await until(f"{gang_id} training", functools.partial(training, client, gang_id, 12))
        queue = await client.queue()
        assert queue["totals"]["gpus_free"] == 0 and {g["priority"] for g in queue["running"]} == {"low"}, queue

        high_run = await client.start(multitenant.pipeline, SHORT, tenant="team-a", priority="high")
        high_gang = gang_of(high_run)
        victim = await until("a low gang preempted", lambda: preempted(client, low_gangs))
        high = await client.result(high_run, multitenant.pipeline)
        assert (high.attempt, high.optimizer_steps) == (0, SHORT["steps"]), high
        for run_id, gang_id in zip(low_runs, low_gangs, strict=True):
            if gang_id == victim:
                await check_resumed(client, run_id, victim, by=high_gang, tenant="team-a", cause="priority")
            else:
                result = await client.result(run_id, multitenant.pipeline)
                assert (result.attempt, result.optimizer_steps) == (0, TRAIN["steps"]), result
        status = await client.status(high_run, with_tasks=False)
        assert (status.tenant, status.priority) == ("team-a", "high")

    run(main())


def test_a_gang_of_a_tenant_the_scheduler_lacks_is_rejected(stack: Stack, project: Path, tmp_path: Path) -> None:
    async def main() -> None:
        client = await stack.client()
        await client.apply_queues(WITH_TEAM_C)
        marker = tmp_path / "go"
        wf = load_workflow_file(f"{project / 'lab_flows.py'}:gated")
        run_id = await client.start(wf, {"marker": str(marker)}, tenant="team-c")  # team-c exists now
        await client.apply_queues(CONFIG)  # ... and no longer: the run asks for its gang after this
        marker.write_text("go")
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(client.wait(run_id), BOUND)
        info = await client.status(run_id)
        assert "rejected: unknown tenant 'team-c' (tenants: team-a, team-b)" in (info.error or ""), info.error
        # the gang was asked for after the change: the plain task before it ran, the gang's ranks never did
        assert [(t.name, t.status) for t in info.tasks] == [("gate", "completed"), ("hold", "failed")], info.tasks
        gang = await client.gang(gang_of(run_id, "hold"))
        assert gang["status"] == "FAILED" and gang["placement"] is None, gang
        queue = await client.queue()
        assert gang_of(run_id, "hold") not in running_ids(queue) | {g["gang_id"] for g in queue["pending"]}

    run(main())


def test_a_gang_bigger_than_its_tenant_may_ever_hold_fails_at_once(stack: Stack, project: Path, tmp_path: Path) -> None:
    async def main() -> None:
        client = await stack.client()
        # team-a may hold 1 GPU at most: its quota, and nothing to borrow
        small = {**CONFIG, "tenants": [{**TENANTS[0], "quota": {"gpu": 1}, "borrowing_limit": {"gpu": 0}}, TENANTS[1]]}
        await client.apply_queues(small)
        started = time.monotonic()
        # the marker exists: were the gang admitted, it would finish at once
        done = cli(stack, "run", "lab_flows.py:holding", "--tenant", "team-a", "--marker", str(tmp_path), cwd=project)
        assert done.returncode == 1, (done.stdout, done.stderr)
        assert time.monotonic() - started < 60  # at once: it never waits in the queue
        said = " ".join(done.stderr.split())  # one line, however the terminal folds it
        assert (
            "rejected: needs 2 GPUs on 1 node (2 GPUs, 1 CPU per node), more than tenant team-a may ever hold "
            "(1 GPU: its quota of 1 GPU plus what it may borrow)"
        ) in said, done.stderr
        assert (await client.queue())["totals"]["pending"] == 0

    run(main())


def test_a_priority_class_the_tenant_may_not_use_is_refused_before_anything_starts(
    stack: Stack, project: Path, tmp_path: Path
) -> None:
    async def main() -> None:
        client = await stack.client()
        restricted = {**CONFIG, "tenants": [{**TENANTS[0], "priority_classes": ["low"]}, TENANTS[1]]}
        await client.apply_queues(restricted)
        try:
            args = ["run", "lab_flows.py:holding", "--tenant", "team-a", "--priority", "high"]
            done = cli(stack, *args, "--run-id", "hostage-high", "--marker", str(tmp_path), cwd=project)
            assert done.returncode == 2, (done.stdout, done.stderr)  # bad input
            said = " ".join(done.stderr.split())
            assert (
                "priority class 'high' (the run) is not allowed for tenant 'team-a': its priority classes are low"
            ) in said, done.stderr
            # nothing started: no run, no gang asked for
            assert "hostage-high" not in {r.run_id for r in await client.runs(limit=200)}
            queue = await client.queue()
            assert not [g for g in [*queue["running"], *queue["pending"]] if g["gang_id"].startswith("hostage")]
        finally:
            await client.apply_queues(CONFIG)

    run(main())


def test_a_waiting_gang_says_why_in_tenant_terms(stack: Stack, project: Path, tmp_path: Path) -> None:
    async def main() -> None:
        client = await stack.client()
        await client.apply_queues(WITH_TEAM_C)
        marker = tmp_path / "go"
        args = ["run", "lab_flows.py:holding", "--detach", "--marker", str(marker)]

        def start(*options: str) -> str:
            return str(cli_json(stack, *args, *options, cwd=project)["run_id"])

        # team-a and team-b each hold their quota; a second team-a gang and a team-c gang must wait
        first = [start("--tenant", "team-a", "--priority", "low"), start("--tenant", "team-b")]
        await stack.wait_for("team-a and team-b running", lambda q: q["totals"]["running"] == 2, BOUND)
        waiting_run = start("--tenant", "team-a", "--priority", "low")
        team_c_run = start("--tenant", "team-c")
        waiting, team_c = gang_of(waiting_run, "hold"), gang_of(team_c_run, "hold")

        def both_pending(queue: dict[str, Any]) -> bool:
            return all((pending_entry(queue, g) or {}).get("reason") for g in (waiting, team_c))

        await stack.wait_for("two gangs pending", both_pending, BOUND)
        queue = cli_json(stack, "cluster")  # what a user sees
        entry = pending_entry(queue, waiting)
        assert entry is not None and (entry["tenant"], entry["priority"]) == ("team-a", "low"), entry
        reason = entry["reason"]
        assert reason.startswith(
            "pending: team-a is at its quota of 2 GPUs and cannot borrow: cohort research has 0 GPUs idle"
        ), reason
        assert "needs 2 GPUs on 1 node" in reason, reason
        c_entry = pending_entry(queue, team_c)
        assert c_entry is not None and c_entry["tenant"] == "team-c", c_entry
        assert c_entry["reason"].startswith("pending: team-c is at its quota of 0 GPUs"), c_entry
        assert queue["tenants"]["team-a"]["pending"] == 1 and queue["tenants"]["team-c"]["pending"] == 1

        # the run's own status shows the reason: the GangTask's phase and current details (the Temporal UI's
        # line, which says it waits though the UI's list shows it Running), the run's current details (the gang
        # tells its run), and `gangflow status`
        async def told() -> bool:  # the Scheduler signals the reason to the GangTask just after it decides
            phase = (await client.gang(waiting))["phase"]
            return bool(phase == reason and reason in await current_details(client, waiting))

        await until("the waiting gang told why", told, 30)
        assert (await current_details(client, waiting)).startswith("**waiting** for a placement — pending: team-a")

        async def run_told() -> bool:
            return f"- **hold-1** · *waiting* · {reason}" in await current_details(client, waiting_run)

        await until("the waiting gang's run told why", run_told, 30)
        (task,) = cli_json(stack, "status", waiting_run)["tasks"]
        assert task["name"] == "hold" and task["detail"] == reason, task
        table = cli(stack, "status", waiting_run)
        assert table.returncode == 0 and "team-a is at its quota of 2 GPUs" in " ".join(table.stdout.split())

        # team-c is dropped from the configuration: its waiting gang is rejected, naming the tenants left
        await client.apply_queues(CONFIG)
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(client.wait(team_c_run), BOUND)
        error = (await client.status(team_c_run)).error or ""
        assert "rejected: unknown tenant 'team-c' (tenants: team-a, team-b)" in error, error

        marker.write_text("go")  # the holders finish, and the waiting gang gets its turn
        for run_id in [*first, waiting_run]:
            assert await asyncio.wait_for(client.wait(run_id), BOUND) == 0
        info = await client.gang(waiting)
        assert info["failed_attempts"] == [] and info["preemptions"] == 0, info

    run(main())
