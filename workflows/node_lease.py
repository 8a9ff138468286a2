"""A node's lease: its liveness, at no cost to the Scheduler while nothing changes.

Node agents used to re-register every 5 s, one signal each into the one Scheduler: at 1,000 nodes 200
signals/s, more than it sustains (about 116/s measured), and a history that grows with the cluster. Now each
agent starts one small workflow (this one, id ``lease_id(node)``, on the platform worker's queue) that

1. tells the Scheduler the node is there (one ``register_node`` signal, retried until a Scheduler takes it),
2. runs one long activity (``HOLD_LEASE``) on the node's own queue ``node/<id>``: the agent holds it for as
   long as it lives and heartbeats it (heartbeats are not in any history; the server keeps only the last),
3. when that activity ends (its heartbeat timeout: the agent died, hung, was stopped with SIGSTOP or lost
   its network; it was never picked up; or the agent stopped and returned it) tells the Scheduler the node is
   lost (one ``node_lost`` signal) and ends.
4. when a gang reports the node lost meanwhile (the Scheduler passes that on as ``LEASE_CHECK_SIGNAL``: the
   node's activities timed out, but its lease did not), pings the agent until it answers, then registers
   the node again. Agents re-registering every 5 s used to undo such a report by themselves; a lease that
   lives on sends nothing, so without this the node would stay lost for as long as its agent lives.

So the Scheduler hears of a node when it comes and when it goes, nothing in between, and a node is lost
``DEFAULT_NODE_TTL_S`` after its last heartbeat, as it was after its last re-registration. An agent that
finds its lease gone (it was stopped for longer than that) starts a new one; an agent that restarts
replaces its old lease (the start terminates it: it never reports the node lost). A Scheduler started
afresh (terminated, then restarted by the platform worker) re-learns the nodes from the running leases'
memos (``LEASED_NODES``); one that continues as new carries them.

Why not the alternatives: an aggregator that batches registrations still needs every agent to send it
something through Temporal, which is again one signal or update per node per period, into another
workflow; DescribeTaskQueue's poller list updates per long poll (about a minute) and keeps a dead worker
listed for minutes, far too slow to notice a lost node.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, FailureError

from engine.core.protocol import (
    HOLD_LEASE,
    LEASE_CHECK_SIGNAL,
    NODE_LEASE_TYPE,
    NODE_LOST_SIGNAL,
    PING,
    REGISTER_NODE_SIGNAL,
    SCHEDULER_ID,
    node_queue,
)
from engine.scheduling import DEFAULT_NODE_TTL_S

__all__ = ["LEASE_TIMEOUT", "NodeLease"]

#: no heartbeat (or no agent picking the lease up) for this long: the node is lost
LEASE_TIMEOUT = timedelta(seconds=DEFAULT_NODE_TTL_S)
#: a lease outlives any agent: this bound only exists because an activity must have one (then it is renewed)
_LEASE_LIFETIME = timedelta(days=365)
#: how long an agent has to answer a ping (and the pause before the next) after a gang reported its node lost
_PING_TIMEOUT = timedelta(seconds=5)
#: a signal the Scheduler did not take (it is not running: the platform worker starts it again within
#: seconds) is sent again after this long, doubling up to the last
_RETRY = (1, 2, 4, 8, 15, 30, 60)
#: a loss is worth telling a Scheduler for this long: one started afresh later never learns of the node
_LOST_TELL_S = 600.0


@workflow.defn(name=NODE_LEASE_TYPE, sandboxed=False)
class NodeLease:
    def __init__(self) -> None:
        self.checks = 0  # LEASE_CHECK signals not looked into yet

    @workflow.signal(name=LEASE_CHECK_SIGNAL)
    def check(self, _reason: Any = None) -> None:
        """A gang reported this node lost (its activities timed out: the agent was frozen, cut off, or
        restarted since the gang's attempt began) while this lease still runs. The Scheduler now offers the
        node to nobody, and no new registration would come from a lease that lives on: look into it."""
        self.checks += 1

    @workflow.run
    async def run(self, spec: Any) -> str:
        """Register ``spec`` (a node's NodeSpec as a dict), hold the lease, report the node lost; returns how
        the lease ended."""
        node_id = spec.get("node_id") if isinstance(spec, dict) else None
        if not isinstance(node_id, str) or not node_id:
            workflow.logger.warning("a node lease for a malformed spec %r: nothing to hold", spec)
            return "malformed spec"
        await self._tell(REGISTER_NODE_SIGNAL, spec, forever=True)
        hold = workflow.start_activity(
            HOLD_LEASE,
            node_id,
            task_queue=node_queue(node_id),
            result_type=str,
            schedule_to_start_timeout=LEASE_TIMEOUT,
            heartbeat_timeout=LEASE_TIMEOUT,
            start_to_close_timeout=_LEASE_LIFETIME,
            retry_policy=RetryPolicy(maximum_attempts=1),
        )
        try:
            while not hold.done():
                await workflow.wait_condition(lambda: hold.done() or self.checks > 0)
                if not hold.done():
                    self.checks = 0
                    await self._recheck(spec, node_id, hold)
        except asyncio.CancelledError:
            # cancelled by hand (a script cancelling every running workflow did, in the suite): the node leaves
            # the Scheduler's view as when the lease ends, and its agent, holding none now, starts another
            await self._tell(NODE_LOST_SIGNAL, node_id, forever=False)
            raise
        try:
            ended: str = hold.result()
        except ActivityError as exc:
            cause = exc.cause
            ended = f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)
        workflow.logger.info("node %s: lease ended (%s); telling the Scheduler it is lost", node_id, ended)
        await self._tell(NODE_LOST_SIGNAL, node_id, forever=False)
        return ended

    async def _recheck(self, spec: dict[str, Any], node_id: str, hold: workflow.ActivityHandle[str]) -> None:
        """Ping the agent until it answers (then register the node again) or the lease ends (then the node
        is lost indeed): an agent frozen for less than the lease's timeout is offered again once it thaws."""
        while not hold.done():
            try:
                await workflow.execute_activity(
                    PING,
                    task_queue=node_queue(node_id),
                    schedule_to_close_timeout=_PING_TIMEOUT,
                    retry_policy=RetryPolicy(maximum_attempts=1),
                    summary=f"is {node_id} back?",
                )
            except ActivityError:
                with contextlib.suppress(TimeoutError):  # the pause; the lease ending cuts it short
                    await workflow.wait_condition(hold.done, timeout=_PING_TIMEOUT)
                continue
            workflow.logger.info("node %s: reported lost, but its agent answers: registering it again", node_id)
            await self._tell(REGISTER_NODE_SIGNAL, spec, forever=False)
            return

    async def _tell(self, name: str, payload: Any, *, forever: bool) -> None:
        """Signal the Scheduler; while it is not running, again and again (backing off)."""
        waited = 0.0
        for attempt in range(1_000_000):
            try:
                await workflow.get_external_workflow_handle(SCHEDULER_ID).signal(name, payload)
                return
            except FailureError as exc:
                if not forever and waited >= _LOST_TELL_S:
                    workflow.logger.warning("the Scheduler did not take %s for %.0f s: %s", name, waited, exc)
                    return
            delay = _RETRY[min(attempt, len(_RETRY) - 1)]
            await workflow.sleep(delay)
            waited += delay
