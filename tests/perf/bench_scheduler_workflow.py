"""The Scheduler workflow at cluster scale: gangs from submit to release through the real Scheduler.

    python tests/perf/bench_scheduler_workflow.py [--nodes 100] [--gpus-per-node 8] [--gangs 1500]
                                                  [--tenants 10] [--seed 0] [--max-hold-s 2]
                                                  [--min-runtime-s 1] [--max-events 4000] [--no-floor]
                                                  [--server-dir DIR] [--json | --markdown]
    python tests/perf/bench_scheduler_workflow.py --render RESULT.json   # the README rows of a saved JSON line

A load test of ``workflows/scheduler.py`` itself, not of the pure policy (``bench_scheduler.py`` does that):
a Temporal dev server, the Scheduler in a real ``gangflow worker`` process, and in this process

* **simulated node agents**: ``--nodes`` nodes of ``--gpus-per-node`` GPUs register as agents from before node
  leases did (signal-with-start of the Scheduler) and re-register every 5 s, their liveness signal then, for
  the whole run: the Scheduler's worst case (agents now hold a lease instead: ``bench_liveness.py``); no rank
  processes;
* **stand-in gangs** (:class:`BenchGang`, a workflow of this file on its own task queue): each signals
  ``submit`` to the Scheduler with its own workflow id as the gang id, waits for ``placement`` (or
  ``rejected``), holds it for a short simulated run, signals ``release`` and ends. It counts ``pending``
  signals and answers ``preempt`` at once: release, then submit again, as GangTask does.

The gangs' shapes, tenants and priority classes are ``bench_scheduler.generate_workload``'s (the Philly fit);
the queue configuration is ``bench_scheduler.queue_config``'s (tenants with quotas in cohorts, priority
classes ``low`` and ``high``), applied with the Scheduler's ``apply_queues`` update before any gang starts.
All gangs are started at once (Kueue's scheduler benchmark does the same). A gang holds its placement for
``--max-hold-s`` x (log10(duration / 60 s) - 1) / 3 of its trace duration, clipped to [0, --max-hold-s]:
the trace's minutes to days compressed into seconds, the long gangs still the longest.
``--min-runtime-s`` is the policy's minimum runtime, scaled the same way (the default 60 s would make any
preemption impossible within a 2-second hold).

**The floor.** Then (unless ``--no-floor``) the same gangs run on a fresh server through
:class:`EchoScheduler`, which places every submission at once, on no nodes, batched as the Scheduler batches:
what the gangs' own signals, timers and workflow tasks cost on this server before any scheduling. The
Scheduler cannot beat that column; the gap between the two is what scheduling adds.

**The server** keeps its sqlite file in RAM (/dev/shm) unless ``--server-dir`` says otherwise: see
:func:`server_root` for why a disk would measure the disk's fsync, not the Scheduler.

Measured, from the histories of every Scheduler run (the continue-as-new chain, followed by run id):

* ``wall_s`` — from the first ``submit`` signal the Scheduler received to the last ``release``;
  ``admissions_per_s`` and ``signals_per_s`` over that window, signals counting both those the Scheduler
  received (``WORKFLOW_EXECUTION_SIGNALED``) and those it sent (``SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED``);
* ``runs`` — Scheduler runs, and per run its history length (``max_history_events``), signals, workflow
  tasks (count; failed ones by cause, e.g. ``FORCE_CLOSE_COMMAND`` when over 100 events arrived while one
  ran; ``wft_busy_s`` started to completed, ``wft_wait_s`` scheduled to started) and the size of the state
  it carried to the next run (``max_carry_bytes``);
* ``ack_wait_s`` — time with signals sent and not yet acknowledged by the server (the Scheduler awaits
  them before it handles the events that came meanwhile);
* ``owner_check_releases`` — gangs the Scheduler's owner check found already ended while it still held them:
  a release signal it had not handled yet (or never got);
* ``pending_per_gang`` — ``pending`` signals per gang, mean and max (reasons are signalled only when their
  meaning changes);
* ``cpu_s`` — CPU seconds of the dev server, of the Scheduler's worker and of this process (the gangs, the
  node agents and the client) while the gangs ran (Linux only): where the time goes;
* ``client_wall_s`` — as the client sees it: from starting the first gang until none runs.

``checks`` (the harness's, as in ``bench_scheduler.py``): every gang finished and none was rejected
(``all_finished``); each submission admitted exactly once, as the Scheduler's history and the gang agree
(``admitted_once``); no GPU held by two gangs at once, judged by the gangs' own hold intervals
(``no_double_allocation``); the Scheduler holds nothing at the end (``scheduler_empty``); every run's history
within Temporal's warning limit of 10,240 events (``history_bounded``); the runs form one chain, none failed
(``chain_complete``). ``violations`` says what failed.

Prints ONE JSON line on stdout and a table on stderr (``--markdown``: the README's rows; ``--json``: no
table). Not a test: nothing here asserts on timings (``tests/test_scheduler_load.py`` runs a small size).

This file is also imported by the in-process worker that runs :class:`BenchGang`: keep its import-time work
to the definitions below.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio import workflow

from engine.core.protocol import (
    CLOSED_OWNERS,
    PENDING_SIGNAL,
    PLACEMENT_SIGNAL,
    PREEMPT_SIGNAL,
    REJECTED_SIGNAL,
    SCHEDULER_ID,
    SCHEDULER_TYPE,
)

__all__ = [
    "CLOSED",
    "CONTINUED",
    "ECHO_TYPE",
    "GANG_QUEUE",
    "GANG_TYPE",
    "HISTORY_WARN_EVENTS",
    "BenchGang",
    "EchoScheduler",
    "LoadRun",
    "RunStats",
    "checks",
    "gang_jobs",
    "gang_worker",
    "hold_for",
    "query_scheduler",
    "run_load",
    "scheduler_runs",
    "server_root",
    "summarize",
]

GANG_TYPE = "BenchGang"
ECHO_TYPE = "BenchEchoScheduler"
#: the stand-in gangs' own task queue: the Scheduler's worker never runs them
GANG_QUEUE = "bench-gangs"
#: simulated node agents re-register this often, as ``gangflow node`` did before node leases
REGISTER_EVERY_S = 5.0
#: Temporal warns at this many events in one history (limit.historyCount.warn); a Scheduler run must stay below
HISTORY_WARN_EVENTS = 10_240
CONTINUED = "WORKFLOW_EXECUTION_CONTINUED_AS_NEW"
#: the last event of a closed run
CLOSED = frozenset(
    f"WORKFLOW_EXECUTION_{end}"
    for end in ("COMPLETED", "FAILED", "TIMED_OUT", "TERMINATED", "CANCELED", "CONTINUED_AS_NEW")
)
#: gangs started concurrently from the client
START_CONCURRENCY = 64
#: the echo scheduler's signals in flight at once, as the Scheduler's (workflows.scheduler.SIGNAL_BATCH)
ECHO_BATCH = 200


# ---------------------------------------------------------------------------------------------------------
# the stand-in gang
# ---------------------------------------------------------------------------------------------------------
@workflow.defn(name=GANG_TYPE, sandboxed=False)
class BenchGang:
    """A gang without ranks: submit, wait for a placement, hold it ``hold_s``, release. A preemption notice
    ends the hold early: release, then submit again (the Scheduler keeps its place in the order).

    Input ``{"request": {...GangRequest fields but gang_id}, "hold_s": float}``; result: what it saw, for the
    harness's checks (every hold with its placement and its interval in workflow time)."""

    def __init__(self) -> None:
        self.placement: dict[str, Any] | None = None
        self.rejected: str | None = None
        self.preempt: dict[str, Any] | None = None
        self.pending = 0
        self.late = 0  # placements that came while the gang held one: a Scheduler bug
        self.stale = 0  # preemption notices that crossed the gang's own release: harmless

    @workflow.signal(name=PLACEMENT_SIGNAL)
    def on_placement(self, placement: Any) -> None:
        if self.placement is not None or not isinstance(placement, dict):
            self.late += 1
            return
        self.placement = placement

    @workflow.signal(name=REJECTED_SIGNAL)
    def on_rejected(self, reason: Any) -> None:
        self.rejected = str(reason)

    @workflow.signal(name=PENDING_SIGNAL)
    def on_pending(self, reason: Any) -> None:
        self.pending += 1

    @workflow.signal(name=PREEMPT_SIGNAL)
    def on_preempt(self, notice: Any) -> None:
        if self.placement is None or self.preempt is not None:  # crossed our own release: nothing to give back
            self.stale += 1
            return
        self.preempt = notice if isinstance(notice, dict) else {"notice": notice}

    @workflow.run
    async def run(self, job: dict[str, Any]) -> dict[str, Any]:
        gang_id = workflow.info().workflow_id
        scheduler = workflow.get_external_workflow_handle(SCHEDULER_ID)
        request = {**job["request"], "gang_id": gang_id}
        hold_s = float(job["hold_s"])
        holds: list[dict[str, Any]] = []
        submits = 0
        while True:
            self.placement, self.rejected, self.preempt = None, None, None
            await scheduler.signal("submit", request)
            submits += 1
            await workflow.wait_condition(lambda: self.placement is not None or self.rejected is not None)
            if self.placement is None:
                await scheduler.signal("release", gang_id)  # as GangTask does: withdraw whatever is left
                return self._result(gang_id, submits, holds)
            start = workflow.now().timestamp()
            with contextlib.suppress(TimeoutError):  # the hold ran out: the usual end
                await workflow.wait_condition(lambda: self.preempt is not None, timeout=hold_s)
            holds.append(
                {
                    "nodes": [[a["node_id"], list(a["gpu_ids"])] for a in self.placement.get("nodes", [])],
                    "from": start,
                    "to": workflow.now().timestamp(),
                    "preempted": self.preempt is not None,
                }
            )
            await scheduler.signal("release", gang_id)
            if self.preempt is None:
                return self._result(gang_id, submits, holds)

    def _result(self, gang_id: str, submits: int, holds: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "gang_id": gang_id,
            "submits": submits,
            "holds": holds,
            "pending": self.pending,
            "rejected": self.rejected,
            "late": self.late,
            "stale_preempts": self.stale,
        }


@workflow.defn(name=ECHO_TYPE, sandboxed=False)
class EchoScheduler:
    """The Temporal floor: a "scheduler" that places every gang at once on no nodes, in batches as the
    Scheduler signals, and keeps no state. What the gangs cost through it is what any scheduler workflow
    costs on this server before it decides anything."""

    def __init__(self) -> None:
        self.inbox: list[str] = []

    @workflow.signal(name="submit")
    def submit(self, request: Any) -> None:
        if isinstance(request, dict) and isinstance(request.get("gang_id"), str):
            self.inbox.append(request["gang_id"])

    @workflow.signal(name="release")
    def release(self, gang_id: Any) -> None:
        pass

    @workflow.run
    async def run(self) -> None:
        while True:
            await workflow.wait_condition(lambda: bool(self.inbox))
            batch, self.inbox = self.inbox[:ECHO_BATCH], self.inbox[ECHO_BATCH:]
            await asyncio.gather(
                *(
                    workflow.get_external_workflow_handle(g).signal(PLACEMENT_SIGNAL, {"gang_id": g, "nodes": []})
                    for g in batch
                )
            )


# ---------------------------------------------------------------------------------------------------------
# the workload
# ---------------------------------------------------------------------------------------------------------
def hold_for(duration_s: float, max_hold_s: float) -> float:
    """A trace duration (10 minutes to days) compressed to a hold of 0..``max_hold_s`` seconds, log scale."""
    scaled = (math.log10(max(duration_s, 60.0) / 60.0) - 1.0) / 3.0
    return round(max_hold_s * min(max(scaled, 0.0), 1.0), 3)


def gang_jobs(workload: Any, max_hold_s: float) -> dict[str, dict[str, Any]]:
    """One :class:`BenchGang` input per gang of a ``bench_scheduler.Workload``, by the trace's gang id."""
    return {
        g.gang_id: {
            "request": {
                "nnodes": g.nnodes,
                "gpus_per_node": g.gpus_per_node,
                "cpus_per_node": g.cpus_per_node,
                "tenant": g.tenant,
                "priority": g.priority,
            },
            "hold_s": hold_for(g.duration, max_hold_s),
        }
        for g in workload.gangs
    }


# ---------------------------------------------------------------------------------------------------------
# the Scheduler's histories
# ---------------------------------------------------------------------------------------------------------
@dataclass
class RunStats:
    """What one Scheduler run's history says."""

    run_id: str
    events: int = 0
    status: str = ""  # the last event's type: CONTINUED_AS_NEW for every run but the current one
    next_run_id: str | None = None
    carry_bytes: int = 0  # the input it handed to the next run
    received: Counter[str] = field(default_factory=Counter)  # signals received, by name
    sent: Counter[str] = field(default_factory=Counter)  # signals sent, by name
    placements: Counter[str] = field(default_factory=Counter)  # placement signals, by gang id
    pendings: Counter[str] = field(default_factory=Counter)  # pending signals, by gang id
    signal_times: list[float] = field(default_factory=list)  # every signal received or sent
    first_submit: float | None = None
    last_release: float | None = None
    wft: int = 0  # workflow tasks completed
    wft_failed: Counter[str] = field(default_factory=Counter)  # failed workflow tasks, by cause
    wft_busy_s: float = 0.0  # started -> completed, summed: the time the worker spent deciding
    wft_max_s: float = 0.0
    wft_wait_s: float = 0.0  # scheduled -> started, summed: the time the workflow task waited for the worker
    #: time with signals sent and not acknowledged yet (a union of intervals): the Scheduler awaits its
    #: deliveries, so events that come meanwhile wait in its inbox
    ack_wait_s: float = 0.0
    #: gangs the owner check found closed while the Scheduler still held them (their release not handled yet)
    owner_check_releases: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "events": self.events,
            "status": self.status,
            "signals_received": sum(self.received.values()),
            "signals_sent": sum(self.sent.values()),
            "received": dict(sorted(self.received.items())),
            "sent": dict(sorted(self.sent.items())),
            "workflow_tasks": self.wft,
            "workflow_tasks_failed": dict(self.wft_failed),
            "wft_busy_s": round(self.wft_busy_s, 3),
            "wft_max_ms": round(self.wft_max_s * 1000, 1),
            "wft_wait_s": round(self.wft_wait_s, 3),
            "ack_wait_s": round(self.ack_wait_s, 3),
            "owner_check_releases": self.owner_check_releases,
            "carry_bytes": self.carry_bytes,
        }


def _seconds(event: Any) -> float:
    return float(event.event_time.ToMicroseconds()) / 1e6


async def run_stats(client: Any, run_id: str) -> RunStats:
    """Read one Scheduler run's history."""
    from temporalio.api.enums.v1 import EventType

    history = await client.get_workflow_handle(SCHEDULER_ID, run_id=run_id).fetch_history()
    stats = RunStats(run_id=run_id, events=len(history.events))
    scheduled: float | None = None
    started: float | None = None
    unacknowledged: set[int] = set()
    waiting_since: float | None = None
    for event in history.events:
        kind = event.event_type
        at = _seconds(event)
        if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            name = event.workflow_execution_signaled_event_attributes.signal_name
            stats.received[name] += 1
            stats.signal_times.append(at)
            if name == "submit" and stats.first_submit is None:
                stats.first_submit = at
            elif name == "release":
                stats.last_release = at
        elif kind == EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED:
            attrs = event.signal_external_workflow_execution_initiated_event_attributes
            name, target = attrs.signal_name, attrs.workflow_execution.workflow_id
            stats.sent[name] += 1
            stats.signal_times.append(at)
            unacknowledged.add(event.event_id)
            if waiting_since is None:
                waiting_since = at
            if name == PLACEMENT_SIGNAL:
                stats.placements[target] += 1
            elif name == PENDING_SIGNAL:
                stats.pendings[target] += 1
        elif kind in (
            EventType.EVENT_TYPE_EXTERNAL_WORKFLOW_EXECUTION_SIGNALED,
            EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_FAILED,
        ):
            attrs = (
                event.external_workflow_execution_signaled_event_attributes
                if kind == EventType.EVENT_TYPE_EXTERNAL_WORKFLOW_EXECUTION_SIGNALED
                else event.signal_external_workflow_execution_failed_event_attributes
            )
            unacknowledged.discard(attrs.initiated_event_id)
            if not unacknowledged and waiting_since is not None:
                stats.ack_wait_s += at - waiting_since
                waiting_since = None
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            scheduled = at
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            started = at
            if scheduled is not None:
                stats.wft_wait_s += at - scheduled
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            stats.wft += 1
            if started is not None:
                stats.wft_busy_s += at - started
                stats.wft_max_s = max(stats.wft_max_s, at - started)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            cause = event.workflow_task_failed_event_attributes.cause
            stats.wft_failed[_enum_name(cause)] += 1
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
            stats.wft_failed["TIMED_OUT"] += 1
        elif kind == EventType.EVENT_TYPE_MARKER_RECORDED:
            stats.owner_check_releases += _closed_owners(event.marker_recorded_event_attributes)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
            attrs = event.workflow_execution_continued_as_new_event_attributes
            stats.next_run_id = attrs.new_execution_run_id
            stats.carry_bytes = sum(len(p.data) for p in attrs.input.payloads)
    if history.events:
        stats.status = EventType.Name(history.events[-1].event_type).removeprefix("EVENT_TYPE_")
    return stats


def _closed_owners(marker: Any) -> int:
    """How many gangs an owner check (the CLOSED_OWNERS local activity's marker) found closed; 0 for others."""
    import json

    try:
        data = json.loads(marker.details["data"].payloads[0].data)
        if data.get("activity_type") != CLOSED_OWNERS or "result" not in marker.details:
            return 0
        return len(json.loads(marker.details["result"].payloads[0].data))
    except (KeyError, IndexError, ValueError, AttributeError, TypeError):
        return 0  # not a local activity marker, or one without a result (it failed)


def _enum_name(cause: Any) -> str:
    from temporalio.api.enums.v1 import WorkflowTaskFailedCause

    return str(WorkflowTaskFailedCause.Name(cause)).removeprefix("WORKFLOW_TASK_FAILED_CAUSE_")


async def scheduler_runs(client: Any, first_run_id: str, limit: int = 10_000) -> list[RunStats]:
    """Every Scheduler run from ``first_run_id`` on, following the continue-as-new chain by run id."""
    runs: list[RunStats] = []
    run_id: str | None = first_run_id
    while run_id is not None and len(runs) < limit:
        stats = await run_stats(client, run_id)
        runs.append(stats)
        run_id = stats.next_run_id
    return runs


# ---------------------------------------------------------------------------------------------------------
# one load run
# ---------------------------------------------------------------------------------------------------------
@dataclass
class LoadRun:
    """What :func:`run_load` saw: the gangs' results, the Scheduler's runs, its state at the end."""

    gangs: dict[str, dict[str, Any]]  # workflow id -> BenchGang's result (or {"error": ...})
    runs: list[RunStats]
    describe: dict[str, Any] | None  # the Scheduler's "describe" once the last release is in (None: echo)
    client_wall_s: float
    nodes: int
    gpus_per_node: int
    cpu_s: dict[str, float] = field(default_factory=dict)  # CPU seconds per process while the gangs ran


async def _register(client: Any, nodes: list[str], gpus: int, cpus: int, queue: str) -> None:
    """One registration of every simulated node, as ``gangflow node`` sent it before node leases (signal-with-start;
    no ``leased``: the Scheduler expires a node that stops re-registering)."""
    from engine.core.protocol import REGISTER_NODE_SIGNAL
    from engine.runtime.keeper import start_scheduler

    def spec(n: str) -> dict[str, Any]:
        return {"node_id": n, "address": f"{n}.bench", "gpus": gpus, "cpus": cpus, "mem": None}

    await asyncio.gather(
        *(start_scheduler(client, queue, signal=REGISTER_NODE_SIGNAL, signal_args=[spec(n)]) for n in nodes)
    )


async def _agents(client: Any, nodes: list[str], gpus: int, cpus: int, queue: str, log: Any) -> None:
    """The simulated node agents' liveness: re-register every node every ``REGISTER_EVERY_S`` until cancelled."""
    while True:
        await asyncio.sleep(REGISTER_EVERY_S)
        try:
            await _register(client, nodes, gpus, cpus, queue)
        except Exception as exc:  # a slow round is reported, the next one tries again (as an agent does)
            log(f"  node re-registration failed: {exc}")


async def query_scheduler(client: Any, name: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """The Scheduler's answer to query ``name`` ("describe", "queues")."""
    answer: dict[str, Any] = await client.get_workflow_handle(SCHEDULER_ID).query(
        name, rpc_timeout=timedelta(seconds=timeout_s)
    )
    return answer


async def _start_scheduler(
    client: Any, workload: Any, queue_config: dict[str, Any] | None, max_events: int | None, queue: str
) -> str:
    """Start the Scheduler with ``max_events``, register every node, apply the queue configuration; returns
    the first run's id. The gangflow worker has already started a Scheduler of its own (its keeper, with the
    default input) on this fresh server: that empty one is replaced, or ``max_events`` would not apply."""
    from temporalio.common import WorkflowIDConflictPolicy

    nodes = workload.node_ids()
    gpus, cpus = workload.gpus_per_node, workload.cpus_per_node
    handle = await client.start_workflow(
        SCHEDULER_TYPE,
        {"max_events": max_events} if max_events else None,
        id=SCHEDULER_ID,
        task_queue=queue,
        id_conflict_policy=WorkflowIDConflictPolicy.TERMINATE_EXISTING,
    )
    first_run_id: str | None = handle.result_run_id
    if not first_run_id:  # pragma: no cover - a signal-with-start always names the run
        raise RuntimeError("the Scheduler's start returned no run id")
    await _register(client, nodes, gpus, cpus, queue)
    if queue_config is not None:
        await handle.execute_update("apply_queues", queue_config, result_type=dict)
    return first_run_id


async def _wait_for_nodes(client: Any, count: int, timeout_s: float = 60.0) -> None:
    """Until the Scheduler counts ``count`` alive nodes (the agents re-register meanwhile, as real ones do)."""
    import time

    deadline = time.monotonic() + timeout_s
    while (totals := (await query_scheduler(client, "describe"))["totals"])["alive_nodes"] < count:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"the {count} nodes did not all register within {timeout_s:.0f} s: the Scheduler says {totals}"
            )
        await asyncio.sleep(0.2)


async def _last_signals(client: Any, first_run_id: str, gang_ids: set[str]) -> dict[str, str]:
    """Where the Scheduler's histories hold each gang's last submit or release: the run, the event, and
    whether it came in that run's first workflow task (handled before ``run`` starts)."""
    import json

    from temporalio.api.enums.v1 import EventType

    found: dict[str, str] = {}
    run_id: str | None = first_run_id
    index = 0
    while run_id is not None:
        history = await client.get_workflow_handle(SCHEDULER_ID, run_id=run_id).fetch_history()
        first_task = next(
            (e.event_id for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED), None
        )
        run_id = None
        for event in history.events:
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
                run_id = event.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
            if event.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
                continue
            attrs = event.workflow_execution_signaled_event_attributes
            if attrs.signal_name not in ("submit", "release") or not attrs.input.payloads:
                continue
            try:
                value = json.loads(attrs.input.payloads[0].data)
            except ValueError:
                continue
            gang_id = value.get("gang_id") if isinstance(value, dict) else value
            if gang_id in gang_ids:
                early = first_task is None or event.event_id < first_task
                found[gang_id] = (
                    f"its last {attrs.signal_name!r} is event {event.event_id} of Scheduler run {index}"
                    + (", in that run's first workflow task" if early else "")
                )
        index += 1
    return found


async def _stuck(client: Any, echo: bool, first_run_id: str) -> str:
    """Which gangs still run, and whether the Scheduler knows them: for the message of a stalled run."""
    running = [
        w.id async for w in client.list_workflows(f"WorkflowType = '{GANG_TYPE}' AND ExecutionStatus = 'Running'")
    ]
    text = f"{len(running)} gangs still run ({', '.join(sorted(running)[:5])}{', ...' if len(running) > 5 else ''})"
    if echo:
        return text
    described = await query_scheduler(client, "describe")
    known = {g["gang_id"] for g in described["running"]} | {g["gang_id"] for g in described["pending"]}
    lost = sorted(set(running) - known)
    if lost:
        where = await _last_signals(client, first_run_id, set(lost[:5]))
        text += (
            f"; the Scheduler holds no request of {len(lost)} of them, a submit or release it never handled: "
            + "; ".join(f"{g}: {where.get(g, 'no submit or release in its histories')}" for g in lost[:5])
        )
    return text


async def _run_gangs(
    client: Any,
    jobs: dict[str, dict[str, Any]],
    id_prefix: str,
    timeout_s: float,
    stall_s: float,
    echo: bool,
    first_run_id: str,
) -> tuple[dict[str, dict[str, Any]], float]:
    """Start every gang at once and wait until none runs; returns their results and the wall time. Gives up
    when no gang has ended for ``stall_s`` (or after ``timeout_s``), saying which gangs are stuck.

    The wait polls visibility rather than holding one long poll per gang: the dev server refuses more
    than about a thousand concurrent long polls in a namespace ("namespace concurrent poller limit
    exceeded"), and the results are read once all gangs are done, outside the measured window."""
    import time

    limit = asyncio.Semaphore(START_CONCURRENCY)

    async def start(gang_id: str, job: dict[str, Any]) -> str:
        async with limit:
            handle = await client.start_workflow(
                GANG_TYPE, job, id=f"{id_prefix}-{gang_id}", task_queue=GANG_QUEUE, result_type=dict
            )
        return str(handle.id)

    started = time.perf_counter()
    ids = await asyncio.gather(*(start(gang_id, job) for gang_id, job in jobs.items()))
    running = f"WorkflowType = '{GANG_TYPE}' AND ExecutionStatus = 'Running'"
    last, changed = -1, time.perf_counter()
    while count := (await client.count_workflows(running)).count:
        now = time.perf_counter()
        if count != last:
            last, changed = count, now
        elif now - changed > stall_s or now - started > timeout_s:
            why = f"no gang ended for {now - changed:.0f} s" if now - changed > stall_s else f"{timeout_s:.0f} s"
            raise TimeoutError(f"{why}: {await _stuck(client, echo, first_run_id)}")
        await asyncio.sleep(0.25)
    wall = time.perf_counter() - started

    async def result(workflow_id: str) -> tuple[str, dict[str, Any]]:
        async with limit:
            try:
                outcome: dict[str, Any] = await client.get_workflow_handle(workflow_id).result()
                return workflow_id, outcome
            except Exception as exc:  # reported by checks(): all_finished
                return workflow_id, {"gang_id": workflow_id, "error": f"{type(exc).__name__}: {exc}"}

    return dict(await asyncio.gather(*(result(i) for i in ids))), wall


async def run_load(
    client: Any,
    workload: Any,
    queue_config: dict[str, Any] | None,
    *,
    max_hold_s: float,
    max_events: int | None = None,
    scheduler_queue: str = "gangflow",
    echo: bool = False,
    id_prefix: str = "bench",
    timeout_s: float = 600.0,
    stall_s: float = 60.0,
    cpu_probe: Any = None,
    jobs: dict[str, dict[str, Any]] | None = None,
    log: Any = print,
) -> LoadRun:
    """Register the workload's nodes (starting the Scheduler on ``scheduler_queue``, where a gangflow worker
    must run), apply ``queue_config``, run every gang through it at once, and read the Scheduler's runs.
    ``echo``: the Temporal floor instead, :class:`EchoScheduler` (no nodes, no configuration).
    ``cpu_probe()`` returns CPU seconds per process; ``LoadRun.cpu_s`` is its change while the gangs ran.
    ``jobs`` replaces the gangs :func:`gang_jobs` makes of the workload (tests submit bad ones). Raises
    TimeoutError when no gang ends for ``stall_s`` seconds, or they run longer than ``timeout_s``.

    Needs :func:`gang_worker` on ``GANG_QUEUE`` and a fresh namespace: the Scheduler's workflow id is fixed,
    and its chain is followed from the run this call starts."""
    import time

    nodes = workload.node_ids()
    gpus, cpus = workload.gpus_per_node, workload.cpus_per_node
    jobs = gang_jobs(workload, max_hold_s) if jobs is None else jobs
    agents = None
    described = None
    try:
        if echo:
            handle = await client.start_workflow(ECHO_TYPE, id=SCHEDULER_ID, task_queue=GANG_QUEUE)
            first_run_id = str(handle.result_run_id)
        else:
            first_run_id = await _start_scheduler(client, workload, queue_config, max_events, scheduler_queue)
            agents = asyncio.create_task(_agents(client, nodes, gpus, cpus, scheduler_queue, log))
            await _wait_for_nodes(client, len(nodes))
        log(f"  {'echo scheduler' if echo else f'{len(nodes)} nodes registered'}; starting {len(jobs):,} gangs ...")
        before = cpu_probe() if cpu_probe else {}
        gangs, client_wall = await _run_gangs(client, jobs, id_prefix, timeout_s, stall_s, echo, first_run_id)
        after = cpu_probe() if cpu_probe else {}
        log(f"  all gangs ended after {client_wall:.1f} s")
        deadline = time.monotonic() + 60
        while not echo:
            described = await query_scheduler(client, "describe")
            totals = described["totals"]
            if (totals["running"] == 0 and totals["pending"] == 0) or time.monotonic() > deadline:
                break  # not empty in time: checks() says so
            await asyncio.sleep(0.2)
    finally:
        if agents is not None:
            agents.cancel()
    runs = await scheduler_runs(client, first_run_id)
    cpu = {k: round(after[k] - before.get(k, 0.0), 2) for k in after}
    return LoadRun(gangs, runs, described, client_wall, len(nodes), gpus, cpu)


def gang_worker(client: Any, gangs: int) -> Any:
    """The in-process worker that runs the stand-in gangs (and the echo scheduler): every gang stays cached,
    so none is replayed."""
    from temporalio.worker import Worker

    return Worker(
        client,
        task_queue=GANG_QUEUE,
        workflows=[BenchGang, EchoScheduler],
        max_cached_workflows=gangs + 100,
        max_concurrent_workflow_tasks=100,
    )


# ---------------------------------------------------------------------------------------------------------
# figures and checks
# ---------------------------------------------------------------------------------------------------------
def checks(load: LoadRun) -> dict[str, Any]:
    """The harness's checks (see the module docstring); ``violations`` lists what failed, a few of each."""
    violations: list[str] = []

    def fail(what: str, items: list[str]) -> bool:
        if items:
            violations.append(
                f"{what}: {len(items)} ({', '.join(sorted(items)[:5])}{', ...' if len(items) > 5 else ''})"
            )
        return not items

    gangs = load.gangs
    unfinished = [g for g, r in gangs.items() if "error" in r or r.get("rejected") is not None]
    all_finished = fail("gangs that failed or were rejected", unfinished)
    for gang_id in sorted(unfinished)[:3]:  # why, for the first few
        why = gangs[gang_id].get("error") or gangs[gang_id].get("rejected")
        violations.append(f"  {gang_id}: {str(why)[:200]}")

    placed: Counter[str] = Counter()
    for run in load.runs:
        placed.update(run.placements)
    # one placement per submission, but for a last submission that was rejected
    wrong = [
        g
        for g, r in gangs.items()
        if "error" not in r
        and not (
            placed[g] == len(r["holds"]) == r["submits"] - (r.get("rejected") is not None) and r.get("late", 0) == 0
        )
    ]
    strangers = [g for g in placed if g not in gangs]
    admitted_once = fail("gangs not admitted exactly once per submission", wrong) & fail(
        "placements for unknown gangs", strangers
    )

    by_gpu: dict[tuple[str, int], list[tuple[float, float, str]]] = defaultdict(list)
    for gang_id, result in gangs.items():
        for hold in result.get("holds", []):
            for node_id, gpu_ids in hold["nodes"]:
                for gpu in gpu_ids:
                    by_gpu[(node_id, gpu)].append((hold["from"], hold["to"], gang_id))
    overlaps = []
    for (node_id, gpu), intervals in by_gpu.items():
        intervals.sort()
        busy_until, holder = -math.inf, ""
        for start, end, gang_id in intervals:
            if start < busy_until:
                overlaps.append(f"{node_id}/gpu{gpu}: {holder} and {gang_id}")
            if end > busy_until:
                busy_until, holder = end, gang_id
    no_double_allocation = fail("GPUs held by two gangs at once", overlaps)

    described = load.describe or {}  # the echo scheduler has no state to check
    totals = described.get("totals", {})
    left = [g["gang_id"] for g in described.get("running", []) + described.get("pending", [])]
    scheduler_empty = fail("gangs the Scheduler still holds at the end", left) and not (
        totals.get("running") or totals.get("pending")
    )

    too_long = [f"run {i} ({r.events} events)" for i, r in enumerate(load.runs) if r.events > HISTORY_WARN_EVENTS]
    history_bounded = fail(f"Scheduler runs over {HISTORY_WARN_EVENTS:,} history events", too_long)

    # every run but the last continued as new; the last one still runs
    broken = [f"run {i} ended {r.status}" for i, r in enumerate(load.runs[:-1]) if r.status != CONTINUED]
    if not load.runs or load.runs[-1].status in CLOSED:
        broken.append(f"the last run ended {load.runs[-1].status if load.runs else '(no run)'}")
    chain_complete = fail("Scheduler runs that did not continue as new", broken)

    return {
        "all_finished": all_finished,
        "admitted_once": admitted_once,
        "no_double_allocation": no_double_allocation,
        "scheduler_empty": scheduler_empty,
        "history_bounded": history_bounded,
        "chain_complete": chain_complete,
        "violations": violations,
    }


def _window(times: list[float], start: float, end: float) -> int:
    return sum(1 for t in times if start <= t <= end)


def summarize(load: LoadRun) -> dict[str, Any]:
    """The figures of one load run (see the module docstring)."""
    runs = load.runs
    firsts = [r.first_submit for r in runs if r.first_submit is not None]
    lasts = [r.last_release for r in runs if r.last_release is not None]
    start, end = (min(firsts), max(lasts)) if firsts and lasts else (0.0, 0.0)
    wall = max(end - start, 1e-9)
    received: Counter[str] = Counter()
    sent: Counter[str] = Counter()
    pendings: Counter[str] = Counter()
    for run in runs:
        received.update(run.received)
        sent.update(run.sent)
        pendings.update(run.pendings)
    signals_in_window = sum(_window(r.signal_times, start, end) for r in runs)
    admissions = sent[PLACEMENT_SIGNAL]
    per_gang = [pendings.get(g, 0) for g in load.gangs]
    seen_pending = [r.get("pending", 0) for r in load.gangs.values()]
    holds = [h for r in load.gangs.values() for h in r.get("holds", [])]
    gpu_seconds = sum((h["to"] - h["from"]) * sum(len(g) for _n, g in h["nodes"]) for h in holds)
    return {
        "gangs": len(load.gangs),
        "wall_s": round(end - start, 2),
        "client_wall_s": round(load.client_wall_s, 2),
        "admissions": admissions,
        "admissions_per_s": round(admissions / wall, 1),
        "signals": signals_in_window,
        "signals_per_s": round(signals_in_window / wall, 1),
        "signals_received": dict(sorted(received.items())),
        "signals_sent": dict(sorted(sent.items())),
        "preemptions": sent[PREEMPT_SIGNAL],
        "rejections": sent[REJECTED_SIGNAL],
        "pending_per_gang": {
            "mean": round(sum(per_gang) / max(len(per_gang), 1), 2),
            "max": max(per_gang, default=0),
            "received_mean": round(sum(seen_pending) / max(len(seen_pending), 1), 2),
        },
        "gpu_utilization": round(gpu_seconds / (wall * load.nodes * load.gpus_per_node), 3),
        "runs": len(runs),
        "max_history_events": max((r.events for r in runs), default=0),
        "max_carry_bytes": max((r.carry_bytes for r in runs), default=0),
        "workflow_tasks": sum(r.wft for r in runs),
        "workflow_tasks_failed": sum(sum(r.wft_failed.values()) for r in runs),
        "wft_busy_s": round(sum(r.wft_busy_s for r in runs), 2),
        "wft_wait_s": round(sum(r.wft_wait_s for r in runs), 2),
        "wft_max_ms": round(max((r.wft_max_s for r in runs), default=0.0) * 1000, 1),
        "ack_wait_s": round(sum(r.ack_wait_s for r in runs), 2),
        "owner_check_releases": sum(r.owner_check_releases for r in runs),
        "cpu_s": load.cpu_s,
        "per_run": [r.as_dict() for r in runs],
    }


# ---------------------------------------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------------------------------------
#: issue 9's goal for the Scheduler workflow at this scale
GOALS = {"wall_s": "≤ 60 s"}
ROWS = (
    ("submit of the first gang to release of the last", "wall_s", "{:.1f} s"),
    ("admissions per second", "admissions_per_s", "{:,.1f}"),
    ("signals per second (received + sent by the Scheduler)", "signals_per_s", "{:,.1f}"),
    ("CPU: dev server / Scheduler worker / gangs and client", "cpu_s", ""),
    ("Scheduler runs (continue-as-new)", "runs", "{:,}"),
    ("longest history of one run", "max_history_events", "{:,} events"),
    ("largest state carried to the next run", "max_carry_bytes", "{:,} bytes"),
    ("pending signals per gang, mean / max", "pending_per_gang", ""),
    ("preemptions", "preemptions", "{:,}"),
    ("the Scheduler's workflow tasks: count / failed / mean wait", "workflow_tasks", ""),
    ("time with signals sent and not yet acknowledged", "ack_wait_s", "{:.1f} s"),
    ("ended gangs the owner check released", "owner_check_releases", "{:,}"),
)
#: rows that mean nothing for the echo scheduler (it keeps no state and never continues as new)
NOT_FOR_FLOOR = frozenset(
    {"runs", "max_history_events", "max_carry_bytes", "pending_per_gang", "preemptions", "owner_check_releases"}
)


def cell(figures: dict[str, Any] | None, key: str, fmt: str, floor: bool = False) -> str:
    if figures is None or (floor and key in NOT_FOR_FLOOR):
        return "–"
    if key == "pending_per_gang":
        return f"{figures[key]['mean']:.2f} / {figures[key]['max']}"
    if key == "workflow_tasks":
        count = max(figures["workflow_tasks"], 1)
        return (
            f"{figures['workflow_tasks']:,} / {figures['workflow_tasks_failed']:,} / "
            f"{figures['wft_wait_s'] / count * 1000:.0f} ms"
        )
    if key == "cpu_s":
        cpu = figures["cpu_s"]
        parts = [cpu.get(k) for k in ("server", "scheduler_worker", "gangs_and_client")]
        return " / ".join("–" if v is None else f"{v:.1f} s" for v in parts)
    return fmt.format(figures[key])


def _rows(result: dict[str, Any]) -> list[list[str]]:
    floor = result.get("floor")
    return [
        [label, cell(result["figures"], key, fmt), cell(floor, key, fmt, floor=True), GOALS.get(key, "")]
        for label, key, fmt in ROWS
    ]


HEADER = ["", "Scheduler workflow", "floor: echo scheduler", "goal"]


#: the flags the caption names only when a run changed them
OPTIONAL_FLAGS = {"tenants": 10, "max_hold_s": 2.0, "min_runtime_s": 1.0, "max_events": 4000}
#: the same, for on/off flags: (config key, flag that turns the default off)
SWITCHES = (("floor", "--no-floor"),)


def command_line(result: dict[str, Any]) -> str:
    c = result["config"]
    line = (
        f"python tests/perf/bench_scheduler_workflow.py --nodes {c['nodes']} --gpus-per-node {c['gpus_per_node']} "
        f"--gangs {c['gangs']} --seed {c['seed']}"
    )
    for key, default in OPTIONAL_FLAGS.items():
        if c.get(key, default) != default:
            line += f" --{key.replace('_', '-')} {c[key]:g}"
    for key, flag in SWITCHES:
        if not c.get(key, True):
            line += f" {flag}"
    return line


def markdown(result: dict[str, Any]) -> list[str]:
    """The README's table and caption for one JSON line of this benchmark."""
    from benchenv import caption, markdown_table

    c, checked = result["config"], result["checks"]
    passed = [k for k, v in checked.items() if k != "violations" and v]
    note = (
        f"{c['gangs']:,} gangs from {c['tenants']} tenants on {c['nodes']:,} simulated nodes x "
        f"{c['gpus_per_node']} GPUs, all submitted at once, each holding its placement 0–{c['max_hold_s']:g} s. "
        f"Checks passed: {', '.join(passed) or 'none'}"
        + (f"; FAILED: {'; '.join(checked['violations'])}" if checked["violations"] else "")
        + "."
    )
    return [
        *markdown_table(HEADER, "lrrr", _rows(result)),
        "",
        note,
        "",
        caption(command_line(result), result),
    ]


def table(result: dict[str, Any]) -> list[str]:
    lines = [f"{HEADER[0]:<58}{HEADER[1]:>26}{HEADER[2]:>26}{HEADER[3]:>8}"]
    for label, ours, floor, goal in _rows(result):
        lines.append(f"{label:<58}{ours:>26}{floor:>26}{goal:>8}")
    lines.append("")
    lines.append(
        f"{'run':>4}{'events':>8}{'received':>10}{'sent':>7}{'WFTs':>7}{'failed':>8}{'busy s':>8}{'carry B':>10}"
    )
    for i, run in enumerate(result["figures"]["per_run"]):
        lines.append(
            f"{i:>4}{run['events']:>8,}{run['signals_received']:>10,}{run['signals_sent']:>7,}"
            f"{run['workflow_tasks']:>7,}{sum(run['workflow_tasks_failed'].values()):>8}{run['wft_busy_s']:>8.1f}"
            f"{run['carry_bytes']:>10,}"
        )
    checked = result["checks"]
    lines.append("")
    lines.append(
        "checks: " + ", ".join(f"{k} {'ok' if v else 'FAILED'}" for k, v in checked.items() if k != "violations")
    )
    lines += [f"  {v}" for v in checked["violations"]]
    load = result["load"]
    lines.append(f"({result['environment']['cores']} cores, load average {load['min']:.1f}–{load['max']:.1f})")
    return lines


# ---------------------------------------------------------------------------------------------------------
# the benchmark
# ---------------------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> Any:
    from benchenv import arguments, at_least_one, output_options

    parser = arguments(__doc__)
    parser.add_argument("--nodes", type=int, default=100, help="simulated nodes (default %(default)s)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default %(default)s)")
    parser.add_argument("--gangs", type=int, default=1500, help="gangs, all started at once (default %(default)s)")
    parser.add_argument("--tenants", type=int, default=10, help="tenants, as bench_scheduler.py (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the workload (default %(default)s)")
    parser.add_argument(
        "--max-hold-s", type=float, default=2.0, help="the longest gang's hold, seconds (default %(default)s)"
    )
    parser.add_argument(
        "--min-runtime-s", type=float, default=1.0, help="the policy's minimum runtime (default %(default)s)"
    )
    parser.add_argument(
        "--max-events",
        type=int,
        default=4000,
        help="events one Scheduler run handles before it continues as new (default %(default)s, the Scheduler's)",
    )
    parser.add_argument(
        "--no-floor",
        dest="floor",
        action="store_false",
        help="skip the second run through the echo scheduler (the Temporal floor)",
    )
    parser.add_argument(
        "--server-dir",
        metavar="DIR",
        help="where the dev server's sqlite file goes (default: under /dev/shm where it exists; see server_root)",
    )
    output_options(parser, json_flag=True)
    args = parser.parse_args(argv)
    at_least_one(parser, args, "nodes", "gpus_per_node", "gangs", "tenants", "max_events")
    for flag in ("max_hold_s", "min_runtime_s"):
        value = getattr(args, flag)
        if not math.isfinite(value) or value < 0:
            parser.error(f"--{flag.replace('_', '-')} must be a finite number >= 0, got {value}")
    return args


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process so far (Linux /proc; None elsewhere or once it is gone)."""
    import os

    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def server_root(choice: str | None) -> str:
    """Where the dev server keeps its sqlite file: ``--server-dir``, else a RAM-backed folder where there is
    one. On a disk every commit waits for fsync, and the history service commits for each event of each
    workflow in turn: with a 4 ms fsync (this VM's disk) 300 gangs take 200 s whatever the Scheduler does,
    against 15 s in RAM. A production Temporal cluster's database does not serialize on one local disk."""
    import os
    import tempfile

    if choice:
        os.makedirs(choice, exist_ok=True)
        return tempfile.mkdtemp(prefix="gangflow-bench-", dir=choice)
    shm = "/dev/shm"
    return tempfile.mkdtemp(prefix="gangflow-bench-", dir=shm if os.path.isdir(shm) else None)


def main(args: Any) -> None:
    import os
    import resource
    import shutil
    import sys
    import time
    from pathlib import Path

    from benchenv import LoadSampler, emit, environment, log, render

    if args.render:
        render(args.render, "scheduler_workflow", markdown)
        return

    from bench_scheduler import generate_workload, queue_config

    from engine.executor.process import spawn, stop_processes
    from engine.runtime import DevServer, Endpoint, connect

    workload = generate_workload(args.nodes, args.gpus_per_node, args.gangs, args.tenants, args.seed)
    queue = queue_config(workload, grace_s=120.0, min_runtime_s=args.min_runtime_s)
    scratch = server_root(args.server_dir)
    os.environ["GANGFLOW_CACHE"] = os.path.join(scratch, "cache")
    log(
        f"{args.gangs:,} gangs, {args.tenants} tenants, {args.nodes} simulated nodes x {args.gpus_per_node} GPUs "
        f"through the Scheduler workflow (dev server under {scratch})"
    )

    def own_cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    def one(echo: bool) -> LoadRun:
        """One load run on a server of its own: the Scheduler in a gangflow worker process, or the echo."""
        server = DevServer(os.path.join(scratch, "echo" if echo else "server"), ui=False).start()
        worker = None
        try:
            if not echo:  # the Scheduler runs where it runs in production: in a gangflow worker of its own
                worker_log = Path(scratch) / "worker.log"
                worker = spawn(
                    [sys.executable, "-m", "engine.cli", "worker", "--address", server.address],
                    log=worker_log,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                    new_session=True,
                )
                deadline = time.monotonic() + 60
                while b"gangflow worker on" not in worker_log.read_bytes():
                    if worker.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit(f"the gangflow worker did not start:\n{worker_log.read_text()[-3000:]}")
                    time.sleep(0.1)
            processes = {"server": server.process.pid if server.process else None}
            if worker is not None:
                processes["scheduler_worker"] = worker.pid

            def probe() -> dict[str, float]:
                seconds = {name: _cpu_seconds(pid) for name, pid in processes.items() if pid is not None}
                return {"gangs_and_client": own_cpu(), **{k: v for k, v in seconds.items() if v is not None}}

            async def drive() -> LoadRun:
                client = await connect(Endpoint.resolve(server.address))
                async with gang_worker(client, args.gangs):
                    return await run_load(
                        client,
                        workload,
                        queue,
                        max_hold_s=args.max_hold_s,
                        max_events=args.max_events,
                        echo=echo,
                        id_prefix="echo" if echo else "bench",
                        cpu_probe=probe,
                        log=log,
                    )

            return asyncio.run(drive())
        finally:
            if worker is not None:
                stop_processes([worker], 15, group=True)
            server.stop()

    try:
        with LoadSampler() as load:
            log("Scheduler workflow ...")
            outcome = one(echo=False)
            floor = None
            if args.floor:
                log("Temporal floor (echo scheduler) ...")
                floor = one(echo=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    floor_figures = None
    if floor is not None:
        floor_figures = summarize(floor)
        floor_figures["checks"] = checks(floor)
    result = {
        "benchmark": "scheduler_workflow",
        "figures": summarize(outcome),
        "checks": checks(outcome),
        "floor": floor_figures,
        "config": {
            "nodes": args.nodes,
            "gpus_per_node": args.gpus_per_node,
            "gangs": args.gangs,
            "tenants": args.tenants,
            "seed": args.seed,
            "max_hold_s": args.max_hold_s,
            "min_runtime_s": args.min_runtime_s,
            "max_events": args.max_events,
            "floor": bool(args.floor),
            "server": f"temporal dev server, sqlite file under {args.server_dir or 'a RAM-backed folder'}, 127.0.0.1",
        },
        "environment": environment(),
        "load": load.summary(),
    }
    emit(result, [] if args.json else markdown(result) if args.markdown else table(result))


if __name__ == "__main__":
    from benchenv import main_by_name

    main_by_name("bench_scheduler_workflow", parse_args())  # the worker and the harness: one BenchGang class
