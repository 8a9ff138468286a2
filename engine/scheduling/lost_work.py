"""What preempting a running gang destroys: its expected lost GPU-seconds.

A gang preempted now throws away the work since its attempt's last durable checkpoint (since its admission
when it reported none), spends a save while it still holds its GPUs, and its next attempt relaunches and
restores before its first new step. So its cost is

    GPUs × (now − last checkpoint (or admission) + save + restore + relaunch)

with, from its GangTask's reports (``GangCheckpointed``, one per new checkpoint of the running attempt):

* *save*: what the last save took;
* *restore + relaunch*: measured on an attempt that resumed (``restore_s``: its start to its first new step,
  which includes the relaunch); else this attempt's start to its first step (``relaunch_s``) plus one more
  save's time (loading a checkpoint takes about what writing it did); a part never measured counts 0.

A gang that just checkpointed is the cheapest victim; one 59 minutes into a 60-minute interval is the
dearest. ``engine.scheduling.preemption`` chooses victims by it once the policy has had a checkpoint report
(``LostWork.active``): until then no gang's cost says more than its admission time, and the victims are
today's (the decisions stay the same, byte for byte, for a cluster whose gangs report no checkpoints).
Every preemption records its cost (``Preempted.cost_gpu_s``) either way.

**Waiting for a checkpoint** (``policy.checkpoint_wait``, off by default): a gang's interval is the time
between its attempt's last two checkpoints (``Checkpoint.every_s``), so its next one is expected an interval
after its last (``next_checkpoint``). A victim whose next checkpoint is expected within the wait, and sooner
than the work it would lose now is old (the wait delays the gang less than it saves), is not preempted
before it, as a gang younger than ``min_runtime`` is not (``engine.scheduling.preemption``): the waiting
gang searches again once it is told (at most ``CHECKPOINT_LATE_S`` after it was expected) and takes it then
at next to nothing (its loss is young: it is not waited for again); one that does not come by then is not
waited for again either. Meanwhile the waiting gang's reason names the victim it waits for
(``reasons.waiting_note_text``; a snapshot keeps it). The victim's GPUs are not idle meanwhile (it
trains up to its checkpoint); only the waiting gang starts up to the wait later. It is for gangs that lose
the work since their last checkpoint when preempted (a save at the notice that does not fit the grace, a
framework that cannot save mid-step); a gang that saves at the notice loses one save anyway.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.scheduling.events import GangCheckpointed
from engine.scheduling.state import Checkpoint, Running

if TYPE_CHECKING:
    from engine.scheduling.policy import Policy

__all__ = ["LostWork", "gpu_minutes", "lost_gpu_s", "next_checkpoint", "record"]


class LostWork:
    """The policy's switch and memory for costing victims."""

    def __init__(self) -> None:
        #: choose victims by their cost once checkpoints are reported; False: by today's rule whatever is
        #: reported (the benchmark's baseline), the costs are still recorded
        self.counting = True
        #: a running gang reported a checkpoint at some time (carried by the snapshot)
        self.seen = False

    @property
    def active(self) -> bool:
        return self.counting and self.seen


def lost_gpu_s(running: Running, now: float) -> float:
    """The GPU-seconds ``running`` is expected to lose if preempted at ``now`` (the module docstring)."""
    checkpoint = running.checkpoint
    if checkpoint is None:
        return running.vec[0] * max(0.0, now - running.admitted_at)
    # a checkpoint older than the admission (a late report of an earlier attempt) keeps nothing of this one
    since = max(checkpoint.at, running.admitted_at)
    save = checkpoint.save_s
    # restore + relaunch: measured on a resumed attempt, else this attempt's launch and a save's time
    back = checkpoint.restore_s if checkpoint.restore_s is not None else (checkpoint.relaunch_s or 0.0) + save
    return running.vec[0] * (max(0.0, now - since) + save + back)


def record(policy: Policy, event: GangCheckpointed) -> bool:
    """Keep a running gang's new checkpoint; a gang that is not running is a no-op (a late report of an
    attempt that has ended). False: nothing the admission cycle reads changed (a search that found no
    victims finds none now either: a cost only orders them)."""
    running = policy.running.get(event.gang_id)
    if running is None:
        return False
    last = running.checkpoint
    # its interval, from this attempt's last two checkpoints (a late report of an earlier attempt is not one)
    every = event.at - last.at if last is not None and running.admitted_at <= last.at < event.at else None
    running.checkpoint = Checkpoint(event.step, event.at, event.save_s, event.restore_s, event.relaunch_s, every)
    policy.lost_work.seen = True
    return False


def next_checkpoint(running: Running) -> float | None:
    """When ``running``'s next checkpoint is expected: its last one and its interval on (None: not known; an
    interval is kept only between two checkpoints of the running attempt, ``record``)."""
    checkpoint = running.checkpoint
    if checkpoint is None or checkpoint.every_s is None:
        return None
    return checkpoint.at + checkpoint.every_s


def gpu_minutes(cost_gpu_s: float) -> str:
    """``~3.1 GPU-min`` / ``~2.5 GPU-h``: a cost as a person reads it."""
    if cost_gpu_s >= 5940:  # 99 GPU-minutes
        return f"~{cost_gpu_s / 3600:.1f} GPU-h"
    return f"~{cost_gpu_s / 60:.1f} GPU-min"
