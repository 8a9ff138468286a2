"""What one failed attempt of a gang means: GangTask's failure classification.

A *system* failure (a node lost: probe, heartbeat or schedule-to-start timeout; a node agent that shut down;
a rank killed by a signal; a hung gang; a rank whose code or inputs the platform could not deliver) spends the
gang's restart budget; a *user* error (an exception in the task body, the task's timeout) is retried only as far
as the task's retry policy says. A timeout only suggests a node is lost: GangTask probes its agent before
reporting it lost (see workflows.gang).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError, TimeoutType, is_cancelled_exception

__all__ = ["AttemptFailed", "Verdict", "attempt_record", "classify", "ended_line", "finish_record"]

#: the node agents' failure types that are the cluster's fault, not the task body's (engine.runtime.node)
_SYSTEM_TYPES = ("RankKilled", "RankHung", "RankUndelivered")
_NODE_LOST = (TimeoutType.HEARTBEAT, TimeoutType.SCHEDULE_TO_START, TimeoutType.SCHEDULE_TO_CLOSE)


class AttemptFailed(Exception):
    """An attempt failed: ``system`` says whether it spends a restart; ``lost_nodes`` go to the Scheduler."""

    def __init__(self, system: bool, reason: str, lost_nodes: list[str], error_type: str | None = None) -> None:
        super().__init__(reason)
        self.system, self.reason, self.lost_nodes, self.error_type = system, reason, lost_nodes, error_type


@dataclass(frozen=True)
class Verdict:
    """What one node's failure says."""

    node_id: str
    system: bool
    reason: str
    node_lost: bool
    error_type: str | None = None
    #: a timeout only suggests the node is lost: its agent is probed before it is reported lost
    suspect: bool = False


def classify(err: BaseException, node_id: str) -> Verdict | None:
    """What one node's failure means; None when it was only our own cancel."""
    if not isinstance(err, ActivityError) or is_cancelled_exception(err):
        return None
    cause = err.cause
    if isinstance(cause, TimeoutError):
        if cause.type in _NODE_LOST:
            return Verdict(
                node_id, True, f"node {node_id} lost ({cause.type.name.lower().replace('_', '-')} timeout)", True
            )
        return Verdict(node_id, False, f"the task exceeded its timeout on node {node_id}", False)
    if isinstance(cause, ApplicationError):
        if cause.type == "NodeShutdown":
            return Verdict(node_id, True, cause.message, True)
        details = cause.details[0] if cause.details and isinstance(cause.details[0], dict) else {}
        error_type = details.get("error_type") if isinstance(details.get("error_type"), str) else None
        return Verdict(node_id, cause.type in _SYSTEM_TYPES, cause.message, False, error_type)
    return Verdict(node_id, True, f"node {node_id}: {err.message}: {cause}", False)


#: how a rank left, as the node agents word it (engine.executor.launcher ``RankFailure.how``): what the attempt
#: list's ``ended`` keeps of a failure's first line, without the error text after it
_HOW = re.compile(r"^(.*?(?:exited with code -?\d+|was killed by [A-Z0-9]+|was killed by signal \d+|\(hung\)))")


def ended_line(reason: str) -> str:
    """How an attempt ended, in a few words: ``rank 1 (node n1) exited with code 1``, ``node n1 lost
    (heartbeat timeout)``; the reason's first line when it has no such head."""
    first = reason.splitlines()[0] if reason else reason
    found = _HOW.match(first)
    return found.group(1) if found else first


def attempt_record(attempt: int, nodes: list[str], now: datetime, flavor: str | None = None) -> dict[str, Any]:
    """One attempt of a gang as GangTask keeps it (``status`` query, memo): running until
    :func:`finish_record`; times are epoch seconds of workflow time (the same on every replay). ``flavor``: the
    one it was admitted on, kept only when there is one (a record without flavors is what it was before)."""
    record: dict[str, Any] = {
        "attempt": attempt,
        "kind": "running",
        "ended": None,
        "reason": None,
        "nodes": nodes,
        "started_at": now.timestamp(),
        "ended_at": None,
        "duration_s": None,
    }
    if flavor is not None:
        record["flavor"] = flavor
    return record


def finish_record(record: dict[str, Any], kind: str, reason: str, now: datetime, ended: str | None = None) -> None:
    """End an attempt record: ``kind`` completed, cancelled, preempted, system or user."""
    record.update(kind=kind, reason=reason, ended=ended or ended_line(reason), ended_at=now.timestamp())
    record["duration_s"] = round(record["ended_at"] - record["started_at"], 3)
