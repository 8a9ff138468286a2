"""Worker assembly: the only place that builds Temporal workers."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from datetime import timedelta

from temporalio.client import Client
from temporalio.worker import Worker

from engine.artifacts.loader import LOADER
from engine.runtime import logs
from engine.runtime.activities import configure_threads, run_task
from engine.runtime.connection import TASK_QUEUE
from workflows.gang import GangRun
from workflows.scheduler import Scheduler
from workflows.shell import UserWorkflow, configure

__all__ = ["build_worker", "preload"]


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
) -> Worker:
    """A worker that runs user workflows and plain tasks from the same queue.

    Sharing one queue lets Temporal hand a task to this worker in the same round trip that scheduled it
    (eager activity dispatch), which roughly halves the per-task latency.
    """
    configure(LOADER)
    configure_threads(max_concurrent_activities)
    logs.install()
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[UserWorkflow, GangRun, Scheduler],
        activities=[run_task],
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
