"""The preemption notice, as GangTask reads and tells it.

The Scheduler preempts a gang with a ``Preempted`` decision (engine.scheduling), signalled to its GangTask
without ``kind`` and ``gang_id`` (engine.core.gang ``notice_payload``); GangTask passes it on to its node
agents with the grace that applies, they write it to the notice file every rank reads
(``engine.preemption()``) and send the plugin's notice signal. This module holds GangTask's words for it:
the attempt list's line, why the gang waits again, and the exception that ends a preempted attempt.
"""

from __future__ import annotations

from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.workflow import ActivityHandle

from engine.core.protocol import PREEMPTED_TYPE
from engine.scheduling import Preempted

__all__ = ["PreemptedAttempt", "preempted_outcome", "preemption_summary", "waiting_because"]


class PreemptedAttempt(Exception):
    """The Scheduler took the gang's placement back for another gang (see ``GangTask.on_preempt``)."""

    def __init__(self, notice: Preempted, lost_nodes: list[str] | None = None, outcome: str = "") -> None:
        super().__init__(notice.reason or "preempted")
        self.notice, self.lost_nodes, self.outcome = notice, lost_nodes or [], outcome

    @property
    def summary(self) -> str:
        return preemption_summary(self.notice)


def preemption_summary(notice: Preempted) -> str:
    """One line for the attempt list: who took the gang's placement, and why."""
    if notice.cause == "drain":
        reason = notice.reason or f"node {notice.by} is draining"
        return f"preempted: {reason}"
    return f"preempted by {notice.by} of {notice.by_tenant} ({notice.cause})"


def waiting_because(notice: Preempted) -> str:
    """Why a preempted gang waits again, in the words its user thinks in."""
    cause, by, tenant = notice.cause, notice.by, notice.by_tenant
    if cause == "reclaim":
        return f"{tenant} reclaimed its quota"
    if cause == "priority":
        return f"a higher-priority gang ({by}) needed the GPUs"
    if cause == "drain":
        return f"node {by} is draining"
    if cause == "backfill":
        return f"gang {by} of {tenant} was waiting before this backfilled gang started"
    return f"moved to make room for gang {by} of {tenant}"


def preempted_outcome(handles: list[ActivityHandle[bytes]], lost: set[str]) -> str:
    """How the ranks of a preempted attempt left, in the node agents' words: the slowest node's report."""
    reports: list[tuple[bool, float, str]] = []
    for handle in handles:
        failure = handle.exception() if handle.done() else None
        cause = failure.cause if isinstance(failure, ActivityError) else None
        if isinstance(cause, ApplicationError) and cause.type == PREEMPTED_TYPE:
            details = cause.details[0] if cause.details and isinstance(cause.details[0], dict) else {}
            seconds = details.get("seconds")
            slow = float(seconds) if isinstance(seconds, int | float) else 0.0
            reports.append((details.get("killed") is True, slow, cause.message.split(": ", 1)[-1]))
    parts = [max(reports)[2]] if reports else ["the ranks were stopped"]
    if lost:
        parts.append(f"node(s) {', '.join(sorted(lost))} lost meanwhile")
    return "; ".join(parts)
