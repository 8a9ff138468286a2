"""A GangTask tells the Scheduler each new durable checkpoint of its running attempt (``CHECKPOINTED_SIGNAL``,
engine.scheduling ``GangCheckpointed``): the policy chooses victims by the work they would lose since it.

The checkpoint comes with node rank 0's progress reports (``GANG_PROGRESS_SIGNAL``: its agent sends one at
once, at most every 15 s, when the ranks saved a new one, engine.runtime.gang_progress), so the Scheduler's
history grows by one event per checkpoint, never per step. Measured here, from workflow state and the ranks'
reports: the save (``ckpt_s`` counts all of an attempt's saves: the difference since the last one told), the
restore (a resumed attempt: its placement to its first new step) or the relaunch (a fresh attempt: its
placement to its first step). Gangs recorded before this replay without the signals (``CHECKPOINT_PATCH``).
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from temporalio import workflow

from engine.core.protocol import CHECKPOINTED_SIGNAL, SCHEDULER_ID

__all__ = ["CHECKPOINT_PATCH", "CheckpointTeller", "checkpoint_of"]

#: workflow.patched id: from here on a GangTask tells the Scheduler its attempts' checkpoints
CHECKPOINT_PATCH = "gang-tells-checkpoints"


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def checkpoint_of(progress: Any) -> dict[str, Any] | None:
    """The checkpoint a progress report carries (engine.core.glance ``checkpoint_of``), None when it has none
    or it is malformed (signal payloads are never trusted)."""
    ckpt = progress.get("ckpt") if isinstance(progress, dict) else None
    if not isinstance(ckpt, dict):
        return None
    step: Any = ckpt.get("step")
    at: Any = ckpt.get("at")
    total: Any = ckpt.get("s")
    if not isinstance(step, int) or isinstance(step, bool) or not _number(at) or at <= 0:
        return None
    since: Any = ckpt.get("since")
    first: Any = ckpt.get("first_step")
    return {
        "step": step,
        "at": float(at),
        "s": float(total) if _number(total) and total >= 0 else 0.0,
        "since": float(since) if _number(since) else None,
        "first_step": first if isinstance(first, int) and not isinstance(first, bool) else None,
    }


class CheckpointTeller:
    """A GangTask's side: one signal to the Scheduler per new checkpoint of the attempt running now."""

    def __init__(self) -> None:
        self.told: tuple[int, int] | None = None  # (attempt, checkpoint step) last told
        self.saved_s = 0.0  # the attempt's save seconds as of the last checkpoint told
        self.sending: set[asyncio.Future[None]] = set()  # held until sent (asyncio keeps only weak references)

    def tell(self, gang_id: str, attempt: int, placed_at: float, ckpt: dict[str, Any]) -> dict[str, Any] | None:
        """Signal the Scheduler ``ckpt`` unless it was told already; what was sent (None: nothing)."""
        if self.told is not None and self.told[0] == attempt and self.told[1] == ckpt["step"]:
            return None
        if not workflow.patched(CHECKPOINT_PATCH):
            return None
        before = self.saved_s if self.told is not None and self.told[0] == attempt else 0.0
        self.told, self.saved_s = (attempt, ckpt["step"]), ckpt["s"]
        resumed = ckpt["first_step"] is not None and ckpt["first_step"] > 1  # as the goodput ledger says it
        start = None if ckpt["since"] is None else round(max(0.0, ckpt["since"] - placed_at), 3)
        payload = {
            "gang_id": gang_id,
            "step": ckpt["step"],
            "at": ckpt["at"],
            "save_s": round(max(0.0, ckpt["s"] - before), 3),
            "restore_s": start if resumed else None,
            "relaunch_s": None if resumed else start,
        }
        sent = asyncio.ensure_future(_send(payload))
        self.sending.add(sent)
        sent.add_done_callback(self.sending.discard)
        return payload


async def _send(payload: dict[str, Any]) -> None:
    try:
        await workflow.get_external_workflow_handle(SCHEDULER_ID).signal(CHECKPOINTED_SIGNAL, payload)
    except Exception as exc:  # no Scheduler now: its next checkpoint is told again; a cost is worth less
        workflow.logger.debug("could not tell the Scheduler the gang's checkpoint: %s", exc)
