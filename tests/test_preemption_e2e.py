"""Checkpoint-aware preemption end to end, on real node agents (a stack of its own: dev server, worker and two
node agents with two GPU slots each; tenants team-a and team-b of 2 GPUs each in one cohort).

- reclaim: team-a borrows the whole cluster, team-b submits; the victim is the team-a gang that checkpointed
  last (the one whose preemption loses the least work, not the most recently admitted); the notice reaches its
  ranks, they save a checkpoint *at the step they reached* and exit, the GPUs go to team-b within seconds,
  and team-a's gang resumes from that step and completes with every step applied once and no restart spent.
  The Scheduler continues as new every few events meanwhile.
- a rank that ignores the notice is killed when its task's ``preemption_grace`` ends; while it runs out, the
  gang's status and the Temporal UI's current-details line say so, and the gang resumes from its last
  periodic checkpoint.
- ``preemptible=False`` gangs never borrow: beyond their tenant's quota they wait, saying why, and the lender's
  gang starts on its own idle quota without preempting anyone.
- a node lost *during* the grace period does not hold up the release: the preemption stays a preemption (no
  restart spent), the node is reported lost, and everything completes once the node is back.
- a rank whose save fails after the notice is still preempted, not failed; a JAX gang (which traps SIGTERM)
  gets its notice as SIGUSR1 and leaves in time.
- ``gangflow node drain`` moves a running gang to the other node through a checkpoint; a gang whose only
  usable node is drained waits, saying so, and starts after ``gangflow node undrain``. SIGTERM to a node agent
  (systemd, Kubernetes deleting its pod) is the same drain, and the agent lifts it when it starts again.

The ranks are a small two-module project whose "training" is a counter checkpointed with
``engine.checkpoint`` (no torch: cheap on a 2-core machine); examples/multitenant.py (torch DDP) is run by
tests/test_tenancy_e2e.py and the benchmark.
"""

from __future__ import annotations

import asyncio
import csv
import getpass
import io
import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import NO_WARM_IMPORTS, Stack, gang_task, gangflow_cli, run, stack_fixture, status_json, until
from temporalio.api.sdk.v1 import WorkflowMetadata

from engine.client import Client, load_workflow_file
from engine.core.protocol import DESCRIBE_QUERY, SCHEDULER_ID, SUBMIT_SIGNAL
from engine.runtime.node import SELF_DRAIN_REASON

pytestmark = pytest.mark.slow

BOUND = 90.0  # how long a gang may take to start, stop or finish on a busy 2-core machine
GRACE = 30  # the cluster's preemption grace in this file (a task may set its own)

CONFIG: dict[str, Any] = {
    "cohorts": [{"name": "research"}],
    "tenants": [
        {"name": "team-a", "cohort": "research", "quota": {"gpu": 2}},
        {"name": "team-b", "cohort": "research", "quota": {"gpu": 2}},
    ],
    "priority_classes": [{"name": "low", "value": 10}, {"name": "high", "value": 100, "preemptible": False}],
    "policy": {"min_runtime": "1s", "preemption_grace": f"{GRACE}s"},
}

TASKS = """
import os
import signal
import time
from dataclasses import dataclass

from engine import Gang, GangPlugin, Resources, checkpoint, report, task
from plugins.jax import Jax


@dataclass(frozen=True)
class Ranks(GangPlugin):
    nnodes: int = 1
    nproc_per_node: int = 1


def _train(steps: int, every: int, save_s: float, cooperate: bool, fail_save: bool = False) -> dict:
    latest = checkpoint.load_latest()
    start, applied = latest if latest is not None else (0, 0)
    rank = int(os.environ["RANK"])
    for step in range(start, steps):
        if cooperate and checkpoint.stop_requested():
            notice = checkpoint.preemption()
            time.sleep(save_s)  # a big model takes a while to save
            if fail_save:
                raise OSError("could not save the checkpoint: disk full")
            checkpoint.save(applied, step=step)
            print(f"rank {rank}: {notice.reason if notice else 'stop'}: saved step {step}", flush=True)
            return {}
        applied += 1
        report(step=step + 1)
        time.sleep(0.05)
        if (step + 1) % every == 0:
            checkpoint.save(applied, step=step + 1)
    return {"first": start, "applied": applied, "attempt": int(os.environ["GANGFLOW_ATTEMPT"]), "rank": rank}


@task(plugin=Ranks(), resources=Resources(gpu=2))
def train(steps: int, every: int = 1000, save_s: float = 0.0) -> dict:
    return _train(steps, every, save_s, True)


@task(plugin=Ranks(), resources=Resources(gpu=2), gang=Gang(preemption_grace=4))
def stubborn(steps: int, every: int) -> dict:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the notice is ignored: killed when the grace ends
    return _train(steps, every, 0.0, False)


@task(plugin=Ranks(), resources=Resources(gpu=2), gang=Gang(preemptible=False))
def steady(steps: int) -> dict:
    return _train(steps, 1000, 0.0, True)


@task(plugin=Ranks(), resources=Resources(gpu=2))
def fragile(steps: int) -> dict:
    return _train(steps, 10, 0.0, True, fail_save=True)


@task(plugin=Jax(nnodes=1, nproc_per_node=2), resources=Resources(gpu=2))
def jax_train(steps: int) -> dict:
    import jax.numpy as jnp  # JAX traps SIGTERM once initialised: the notice comes as SIGUSR1

    total = jnp.zeros(())
    out = _train(steps, 1000, 0.0, True)
    return {**out, "total": float(total)}


@task(plugin=Ranks(nnodes=2), resources=Resources(gpu=1))
def wide(steps: int, save_s: float = 0.0) -> dict:
    return _train(steps, 1000, save_s, True)
"""

FLOWS = """
from engine import workflow

from lab_tasks import fragile, jax_train, steady, stubborn, train, wide


@workflow
async def fragile_run(steps: int) -> dict:
    return await fragile(steps=steps)


@workflow
async def jax_run(steps: int) -> dict:
    return await jax_train(steps=steps)


@workflow
async def trained(steps: int, every: int = 1000, save_s: float = 0.0) -> dict:
    return await train(steps=steps, every=every, save_s=save_s)


@workflow
async def nested(steps: int) -> dict:
    return await trained(steps=steps)


@workflow
async def both(steps: int) -> dict:
    # two calls with one call id, train-1: the run's own and its sub-workflow's (trained-1)
    direct = await train(steps=steps)
    return {"direct": direct, "inner": await trained(steps=steps + 4)}


@workflow
async def stubborn_run(steps: int, every: int) -> dict:
    return await stubborn(steps=steps, every=every)


@workflow
async def steady_run(steps: int) -> dict:
    return await steady(steps=steps)


@workflow
async def wide_run(steps: int, save_s: float = 0.0) -> dict:
    return await wide(steps=steps, save_s=save_s)
"""


# the Scheduler continues as new every few events: preemptions cross continue-as-new all the time; no gang here
# imports torch (JAX's ranks import jax themselves), so the standbys import nothing ahead
stack = stack_fixture("p", count=2, gpus=2, scheduler_events=3, env=NO_WARM_IMPORTS)


@pytest.fixture(scope="module")
def flows(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("preemption-project")
    (folder / "lab_tasks.py").write_text(TASKS)
    (folder / "lab_flows.py").write_text(FLOWS)
    return folder / "lab_flows.py"


def gang_of(run_id: str, task: str) -> str:
    return f"{run_id}.{task}-1"


async def step_of(client: Client, gang_id: str) -> int:
    """The lowest step the gang's ranks reported (-1 before every rank reported)."""
    gang = await client.gang(gang_id)
    steps = [p.get("step", -1) for node in gang["nodes"] for p in node.get("progress", {}).values()]
    return min(steps) if steps else -1


async def details(client: Client, workflow_id: str) -> str:
    """What the Temporal UI shows as the workflow's current details."""
    metadata = await client.temporal.get_workflow_handle(workflow_id).query(
        "__temporal_workflow_metadata", result_type=WorkflowMetadata
    )
    return str(metadata.current_details)


async def start(client: Client, flows: Path, name: str, inputs: dict[str, Any], **options: Any) -> str:
    return await client.start(load_workflow_file(f"{flows}:{name}"), inputs, **options)


async def result(client: Client, flows: Path, run_id: str, name: str) -> dict[str, Any]:
    return dict(await asyncio.wait_for(client.result(run_id, load_workflow_file(f"{flows}:{name}")), BOUND * 2))


async def scheduler_runs(client: Client) -> int:
    """How many runs the Scheduler's workflow id has had (each continue-as-new starts one)."""
    return len([w async for w in client.temporal.list_workflows(f"WorkflowId = '{SCHEDULER_ID}'")])


def resumed_at(stack: Stack, run_id: str, ended: str, first: int) -> None:
    """``gangflow status --json`` of a finished run whose gang was preempted once and resumed from step
    ``first``: both attempts (0-based), how the first ended, each one's steps and duration, and the rank
    table's final step."""
    task = gang_task(status_json(stack.server.address, run_id))
    preempted, resumed = task["attempts"]
    assert (preempted["attempt"], resumed["attempt"], task["attempt"], task["ranks"]["attempt"]) == (0, 1, 1, 1)
    assert (preempted["kind"], preempted["ended"]) == ("preempted", ended), preempted
    assert (resumed["kind"], resumed["ended"]) == ("completed", "completed"), resumed
    # each rank reports step + 1 after each step: the preempted attempt reported up to the step it saved
    assert preempted["first_step"] == 1 and 0 < preempted["last_step"] <= first, preempted
    assert resumed["first_step"] == first + 1 and resumed["last_step"] == task["ranks"]["ranks"][0]["step"], resumed
    assert all(a["duration_s"] > 0 for a in (preempted, resumed)), task["attempts"]
    # the goodput ledger: each attempt's GPU-seconds add up; the resumed one restored from the checkpoint
    for ledger in (preempted["ledger"], resumed["ledger"]):
        whole = ledger["allocated_gpu_s"]
        assert whole > 0 and abs(ledger["productive_gpu_s"] + sum(ledger["badput"].values()) - whole) <= 0.01 * whole
    lost = preempted["ledger"]["badput"]
    other = "lost_preemption" if "is draining" in ended else "lost_drain"  # a drain is not a reclaim
    assert resumed["ledger"]["badput"]["restore"] > 0 and lost["lost_failure"] == lost[other] == 0, task
    # `gangflow usage` sums the same ledgers, as a user reads them for chargeback
    shown = gangflow_cli("usage", "--json", "--by", "run", "--since", "1h", GANGFLOW_ADDRESS=stack.server.address)
    assert shown.returncode == 0, shown.stderr
    (row,) = [r for r in json.loads(shown.stdout)["rows"] if r["run"] == run_id]
    whole = preempted["ledger"]["allocated_gpu_s"] + resumed["ledger"]["allocated_gpu_s"]
    assert row["allocated_gpu_s"] == pytest.approx(whole, abs=0.01) and row["wait_s"] >= 0, row
    # per node (CSV, as chargeback reads it): the stack's own nodes, holding at least this run's GPU-seconds
    per_node = gangflow_cli("usage", "--csv", "--by", "node", "--since", "1h", GANGFLOW_ADDRESS=stack.server.address)
    assert per_node.returncode == 0, per_node.stderr
    lines = list(csv.DictReader(io.StringIO(per_node.stdout)))
    assert {r["node"] for r in lines} <= set(stack.nodes) and lines, per_node.stdout
    assert sum(float(r["allocated_gpu_s"]) for r in lines) >= whole - 0.01, per_node.stdout


async def settled(stack: Stack) -> None:
    # a GangTask's release reaches the Scheduler as a signal, possibly just after its run's result
    await stack.wait_for("every gang released", lambda q: q["totals"]["running"] == q["totals"]["pending"] == 0)


def test_reclaim_takes_the_gang_that_checkpointed_last_which_saves_at_the_notice_and_resumes(
    stack: Stack, flows: Path
) -> None:
    """Which gang a reclaim preempts is the one that would lose the least work: team-a's first gang checkpoints
    every 10 steps (its agent tells the Scheduler at most every 15 s), the second, admitted after it, never; once
    the first's told checkpoint is well after the second's admission, team-b's gang preempts the first (by the
    rule before lost work, the most recent admission, it would have been the second)."""

    async def main() -> None:
        client = await stack.client()
        await client.apply_queues(CONFIG)
        # team-a borrows the whole cluster: the first gang checkpoints, the second saves no periodic checkpoint
        a_runs = [await start(client, flows, "trained", {"steps": 700, "every": 10}, tenant="team-a")]
        a_gangs = [gang_of(a_runs[0], "train")]

        async def training(g: str) -> bool:
            return await step_of(client, g) >= 5

        await until(f"{a_gangs[0]} training", lambda: training(a_gangs[0]))
        a_runs.append(await start(client, flows, "trained", {"steps": 700}, tenant="team-a"))
        a_gangs.append(gang_of(a_runs[1], "train"))
        await until(f"{a_gangs[1]} training", lambda: training(a_gangs[1]))

        async def told_late() -> dict[str, Any] | None:
            # the first gang's last told checkpoint, once preempting the first loses less than preempting the
            # second: 2 GPUs × (now − that checkpoint + the first's launch, its admission to its ranks' first
            # report, + two saves of a few ms) against 2 GPUs × (now − the second's admission); 4 s to spare
            rows = {r["gang_id"]: r for r in (await client.queue())["running"]}
            first, second = (rows.get(g) for g in a_gangs)
            known = first.get("checkpoint") if first is not None and second is not None else None
            if not known:
                return None
            reports = [p for n in (await client.gang(a_gangs[0]))["nodes"] for p in n.get("progress", {}).values()]
            since = min((p["since"] for p in reports if isinstance(p.get("since"), int | float)), default=None)
            launch = max(0.0, since - first["admitted_at"]) if since is not None else 8.0
            return known if known["at"] >= second["admitted_at"] + launch + 4 else None

        checkpointed = await until("the first gang's checkpoint told after the second's admission", told_late)
        assert checkpointed["step"] % 10 == 0, checkpointed
        runs_before = await scheduler_runs(client)
        b_run = await start(client, flows, "trained", {"steps": 20}, tenant="team-b")
        noticed = time.monotonic()
        b_gang = gang_of(b_run, "train")

        async def victim() -> str | None:
            for gang_id in a_gangs:
                if (await client.gang(gang_id)).get("preemptions"):
                    return gang_id
            return None

        async def b_running() -> bool:
            return b_gang in {g["gang_id"] for g in (await client.queue())["running"]}

        preempted = await until("a team-a gang preempted", victim)
        assert preempted == a_gangs[0], (preempted, await client.queue())  # the one that checkpointed last
        await until("team-b's gang running", b_running)
        # the ranks saved and left at once: far sooner than the 30 s grace
        assert time.monotonic() - noticed < 25, time.monotonic() - noticed

        async def continued() -> bool:  # (its third event since may be the victim's submit, after its release)
            return await scheduler_runs(client) > runs_before

        await until("the Scheduler continued as new meanwhile", continued)
        b = await result(client, flows, b_run, "trained")
        assert (b["attempt"], b["applied"]) == (0, 20), b
        for run_id, gang_id in zip(a_runs, a_gangs, strict=True):
            a = await result(client, flows, run_id, "trained")
            info = await client.gang(gang_id)
            assert info["restarts"] == 0 and info["status"] == "COMPLETED", info
            if gang_id != preempted:
                assert (a["attempt"], a["first"], a["applied"]) == (0, 0, 700), a
                continue
            # resumed from the step the notice found (after its last periodic one), every step applied once
            assert a["attempt"] == 1 and a["first"] >= checkpointed["step"] and a["applied"] == 700, a
            (attempt,) = info["failed_attempts"]
            assert attempt["kind"] == "preempted", attempt
            assert attempt["reason"].startswith(f"preempted by {b_gang} of team-b (reclaim): the ranks exited ")
            assert info["preemptions"] == 1 and info["preemption"] is None, info
            resumed_at(stack, run_id, f"preempted by {b_gang} of team-b (reclaim)", a["first"])
        await settled(stack)

    run(main())


def test_a_rank_that_ignores_the_notice_is_killed_when_the_grace_ends(stack: Stack, flows: Path) -> None:
    async def main() -> None:
        client = await stack.client()
        await client.apply_queues(CONFIG)
        # team-a's stubborn gang (grace 4 s, checkpoints every 10 steps) and a second gang fill the cluster
        low = await start(client, flows, "stubborn_run", {"steps": 400, "every": 10}, tenant="team-a", priority="low")
        other = await start(client, flows, "trained", {"steps": 5000}, tenant="team-b")  # busy till the end
        gang = gang_of(low, "stubborn")

        async def past_a_checkpoint() -> bool:
            return await step_of(client, gang) >= 12

        await until("the stubborn gang past its first checkpoint", past_a_checkpoint)

        async def told() -> dict[str, Any] | None:  # node rank 0's agent -> its GangTask -> the Scheduler
            row = next((r for r in (await client.queue())["running"] if r["gang_id"] == gang), None)
            return row["checkpoint"] if row is not None and row.get("checkpoint") else None

        known = await until("the Scheduler told of its checkpoint", told)
        assert known["step"] % 10 == 0 and known["step"] >= 10, known
        high = await start(client, flows, "trained", {"steps": 10}, tenant="team-a", priority="high")

        async def in_grace() -> dict[str, Any] | None:
            info = await client.gang(gang)
            return info if info.get("preemption") else None

        info = await until("the notice sent", in_grace)
        notice = info["preemption"]
        assert notice["grace_s"] == 4 and notice["cause"] == "priority", notice
        # the decision carries what it costs (GPUs × the work since its last checkpoint and the restart)
        cost = notice.get("cost_gpu_s")
        assert isinstance(cost, int | float) and cost >= 0, notice
        line = await details(client, gang)
        # (after the gang's status word, and before the ranks' last step where they reported one: engine.core.glance)
        assert "— attempt 0: preempted (priority by team-a, costs ~" in line, line
        assert " GPU-min): saving checkpoint, " in line, line
        assert " of 4 s grace" in line, line

        low_result = await result(client, flows, low, "stubborn_run")
        info = await client.gang(gang)
        (attempt,) = info["failed_attempts"]
        assert attempt["kind"] == "preempted" and "killed" in attempt["reason"], attempt
        assert "had not exited when the 4 s grace ended" in attempt["reason"], attempt
        # resumed from its last periodic checkpoint: the steps after it ran twice (what a kill costs)
        assert low_result["attempt"] == 1 and low_result["first"] % 10 == 0 and low_result["first"] >= 10
        assert low_result["applied"] == 400 and info["restarts"] == 0, (low_result, info)
        assert (await result(client, flows, high, "trained"))["applied"] == 10
        await client.cancel(other)
        await settled(stack)

    run(main())


def test_a_gang_that_is_not_preemptible_never_borrows_so_it_never_holds_a_lenders_quota(
    stack: Stack, flows: Path
) -> None:
    async def main() -> None:
        client = await stack.client()
        await client.apply_queues(CONFIG)
        # team-a tries to borrow the whole cluster with gangs that may not be preempted: only its quota's worth
        # starts (issue 20, attack 6: they would keep team-b out of its own quota)
        steady = [await start(client, flows, "steady_run", {"steps": 60}, tenant="team-a") for _ in range(2)]
        gangs = [gang_of(r, "steady") for r in steady]

        def one_runs_one_waits(queue: dict[str, Any]) -> bool:
            running = {g["gang_id"] for g in queue["running"]} & set(gangs)
            waiting = [g for g in queue["pending"] if g["gang_id"] in gangs and g["reason"]]
            return len(running) == 1 and len(waiting) == 1

        await stack.wait_for("one steady gang running, the other waiting", one_runs_one_waits, BOUND)
        (entry,) = [g for g in (await client.queue())["pending"] if g["gang_id"] in gangs]
        assert "only preemptible gangs may borrow beyond the nominal quota" in entry["reason"], entry
        # team-b's quota stayed idle for team-b: its gang starts without preempting anyone
        b_run = await start(client, flows, "trained", {"steps": 5}, tenant="team-b")
        assert (await result(client, flows, b_run, "trained"))["applied"] == 5
        for run_id, gang_id in zip(steady, gangs, strict=True):
            done = await result(client, flows, run_id, "steady_run")
            assert (done["attempt"], done["applied"]) == (0, 60), done
            assert (await client.gang(gang_id))["preemptions"] == 0
        await settled(stack)

    run(main())


def test_a_node_lost_during_the_grace_period_does_not_hold_up_the_release(stack: Stack, flows: Path) -> None:
    async def main() -> None:
        client = await stack.client()
        await client.apply_queues(CONFIG)
        # two 2-node gangs of team-a (1 GPU on each node) fill the cluster; their ranks take 8 s to save
        a_runs = [await start(client, flows, "wide_run", {"steps": 400, "save_s": 8}, tenant="team-a") for _ in "ab"]
        a_gangs = [gang_of(r, "wide") for r in a_runs]
        for gang_id in a_gangs:

            async def going(g: str = gang_id) -> bool:
                return await step_of(client, g) >= 3

            await until(f"{gang_id} running", going)
        b_run = await start(client, flows, "wide_run", {"steps": 5}, tenant="team-b")

        async def in_grace() -> str | None:
            for gang_id in a_gangs:
                if (await client.gang(gang_id)).get("preemption"):
                    return gang_id
            return None

        victim = await until("a team-a gang noticed", in_grace)
        lost = stack.nodes["p1"]
        lost.stop(signal.SIGKILL)  # the machine dies while the victim's ranks save
        started = time.monotonic()

        async def released() -> bool:
            return victim not in {g["gang_id"] for g in (await client.queue())["running"]}

        await until("the victim released", released, 40)
        assert time.monotonic() - started < 40
        info = await client.gang(victim)
        (attempt,) = info["failed_attempts"]
        assert attempt["kind"] == "preempted" and "node(s) p1 lost meanwhile" in attempt["reason"], attempt
        assert info["restarts"] == 0, info

        lost.start()  # the node comes back: everything completes
        for run_id, gang_id in zip(a_runs, a_gangs, strict=True):
            done = await result(client, flows, run_id, "wide_run")
            assert done["applied"] == 400, done
            if gang_id == victim:
                assert (await client.gang(gang_id))["restarts"] == 0
        assert (await result(client, flows, b_run, "wide_run"))["applied"] == 5
        await stack.wait_nodes()
        await settled(stack)

    run(main())


@pytest.mark.parametrize(
    ("flow", "task", "reason"),
    [
        # a rank whose save fails after the notice: the attempt is still a preemption, not a user error (the task
        # allows no retry), and the gang resumes from its last periodic checkpoint
        ("fragile_run", "fragile", "the ranks exited "),
        # JAX traps SIGTERM: the notice comes as SIGUSR1, which stop_requested() sees, and the ranks leave in time
        ("jax_run", "jax_train", "the ranks exited "),
    ],
)
def test_a_priority_preemption_of(stack: Stack, flows: Path, flow: str, task: str, reason: str) -> None:
    async def main() -> None:
        client = await stack.client()
        await client.apply_queues(CONFIG)
        victim_run = await start(client, flows, flow, {"steps": 150}, tenant="team-a", priority="low")
        # the other node stays busy until the end (a JAX start can take long on a busy machine): the
        # high-priority gang can only run by preempting the victim
        filler = await start(client, flows, "trained", {"steps": 5000}, tenant="team-b")
        victim = gang_of(victim_run, task)

        async def going() -> bool:
            return await step_of(client, victim) >= 12

        await until(f"{victim} running", going)
        assert gang_of(filler, "train") in {g["gang_id"] for g in (await client.queue())["running"]}
        high = await start(client, flows, "trained", {"steps": 5}, tenant="team-a", priority="high")
        done = await result(client, flows, victim_run, flow)
        info = await client.gang(victim)
        (attempt,) = info["failed_attempts"]
        assert attempt["kind"] == "preempted" and attempt["reason"].startswith(
            f"preempted by {gang_of(high, 'train')} of team-a (priority): {reason}"
        ), attempt
        assert done["attempt"] == 1 and done["applied"] == 150 and info["restarts"] == 0, (done, info)
        assert (await result(client, flows, high, "trained"))["applied"] == 5
        await client.cancel(filler)
        await settled(stack)
        # `gangflow usage --by priority`: each call counts under the class its gang asked for (read from its
        # run's history), the filler, which named none, under the default class
        shown = gangflow_cli("usage", "--json", "--by", "priority", GANGFLOW_ADDRESS=stack.server.address)
        assert shown.returncode == 0, shown.stderr
        rows = {r["priority"]: r for r in json.loads(shown.stdout)["rows"]}
        assert {"low", "high", "default"} <= set(rows), rows
        assert rows["low"]["badput"]["lost_preemption"] > 0 and rows["high"]["allocated_gpu_s"] > 0, rows
        assert "team-b" in rows["default"]["tenants"] and rows["high"]["tenants"] == ["team-a"], rows

    run(main())


async def gpu_seconds(client: Client, tenant: str) -> dict[str, float]:
    """The Scheduler's count of the tenant's ended attempts' GPU-seconds by cause (what Prometheus reads as
    ``gangflow_gpu_seconds_total``), once two looks a second apart agree (a gang's ledger follows its release)."""
    scheduler = client.temporal.get_workflow_handle(SCHEDULER_ID)
    seen: dict[str, float] | None = None
    while True:
        counters = (await scheduler.query(DESCRIBE_QUERY))["counters"]
        now: dict[str, float] = {}
        for name, _flavor, cause, seconds in counters.get("gpu_seconds", []):
            if name == tenant:
                now[cause] = now.get(cause, 0.0) + seconds
        if now == seen:
            return now
        seen = now
        await asyncio.sleep(1.0)


def test_usage_counts_a_gang_called_in_a_child_workflow_under_its_run(stack: Stack, flows: Path) -> None:
    """``gangflow list`` and ``usage`` read runs only; the gang of a child workflow call is its run's. The
    Scheduler's goodput counters (Prometheus's) grow by the same ledger, told by the gang itself."""

    async def main() -> tuple[str, dict[str, float], dict[str, float]]:
        client = await stack.client()
        await client.apply_queues(CONFIG)
        await settled(stack)
        before = await gpu_seconds(client, "team-b")
        run_id = await start(client, flows, "nested", {"steps": 5}, tenant="team-b")
        assert (await result(client, flows, run_id, "nested"))["applied"] == 5
        await settled(stack)
        return run_id, before, await gpu_seconds(client, "team-b")

    run_id, before, after = run(main())
    shown = gangflow_cli("usage", "--json", "--by", "run", "--since", "1h", GANGFLOW_ADDRESS=stack.server.address)
    assert shown.returncode == 0, shown.stderr
    rows = json.loads(shown.stdout)["rows"]
    (row,) = [r for r in rows if r["run"] == run_id]
    assert row["allocated_gpu_s"] > 0 and row["tenant"] == "team-b", row
    assert not [r for r in rows if r["run"].startswith(f"{run_id}.")], rows  # its child call is no run
    grown = {cause: seconds - before.get(cause, 0.0) for cause, seconds in after.items()}
    assert sum(grown.values()) == pytest.approx(row["allocated_gpu_s"], rel=0.01, abs=0.01), (grown, row)
    assert grown["productive"] == pytest.approx(row["productive_gpu_s"], rel=0.01, abs=0.01), (grown, row)


def test_a_sub_workflows_call_keeps_its_rank_files_apart_from_the_runs_call_of_the_same_id(
    stack: Stack, flows: Path
) -> None:
    """A run calls ``train`` (``train-1``) and a sub-workflow that calls it too (its own ``train-1``): each call's
    rank logs and saved rank reports have names of their own in the run's store (the sub-workflow's after its
    id), so each one's status reads its own steps and ``gangflow logs --task train`` finds both. Both gangs'
    requests name who started the run (the client's login name here, no gateway): the sub-workflow's by its memo."""

    async def main() -> Any:
        client = await stack.client()
        await client.apply_queues(CONFIG)
        run_id = await start(client, flows, "both", {"steps": 5}, tenant="team-a")
        done = await result(client, flows, run_id, "both")
        assert (done["direct"]["applied"], done["inner"]["applied"]) == (5, 9), done
        for gang_id in (f"{run_id}.train-1", f"{run_id}.trained-1.train-1"):
            events = (await client.temporal.get_workflow_handle(gang_id).fetch_history()).events
            signals = [e.signal_external_workflow_execution_initiated_event_attributes for e in events]
            users = {
                json.loads(a.input.payloads[0].data).get("user") for a in signals if a.signal_name == SUBMIT_SIGNAL
            }
            assert users == {getpass.getuser()}, (gang_id, users)
        info = await client.status(run_id)
        child = await client.status(f"{run_id}.trained-1", parent=info)
        logs = await client.logs(run_id, task="train")
        await settled(stack)
        return info, child, logs

    info, child, logs = run(main())
    steps = {}
    for name, status in (("run", info), ("sub-workflow", child)):
        (call,) = [t for t in status.tasks if t.kind == "gang"]
        (attempt,) = call.attempts
        steps[name] = (call.call, attempt["last_step"])
    assert steps == {"run": ("train-1", 5), "sub-workflow": ("train-1", 9)}, steps
    names = sorted(name for name, _ in logs)
    assert any(n.startswith("train-1.") for n in names), names
    assert any(n.startswith("trained-1~train-1.") for n in names), names


def test_a_drain_moves_a_running_gang_to_another_node_through_a_checkpoint(stack: Stack, flows: Path) -> None:
    def cli(*args: str) -> Any:
        return gangflow_cli(*args, GANGFLOW_ADDRESS=stack.server.address, COLUMNS="200")

    async def main() -> None:
        client = await stack.client()
        await client.apply_queues(CONFIG)
        run_id = await start(client, flows, "trained", {"steps": 400}, tenant="team-a")
        gang = gang_of(run_id, "train")

        async def going() -> bool:
            return await step_of(client, gang) >= 10

        await until(f"{gang} running", going)
        (first,) = [n["node_id"] for n in (await client.gang(gang))["placement"]["nodes"]]
        other = next(n for n in stack.nodes if n != first)
        drained = cli("node", "drain", first, "--reason", "maintenance")
        assert drained.returncode == 0, drained.stderr

        async def moved() -> str | None:
            placement = (await client.gang(gang)).get("placement")
            nodes = [n["node_id"] for n in (placement or {}).get("nodes", [])]
            return nodes[0] if nodes and nodes[0] != first else None

        assert await until("the gang placed on the other node", moved) == other
        queue = await client.queue()
        assert queue["drained"] == [first], queue
        node = next(n for n in queue["nodes"] if n["node_id"] == first)
        assert node["drained"] and node["drain_reason"] == "maintenance", node

        # the other node is busy with the moved gang: a second gang has nowhere to go but the drained node
        waiting_run = await start(client, flows, "trained", {"steps": 5}, tenant="team-b")
        waiting = gang_of(waiting_run, "train")

        def told(q: dict[str, Any]) -> bool:
            entry = next((g for g in q["pending"] if g["gang_id"] == waiting), None)
            return bool(entry and first in entry["reason"] and "drained" in entry["reason"])

        await stack.wait_for("the second gang waits, naming the drained node", told, BOUND)
        assert cli("node", "undrain", first).returncode == 0
        assert (await result(client, flows, waiting_run, "trained"))["applied"] == 5

        done = await result(client, flows, run_id, "trained")
        info = await client.gang(gang)
        (attempt,) = info["failed_attempts"]
        assert attempt["kind"] == "preempted", attempt
        assert attempt["reason"].startswith(f"preempted: node {first} is draining (maintenance): the ranks exited ")
        # resumed on the other node from the step the notice found, every step applied once, no restart spent
        assert done["attempt"] == 1 and done["first"] > 0 and done["applied"] == 400, done
        resumed_at(stack, run_id, f"preempted: node {first} is draining (maintenance)", done["first"])
        task = gang_task(status_json(stack.server.address, run_id))
        assert [a["nodes"] for a in task["attempts"]] == [[first], [other]], task["attempts"]
        assert task["attempts"][1]["last_step"] == 400 and task["ranks"]["ranks"][0]["step"] == 400, task
        shown = cli("status", run_id)
        assert "train-1 attempts" in shown.stdout and f"node {first} is draining" in shown.stdout, shown.stdout
        assert info["restarts"] == 0, info
        await settled(stack)

    run(main())


def test_a_node_agent_stopped_with_sigterm_drains_its_node_first(stack: Stack, flows: Path) -> None:
    """What systemd, Kubernetes deleting the agent's pod and the end of a Slurm job do: SIGTERM to the agent.
    Its gang checkpoints and moves to the other node without spending a restart; the agent stops once it
    has left; started again, the agent lifts the drain it set."""

    async def main() -> None:
        client = await stack.client()
        await client.apply_queues(CONFIG)
        run_id = await start(client, flows, "trained", {"steps": 150}, tenant="team-a")
        gang = gang_of(run_id, "train")

        async def going() -> bool:
            return await step_of(client, gang) >= 10

        await until(f"{gang} running", going)
        (first,) = [n["node_id"] for n in (await client.gang(gang))["placement"]["nodes"]]
        agent = stack.nodes[first]
        started = time.monotonic()
        await asyncio.to_thread(agent.stop, signal.SIGTERM)  # returns once the agent has exited
        assert agent.proc.returncode == 0 and time.monotonic() - started < 60, agent.log.read_text()[-2000:]
        node = next(n for n in (await client.queue())["nodes"] if n["node_id"] == first)
        assert node["drained"] and node["drain_reason"] == SELF_DRAIN_REASON, node
        # what the operator reads in the agent's log: one line for the drain, no traceback
        log = agent.log.read_text()
        assert "Traceback" not in log, log[-4000:]
        assert log.count("drained; waiting up to") == 1, log[-4000:]

        done = await result(client, flows, run_id, "trained")
        info = await client.gang(gang)
        (attempt,) = info["failed_attempts"]
        assert attempt["reason"].startswith(f"preempted: node {first} is draining ({SELF_DRAIN_REASON}): "), attempt
        assert done["attempt"] == 1 and done["first"] > 0 and done["applied"] == 150 and info["restarts"] == 0

        agent.start()

        def back(q: dict[str, Any]) -> bool:
            return any(n["node_id"] == first and n["alive"] and not n["drained"] for n in q["nodes"])

        await stack.wait_for("the agent back and its drain lifted", back, BOUND)
        await settled(stack)

    run(main())
