"""The Scheduler: one long-lived durable workflow per cluster (namespace) that owns the node inventory,
the tenants' queues and the gangs' placements.

It is a thin shell around the pure policy in ``engine.scheduling`` (``Policy``): signals become events, the
policy returns decisions (admit, reject, preempt, a pending reason that changed), and each decision is
signalled to the GangTask workflow it concerns. The events waiting at a wake-up are decided first and their
decisions then go out without waiting for their acknowledgements, ``MAX_IN_FLIGHT`` at most (so the next
events are decided meanwhile, not one round trip per decision); a gang's superseded pending reasons are
never sent. It sleeps until a signal arrives or its ticker fires (every few seconds: the registrations of
agents from before node leases expire, a gang's wait for lost nodes runs out, a gang becomes old enough to
preempt, and now and then the owners of allocations are checked, in the background). It continues as new
when Temporal suggests it or after ``max_events`` events, checked after every event, carrying the policy's
compact snapshot and everything not yet handled or delivered, so its history stays small however long it
lives. Nodes come and go through their leases (workflows.node_lease): one signal when a node registers, one
when it is lost, none while it lives; a run started afresh (no carried state: terminated and restarted by
the platform worker) re-learns the nodes whose leases run (``_learn_leases``). The platform worker keeps it
running (engine.runtime.keeper), so there is nothing to deploy by hand; ``gangflow queues apply`` (the
update ``apply_queues``, validated before it is accepted) sets tenants, cohorts, quotas and priority classes;
``gangflow node drain|undrain`` (the update ``drain_node``, validated the same way) takes a node out of
service and back.

Nothing leaks: an allocation lives only as long as the GangTask that owns it. A GangTask releases its
placement itself when it ends, is cancelled, preempted, or its parent run is terminated (the user-workflow
shell starts gangs with the parent-close policy REQUEST_CANCEL). What it cannot release (a GangTask
terminated directly, or timed out) is found by the owner check: a local activity describes the owners of
every allocation and queued request, and the closed ones are released.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from datetime import timedelta
from typing import Any

from pydantic import TypeAdapter, ValidationError
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError, FailureError

from engine.core.gang import notice_payload
from engine.core.protocol import (
    APPLY_QUEUES_UPDATE,
    CHECKPOINTED_SIGNAL,
    CLOSED_OWNERS,
    DESCRIBE_QUERY,
    DRAIN_NODE_UPDATE,
    LEASE_CHECK_SIGNAL,
    LEASED_NODES,
    LEDGER_SIGNAL,
    NODE_LOST_SIGNAL,
    NODE_QUERY,
    PENDING_SIGNAL,
    PLACEMENT_SIGNAL,
    PREEMPT_SIGNAL,
    QUEUES_QUERY,
    REGISTER_NODE_SIGNAL,
    REJECTED_SIGNAL,
    RELEASE_SIGNAL,
    SCHEDULER_TYPE,
    SUBMIT_SIGNAL,
    lease_id,
)
from engine.scheduling import (
    Admitted,
    ConfigApplied,
    Decision,
    Event,
    GangCheckpointed,
    GangRejected,
    GangReleased,
    GangRequest,
    GangSubmitted,
    NodeLost,
    NodeRegistered,
    NodeSpec,
    Pending,
    Policy,
    Preempted,
    QueueConfigError,
    Tick,
    drain_request,
    dump_queue_config,
    load_queue_config,
)

__all__ = [
    "Scheduler",
]

MAX_EVENTS_PER_RUN = 4000
#: Scheduler runs recorded before it rejected a gang no registered node could hold at once; from this patch on
#: such a gang waits for a node to register (Policy.wait_for_nodes), up to its lost_node_wait_s
NODE_WAIT_PATCH = "wait-for-nodes"
#: Scheduler runs recorded before a gang waiting for its victims held what they free (Policy.hold_for_victims):
#: a gang of lower priority could take it and be preempted for it again, in a loop (issue 22)
HOLD_PATCH = "hold-for-victims"
#: Scheduler runs recorded before a gang preferring a topology level moved its victims out of one domain where
#: it could (Policy.defrag_preferred): they chose them topology-blind
DEFRAG_PREFERRED_PATCH = "defrag-preferred-topology"
#: Scheduler runs recorded before a gang named the victim too young to go that it waits for
#: (Policy.name_young_victims): its reason said only what stops it
YOUNG_VICTIMS_PATCH = "name-young-victims"
#: Scheduler runs recorded before a gang of several flavors, refused on every one of them in a cycle, was passed
#: over without choosing among them (Policy.skip_refused_flavors): it chose one again, for nothing
REFUSED_FLAVORS_PATCH = "skip-refused-flavors"
#: Scheduler runs recorded before node leases: a run started afresh knew no node until agents re-registered;
#: from this patch on it re-learns the nodes from their running leases (workflows.node_lease)
NODE_LEASE_PATCH = "node-leases"
#: workflow.patched id: from here on the Scheduler's looks (owners, leases) are activities, not local activities
ACTIVITIES_PATCH = "scheduler-looks-are-activities"
#: how often the Scheduler wakes up by itself (deadlines have this granularity)
TICK = timedelta(seconds=5)
#: how often the owners of allocations are checked (on a tick), when there is anything to check
OWNER_CHECK_EVERY = timedelta(seconds=15)
#: at most this many decisions are being signalled (sent, not yet acknowledged) at a time: the Scheduler
#: decides the next events meanwhile. Each acknowledgement is an event, and more than 100 of them arriving
#: during one workflow task make the server force-fail it (history.maximumBufferedEventsBatch): the worker
#: then replays the whole run. Small also means more superseded pending reasons are dropped unsent.
MAX_IN_FLIGHT = 50
#: how many node ids the refusal of an unknown node lists
KNOWN_NODES_SHOWN = 20
_EVENTS: TypeAdapter[Event] = TypeAdapter(Event)
_DECISIONS: TypeAdapter[Decision] = TypeAdapter(Decision)


@workflow.defn(name=SCHEDULER_TYPE, sandboxed=False)
class Scheduler:
    # The carried state is restored here, before any handler runs: a run's first workflow task delivers the
    # signals and updates that came before it ahead of ``run``, and an update handled then must see (and
    # change) the restored policy, not a fresh one that ``run`` would replace.
    @workflow.init
    def __init__(self, carried: Any = None) -> None:
        self.policy = Policy()
        self.inbox: list[Event] = []
        self.outbox: list[Decision] = []
        self.handled = 0
        self.tick_due = False
        self.sending: dict[str, asyncio.Task[None]] = {}  # gang id -> its last signal not yet acknowledged
        self.checking: asyncio.Task[None] | None = None  # the owner check in progress
        self.learning: asyncio.Task[None] | None = None  # a fresh run's look at the running node leases
        self.owners_checked = 0.0  # workflow time of the last owner check (carried across continue-as-new)
        self.max_events = MAX_EVENTS_PER_RUN
        self.versioned = False  # whether this run's behaviour version is decided (``_step``)
        self._restore(carried)

    # -- inputs ----------------------------------------------------------------------------------
    # A signal handler that raises would fail the workflow task again and again: every payload is taken
    # as Any and checked here; bad input is logged (or answered with a rejection), never raised.
    @workflow.signal(name=REGISTER_NODE_SIGNAL)
    def register_node(self, spec: Any) -> None:
        try:
            self.inbox.append(NodeRegistered(spec=NodeSpec.model_validate(spec)))
        except (ValidationError, TypeError, ValueError) as exc:
            workflow.logger.warning("ignoring a malformed node registration %r: %s", spec, exc)

    @workflow.signal(name=NODE_LOST_SIGNAL)
    def node_lost(self, node_id: Any) -> None:
        if isinstance(node_id, str) and node_id:
            self.inbox.append(NodeLost(node_id=node_id))
        else:
            workflow.logger.warning("ignoring a malformed node_lost signal %r", node_id)

    @workflow.signal(name=SUBMIT_SIGNAL)
    def submit(self, request: Any) -> None:
        try:
            self.inbox.append(GangSubmitted(request=GangRequest.model_validate(request)))
        except (ValidationError, TypeError, ValueError) as exc:
            gang_id = request.get("gang_id") if isinstance(request, dict) else None
            if isinstance(gang_id, str) and gang_id:  # someone waits for an answer: tell it what is wrong
                self.outbox.append(GangRejected(gang_id=gang_id, reason=f"rejected: malformed request: {exc}"))
            else:
                workflow.logger.warning("ignoring a malformed gang request %r: %s", request, exc)

    @workflow.signal(name=RELEASE_SIGNAL)
    def release(self, gang_id: Any) -> None:
        if isinstance(gang_id, str) and gang_id:
            self.inbox.append(GangReleased(gang_id=gang_id))
        else:
            workflow.logger.warning("ignoring a malformed release signal %r", gang_id)

    @workflow.signal(name=CHECKPOINTED_SIGNAL)
    def checkpointed(self, payload: Any) -> None:
        try:
            fields = {k: v for k, v in payload.items() if k != "kind"} if isinstance(payload, dict) else payload
            self.inbox.append(GangCheckpointed.model_validate(fields))
        except (ValidationError, TypeError, ValueError) as exc:
            workflow.logger.warning("ignoring a malformed checkpoint report %r: %s", payload, exc)

    @workflow.signal(name=LEDGER_SIGNAL)
    def ledger(self, payload: Any) -> None:
        # counted at once, not an event of the policy's: it changes no decision (engine.scheduling.counters)
        if not self.policy.counters.ledger(payload):
            workflow.logger.warning("ignoring a malformed goodput ledger %r", payload)

    @workflow.update(name=APPLY_QUEUES_UPDATE)
    def apply_queues(self, config: Any) -> dict[str, Any]:
        """Apply a queue configuration (tenants, cohorts, quotas, priority classes) and return ``queues``
        as it is afterwards. Validated first (``_check_queues``): a bad one changes nothing. Events that
        arrived before it are decided first, under the configuration they were sent under."""
        while self.inbox:
            self._step(self.inbox.pop(0))
        self._step(ConfigApplied(config=load_queue_config(config)))
        return self.queues()

    @apply_queues.validator
    def _check_queues(self, config: Any) -> None:
        # a validator that raises rejects the update before it enters history: nothing is half-applied
        try:
            load_queue_config(config)
        except QueueConfigError as exc:
            raise ApplicationError(str(exc), type="QueueConfigError", non_retryable=True) from None

    @workflow.update(name=DRAIN_NODE_UPDATE)
    def drain_node(self, request: Any) -> dict[str, Any]:
        """Drain a node (``{"node_id", "drained": true, "reason"}``: it takes no new gangs and its preemptible
        gangs are preempted) or undrain it (``"drained": false``). Validated first (``_check_drain``): an
        unknown node or a malformed request changes nothing. Events that arrived before it are decided first.
        Returns what it did: the gangs ``preempted`` now, the ones ``remaining`` there (not preemptible),
        and the ones already ``leaving`` it (preempted earlier, not released yet)."""
        while self.inbox:
            self._step(self.inbox.pop(0))
        event = drain_request(request)
        decisions = self._step(event)
        preempted = [d.gang_id for d in decisions if isinstance(d, Preempted) and d.cause == "drain"]
        report = self.policy.drain_report(event.node_id)
        return {
            "node_id": event.node_id,
            "drained": event.drained,
            "reason": event.reason,
            "preempted": preempted,
            "remaining": report["remaining"],
            "leaving": [g for g in report["leaving"] if g not in preempted],
        }

    @drain_node.validator
    def _check_drain(self, request: Any) -> None:
        try:
            event = drain_request(request)
        except ValueError as exc:
            raise ApplicationError(f"bad drain request: {exc}", type="BadRequest", non_retryable=True) from None
        # a node whose first registration waits in the inbox is known: the update decides the inbox first
        known = {*self.policy.inventory.nodes, *(e.spec.node_id for e in self.inbox if isinstance(e, NodeRegistered))}
        if event.node_id not in known:
            names = sorted(known)
            listed = ", ".join(names[:KNOWN_NODES_SHOWN]) or "none (no node agent has registered)"
            if len(names) > KNOWN_NODES_SHOWN:
                listed += f" and {len(names) - KNOWN_NODES_SHOWN} more"
            raise ApplicationError(
                f"unknown node {event.node_id!r}; the nodes the Scheduler knows: {listed}",
                type="UnknownNode",
                non_retryable=True,
            )

    @workflow.query(name=DESCRIBE_QUERY)
    def describe(self) -> dict[str, Any]:
        return self.policy.describe()

    @workflow.query(name=NODE_QUERY)
    def node(self, node_id: Any = None) -> dict[str, Any] | None:
        # a bad payload is no node (a query must answer, never fail the caller's look)
        return self.policy.describe_node(node_id) if isinstance(node_id, str) else None

    @workflow.query(name=QUEUES_QUERY)
    def queues(self) -> dict[str, Any]:
        return {**self.policy.queues(), "config": dump_queue_config(self.policy.config)}

    # -- the loop --------------------------------------------------------------------------------
    @workflow.run
    async def run(self, carried: Any = None) -> None:  # the same input as __init__, which restored it
        ticker = asyncio.create_task(self._ticker())
        fresh = not (isinstance(carried, dict) and isinstance(carried.get("policy"), dict))
        if fresh and workflow.patched(NODE_LEASE_PATCH):  # in the background: events go on meanwhile
            self.learning = asyncio.create_task(self._learn_leases())
        try:
            while True:
                await workflow.wait_condition(
                    lambda: bool(self.inbox or self.tick_due or (self.outbox and len(self.sending) < MAX_IN_FLIGHT))
                )
                if self.tick_due:
                    self.tick_due = False
                    now = workflow.now().timestamp()
                    deadline = self.policy.next_deadline()
                    if deadline is not None and deadline < now:  # else a Tick would change nothing
                        self.inbox.append(Tick())
                    due = now - self.owners_checked >= OWNER_CHECK_EVERY.total_seconds()
                    if due and self._idle(self.checking):  # in the background: events go on meanwhile
                        self.checking = asyncio.create_task(self._check_owners())
                # the events waiting now are decided first, then their decisions are sent without waiting for
                # the acknowledgements (the next events are decided meanwhile); a continue-as-new is checked
                # after every event, and carries what is left once every signal in flight is acknowledged
                while self.inbox and not self._due():
                    self._step(self.inbox.pop(0))
                self._send()
                if self._due():
                    await workflow.wait_condition(
                        lambda: (
                            not self.sending
                            and self._idle(self.checking)
                            and self._idle(self.learning)
                            and workflow.all_handlers_finished()
                        )
                    )
                    workflow.continue_as_new(self._carry())
        finally:
            ticker.cancel()

    @staticmethod
    def _idle(task: asyncio.Task[None] | None) -> bool:
        return task is None or task.done()

    def _step(self, event: Event) -> list[Decision]:
        if not self.versioned:  # once per run, before its first event: the same point when it is replayed
            self.versioned = True
            self.policy.wait_for_nodes = workflow.patched(NODE_WAIT_PATCH)
            self.policy.hold_for_victims = workflow.patched(HOLD_PATCH)
            self.policy.defrag_preferred = workflow.patched(DEFRAG_PREFERRED_PATCH)
            self.policy.name_young_victims = workflow.patched(YOUNG_VICTIMS_PATCH)
            self.policy.skip_refused_flavors = workflow.patched(REFUSED_FLAVORS_PATCH)
        # a leased node reported lost by a gang stays lost for as long as its lease lives on (nothing else
        # registers it again): its lease is asked to check the agent. Never on a replay of older runs: a
        # node only has ``leased`` in runs recorded since node leases.
        node = self.policy.inventory.nodes.get(event.node_id) if isinstance(event, NodeLost) else None
        was_alive = node is not None and node.alive
        decisions = self.policy.step(event, workflow.now().timestamp())
        if node is not None and was_alive and node.spec.leased and not node.alive:
            self._check_lease(node.spec.node_id)
        self.outbox.extend(decisions)
        self.handled += 1
        return decisions

    def _due(self) -> bool:
        return self.handled >= self.max_events or workflow.info().is_continue_as_new_suggested()

    def _restore(self, carried: Any) -> None:
        if not isinstance(carried, dict):
            return
        if isinstance(carried.get("max_events"), int) and carried["max_events"] > 0:
            self.max_events = carried["max_events"]
        if isinstance(carried.get("owners_checked"), int | float):
            self.owners_checked = float(carried["owners_checked"])
        if isinstance(carried.get("policy"), dict):
            self.policy = Policy.restore(carried["policy"])
        self.inbox = [_EVENTS.validate_python(e) for e in carried.get("inbox", [])]
        self.outbox = [_DECISIONS.validate_python(d) for d in carried.get("outbox", [])]

    def _carry(self) -> dict[str, Any]:
        return {
            "policy": self.policy.snapshot(),
            "inbox": [_EVENTS.dump_python(e, mode="json") for e in self.inbox],
            "outbox": [_DECISIONS.dump_python(d, mode="json") for d in self.outbox],
            "max_events": self.max_events,
            "owners_checked": self.owners_checked,
        }

    @staticmethod
    async def _look(name: str, args: list[Any], timeout_s: float, attempts: int) -> list[Any]:
        """Run one of the Scheduler's looks outside it (the owners' workflows, the node leases): an activity on
        its own task queue. Runs recorded before ``ACTIVITIES_PATCH`` ran them as local activities, and replay
        so; a local activity's result can reach the workflow one task later than its marker was recorded (the
        SDK's race, met by a recorded fresh Scheduler whose lease look finished as its first task completed),
        and a replay that takes it one task earlier decides there, where the history has nothing: an
        activity's result is an event of its own, taken where it is."""
        options: dict[str, Any] = {
            "start_to_close_timeout": timedelta(seconds=timeout_s),
            "retry_policy": RetryPolicy(maximum_attempts=attempts),
        }
        if workflow.patched(ACTIVITIES_PATCH):
            found: list[Any] = await workflow.execute_activity(name, args=args, result_type=list[Any], **options)
        else:
            found = await workflow.execute_local_activity(name, args=args, result_type=list[Any], **options)
        return found

    async def _ticker(self) -> None:
        while True:
            await workflow.sleep(TICK)
            self.tick_due = True

    async def _check_owners(self) -> None:
        self.owners_checked = workflow.now().timestamp()
        owners = sorted({*self.policy.running, *self.policy.pending})
        if not owners:
            return
        try:
            closed: list[str] = await self._look(CLOSED_OWNERS, [owners], 30, 2)
        except FailureError as exc:  # the check is best effort: the next one tries again
            workflow.logger.warning("owner check failed: %s", exc)
            return
        for gang_id in closed:
            workflow.logger.warning("gang %s has no running workflow any more: releasing what it held", gang_id)
            self.inbox.append(GangReleased(gang_id=gang_id))

    async def _learn_leases(self) -> None:
        """A run started afresh: the nodes whose leases run now (their agents registered with a Scheduler
        that is gone) are registered again. A node this run has heard of meanwhile is not: its own signal
        is newer than the list, which comes from visibility and may lag."""
        try:
            specs: list[Any] = await self._look(LEASED_NODES, [], 60, 5)
        except FailureError as exc:  # the leases' own signals still come for every node that registers anew
            workflow.logger.warning("could not list the running node leases: %s", exc)
            return
        heard = {*self.policy.inventory.nodes, *(e.spec.node_id for e in self.inbox if isinstance(e, NodeRegistered))}
        heard |= {e.node_id for e in self.inbox if isinstance(e, NodeLost)}
        for spec in specs:
            try:
                event = NodeRegistered(spec=NodeSpec.model_validate(spec))
            except (ValidationError, TypeError, ValueError) as exc:
                workflow.logger.warning("ignoring a malformed node lease %r: %s", spec, exc)
                continue
            if event.spec.node_id not in heard:
                self.inbox.append(event)

    def _check_lease(self, node_id: str) -> None:
        """Signal the node's lease to check its agent, in the background (among ``sending``: a continue-as-new
        waits for it). A lease that ended (the loss was its own report) is gone: nothing to tell."""
        key = lease_id(node_id)
        if key in self.sending:
            return

        async def tell() -> None:
            with contextlib.suppress(FailureError):
                await workflow.get_external_workflow_handle(key).signal(LEASE_CHECK_SIGNAL, "reported lost")

        task = asyncio.create_task(tell())
        self.sending[key] = task
        task.add_done_callback(functools.partial(self._sent, key))

    def _send(self) -> None:
        """Start signalling the decisions in the outbox, at most ``MAX_IN_FLIGHT`` unacknowledged at a time;
        the rest wait in the outbox (and cross a continue-as-new there).

        Only the last ``Pending`` of a gang in the outbox is sent, and none when an admission or rejection
        of that gang follows it: a gang needs its current reason, not the history of the batch. The signals
        to one gang go one after the other, in order (a placement before the preemption of that placement)."""
        final: dict[str, int] = {}
        for index, decision in enumerate(self.outbox):
            if isinstance(decision, Pending | Admitted | GangRejected):
                final[decision.gang_id] = index
        wanted = [d for i, d in enumerate(self.outbox) if not isinstance(d, Pending) or final[d.gang_id] == i]
        room = max(0, MAX_IN_FLIGHT - len(self.sending))
        self.outbox = wanted[room:]
        for decision in wanted[:room]:
            gang_id = decision.placement.gang_id if isinstance(decision, Admitted) else decision.gang_id
            task = asyncio.create_task(self._deliver_after(self.sending.get(gang_id), decision))
            self.sending[gang_id] = task
            task.add_done_callback(functools.partial(self._sent, gang_id))

    def _sent(self, gang_id: str, task: asyncio.Task[None]) -> None:
        if self.sending.get(gang_id) is task:
            del self.sending[gang_id]

    async def _deliver_after(self, previous: asyncio.Task[None] | None, decision: Decision) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        await self._deliver(decision)

    async def _deliver(self, decision: Decision) -> None:
        payload: Any
        if isinstance(decision, Admitted):
            gang_id, name, payload = decision.gang_id, PLACEMENT_SIGNAL, decision.placement.model_dump(mode="json")
            if decision.flavor is not None:  # only then: a placement without flavors keeps its old payload
                payload["flavor"] = decision.flavor
        elif isinstance(decision, GangRejected):
            gang_id, name, payload = decision.gang_id, REJECTED_SIGNAL, decision.reason
        elif isinstance(decision, Pending):
            gang_id, name, payload = decision.gang_id, PENDING_SIGNAL, decision.reason
        elif isinstance(decision, Preempted):
            gang_id, name, payload = decision.gang_id, PREEMPT_SIGNAL, notice_payload(decision)
        else:  # pragma: no cover - the union is closed
            return
        try:
            await workflow.get_external_workflow_handle(gang_id).signal(name, payload)
        except FailureError:
            # the gang's workflow is gone (cancelled, terminated): give back what it held or was offered
            if isinstance(decision, Admitted | Preempted):
                self.inbox.append(GangReleased(gang_id=gang_id))
