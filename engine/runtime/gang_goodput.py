"""A finished distributed task call's goodput, for its run's current details: ``goodput 94 %: 3 % launch, ...``;
and an ended attempt's ledger, which its GangTask tells the Scheduler (``ATTEMPT_LEDGER``, workflows.gang_ledger).

The run's workflow asks for it once per call, when the call ends (a local activity on the run's own worker,
``GANG_GOODPUT``): the ledger is what ``gangflow status`` prints (engine.runtime.ledger, from the gang's attempt
list in its memo and the rank reports its node agents saved in the run's store), so the run's page and the CLI
say the same. A gang whose attempts cannot be read (a tenant's gang lives in the platform's namespace; a store
that cannot be read) gets its ledger from the saved reports alone, or none: never an error for the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from temporalio import activity
from temporalio.exceptions import TemporalError
from temporalio.service import RPCError

from engine.core.protocol import ATTEMPT_LEDGER, ATTEMPTS_MEMO, GANG_GOODPUT
from engine.runtime.activities import store_for
from engine.runtime.ledger import add_ledgers, goodput_line
from engine.runtime.ranks import attempt_ranks, merge_attempts

__all__ = ["attempt_ledger_of", "gang_goodput"]

log = logging.getLogger(__name__)


@activity.defn(name=GANG_GOODPUT)
async def gang_goodput(request: dict[str, Any]) -> str | None:
    """``request``: ``{"gang_id"`` (None behind Nexus)``, "run_id", "call", "artifacts", "status"}``."""
    recorded: list[dict[str, Any]] = []
    if request.get("gang_id"):
        with contextlib.suppress(RPCError, TemporalError):
            desc = await activity.client().get_workflow_handle(str(request["gang_id"])).describe()
            recorded = [a for a in await desc.memo_value(ATTEMPTS_MEMO, []) if isinstance(a, dict)]
    saved = await _saved(request)
    ledger = add_ledgers(a.get("ledger") for a in merge_attempts(recorded, saved, str(request.get("status"))))
    return goodput_line(ledger) if ledger is not None else None


@activity.defn(name=ATTEMPT_LEDGER)
async def attempt_ledger_of(request: dict[str, Any]) -> dict[str, Any] | None:
    """An ended attempt's ledger, for its GangTask to tell the Scheduler (the cluster's goodput counters).
    ``request``: ``{"run_id", "call", "artifacts", "attempt"}``, the last the attempt's record as the GangTask
    ended it; its ranks' reports are what the node agents saved by then (each saves at its launch's end, before
    its activity returns: a lost node's last save is older)."""
    record = request.get("attempt")
    if not isinstance(record, dict) or not isinstance(record.get("attempt"), int):
        return None
    saved = await _saved(request)
    (entry,) = merge_attempts([record], {record["attempt"]: saved.get(record["attempt"], [])}, "")
    ledger: dict[str, Any] | None = entry.get("ledger")
    return ledger


async def _saved(request: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    """The call's saved rank reports by attempt (none where the store cannot be read: never an error)."""
    try:
        return await asyncio.to_thread(
            attempt_ranks, store_for(str(request["artifacts"])), str(request["run_id"]), str(request["call"])
        )
    except (OSError, ValueError, KeyError) as exc:
        log.debug("no rank reports for %s: %s", request.get("call"), exc)
        return {}
