"""GangRun: one distributed task call, run as a gang of rank processes on the nodes the Scheduler gives.

Each attempt: request a placement → reserve a fresh rendezvous port on node rank 0 → start one activity
per node on that node's own queue (``node/<id>``) → wait; the first failure stops every other node's
ranks → give the placement back (always, also when cancelled). Rank 0's encoded result is the result.

When an attempt fails, the failure is classified. A *system* failure (a node lost: heartbeat or
schedule-to-start timeout; a rank killed by a signal; a hung gang) spends the restart budget
(``max_restarts``): lost nodes are reported to the Scheduler, and every rank is relaunched on a new
placement with ``GANGFLOW_ATTEMPT`` + 1 and the same checkpoint folder. A *user* error (an exception in
the task body) is retried only as far as the task's retry policy says. The budget and the attempt list
live in workflow state, so they survive any crash of workers or server.

The node activities get no retries from Temporal (``maximum_attempts=1``): a retry would be queued on
the same node's queue, which may belong to a dead machine. This workflow owns every retry.
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    TimeoutError,
    TimeoutType,
    is_cancelled_exception,
)
from temporalio.workflow import ActivityCancellationType, ActivityHandle

from engine.core.gang import NodeLaunch
from engine.core.wire import Envelope
from engine.scheduling import Placement
from workflows.scheduler import PENDING_SIGNAL, PLACEMENT_SIGNAL, REJECTED_SIGNAL, SCHEDULER_ID

__all__ = ["GANG_TYPE", "REMOTE_COMMAND", "RESERVE_PORT", "RUN_RANKS", "GangRun", "GangSpec", "node_queue"]

GANG_TYPE = "GangRun"
RUN_RANKS = "gangflow.run_ranks"
RESERVE_PORT = "gangflow.reserve_port"
#: a launcher's command for another node (MPI proxies), relayed through this workflow
REMOTE_COMMAND = "remote_command"


def node_queue(node_id: str) -> str:
    return f"node/{node_id}"


@dataclass(frozen=True)
class GangSpec:
    """What the user-workflow shell asks GangRun to run (the task's layout and limits)."""

    task: str
    call: str  # unique per task call within the run, e.g. "train-1": names logs and checkpoints
    nnodes: int
    nproc_per_node: int
    gpus_per_node: int
    cpus_per_node: float
    mem_per_node: int | None
    timeout_s: float
    heartbeat_timeout_s: float
    tenant: str
    max_restarts: int = 3
    user_attempts: int = 1
    retry_backoff_s: float = 1.0
    hang_timeout_s: float | None = None


class _AttemptFailed(Exception):
    def __init__(self, system: bool, reason: str, lost_nodes: list[str]) -> None:
        super().__init__(reason)
        self.system, self.reason, self.lost_nodes = system, reason, lost_nodes


_SYSTEM_TYPES = ("RankKilled", "RankHung")
_NODE_LOST = (TimeoutType.HEARTBEAT, TimeoutType.SCHEDULE_TO_START, TimeoutType.SCHEDULE_TO_CLOSE)


def _classify(err: BaseException, node_id: str) -> tuple[bool, str, bool] | None:
    """(system?, reason, node lost?) for one node's failure; None when it was only our own cancel."""
    if not isinstance(err, ActivityError) or is_cancelled_exception(err):
        return None
    cause = err.cause
    if isinstance(cause, TimeoutError):
        if cause.type in _NODE_LOST:
            return True, f"node {node_id} lost ({cause.type.name.lower().replace('_', '-')} timeout)", True
        return False, f"the task exceeded its timeout on node {node_id}", False
    if isinstance(cause, ApplicationError):
        if cause.type == "NodeShutdown":
            return True, cause.message, True
        return cause.type in _SYSTEM_TYPES, cause.message, False
    return True, f"node {node_id}: {err.message}: {cause}", False


def _record(order: list[int], index: int, _: object) -> None:
    order.append(index)


def _first_line(text: str) -> str:
    return text.splitlines()[0] if text else text


@workflow.defn(name=GANG_TYPE, sandboxed=False)
class GangRun:
    def __init__(self) -> None:
        self.placement: Placement | None = None
        self.rejected: str | None = None
        self.pending: str | None = None
        self.phase = "submitted"
        self.attempts: list[dict[str, Any]] = []  # one entry per failed attempt
        self.restarts = 0
        self.remote: dict[str, list[str]] = {}  # "<attempt>/<node rank>" -> command

    @workflow.signal(name=PLACEMENT_SIGNAL)
    def on_placement(self, placement: dict[str, Any]) -> None:
        self.placement = Placement.model_validate(placement)

    @workflow.signal(name=REJECTED_SIGNAL)
    def on_rejected(self, reason: str) -> None:
        self.rejected = reason

    @workflow.signal(name=PENDING_SIGNAL)
    def on_pending(self, reason: str) -> None:
        self.pending = reason
        self._say(reason)

    @workflow.signal(name=REMOTE_COMMAND)
    def on_remote_command(self, payload: dict[str, Any]) -> None:
        self.remote[f"{payload['attempt']}/{payload['node_rank']}"] = list(payload["command"])

    @workflow.query(name=REMOTE_COMMAND)
    def remote_command(self, attempt: int, node_rank: int) -> list[str] | None:
        return self.remote.get(f"{attempt}/{node_rank}")

    @workflow.query(name="status")
    def status(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "pending": self.pending,
            "placement": self.placement.model_dump(mode="json") if self.placement else None,
            "restarts": self.restarts,
            "failed_attempts": self.attempts,
        }

    def _say(self, text: str) -> None:
        self.phase = text
        workflow.set_current_details(text)

    @workflow.run
    async def run(self, spec: GangSpec, envelope: bytes) -> bytes:
        gang_id = workflow.info().workflow_id
        scheduler = workflow.get_external_workflow_handle(SCHEDULER_ID)
        user_failures = 0
        attempt = 0
        while True:
            placement = await self._place(spec, scheduler)
            failure: _AttemptFailed | None = None
            try:
                return await self._attempt(spec, envelope, placement, attempt)
            except _AttemptFailed as failed:
                failure = failed
            finally:
                # Always hand the GPUs back (also when this run is being cancelled), after reporting
                # lost nodes so the Scheduler never offers them again.
                for node_id in failure.lost_nodes if failure else []:
                    await scheduler.signal("node_lost", node_id)
                await scheduler.signal("release", gang_id)
            assert failure is not None
            kind = "system" if failure.system else "user"
            self.attempts.append({"attempt": attempt, "kind": kind, "reason": failure.reason})
            if failure.system:
                self.restarts += 1
                if self.restarts > spec.max_restarts:
                    raise ApplicationError(
                        self._summary(f"restart budget exhausted ({spec.max_restarts} restarts) after system failures"),
                        type="RestartBudgetExhausted",
                        non_retryable=True,
                    )
            else:
                user_failures += 1
                if user_failures >= spec.user_attempts:
                    allowed = f"{spec.user_attempts} attempt(s) allowed by the task's retry policy"
                    raise ApplicationError(
                        self._summary(f"user error in the task body, not restarted ({allowed})"),
                        type="RankFailed",
                        non_retryable=True,
                    )
                await workflow.sleep(timedelta(seconds=spec.retry_backoff_s * 2 ** (user_failures - 1)))
            attempt += 1
            self._say(f"restarting (attempt {attempt}) after {kind} failure: {_first_line(failure.reason)}")

    def _summary(self, headline: str) -> str:
        lines = [headline + ":"]
        lines += [f"  attempt {a['attempt']} [{a['kind']}] {_first_line(a['reason'])}" for a in self.attempts]
        lines.append(f"last failure: {self.attempts[-1]['reason']}")
        return "\n".join(lines)

    async def _place(self, spec: GangSpec, scheduler: Any) -> Placement:
        gang_id = workflow.info().workflow_id
        self.placement, self.rejected, self.pending = None, None, None
        request = {
            "gang_id": gang_id,
            "nnodes": spec.nnodes,
            "gpus_per_node": spec.gpus_per_node,
            "cpus_per_node": spec.cpus_per_node,
            "mem_per_node": spec.mem_per_node,
            "tenant": spec.tenant,
        }
        try:
            await scheduler.signal("submit", request)
        except Exception as exc:
            raise ApplicationError(
                "no gangflow scheduler is running: start node agents ('gangflow node' or 'gangflow dev --nodes N')",
                type="Unschedulable",
                non_retryable=True,
            ) from exc
        self._say(f"waiting for a placement: {spec.nnodes} node(s) × {spec.nproc_per_node} rank(s)")
        try:
            await workflow.wait_condition(lambda: self.placement is not None or self.rejected is not None)
        except asyncio.CancelledError:
            await scheduler.signal("release", gang_id)  # withdraw the queued request
            raise
        if self.rejected is not None:
            await scheduler.signal("release", gang_id)
            raise ApplicationError(self.rejected, type="Unschedulable", non_retryable=True)
        assert self.placement is not None
        return self.placement

    async def _attempt(self, spec: GangSpec, envelope: bytes, placement: Placement, attempt: int) -> bytes:
        run = Envelope.decode(envelope).run
        nodes = sorted(placement.nodes, key=lambda n: n.node_rank)
        where = ", ".join(n.node_id for n in nodes)
        self._say(f"attempt {attempt}: starting on {where}")
        try:
            port: int = await workflow.execute_activity(
                RESERVE_PORT,
                task_queue=node_queue(nodes[0].node_id),
                result_type=int,
                start_to_close_timeout=timedelta(seconds=10),
                schedule_to_close_timeout=timedelta(seconds=spec.heartbeat_timeout_s + 5),
                retry_policy=RetryPolicy(maximum_attempts=3),
            )
        except ActivityError as err:
            verdict = _classify(err, nodes[0].node_id)
            assert verdict is not None
            raise _AttemptFailed(True, verdict[1], [nodes[0].node_id]) from err
        checkpoint_dir = f"{run.artifacts}/checkpoints/{run.run_id}/{spec.call}"
        handles: list[ActivityHandle[bytes]] = []
        for node in nodes:
            launch = NodeLaunch(
                gang_id=workflow.info().workflow_id,
                task=spec.task,
                node_id=node.node_id,
                node_rank=node.node_rank,
                nnodes=spec.nnodes,
                nproc_per_node=spec.nproc_per_node,
                gpu_ids=list(node.gpu_ids),
                cpus_per_node=spec.cpus_per_node,
                master_addr=nodes[0].address,
                master_port=port,
                attempt=attempt,
                checkpoint_dir=checkpoint_dir,
                log_name=spec.call,
                hang_timeout_s=spec.hang_timeout_s,
                hosts=[n.node_id for n in nodes],
            )
            handles.append(
                workflow.start_activity(
                    RUN_RANKS,
                    args=[launch, envelope],
                    task_queue=node_queue(node.node_id),
                    result_type=bytes,
                    start_to_close_timeout=timedelta(seconds=spec.timeout_s),
                    # a node that never picks its work up is as lost as one that stops heartbeating
                    schedule_to_start_timeout=timedelta(seconds=max(30.0, spec.heartbeat_timeout_s)),
                    heartbeat_timeout=timedelta(seconds=spec.heartbeat_timeout_s),
                    retry_policy=RetryPolicy(maximum_attempts=1),
                    cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                    summary=f"{spec.task} attempt {attempt}: ranks on {node.node_id} (node rank {node.node_rank})",
                )
            )
        self._say(f"attempt {attempt}: {spec.nnodes * spec.nproc_per_node} ranks running on {where}")
        finished: list[int] = []  # node indexes in the order their activities ended (deterministic on replay)
        for index, handle in enumerate(handles):
            handle.add_done_callback(functools.partial(_record, finished, index))
        try:
            await workflow.wait(handles, return_when=asyncio.FIRST_EXCEPTION)
        except asyncio.CancelledError:
            await self._stop(handles)
            raise
        if all(h.done() and h.exception() is None for h in handles):
            return handles[0].result()
        # Stop the survivors first, then judge: the root cause (a node that vanished, a rank killed
        # from outside) often reports after its peers' collective errors ("connection closed by peer").
        self._say(f"attempt {attempt}: a rank failed; stopping the others and waiting for every node to confirm")
        await self._stop(handles)
        verdicts: list[tuple[str, bool, str, bool]] = []
        for index in finished:  # earliest failure first: it is the likely root cause among equals
            failure = handles[index].exception()
            verdict = _classify(failure, nodes[index].node_id) if failure is not None else None
            if verdict is not None:
                verdicts.append((nodes[index].node_id, *verdict))
        if not verdicts:  # every node reported cancellation: treat as lost contact
            raise _AttemptFailed(True, "the gang's node activities were cancelled", [])
        system = [v for v in verdicts if v[1]]
        lost = [node_id for node_id, _, _, node_lost in verdicts if node_lost]
        root = system[0] if system else verdicts[0]
        raise _AttemptFailed(bool(system), root[2], lost)

    async def _stop(self, handles: list[ActivityHandle[bytes]]) -> None:
        """Cancel every node's ranks and wait until each node agent confirms they are gone."""
        for handle in handles:
            if not handle.done():
                handle.cancel()
        await asyncio.gather(*handles, return_exceptions=True)
