"""A rank's pauses between steps: the part of the goodput ledger's ``idle`` that falls between two reports.

The node agent keeps only each rank's latest ``engine.report`` (one small file), so the ledger cannot see the
gaps between reports afterwards: the rank counts them itself, as it reports, in O(1) per report. The rule:

* the rank's *usual step interval* is a moving average of the seconds per step between reports that advance
  the step (it follows faster steps quickly, slower ones slowly: a slow first step or two after a launch
  does not hide later pauses for long);
* a gap between two reports is a *pause* when it is longer than ``IDLE_FACTOR`` times the usual interval for
  the steps it advanced, and longer than that by more than ``IDLE_MIN_S``; its excess over the usual time of
  those steps is idle (``idle_s``, summed over the attempt); a pause does not move the usual interval;
* the seconds a checkpoint save took within a gap are not part of it (they are the ledger's ``checkpoint``);
* a report of the same step is no progress (the gap runs on); a lower step starts over (a new loop).

The first interval seeds the usual one, so a pause before the second report is not told apart. At a checkpoint
the idle seconds so far are noted too (``ckpt_idle_s``): an attempt that is then preempted or fails loses the
work after its last checkpoint (``lost_*``) and keeps only the pauses before it as ``idle``. Pure: the caller
passes the clock.
"""

from __future__ import annotations

__all__ = ["IDLE_FACTOR", "IDLE_MIN_S", "Pace"]

#: how many times the usual step interval a gap must last to be a pause
IDLE_FACTOR = 10.0
#: and by how many seconds at least it must exceed the usual time of its steps (a GC pause in a loop of 1 ms
#: steps is not worth a line of the ledger)
IDLE_MIN_S = 2.0
#: the moving average's weight of a new interval: faster than the usual one, slower
_FOLLOW_FASTER, _FOLLOW_SLOWER = 0.5, 0.1


class Pace:
    """One rank's step pace: ``step`` at each report, ``saved`` at each checkpoint save; ``idle_s`` so far."""

    __slots__ = ("idle_s", "last_at", "last_step", "saving_s", "usual_s")

    def __init__(self) -> None:
        self.last_step: int | None = None
        self.last_at = 0.0
        self.usual_s: float | None = None  # seconds per step
        self.saving_s = 0.0  # checkpoint seconds since the last step advance
        self.idle_s = 0.0

    def step(self, step: int, now: float) -> None:
        """A report of ``step`` at ``now`` (a monotonic clock's seconds)."""
        if self.last_step is None or step < self.last_step:
            self.last_step, self.last_at, self.saving_s = step, now, 0.0
            return
        advanced = step - self.last_step
        if advanced == 0:
            return
        gap = max(0.0, now - self.last_at - self.saving_s)
        usual = self.usual_s
        if usual is not None and gap > IDLE_FACTOR * usual * advanced and gap - usual * advanced > IDLE_MIN_S:
            self.idle_s += gap - usual * advanced
        else:
            per = gap / advanced
            if usual is None:
                self.usual_s = per
            else:
                self.usual_s = usual + (_FOLLOW_FASTER if per < usual else _FOLLOW_SLOWER) * (per - usual)
        self.last_step, self.last_at, self.saving_s = step, now, 0.0

    def saved(self, seconds: float) -> None:
        """A checkpoint save took ``seconds`` since the last step advance."""
        self.saving_s += max(0.0, seconds)
