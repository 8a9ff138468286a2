"""Worker assembly: the only place that builds Temporal workers."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from datetime import timedelta

from temporalio.client import Client
from temporalio.worker import Replayer, Worker

from engine.artifacts.loader import LOADER
from engine.core.protocol import TASK_QUEUE, TenantRoute
from engine.runtime import logs
from engine.runtime.activities import configure_threads, run_task
from engine.runtime.caching import CACHE_ACTIVITIES
from engine.runtime.gang_goodput import attempt_ledger_of, gang_goodput
from engine.runtime.guard import GuardedWorkflowRunner
from engine.runtime.leases import leased_nodes
from engine.runtime.owners import closed_owners
from engine.runtime.prefetch import prefetching_client, prefetching_converter
from workflows.gang import GangTask, LegacyGangRun
from workflows.mapping import MapChunk
from workflows.node_lease import NodeLease
from workflows.platform import TenantView
from workflows.scheduler import Scheduler
from workflows.shell import UserWorkflow, configure

__all__ = ["WORKFLOWS", "build_replayer", "build_worker", "preload"]

#: the workflows every gangflow worker runs (a replay of their histories needs the same set)
WORKFLOWS: tuple[type, ...] = (UserWorkflow, GangTask, LegacyGangRun, Scheduler, MapChunk, TenantView, NodeLease)


def preload(modules: Sequence[str]) -> None:
    """Import packages of workflows / tasks up front (``gangflow worker --load pkg``)."""
    for name in modules:
        importlib.import_module(name)


def build_worker(
    client: Client,
    *,
    task_queue: str = TASK_QUEUE,
    max_concurrent_activities: int = 100,
    max_concurrent_workflow_tasks: int = 100,
    route: TenantRoute | None = None,
) -> Worker:
    """A worker that runs user workflows and plain tasks from the same queue.

    Sharing one queue lets Temporal hand a task to this worker in the same round trip that scheduled it
    (eager activity dispatch), which roughly halves the per-task latency. User workflows run under the
    determinism guard, and their code is loaded before their first workflow task is timed (prefetch).
    ``route``: a tenant's worker in the isolated layout (its tenant and artifact root pinned, gangs through
    its Nexus endpoint).
    """
    configure(LOADER, route)
    configure_threads(max_concurrent_activities)
    logs.install()
    return Worker(
        prefetching_client(client),
        task_queue=task_queue,
        workflows=list(WORKFLOWS),
        unsandboxed_workflow_runner=GuardedWorkflowRunner(),
        activities=[run_task, closed_owners, leased_nodes, gang_goodput, attempt_ledger_of, *CACHE_ACTIVITIES],
        max_concurrent_activities=max_concurrent_activities,
        max_concurrent_workflow_tasks=max_concurrent_workflow_tasks,
        # A dead worker's sticky queue holds the next workflow task until this expires; the default
        # (10 s) would stall every run that worker owned after a crash.
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=2),
        # Heartbeats carry cancellation: keep them frequent so a cancel reaches a task within ~2 s.
        max_heartbeat_throttle_interval=timedelta(seconds=2),
        default_heartbeat_throttle_interval=timedelta(seconds=2),
        graceful_shutdown_timeout=timedelta(seconds=5),
    )


def build_replayer(route: TenantRoute | None = None) -> Replayer:
    """Replays recorded histories the way :func:`build_worker`'s worker runs them (same workflows, same
    runner, same code loader), without a server: ``tests/test_replay.py`` uses it so a workflow change
    that would break runs in flight fails there. ``route``: replay as a tenant's worker does."""
    configure(LOADER, route)
    return Replayer(
        workflows=list(WORKFLOWS),
        unsandboxed_workflow_runner=GuardedWorkflowRunner(),
        data_converter=prefetching_converter(),  # a heavy import must not trip the replay's deadlock timer either
    )
