"""Checkpoints in the scheduler benchmark's simulation (``bench_scheduler.py --checkpoint-interval S``).

Without the flag every gang checkpoints every ``CHECKPOINT_EVERY_S`` of work and the policy hears nothing of
it (the benchmark as before, decision for decision). With it, each gang gets its own interval, drawn (seeded
by the workload's seed) from S × 2^U(-1, 1): from half to twice S, median S, as jobs whose authors chose
their own. A running gang checkpoints each time its progress (work carried from earlier attempts plus its
run time in this one) reaches a multiple of its interval, and the Policy is told at once (``GangCheckpointed``:
the step, the time, ``--save-s`` as the save). Those reports are policy calls the simulation makes outside
the timed ones (``checkpoint_reports``, ``checkpoint_report_us`` per report): the latency figures stay those
of the events that schedule. A preempted gang keeps the work up to its last checkpoint, as before.

``lost_work_choice``: False runs the same trace, reports included, with victims chosen by the rule of before
costs (``Policy.lost_work.counting``), so the two sides of one run differ only in the choice.
"""

from __future__ import annotations

import math
import random
import time
from typing import Any

__all__ = ["CHECKPOINT", "Checkpoints"]

#: the simulation's event kind: a running gang saves a periodic checkpoint
CHECKPOINT = "checkpoint"


class Checkpoints:
    """Each gang's checkpoint interval, what a preempted gang keeps, and the reports to the policy."""

    def __init__(self, default_s: float, intervals: dict[str, float] | None = None, save_s: float = 0.0) -> None:
        self.default_s, self.intervals, self.save_s = default_s, intervals or {}, save_s
        self.reporting = intervals is not None
        self.reports = 0
        self.report_s = 0.0

    @classmethod
    def drawn(cls, gang_ids: list[str], mean_s: float, seed: int, save_s: float) -> Checkpoints:
        rng = random.Random(f"checkpoints-{seed}")
        return cls(mean_s, {g: mean_s * 2.0 ** rng.uniform(-1.0, 1.0) for g in gang_ids}, save_s)

    def interval(self, gang_id: str) -> float:
        return self.intervals.get(gang_id, self.default_s)

    def kept(self, gang_id: str, progress: float) -> float:
        """The work a gang stopped at ``progress`` keeps: up to its last checkpoint."""
        every = self.interval(gang_id)
        return math.floor(progress / every + 1e-9) * every

    def admitted(self, sim: Any, run: Any) -> None:
        """A gang starts an attempt: its first checkpoint of it comes when its progress reaches the next
        multiple of its interval (if before it finishes)."""
        if self.reporting and hasattr(sim.adapter, "policy"):
            every = self.interval(run.gang.gang_id)
            due = (math.floor(run.done_work / every + 1e-9) + 1) * every - run.done_work
            self._next(sim, run, sim.clock + due)

    def fire(self, sim: Any, run: Any, attempt: int) -> None:
        """A running gang saved a checkpoint: the policy is told, and its next one is due an interval on."""
        if run.attempt != attempt or run.state != "running":
            return  # stopped (preempted, finished) before it came
        from engine.scheduling import GangCheckpointed

        progress = run.done_work + (sim.clock - run.started)
        event = GangCheckpointed(gang_id=run.gang.gang_id, step=int(progress), at=sim.clock, save_s=self.save_s)
        cpu = time.process_time()
        sim.adapter.policy.step(event, sim.clock)
        self.report_s += time.process_time() - cpu
        self.reports += 1
        self._next(sim, run, sim.clock + self.interval(run.gang.gang_id))

    def _next(self, sim: Any, run: Any, at: float) -> None:
        if at < run.started + run.remaining - 1e-9:  # one at its very end is no use to anyone
            sim.push(at, CHECKPOINT, run.gang.gang_id, run.attempt)

    def result(self) -> dict[str, Any]:
        if not self.reporting:
            return {}
        return {
            "checkpoint_reports": self.reports,
            "checkpoint_report_us": round(self.report_s / self.reports * 1e6, 2) if self.reports else None,
        }
