"""A run started by a Temporal Schedule gets its own run id (``gangflow schedule``, engine/client/_schedules.py).

A schedule stores one envelope, built when it was created, and Temporal starts each of its runs as
``<schedule>-<time>`` with that same envelope, whose run id is the schedule's name. Every run must have its
own id in its run context: logs and checkpoints are filed under it, so without this all the runs of a
schedule would share their logs, and a nightly training run would resume from last night's checkpoint.

Only a run that Temporal says a schedule started (its ``TemporalScheduledById`` search attribute), whose
envelope names that schedule, is renamed: every other run (and so every run recorded before schedules
existed) keeps its context unchanged, and replays as it ran.
"""

from __future__ import annotations

from dataclasses import replace

from temporalio import workflow
from temporalio.common import SearchAttributeKey

from engine.core.protocol import SCHEDULED_BY_ATTRIBUTE
from engine.core.wire import RunContext

__all__ = ["SCHEDULED_BY", "own_run_context", "scheduled_run_context"]

#: set by Temporal on every workflow a schedule starts: the schedule's id
SCHEDULED_BY = SearchAttributeKey.for_keyword(SCHEDULED_BY_ATTRIBUTE)


def own_run_context(run: RunContext, workflow_id: str, scheduled_by: str | None) -> RunContext:
    """``run`` with the workflow's own id when a schedule named like the envelope's run id started it."""
    if scheduled_by is None or scheduled_by != run.run_id or not workflow_id.startswith(f"{run.run_id}-"):
        return run
    return replace(run, run_id=workflow_id)


def scheduled_run_context(run: RunContext) -> RunContext:
    """``own_run_context`` for the current workflow (call it inside a workflow only)."""
    info = workflow.info()
    return own_run_context(run, info.workflow_id, info.typed_search_attributes.get(SCHEDULED_BY))
