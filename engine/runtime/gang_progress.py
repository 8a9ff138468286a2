"""Node rank 0's agent tells its GangTask how far the ranks got, seldom: what the gang's and its run's current
details show (engine.core.glance), so a run's page in the Web UI reads "step 340, loss 0.41".

Every report is a signal in the gang's history (and, relayed, one in its run's), so they are spaced out
(engine.core.glance ``progress_interval``: every 15 s at first, at most every 10 minutes) and sent only when the
step moved; the live per-rank view stays in the heartbeats. One last report goes when the ranks exit, so a
finished call shows its last step. A report that cannot be sent (the gang ended meanwhile, Temporal is away)
costs nothing but the line: logged once, never raised into the ranks' activity.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from temporalio import activity

from engine.core.glance import PROGRESS_MIN_S, checkpoint_of, progress_interval, progress_payload
from engine.core.protocol import GANG_PROGRESS_SIGNAL
from engine.rank.view import rank_rows

__all__ = ["ProgressTeller"]

log = logging.getLogger(__name__)

#: how long one report may take before the agent gives up on it (the ranks' loop waits for it)
_SEND_TIMEOUT_S = 2.0


class ProgressTeller:
    """Called with each heartbeat's details of a node launch (``engine.runtime.ranks.rank_details``); tells only
    where ``told`` (node rank 0: one report per gang, whose rank 0 speaks for it)."""

    def __init__(self, attempt: int, *, told: bool = True) -> None:
        self.attempt, self.told = attempt, told
        self.started = time.monotonic()
        self.next_at = self.started  # the first report goes as soon as a rank has one
        self.sent_step: int | None = None
        self.sent_ckpt: int | None = None  # the checkpoint step last told
        self.tried_at = -PROGRESS_MIN_S  # when a report was last tried (monotonic)
        self.warned = False

    async def maybe(self, details: dict[str, Any]) -> None:
        """Report if one is due and the step moved, or at once (at most every ``PROGRESS_MIN_S``) when the
        ranks saved a new checkpoint: the gang tells the Scheduler, which costs victims by it."""
        now = time.monotonic()
        ckpt = checkpoint_of(details) if self.told else None
        new_ckpt = ckpt is not None and ckpt["step"] != self.sent_ckpt
        due = now >= self.next_at or (new_ckpt and now - self.tried_at >= PROGRESS_MIN_S)
        if due and await self._send(details, force=new_ckpt) is not None:  # tried, told or not: wait again
            self.next_at, self.tried_at = now + progress_interval(now - self.started), now

    async def last(self, details: dict[str, Any]) -> None:
        """The ranks have exited: their last step, unless it was told already."""
        await self._send(details)

    async def _send(self, details: dict[str, Any], *, force: bool = False) -> bool | None:
        """Whether the report was told; None when there was nothing new to tell (``force``: a new checkpoint
        is new even where the step is not)."""
        payload = progress_payload(self.attempt, rank_rows([details], time.time())) if self.told else None
        if payload is None or (payload["step"] == self.sent_step and not force):
            return None
        ckpt = checkpoint_of(details)
        if ckpt is not None:  # (a gang from before checkpoints were told reads past the key)
            payload["ckpt"] = ckpt
        try:
            handle = activity.client().get_workflow_handle(activity.info().workflow_id or "")
            await asyncio.wait_for(handle.signal(GANG_PROGRESS_SIGNAL, payload), _SEND_TIMEOUT_S)
        except Exception as exc:  # the line is worth less than the ranks: never raised into their activity
            if not self.warned:
                self.warned = True
                log.warning("could not tell the gang its ranks' progress: %s", exc)
            return False
        self.sent_step = payload["step"]
        self.sent_ckpt = ckpt["step"] if ckpt is not None else self.sent_ckpt
        return True
