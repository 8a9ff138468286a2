"""The Scheduler: one long-lived durable workflow per cluster (namespace) that owns the node inventory
and the gang queue.

It is a thin shell around the pure policy in ``engine.scheduling``: signals become events, the policy
returns decisions, and each decision is signalled to the GangRun workflow it concerns. It never polls:
it sleeps until a signal arrives. It continues as new when Temporal suggests it (or after a few
thousand events), carrying its state as plain JSON, so its history stays small however long it lives.
Node agents start it on first registration (signal-with-start), so there is nothing to deploy by hand.
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter, ValidationError
from temporalio import workflow
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
    describe,
    step,
)

__all__ = [
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
_MAX_EVENTS_PER_RUN = 4000
_EVENTS: TypeAdapter[Event] = TypeAdapter(Event)


@workflow.defn(name=SCHEDULER_TYPE, sandboxed=False)
class Scheduler:
    def __init__(self) -> None:
        self.state = ClusterState()
        self.inbox: list[Event] = []
        self.outbox: list[Decision] = []
        self.handled = 0

    # -- inputs ----------------------------------------------------------------------------------
    # A signal handler that raises would fail the workflow task again and again: bad input is logged
    # (a node) or answered with a rejection (a gang), never raised.
    @workflow.signal(name="register_node")
    def register_node(self, spec: dict[str, Any]) -> None:
        try:
            self.inbox.append(NodeRegistered(spec=NodeSpec.model_validate(spec)))
        except ValidationError as exc:
            workflow.logger.warning("ignoring a malformed node registration %r: %s", spec, exc)

    @workflow.signal(name="node_lost")
    def node_lost(self, node_id: str) -> None:
        self.inbox.append(NodeLost(node_id=node_id))

    @workflow.signal(name="submit")
    def submit(self, request: dict[str, Any]) -> None:
        try:
            self.inbox.append(GangSubmitted(request=GangRequest.model_validate(request)))
        except ValidationError as exc:
            self.outbox.append(Rejected(gang_id=str(request.get("gang_id", "")), reason=f"malformed request: {exc}"))

    @workflow.signal(name="release")
    def release(self, gang_id: str) -> None:
        self.inbox.append(GangReleased(gang_id=gang_id))

    @workflow.query(name="describe")
    def describe(self) -> dict[str, Any]:
        return describe(self.state)

    # -- the loop --------------------------------------------------------------------------------
    @workflow.run
    async def run(self, carried: dict[str, Any] | None = None) -> None:
        if carried:
            self.state = ClusterState.model_validate(carried["state"])
            self.inbox = [_EVENTS.validate_python(e) for e in carried.get("inbox", [])]
        while True:
            await workflow.wait_condition(lambda: bool(self.inbox or self.outbox))
            while self.outbox:
                await self._deliver(self.outbox.pop(0))
            while self.inbox:
                event = self.inbox.pop(0)
                self.state, decisions = step(self.state, event)
                self.handled += 1
                for decision in decisions:
                    await self._deliver(decision)
            if self.handled >= _MAX_EVENTS_PER_RUN or workflow.info().is_continue_as_new_suggested():
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(
                    {
                        "state": self.state.model_dump(mode="json"),
                        "inbox": [_EVENTS.dump_python(e, mode="json") for e in self.inbox],
                    }
                )

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
