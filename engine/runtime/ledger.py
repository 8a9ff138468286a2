"""The goodput ledger: where a gang attempt's GPU-seconds went.

An attempt holds its GPUs from its placement (``started_at`` of its record, workflow time) to its end
(``ended_at``): that is its *allocated* time, times the GPUs its node launches held. The ledger splits it,
from what its ranks reported (``engine.report``: the first report's time ``since``, the last one's ``time``
and ``step``; ``engine.checkpoint.save``: the last checkpoint's ``ckpt_time`` and the seconds all saves took,
``ckpt_s``) and from how the attempt ended:

* ``launch`` — placement → the first step (for an attempt resumed from a checkpoint, placement → its
  ranks started);
* ``restore`` — a resumed attempt's ranks started → its first new step (loading the checkpoint, rejoining);
* ``checkpoint`` — the saves;
* ``lost_failure`` / ``lost_preemption`` / ``lost_drain`` — the work since the attempt's last checkpoint
  (since its first step when it saved none), thrown away by a failure, a preemption or a drain;
* ``hang`` — a hung rank's attempt, from the last report to the end (when the hang was detected);
* ``idle`` — allocated with no step to show: the pauses between reports (below), after the last report of an
  attempt that completed or was cancelled (the ranks exiting, the placement being released), or the whole of
  one whose ranks never reported (``reported`` False: its goodput cannot be told);
* ``productive`` — the rest: steps that counted.

*Pauses between reports.* The agent keeps only each rank's latest report, so each rank counts its own pauses
as it reports (engine.rank.pace): a gap between two reports longer than 10 times the rank's usual step
interval, and longer than that by over 2 s, is a pause, and its excess over the usual time of its steps is
idle (a checkpoint save within it is not: that is ``checkpoint``). The report carries the sum (``idle_s``), and
at each checkpoint the sum so far (``ckpt_idle_s``). The ledger takes the mean over the attempt's reporting ranks
(a gang's ranks step together): all of ``idle_s`` for an attempt that completed or was cancelled, and for one
that lost its work since a checkpoint only the pauses before that checkpoint (``ckpt_idle_s`` of the report that
names it; the pauses after it are part of the lost work). Ranks from before ``idle_s`` report none: 0.

The parts add up to the whole (each is clamped to what is left of it). Queueing is not GPU time: a gang task's
wait for its placement is reported beside the ledger (``wait_s``), not in it. Pure: dicts in, dicts out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from engine.core.protocol import BADPUT

__all__ = ["add_ledgers", "attempt_ledger", "goodput_line", "node_shares"]


def _numbers(values: Iterable[Any]) -> list[float]:
    return [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]


def _reports(nodes: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    reports: list[Mapping[str, Any]] = []
    for details in nodes:
        progress = details.get("progress")
        if isinstance(progress, Mapping):
            reports += [r for r in progress.values() if isinstance(r, Mapping)]
    return reports


def _paused_before(reports: Sequence[Mapping[str, Any]], kept: float) -> float:
    """The ranks' pauses between reports before the checkpoint at ``kept``: the mean ``ckpt_idle_s`` of the
    reports that name that checkpoint (usually rank 0's alone: the others do not save)."""
    at = _numbers(r.get("ckpt_idle_s") for r in reports if r.get("ckpt_time") == kept)
    return sum(at) / len(at) if at else 0.0


def _lost_cause(kind: Any, reason: str) -> str | None:
    if kind == "preempted":
        return "lost_drain" if "is draining" in reason else "lost_preemption"  # workflows.gang_notice's words
    if kind in ("user", "system"):
        return "lost_failure"
    return None  # completed, cancelled: nothing was thrown away


def attempt_ledger(attempt: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The ledger of one finished attempt (its merged record, ``engine.runtime.ranks.merge_attempts``, and its
    node launches' saved details), or None while it runs or where its times are unknown."""
    placed, end = attempt.get("started_at"), attempt.get("ended_at")
    if attempt.get("kind") == "running" or not isinstance(placed, int | float) or not isinstance(end, int | float):
        return None
    total = max(0.0, float(end) - float(placed))
    held: dict[str, int] = {}  # node -> its GPUs in this attempt (``gangflow usage --by node``)
    for details in nodes:
        name = str(details.get("node") or "?")
        held[name] = held.get(name, 0) + int(sum(_numbers([details.get("gpus")])))
    gpus = sum(held.values())
    reports = _reports(nodes)
    firsts, lasts = _numbers(r.get("since") for r in reports), _numbers(r.get("time") for r in reports)
    saved_at, save_s = _numbers(r.get("ckpt_time") for r in reports), _numbers(r.get("ckpt_s") for r in reports)
    first_steps = _numbers(r.get("first_step") for r in reports)
    paused = _numbers(r.get("idle_s") for r in reports)
    started = _numbers(d.get("started") for d in nodes)
    left = total
    parts = dict.fromkeys(BADPUT, 0.0)

    def take(cause: str, seconds: float) -> None:
        nonlocal left
        seconds = min(max(0.0, seconds), left)
        parts[cause] += seconds
        left -= seconds

    kind, reason = attempt.get("kind"), str(attempt.get("reason") or attempt.get("ended") or "")
    lost = _lost_cause(kind, reason)
    if not firsts:  # not one step: launching until it failed or hung, or (it ended well) ranks that never report
        take("hang" if "(hung)" in reason else lost or "idle", total)
    else:
        first, last = min(firsts), max(lasts or firsts)
        resumed = bool(first_steps) and min(first_steps) > 1 and bool(started)
        if resumed:
            take("launch", min(started) - float(placed))
            take("restore", first - min(started))
        else:
            take("launch", first - float(placed))
        take("checkpoint", max(save_s, default=0.0))
        if lost is None:
            take("idle", sum(paused) / len(paused) if paused else 0.0)  # between reports
            take("idle", float(end) - last)
        else:
            if "(hung)" in reason:
                take("hang", float(end) - last)
                end_of_work = last
            else:
                end_of_work = float(end)
            kept = max([t for t in saved_at if t >= first], default=first)
            take("idle", _paused_before(reports, kept) if kept > first else 0.0)
            take(lost, end_of_work - kept)
    scale = float(gpus) if gpus else 0.0
    return {
        "gpus": gpus,
        "nodes": held,
        "allocated_s": round(total, 3),
        "allocated_gpu_s": round(total * scale, 3),
        "productive_gpu_s": round(left * scale, 3),
        "badput": {cause: round(seconds * scale, 3) for cause, seconds in parts.items()},
        "goodput": round(left / total, 4) if total > 0 else None,
        "reported": bool(firsts),  # False: its ranks never called engine.report, so no step could count
    }


def node_shares(ledger: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """One attempt's ledger split over its nodes by their GPUs: a gang's ranks step together, so every node
    of an attempt held its GPUs for the same causes (a CPU-only attempt's nodes: all of its seconds each, no
    GPU-seconds)."""
    nodes = ledger.get("nodes")
    if not isinstance(nodes, Mapping) or not nodes:
        return {}
    gpus = float(ledger.get("gpus") or 0)
    shares: dict[str, dict[str, Any]] = {}
    for name, held in nodes.items():
        weight = float(held) / gpus if gpus > 0 else 0.0
        shares[str(name)] = {
            **ledger,
            "gpus": int(held),
            "nodes": {str(name): int(held)},
            "allocated_gpu_s": round(float(ledger["allocated_gpu_s"]) * weight, 3),
            "productive_gpu_s": round(float(ledger["productive_gpu_s"]) * weight, 3),
            "badput": {c: round(float(v) * weight, 3) for c, v in ledger["badput"].items()},
        }
    return shares


def add_ledgers(ledgers: Iterable[Mapping[str, Any] | None]) -> dict[str, Any] | None:
    """The sum of attempts' (or task calls', or runs') ledgers; None when none is known."""
    known = [x for x in ledgers if x]
    if not known:
        return None
    allocated = sum(float(x["allocated_gpu_s"]) for x in known)
    productive = sum(float(x["productive_gpu_s"]) for x in known)
    seconds = sum(float(x["allocated_s"]) for x in known)
    badput = {c: round(sum(float(x["badput"].get(c, 0.0)) for x in known), 3) for c in BADPUT}
    weighted = [(float(x["goodput"]), float(x["allocated_s"])) for x in known if x.get("goodput") is not None]
    return {
        "gpus": max(int(x.get("gpus", 0)) for x in known),
        "allocated_s": round(seconds, 3),
        "allocated_gpu_s": round(allocated, 3),
        "productive_gpu_s": round(productive, 3),
        "badput": badput,
        "reported": any(x.get("reported", True) for x in known),
        # by GPU-seconds where there are GPUs, by seconds for CPU-only gangs
        "goodput": round(productive / allocated, 4)
        if allocated > 0
        else (round(sum(g * s for g, s in weighted) / seconds, 4) if weighted and seconds > 0 else None),
    }


_WORDS = {
    "launch": "launch",
    "checkpoint": "checkpoints",
    "restore": "restore",
    "lost_failure": "lost to failures",
    "lost_preemption": "lost to preemption",
    "lost_drain": "lost to drains",
    "hang": "hung",
    "idle": "idle",
}


def goodput_line(ledger: Mapping[str, Any]) -> str:
    """``goodput 94 %: 3 % launch, 2 % lost to failures, 1 % checkpoints`` (causes of 0.5 % or more)."""
    goodput = ledger.get("goodput")
    if not ledger.get("reported", True):
        return "goodput unknown: the ranks reported no step (engine.report(step=...) counts them)"
    if goodput is None:
        return "goodput unknown"
    allocated = float(ledger.get("allocated_gpu_s") or 0.0)
    weight = allocated if allocated > 0 else float(ledger.get("allocated_s") or 0.0)
    shares: list[tuple[float, str]] = []
    for cause in BADPUT:
        value = float(ledger["badput"].get(cause, 0.0))
        share = value / allocated if allocated > 0 else 0.0
        if share >= 0.005:
            shares.append((share, _WORDS[cause]))
    shares.sort(reverse=True)
    detail = ", ".join(f"{round(share * 100)} % {words}" for share, words in shares)
    head = f"goodput {round(float(goodput) * 100)} %"
    if weight <= 0:
        return head
    return f"{head}: {detail}" if detail else head
