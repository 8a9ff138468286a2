"""What a run's page in the Temporal Web UI shows of its distributed task calls, and the search attributes of
the workflows a run starts.

A GangTask tells the run that called it its state (``GANG_STATE_SIGNAL``: phase, placement, attempt, restarts,
the ranks' last progress) whenever that changes, so the run's current details (the markdown the Web UI renders
on the run's own page) say what each gang does without a click into it; the words are engine.core.glance's, the
same ``gangflow status`` prints. A gang behind the platform's Nexus endpoint (the isolated layout) has no parent
in its namespace to tell: that run's details list the call as started only, and ``gangflow status`` asks the
platform.

The signals are one per change of state (the Scheduler signals a pending reason only when its meaning changes)
plus node rank 0's seldom progress reports (engine.core.glance ``progress_interval``). Gangs recorded before
this replay without them (``GLANCE_PATCH``). Once a call has ended, the run looks its goodput up with one local
activity (``goodput_of``; runs recorded before replay without it, ``GOODPUT_PATCH``).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ActivityError

from engine.core.glance import gang_details, run_details
from engine.core.protocol import GANG_GOODPUT, GANG_STATE_SIGNAL, KIND_ATTRIBUTE, TENANT_ATTRIBUTE
from engine.core.wire import RunContext

__all__ = ["GLANCE_PATCH", "GOODPUT_PATCH", "GangTeller", "RunGlance", "call_attributes", "goodput_of", "progress_of"]

#: workflow.patched id: from here on a GangTask signals its state to its run
GLANCE_PATCH = "gang-tells-run"
#: workflow.patched id: from here on a run looks up each finished gang call's goodput (a local activity)
GOODPUT_PATCH = "run-shows-goodput"

_KIND = SearchAttributeKey.for_keyword(KIND_ATTRIBUTE)
_TENANT = SearchAttributeKey.for_keyword(TENANT_ATTRIBUTE)


def call_attributes(kind: str, tenant: str, inherited: TypedSearchAttributes | None = None) -> TypedSearchAttributes:
    """The start-time search attributes of a workflow a run starts (a gang, a child workflow, a map chunk): the
    run's own (``inherited``: a child workflow keeps its pipeline) with its ``GangflowKind`` and tenant. Set in the
    start command, so they are there from the first moment a list can show it (no upsert)."""
    own = (_KIND.name, _TENANT.name)
    pairs = [p for p in (inherited.search_attributes if inherited else []) if p.key.name not in own]
    return TypedSearchAttributes([*pairs, SearchAttributePair(_KIND, kind), SearchAttributePair(_TENANT, tenant)])


def progress_of(payload: Any) -> dict[str, Any] | None:
    """A node agent's progress report as the gang keeps it, None when malformed (signal payloads are never
    trusted: a handler that raised would fail the workflow task again and again)."""
    if not isinstance(payload, dict):
        return None
    attempt, step, metrics, at = payload.get("attempt"), payload.get("step"), payload.get("metrics"), payload.get("at")
    if not isinstance(attempt, int) or not isinstance(step, int) or isinstance(step, bool):
        return None
    numbers = {
        str(k): v for k, v in (metrics.items() if isinstance(metrics, dict) else ()) if isinstance(v, int | float)
    }
    return {"attempt": attempt, "step": step, "metrics": numbers, "at": at if isinstance(at, int | float) else None}


async def goodput_of(gang_id: str | None, run: RunContext, call: str, status: str, key: str) -> str | None:
    """A finished gang call's goodput line (engine.runtime.gang_goodput, the ledger ``gangflow status`` prints),
    None where it cannot be told; runs recorded before this replay without the look. ``key``: the name its
    rank reports are saved by (``GangSpec.files_key``)."""
    if not workflow.patched(GOODPUT_PATCH):
        return None
    request = {"gang_id": gang_id, "run_id": run.run_id, "call": key, "artifacts": run.artifacts, "status": status}
    try:
        line = await workflow.execute_local_activity(
            GANG_GOODPUT,
            request,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=2),
            summary=f"{call}: goodput",
        )
    except ActivityError as exc:  # the line is worth less than the run: never its failure
        workflow.logger.warning("no goodput for %s: %s", call, exc)
        return None
    return line if isinstance(line, str) else None


class GangTeller:
    """A GangTask's side: renders its own current details and tells its parent run its state."""

    def __init__(self) -> None:
        self.seq = 0
        self.more = ""  # the markdown below the line (where the ranks run), kept for a progress-only refresh
        self.sending: set[asyncio.Future[None]] = set()  # held until sent (asyncio keeps only weak references)
        self.told: dict[str, Any] | None = None  # the last state the run was told (the same one is not sent again)

    def show(self, state: dict[str, Any], more: str | None = None, *, tell: bool = True) -> None:
        if more is not None:
            self.more = more
        workflow.set_current_details(gang_details(state, self.more))  # (not in history: free to change)
        parent = workflow.info().parent
        if not tell or state == self.told or parent is None or not workflow.patched(GLANCE_PATCH):
            return  # a passing phase, nothing new, behind a Nexus operation (no parent), or recorded before this
        self.told = state
        self.seq += 1
        handle = workflow.get_external_workflow_handle(parent.workflow_id, run_id=parent.run_id)
        sent = asyncio.ensure_future(_tell(handle, {**state, "seq": self.seq}))
        self.sending.add(sent)
        sent.add_done_callback(self.sending.discard)

    async def flush(self) -> None:
        """Wait until the run has been told (before the gang completes: a signal still being sent when the
        workflow completes is dropped)."""
        if self.sending:
            await asyncio.gather(*self.sending)


async def _tell(handle: workflow.ExternalWorkflowHandle[Any], state: dict[str, Any]) -> None:
    try:
        await handle.signal(GANG_STATE_SIGNAL, state)
    except Exception as exc:  # the run has ended meanwhile: nothing to tell
        workflow.logger.debug("could not tell the run the gang's state: %s", exc)


class RunGlance:
    """A run's side: the last state of each distributed task call it started, and its current details."""

    def __init__(self) -> None:
        self.gangs: dict[str, dict[str, Any]] = {}  # call -> {"call", "ended", "seq", **state}

    def started(self, call: str, *, told: bool = True) -> None:
        """``told``: whether its gang will tell this run its state (not behind the platform's Nexus endpoint)."""
        self.gangs[call] = {"call": call, "phase": "submitted", "ended": None, "seq": 0}
        if not told:
            self.gangs[call].update(status="started", phase="in the platform's namespace, which gangflow status asks")

    def told(self, state: Any) -> bool:
        """A gang's state signal; False when it is malformed or older than one already seen."""
        if not isinstance(state, dict) or not isinstance(state.get("call"), str):
            return False
        known = self.gangs.get(state["call"])
        seq = state.get("seq")
        if known is None or known.get("final") or not isinstance(seq, int) or seq <= int(known.get("seq") or 0):
            return False  # (a failed call keeps its failure: a state signalled before it may arrive after it)
        known.update({k: v for k, v in state.items() if k != "call" and (k != "ended" or v)})
        return True

    def finished(self, call: str, ended: str, reason: str | None = None, goodput: str | None = None) -> None:
        gang = self.gangs.get(call)
        if gang is not None:
            gang["ended"], gang["goodput"] = ended, goodput
            if reason:
                gang.update(phase=reason.splitlines()[0], progress=None, restarts=None, final=True)

    def details(self, head: str) -> str:
        return run_details(head, self.gangs.values())
