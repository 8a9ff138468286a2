"""The isolated layout end to end: `gangflow dev --auth` with two node agents, two teams each with its own
namespace, token and artifact root, gangs in the platform namespace reached only through each team's Nexus
endpoint.

What a tenant relies on: its pipeline with a 2-node gang runs from the CLI with its token; the platform
decides whose gang it is and where its artifacts live (a client declaring another tenant or root changes
neither); its credentials reach nothing of the platform (no Scheduler, no node registration); a cancelled
or terminated run frees its GPUs; `gangflow status` shows the gang task.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jwt
import pytest
from conftest import ROOT, AuthStack, run, until
from temporalio.api.command.v1 import Command, ScheduleNexusOperationCommandAttributes
from temporalio.api.enums.v1 import CommandType
from temporalio.api.workflowservice.v1 import RespondWorkflowTaskCompletedRequest
from temporalio.client import Client as TemporalClient
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
from temporalio.service import RPCError, RPCStatusCode

from engine.client import Client, prepare_run
from engine.core.protocol import SCHEDULER_ID, SUBMIT_SIGNAL, USER_MEMO
from engine.runtime.gateway import authorized
from engine.runtime.tokens import Claims

pytestmark = pytest.mark.slow

FLOW = str(ROOT / "examples" / "two_teams" / "pipeline.py")
GPUS = 4
TOKENS = {"team-a": "a-data-token-5f1e2c", "team-b": "b-data-token-77d0aa"}


@pytest.fixture(scope="module")
def stack(auth_stack: AuthStack) -> AuthStack:
    """The session's shared stack (conftest.auth_stack, 2 node agents with 2 GPU slots each), with each team's
    own token for its data (examples/two_teams/README.md), once every GPU is free."""
    for tenant in ("team-a", "team-b"):
        command = [sys.executable, "-m", "engine.cli", "secret", "set", tenant, "data-token"]
        secret = subprocess.run(  # with the team's own token, as an --auth stack asks
            [*command, "--state-dir", str(auth_stack.state), "--api-key", auth_stack.token(tenant)],
            input=TOKENS[tenant],
            text=True,
            capture_output=True,
        )
        assert secret.returncode == 0, secret.stderr
    run(_platform_idle(auth_stack, timeout=90))
    return auth_stack


async def _platform(stack: AuthStack) -> Client:
    return Client(await TemporalClient.connect(stack.upstream, namespace="gangflow-system"))


async def _platform_idle(stack: AuthStack, timeout: float) -> float:
    platform = await _platform(stack)

    async def idle() -> bool | None:
        try:
            q = await platform.queue()
        except RPCError:
            return None
        totals = q["totals"]
        return True if totals["alive_nodes"] == 2 and totals["gpus_free"] == GPUS and not q["running"] else None

    loop = asyncio.get_running_loop()
    started = loop.time()
    await until("every GPU free", idle, timeout=timeout)
    return loop.time() - started


def _cli(stack: AuthStack, tenant: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "engine.cli", *args],
        env=stack.env(tenant),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _subject(token: str) -> str:
    """Who a token names (its ``sub``): what the gateway stamps as the user of each run it starts."""
    return str(jwt.decode(token, options={"verify_signature": False})["sub"])


async def _gang_user(stack: AuthStack, gang_id: str) -> tuple[str | None, set[str | None]]:
    """The user in a platform GangTask's input (the GangSpec its run sent through Nexus), and in each gang request
    it submitted to the Scheduler (its ``submit`` signals), both read from its history."""
    platform = await TemporalClient.connect(stack.upstream, namespace="gangflow-system")
    events = (await platform.get_workflow_handle(gang_id).fetch_history()).events
    spec = json.loads(events[0].workflow_execution_started_event_attributes.input.payloads[0].data)
    signals = [e.signal_external_workflow_execution_initiated_event_attributes for e in events]
    requests = [json.loads(a.input.payloads[0].data) for a in signals if a.signal_name == SUBMIT_SIGNAL]
    return spec.get("user"), {request.get("user") for request in requests}


async def _gangs(stack: AuthStack) -> list[Any]:
    platform = await TemporalClient.connect(stack.upstream, namespace="gangflow-system")
    return [w async for w in platform.list_workflows("WorkflowType = 'GangTask'")]


def test_a_team_runs_a_gang_through_its_endpoint_and_the_platform_pins_who_and_where(stack: AuthStack) -> None:
    done = _cli(stack, "team-a", "run", FLOW + ":pipeline", "--n", "10", "--run-id", "a-first", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["result"] == {"total": 45, "world": 2}

    async def check() -> None:
        gangs = [g.id for g in await _gangs(stack)]
        assert "team-a:a-first.train-1" in gangs, gangs
        # who started the run is the token's subject, stamped by the gateway over the CLI's login name, and it
        # reached the gang request the Scheduler got (through the run, its endpoint and the platform's GangTask)
        subject = _subject(stack.token("team-a"))
        assert await _gang_user(stack, "team-a:a-first.train-1") == (subject, {subject})
        # the run's own namespace holds no GangTask: the gang ran in the platform's
        a = await stack.client("gf-team-a", stack.token("team-a"))
        assert [w.id async for w in a.list_workflows("WorkflowType = 'GangTask'")] == []
        # the ranks wrote their logs and checkpoint folder into team-a's root (pinned by the platform)
        root = stack.state / "artifacts" / "team-a"
        logged = {p.name for p in (root / "logs" / "a-first").iterdir()}
        assert {"train-1.rank0.attempt0.log", "train-1.rank1.attempt0.log"} <= logged, logged
        assert (root / "checkpoints" / "a-first").is_dir()
        assert not (stack.state / "artifacts" / "team-b" / "logs" / "a-first").exists()
        # the plain task got team-a's secret, and its log shows it redacted
        logs = _cli(stack, "team-a", "logs", "a-first", "--task", "prepare")
        assert "reading the dataset with token [secret:data-token]" in logs.stdout, logs.stdout + logs.stderr
        assert TOKENS["team-a"] not in logs.stdout
        status = _cli(stack, "team-a", "status", "a-first")
        assert status.returncode == 0, status.stdout + status.stderr
        assert "train" in status.stdout and "completed" in status.stdout
        assert f"started by {_subject(stack.token('team-a'))}" in status.stdout  # the token's, stamped by the gateway
        # the per-rank view, though the GangTask is the platform's: from what the node agents saved in team-a's root
        status = _cli(stack, "team-a", "status", "a-first", "--json")
        assert json.loads(status.stdout)["user"] == _subject(stack.token("team-a"))
        (train,) = [t for t in json.loads(status.stdout)["tasks"] if t["name"] == "train"]
        ranks = train["ranks"]
        assert ranks["gang_id"] == "a-first.train-1" and not ranks["live"], ranks
        assert sorted(r["rank"] for r in ranks["ranks"]) == [0, 1] and all(r["pid"] for r in ranks["ranks"]), ranks
        # its attempt list too: the platform's GangTask is out of reach, the saved reports give its times
        (attempt,) = train["attempts"]
        assert (train["attempt"], attempt["attempt"], attempt["ended"]) == (0, 0, "completed"), train["attempts"]
        assert attempt["duration_s"] > 0 and attempt["last_step"] is None, attempt  # its task reports no step

    run(check())


def test_a_client_cannot_declare_another_tenant_or_root(stack: AuthStack, tmp_path: Path) -> None:
    """A hostile client in gf-team-a names team-b as the run's tenant, and someone else as its user: the gang is
    still team-a's (what the Scheduler charges, where its artifacts go), and its user the token's subject. One
    naming a root of its own is refused before any task."""
    sys.path.insert(0, str(ROOT / "examples" / "two_teams"))
    import pipeline

    async def start(run_id: str, tenant: str, artifacts: str) -> Any:
        temporal = await stack.client("gf-team-a", stack.token("team-a"))
        defn, envelope = prepare_run(pipeline.pipeline, {"n": 4}, artifacts=artifacts, tenant=tenant, run_id=run_id)
        # straight to Temporal, past the client's own checks, as a hostile client would
        return await temporal.start_workflow(
            defn.name, envelope.encode("inputs"), id=run_id, task_queue="gangflow", memo={USER_MEMO: "someone-else"}
        )

    async def go() -> None:
        forged = await start("a-as-b", "team-b", str(stack.state / "artifacts" / "team-a"))
        await forged.result()
        platform = await TemporalClient.connect(stack.upstream, namespace="gangflow-system")
        first = (await platform.get_workflow_handle("team-a:a-as-b.train-1").fetch_history()).events[0]
        spec = json.loads(first.workflow_execution_started_event_attributes.input.payloads[0].data)
        assert spec["tenant"] == "team-a"
        subject = _subject(stack.token("team-a"))
        assert subject != "someone-else"
        assert await _gang_user(stack, "team-a:a-as-b.train-1") == (subject, {subject})

        elsewhere = await start("a-elsewhere", "team-a", str(tmp_path / "elsewhere"))
        with pytest.raises(WorkflowFailureError) as caught:
            await elsewhere.result()
        assert "outside tenant team-a's artifact root" in str(caught.value.cause)
        assert "team-a:a-elsewhere.train-1" not in [g.id for g in await _gangs(stack)]

    run(go())


def test_tenant_credentials_reach_nothing_of_the_platform(stack: AuthStack, tmp_path: Path) -> None:
    async def go() -> None:
        system = await stack.client("gangflow-system", stack.token("team-a"))
        for action in (
            lambda: system.get_workflow_handle(SCHEDULER_ID).query("describe"),
            lambda: system.get_workflow_handle(SCHEDULER_ID).signal("release", "team-b:x.train-1"),
            lambda: system.get_workflow_handle("team-b:b.train-1").cancel(),
        ):
            with pytest.raises(RPCError) as caught:
                await action()
            assert caught.value.status == RPCStatusCode.PERMISSION_DENIED

    run(go())
    # a node agent with a tenant's token: registers nowhere, gets no gang (exits naming the refusal)
    env = {**stack.env("team-a"), "GANGFLOW_NAMESPACE": "gangflow-system"}
    node = subprocess.run(
        [sys.executable, "-m", "engine.cli", "node", "--node-id", "fake", "--gpus", "8", "--drain-timeout", "0"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert node.returncode != 0
    assert "unauthorized" in (node.stdout + node.stderr).lower() or "permission" in (node.stdout + node.stderr).lower()

    async def no_fake() -> None:
        q = await (await _platform(stack)).queue()
        assert "fake" not in [n.get("node_id") for n in q["nodes"]]

    run(no_fake())


def test_a_namespace_may_use_its_own_endpoint_only() -> None:
    """The gateway's rule for Nexus (Temporal's default authorizer has none): gf-team-a's workflows may call
    gf-team-a-gangs, never gf-team-b-gangs, which would act in the platform as team-b."""
    claims = Claims("team-a", 0, {"gf-team-a": 4})

    def completing(endpoint: str) -> RespondWorkflowTaskCompletedRequest:
        attrs = ScheduleNexusOperationCommandAttributes(
            endpoint=endpoint, service="gangflow.Gangs", operation="run_gang"
        )
        command = Command(
            command_type=CommandType.COMMAND_TYPE_SCHEDULE_NEXUS_OPERATION,
            schedule_nexus_operation_command_attributes=attrs,
        )
        return RespondWorkflowTaskCompletedRequest(namespace="gf-team-a", commands=[command])

    method = "/temporal.api.workflowservice.v1.WorkflowService/RespondWorkflowTaskCompleted"
    assert authorized(claims, method, completing("gf-team-a-gangs"))
    assert not authorized(claims, method, completing("gf-team-b-gangs"))
    assert not authorized(claims, method, completing("anything-else"))


@pytest.mark.parametrize("how", ["cancel", "terminate"])
def test_a_stopped_run_frees_its_gangs_gpus(stack: AuthStack, how: str) -> None:
    """Cancel reaches the GangTask through Nexus; terminate cancels nothing (Temporal's rule), so the platform's
    owner check finds the orphan and cancels it."""
    run_id = f"b-{how}"
    started = _cli(stack, "team-b", "run", FLOW + ":pipeline", "--seconds", "300", "--run-id", run_id, "--detach")
    assert started.returncode == 0, started.stdout + started.stderr

    async def go() -> None:
        platform = await _platform(stack)

        async def running() -> bool | None:
            q = await platform.queue()
            return True if any(r.get("gang_id") == f"team-b:{run_id}.train-1" for r in q["running"]) else None

        await until("the gang placed", running, timeout=120)
        b = await stack.client("gf-team-b", stack.token("team-b"))
        handle = b.get_workflow_handle(run_id)
        if how == "cancel":
            await handle.cancel()
        else:
            await handle.terminate("stopped by its team")
        seconds = await _platform_idle(stack, timeout=120)
        platform_ns = await TemporalClient.connect(stack.upstream, namespace="gangflow-system")
        gang = platform_ns.get_workflow_handle(f"team-b:{run_id}.train-1")

        async def closed() -> WorkflowExecutionStatus | None:
            # the gang ends just after its release: it tells the Scheduler its attempt's goodput ledger first
            status = (await gang.describe()).status
            return None if status == WorkflowExecutionStatus.RUNNING else status

        status = await until("the gang closed", closed, timeout=60)
        assert status in (WorkflowExecutionStatus.CANCELED, WorkflowExecutionStatus.COMPLETED), status
        print(f"{how}: GPUs free {seconds:.1f} s after")

    run(go())


def test_a_command_for_another_tenant_is_refused_in_one_line(stack: AuthStack) -> None:
    listed = _cli(stack, "team-a", "list", "--tenant", "team-b")
    assert listed.returncode == 1
    assert "Temporal refused: Request unauthorized." in listed.stderr and "namespace gf-team-b" in listed.stderr
    assert "Traceback" not in listed.stderr
    bad = _cli(stack, "team-a", "list", "--tenant", "Team_B")
    assert bad.returncode == 2 and "tenant 'Team_B'" in bad.stderr


def test_quotas_and_reclaim_apply_across_namespaces(stack: AuthStack) -> None:
    """team-a fills the cluster (its quota and team-b's idle one, borrowed); team-b's run takes its quota back:
    the Scheduler preempts a team-a gang living in the same platform namespace, whatever namespace each run is
    in. Every run completes; the preempted gang ran again."""
    runs = ["a-fill-1", "a-fill-2"]
    for run_id in runs:
        started = _cli(stack, "team-a", "run", FLOW + ":pipeline", "--seconds", "20", "--run-id", run_id, "--detach")
        assert started.returncode == 0, started.stderr

    async def go() -> None:
        platform = await _platform(stack)

        async def full() -> bool | None:
            q = await platform.queue()
            return True if q["totals"]["gpus_free"] == 0 and len(q["running"]) == 2 else None

        await until("team-a holding all 4 GPUs", full, timeout=120)
        claimed = _cli(stack, "team-b", "run", FLOW + ":pipeline", "--run-id", "b-reclaim", "--json")
        assert claimed.returncode == 0, claimed.stdout + claimed.stderr
        system = await TemporalClient.connect(stack.upstream, namespace="gangflow-system")
        preempted = 0
        for run_id in runs:
            a = await stack.client("gf-team-a", stack.token("team-a"))
            await a.get_workflow_handle(run_id).result()
            status = await system.get_workflow_handle(f"team-a:{run_id}.train-1").query("status")
            preempted += status["preemptions"]
        assert preempted >= 1

    run(go())
