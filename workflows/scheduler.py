"""The Scheduler: one long-lived durable workflow per cluster (namespace) that owns the node inventory
and the gang queue.

It is a thin shell around the pure policy in ``engine.scheduling``: signals become events, the policy
returns decisions, and each decision is signalled to the GangRun workflow it concerns. It sleeps until a
signal arrives or its ticker fires (every few seconds: node registrations expire, a gang's wait for lost
nodes runs out, and now and then the owners of allocations are checked). It continues as new when
Temporal suggests it or after ``max_events`` events, checked after every event and carrying everything
not yet handled (events and undelivered decisions), so its history stays small however long it lives.
Node agents start it on first registration (signal-with-start), so there is nothing to deploy by hand.

Nothing leaks: an allocation lives only as long as the GangRun that owns it. A GangRun releases its
placement itself when it ends, is cancelled, or its parent run is terminated (the user-workflow shell
starts gangs with the parent-close policy REQUEST_CANCEL). What it cannot release (a GangRun terminated
directly, or timed out) is found by the owner check: a local activity describes the owners of every
allocation and queued request, and the closed ones are released.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from pydantic import TypeAdapter, ValidationError
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import FailureError

from engine.scheduling import (
    Admitted,
    ClusterState,
    Decision,
    Event,
    GangReleased,
    GangRequest,
    GangSubmitted,
    NodeLost,
    NodeRegistered,
    NodeSpec,
    Pending,
    Rejected,
    Tick,
    describe,
    next_deadline,
    step,
)

__all__ = [
    "CLOSED_OWNERS",
    "PENDING_SIGNAL",
    "PLACEMENT_SIGNAL",
    "REJECTED_SIGNAL",
    "SCHEDULER_ID",
    "SCHEDULER_TYPE",
    "Scheduler",
]

SCHEDULER_ID = "gangflow-scheduler"
SCHEDULER_TYPE = "GangflowScheduler"
PLACEMENT_SIGNAL = "placement"
REJECTED_SIGNAL = "rejected"
PENDING_SIGNAL = "pending"
#: the local activity that returns which of the given gang ids no longer have a running workflow
CLOSED_OWNERS = "gangflow.closed_owners"
MAX_EVENTS_PER_RUN = 4000
#: how often the Scheduler wakes up by itself (deadlines have this granularity)
TICK = timedelta(seconds=5)
#: how often the owners of allocations are checked (on a tick), when there is anything to check
OWNER_CHECK_EVERY = timedelta(seconds=15)
_EVENTS: TypeAdapter[Event] = TypeAdapter(Event)
_DECISIONS: TypeAdapter[Decision] = TypeAdapter(Decision)


@workflow.defn(name=SCHEDULER_TYPE, sandboxed=False)
class Scheduler:
    def __init__(self) -> None:
        self.state = ClusterState()
        self.inbox: list[Event] = []
        self.outbox: list[Decision] = []
        self.handled = 0
        self.tick_due = False
        self.owners_checked = 0.0  # workflow time of the last owner check (carried across continue-as-new)
        self.max_events = MAX_EVENTS_PER_RUN

    # -- inputs ----------------------------------------------------------------------------------
    # A signal handler that raises would fail the workflow task again and again: every payload is taken
    # as Any and checked here; bad input is logged (or answered with a rejection), never raised.
    @workflow.signal(name="register_node")
    def register_node(self, spec: Any) -> None:
        try:
            self.inbox.append(NodeRegistered(spec=NodeSpec.model_validate(spec)))
        except (ValidationError, TypeError, ValueError) as exc:
            workflow.logger.warning("ignoring a malformed node registration %r: %s", spec, exc)

    @workflow.signal(name="node_lost")
    def node_lost(self, node_id: Any) -> None:
        if isinstance(node_id, str) and node_id:
            self.inbox.append(NodeLost(node_id=node_id))
        else:
            workflow.logger.warning("ignoring a malformed node_lost signal %r", node_id)

    @workflow.signal(name="submit")
    def submit(self, request: Any) -> None:
        try:
            self.inbox.append(GangSubmitted(request=GangRequest.model_validate(request)))
        except (ValidationError, TypeError, ValueError) as exc:
            gang_id = request.get("gang_id") if isinstance(request, dict) else None
            if isinstance(gang_id, str) and gang_id:  # someone waits for an answer: tell it what is wrong
                self.outbox.append(Rejected(gang_id=gang_id, reason=f"rejected: malformed request: {exc}"))
            else:
                workflow.logger.warning("ignoring a malformed gang request %r: %s", request, exc)

    @workflow.signal(name="release")
    def release(self, gang_id: Any) -> None:
        if isinstance(gang_id, str) and gang_id:
            self.inbox.append(GangReleased(gang_id=gang_id))
        else:
            workflow.logger.warning("ignoring a malformed release signal %r", gang_id)

    @workflow.query(name="describe")
    def describe(self) -> dict[str, Any]:
        return describe(self.state)

    # -- the loop --------------------------------------------------------------------------------
    @workflow.run
    async def run(self, carried: Any = None) -> None:
        self._restore(carried)
        ticker = asyncio.create_task(self._ticker())
        try:
            while True:
                await workflow.wait_condition(lambda: bool(self.inbox or self.outbox or self.tick_due))
                if self.tick_due:
                    self.tick_due = False
                    now = workflow.now().timestamp()
                    deadline = next_deadline(self.state)
                    if deadline is not None and deadline < now:  # else a Tick would change nothing
                        self.inbox.append(Tick())
                    if now - self.owners_checked >= OWNER_CHECK_EVERY.total_seconds():
                        await self._check_owners()
                while self.outbox or self.inbox:
                    if self.outbox:
                        await self._deliver(self.outbox.pop(0))
                        continue
                    self.state, decisions = step(self.state, self.inbox.pop(0), workflow.now().timestamp())
                    self.handled += 1
                    # undelivered decisions wait in the outbox, so a continue-as-new never drops one
                    self.outbox.extend(decisions)
                    if self.handled >= self.max_events or workflow.info().is_continue_as_new_suggested():
                        await workflow.wait_condition(workflow.all_handlers_finished)
                        workflow.continue_as_new(self._carry())
        finally:
            ticker.cancel()

    def _restore(self, carried: Any) -> None:
        if not isinstance(carried, dict):
            return
        if isinstance(carried.get("max_events"), int) and carried["max_events"] > 0:
            self.max_events = carried["max_events"]
        if isinstance(carried.get("owners_checked"), int | float):
            self.owners_checked = float(carried["owners_checked"])
        if "state" in carried:
            self.state = ClusterState.model_validate(carried["state"])
        self.inbox = [_EVENTS.validate_python(e) for e in carried.get("inbox", [])]
        self.outbox = [_DECISIONS.validate_python(d) for d in carried.get("outbox", [])]

    def _carry(self) -> dict[str, Any]:
        return {
            "state": self.state.model_dump(mode="json"),
            "inbox": [_EVENTS.dump_python(e, mode="json") for e in self.inbox],
            "outbox": [_DECISIONS.dump_python(d, mode="json") for d in self.outbox],
            "max_events": self.max_events,
            "owners_checked": self.owners_checked,
        }

    async def _ticker(self) -> None:
        while True:
            await workflow.sleep(TICK)
            self.tick_due = True

    async def _check_owners(self) -> None:
        self.owners_checked = workflow.now().timestamp()
        owners = sorted({*self.state.running, *self.state.queued_ids()})
        if not owners:
            return
        try:
            closed: list[str] = await workflow.execute_local_activity(
                CLOSED_OWNERS,
                owners,
                result_type=list[str],
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=2),
            )
        except FailureError as exc:  # the check is best effort: the next one tries again
            workflow.logger.warning("owner check failed: %s", exc)
            return
        for gang_id in closed:
            workflow.logger.warning("gang %s has no running workflow any more: releasing what it held", gang_id)
            self.inbox.append(GangReleased(gang_id=gang_id))

    async def _deliver(self, decision: Decision) -> None:
        payload: Any
        if isinstance(decision, Admitted):
            gang_id, name, payload = decision.gang_id, PLACEMENT_SIGNAL, decision.placement.model_dump(mode="json")
        elif isinstance(decision, Rejected):
            gang_id, name, payload = decision.gang_id, REJECTED_SIGNAL, decision.reason
        elif isinstance(decision, Pending):
            gang_id, name, payload = decision.gang_id, PENDING_SIGNAL, decision.reason
        else:  # pragma: no cover - the union is closed
            return
        try:
            await workflow.get_external_workflow_handle(gang_id).signal(name, payload)
        except FailureError:
            # the gang's workflow is gone (cancelled, terminated): give its placement back
            if isinstance(decision, Admitted):
                self.inbox.append(GangReleased(gang_id=gang_id))
