"""The real Scheduler workflow under load, continuing as new mid-load (a scaled-down bench_scheduler_workflow).

300 gangs on 20 simulated nodes go from submit to release through the Scheduler in a real ``gangflow
worker`` process, while the Scheduler continues as new every 150 events (``{"max_events": 150}``, what
``GANGFLOW_SCHEDULER_EVENTS_PER_RUN`` gives it). The stand-in gangs (``BenchGang``) run in this process.
What must hold: every gang admitted exactly once per submission and released, no GPU held by two gangs at
once (judged from the gangs' own hold intervals), the Scheduler empty at the end, and every run's history
bounded. No timing is asserted beyond generous limits: the machine is shared.

The dev server keeps its sqlite file in RAM (/dev/shm where there is one): on this VM's disk every commit
waits ~4 ms for fsync, which makes 300 gangs take minutes whatever the Scheduler does (see the bench's
``server_root``).
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

PERF = Path(__file__).resolve().parent / "perf"
sys.path.insert(0, str(PERF))

import bench_scheduler_workflow as sw  # noqa: E402
from bench_scheduler import generate_workload, queue_config  # noqa: E402
from conftest import WorkerProcess, run  # noqa: E402

from engine.core.protocol import SCHEDULER_ID, SCHEDULER_TYPE  # noqa: E402
from engine.runtime import DevServer, Endpoint, connect  # noqa: E402

pytestmark = pytest.mark.slow

NODES, GPUS, GANGS = 20, 8, 300
MAX_EVENTS = 150


class Stack:
    """A dev server in RAM and a real gangflow worker (the Scheduler's) on it."""

    def __init__(self, home: Path) -> None:
        self.root = Path(sw.server_root(None))
        self.server = DevServer(self.root / "server", ui=False).start()
        try:
            self.worker = WorkerProcess(self.server.address, "gangflow", home / "worker").start()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if getattr(self, "worker", None) is not None:
            self.worker.stop()
        self.server.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    made = Stack(tmp_path)
    yield made
    made.close()


async def load(stack: Stack, workload: Any, **kwargs: Any) -> sw.LoadRun:
    client = await connect(Endpoint.resolve(stack.server.address))
    async with sw.gang_worker(client, len(workload.gangs)):
        return await sw.run_load(client, workload, queue_config(workload, 120.0, 1.0), log=lambda _m: None, **kwargs)


def test_300_gangs_through_the_scheduler_while_it_continues_as_new(stack: Stack) -> None:
    workload = generate_workload(NODES, GPUS, GANGS, tenants=3, seed=7)
    shapes = {f"bench-{g.gang_id}": g for g in workload.gangs}
    started = time.monotonic()
    outcome = run(load(stack, workload, max_hold_s=1.0, max_events=MAX_EVENTS, timeout_s=240, stall_s=45))
    took = time.monotonic() - started
    checked = sw.checks(outcome)
    assert not checked["violations"], checked["violations"]
    assert all(v for k, v in checked.items() if k != "violations"), checked

    # -- every gang: finished, admitted once per submission, released --------------------------------------
    assert set(outcome.gangs) == set(shapes)
    placements: Counter[str] = Counter()
    releases: Counter[str] = Counter()
    submits: Counter[str] = Counter()
    for r in outcome.runs:
        placements.update(r.placements)
        releases["total"] += r.received["release"]
        submits["total"] += r.received["submit"]
    for gang_id, result in outcome.gangs.items():
        assert "error" not in result and result["rejected"] is None, result
        assert result["submits"] == len(result["holds"]) == placements[gang_id] >= 1, (gang_id, result)
        assert result["late"] == 0, result
        # the placement is whole and fits the gang's shape: nnodes distinct nodes, gpus_per_node GPUs on each
        shape = shapes[gang_id]
        for hold in result["holds"]:
            nodes = [node for node, _gpus in hold["nodes"]]
            assert len(nodes) == len(set(nodes)) == shape.nnodes, hold
            assert all(len(set(gpus)) == len(gpus) == shape.gpus_per_node for _n, gpus in hold["nodes"]), hold
            assert all(0 <= g < GPUS for _n, gpus in hold["nodes"] for g in gpus), hold
    assert submits["total"] == releases["total"] == sum(r["submits"] for r in outcome.gangs.values())

    # -- no GPU held by two gangs at once (an independent pairwise check of the gangs' own intervals) --------
    held: dict[tuple[str, int], list[tuple[float, float, str]]] = defaultdict(list)
    for gang_id, result in outcome.gangs.items():
        for hold in result["holds"]:
            for node, gpus in hold["nodes"]:
                for gpu in gpus:
                    held[(node, gpu)].append((hold["from"], hold["to"], gang_id))
    for slot, intervals in held.items():
        for i, (a0, a1, a) in enumerate(intervals):
            for b0, b1, b in intervals[i + 1 :]:
                assert a1 <= b0 or b1 <= a0, f"{slot} held by {a} [{a0}, {a1}] and {b} [{b0}, {b1}]"

    # -- the Scheduler holds nothing at the end, and every node is still alive --------------------------------
    assert outcome.describe is not None
    totals = outcome.describe["totals"]
    assert (totals["running"], totals["pending"]) == (0, 0), totals
    assert totals["alive_nodes"] == NODES and totals["gpus_free"] == NODES * GPUS, totals

    # -- it continued as new several times mid-load, each run's history bounded -------------------------------
    runs = outcome.runs
    assert len(runs) >= 4, [r.as_dict() for r in runs]
    assert all(r.status == sw.CONTINUED for r in runs[:-1])
    assert runs[-1].status not in sw.CLOSED
    # a run handles MAX_EVENTS events, then continues as new with what is left; the signals it sends and its
    # workflow tasks come on top, a few events each. Without continue-as-new one run would hold them all.
    sizes = [(r.events, sum(r.received.values()), sum(r.sent.values())) for r in runs]
    assert max(r.events for r in runs) <= 12 * MAX_EVENTS, sizes
    assert all(sum(r.received.values()) <= 3 * MAX_EVENTS for r in runs), sizes
    assert all(r.carry_bytes < 256 * 1024 for r in runs), [r.carry_bytes for r in runs]

    # -- pending reasons are signalled when they change, not on every event -----------------------------------
    pendings = [p for r in runs for p in r.pendings.values()]
    assert sum(pendings) / GANGS <= 3, Counter(pendings)
    assert took < 240, f"took {took:.0f} s"


def test_a_gang_the_scheduler_rejects_is_reported(stack: Stack) -> None:
    """The stand-in's other path: a rejection through the real Scheduler ends the gang, and the harness
    names it instead of counting it as finished."""
    workload = generate_workload(2, GPUS, 6, tenants=2, seed=1)
    jobs = sw.gang_jobs(workload, 0.2)
    bad = workload.gangs[0].gang_id
    jobs[bad] = {**jobs[bad], "request": {**jobs[bad]["request"], "tenant": "nobody"}}
    outcome = run(load(stack, workload, max_hold_s=0.2, jobs=jobs, timeout_s=120))
    result = outcome.gangs[f"bench-{bad}"]
    assert result["holds"] == [] and "unknown tenant 'nobody'" in result["rejected"], result
    checked = sw.checks(outcome)
    assert not checked["all_finished"]
    assert checked["violations"] == [
        f"gangs that failed or were rejected: 1 (bench-{bad})",
        f"  bench-{bad}: {result['rejected']}",
    ]
    others = [r for g, r in outcome.gangs.items() if g != f"bench-{bad}"]
    assert all(r["rejected"] is None and len(r["holds"]) == 1 for r in others), others


def test_signals_in_the_schedulers_first_workflow_task_are_handled(stack: Stack, tmp_path: Path) -> None:
    """A run's first workflow task handles the signals that came before it, before ``run`` starts: those
    must survive the restore of the carried state. After a continue-as-new they are the submits and releases
    sent while it happened; here, node registrations sent before any worker polls the Scheduler's queue, to
    a Scheduler started with a carried input as ``gangflow node`` starts it under
    GANGFLOW_SCHEDULER_EVENTS_PER_RUN."""
    from temporalio.common import WorkflowIDConflictPolicy

    def spec(i: int) -> dict[str, Any]:
        return {"node_id": f"early-{i}", "address": f"early-{i}.test", "gpus": 8, "cpus": 64, "mem": None}

    async def scenario() -> dict[str, Any]:
        client = await connect(Endpoint.resolve(stack.server.address))
        handle: Any = await client.start_workflow(
            SCHEDULER_TYPE,
            {"max_events": MAX_EVENTS},
            id=SCHEDULER_ID,
            task_queue="late",  # nobody polls it yet: every signal below lands in the first workflow task
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            start_signal="register_node",
            start_signal_args=[spec(0)],
        )
        await handle.signal("register_node", spec(1))
        worker = WorkerProcess(stack.server.address, "late", tmp_path / "late").start()
        try:
            # the first answer comes after the first workflow task, which held both signals: it is final
            deadline = time.monotonic() + 30
            while True:
                try:
                    described: dict[str, Any] = await sw.query_scheduler(client, "describe")
                    return described
                except Exception:  # the worker is not answering queries yet
                    if time.monotonic() > deadline:
                        raise
                await asyncio.sleep(0.2)
        finally:
            worker.stop()

    described = run(scenario())
    assert [n["node_id"] for n in described["nodes"]] == ["early-0", "early-1"], described["totals"]


def test_a_queue_configuration_applied_as_a_run_starts_is_kept(stack: Stack, tmp_path: Path) -> None:
    """The same first workflow task after a continue-as-new (the run carries a policy snapshot), with an
    ``apply_queues`` update in it: the update is answered from the restored policy and stays applied, and the
    registration that came with it is kept."""
    from engine.scheduling import Policy

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        client = await connect(Endpoint.resolve(stack.server.address))
        carried = {"policy": Policy().snapshot(), "inbox": [], "outbox": [], "max_events": MAX_EVENTS}
        handle: Any = await client.start_workflow(SCHEDULER_TYPE, carried, id=SCHEDULER_ID, task_queue="late")
        await handle.signal("register_node", {"node_id": "n0", "address": "n0.test", "gpus": 8, "cpus": 64})
        config = {"tenants": [{"name": "team-a", "quota": {"gpu": 4}}, {"name": "team-b"}]}
        update = asyncio.ensure_future(handle.execute_update("apply_queues", config, result_type=dict))
        await asyncio.sleep(0.5)  # the update waits for the first workflow task, with the signal
        worker = WorkerProcess(stack.server.address, "late", tmp_path / "late").start()
        try:
            answered: dict[str, Any] = await asyncio.wait_for(update, 60)
            return answered, await sw.query_scheduler(client, "queues"), await sw.query_scheduler(client, "describe")
        finally:
            worker.stop()

    answered, queues, described = run(scenario())
    assert sorted(answered["tenants"]) == ["team-a", "team-b"]
    assert sorted(queues["tenants"]) == ["team-a", "team-b"], "the applied configuration was lost"
    assert [n["node_id"] for n in described["nodes"]] == ["n0"], described["totals"]
