"""GangRun: one distributed task call, run as a gang of rank processes on the nodes the Scheduler gives.

request a placement → reserve a rendezvous port on node rank 0 → start one activity per node on that
node's own queue (``node/<id>``) → wait; the first rank failure stops every other node's ranks → give
the placement back (always, also when cancelled) → rank 0's encoded result is the task's result.

The node activities get no retries from Temporal (``maximum_attempts=1``): a retry would be queued on
the same node's queue, which may belong to a dead machine. This workflow owns what happens next.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception
from temporalio.workflow import ActivityCancellationType, ActivityHandle

from engine.core.gang import NodeLaunch
from engine.core.wire import Envelope
from engine.scheduling import Placement
from workflows.scheduler import PENDING_SIGNAL, PLACEMENT_SIGNAL, REJECTED_SIGNAL, SCHEDULER_ID

__all__ = ["GANG_TYPE", "RESERVE_PORT", "RUN_RANKS", "GangRun", "GangSpec", "node_queue"]

GANG_TYPE = "GangRun"
RUN_RANKS = "gangflow.run_ranks"
RESERVE_PORT = "gangflow.reserve_port"


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


def _rank_failure(err: ActivityError) -> str:
    cause = err.cause
    if isinstance(cause, ApplicationError):
        return cause.message
    return f"{err.message}: {cause}" if cause else err.message


@workflow.defn(name=GANG_TYPE, sandboxed=False)
class GangRun:
    def __init__(self) -> None:
        self.placement: Placement | None = None
        self.rejected: str | None = None
        self.pending: str | None = None
        self.phase = "submitted"

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

    @workflow.query(name="status")
    def status(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "pending": self.pending,
            "placement": self.placement.model_dump(mode="json") if self.placement else None,
        }

    def _say(self, text: str) -> None:
        self.phase = text
        workflow.set_current_details(text)

    @workflow.run
    async def run(self, spec: GangSpec, envelope: bytes) -> bytes:
        gang_id = workflow.info().workflow_id
        scheduler = workflow.get_external_workflow_handle(SCHEDULER_ID)
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
            if self.rejected is not None:
                raise ApplicationError(self.rejected, type="Unschedulable", non_retryable=True)
            assert self.placement is not None
            return await self._attempt(spec, envelope, self.placement, attempt=0)
        finally:
            # Always hand the GPUs back, even when this run is being cancelled.
            await scheduler.signal("release", gang_id)

    async def _attempt(self, spec: GangSpec, envelope: bytes, placement: Placement, attempt: int) -> bytes:
        run = Envelope.decode(envelope).run
        nodes = sorted(placement.nodes, key=lambda n: n.node_rank)
        self._say(f"starting on {', '.join(n.node_id for n in nodes)}")
        port: int = await workflow.execute_activity(
            RESERVE_PORT,
            task_queue=node_queue(nodes[0].node_id),
            result_type=int,
            start_to_close_timeout=timedelta(seconds=10),
            schedule_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=3),
        )
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
            )
            handles.append(
                workflow.start_activity(
                    RUN_RANKS,
                    args=[launch, envelope],
                    task_queue=node_queue(node.node_id),
                    result_type=bytes,
                    start_to_close_timeout=timedelta(seconds=spec.timeout_s),
                    heartbeat_timeout=timedelta(seconds=spec.heartbeat_timeout_s),
                    retry_policy=RetryPolicy(maximum_attempts=1),
                    cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                    summary=f"{spec.task} ranks on {node.node_id} (node rank {node.node_rank})",
                )
            )
        self._say(f"running: {spec.nnodes * spec.nproc_per_node} ranks on {', '.join(n.node_id for n in nodes)}")
        try:
            await workflow.wait(handles, return_when=asyncio.FIRST_EXCEPTION)
        except asyncio.CancelledError:
            await self._stop(handles)
            raise
        failed = [h for h in handles if h.done() and h.exception() is not None]
        if failed:
            await self._stop(handles)
            err = failed[0].exception()
            if isinstance(err, ActivityError) and not is_cancelled_exception(err):
                raise ApplicationError(_rank_failure(err), type="RankFailed", non_retryable=True) from err
            raise err  # type: ignore[misc]
        return handles[0].result()

    async def _stop(self, handles: list[ActivityHandle[bytes]]) -> None:
        """Cancel every node's ranks and wait until each node agent confirms they are gone."""
        for handle in handles:
            if not handle.done():
                handle.cancel()
        await asyncio.gather(*handles, return_exceptions=True)
