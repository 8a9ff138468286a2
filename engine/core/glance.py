"""A run at a glance: the words for a distributed task call's state, in one home.

The same line is the *detail* of a gang task in ``gangflow status`` and its entry in the run's current details
(the markdown the Temporal Web UI shows on the run's own page, so a user need not click into a gang), and the
head of the gang's own current details. It is built from a gang's *state*, a mapping with the keys of the
GangTask's status query (``workflows.gang``) that matter here:

* ``phase`` — what the gang says it does, in its own and the Scheduler's words ("pending: team-a is at its
  quota of 8 GPUs and cannot borrow", "attempt 2: 4 ranks running on n1, n2");
* ``placed`` (or ``placement``) — whether it holds a placement: without one it is *waiting* (its workflow runs,
  its ranks do not, which the Web UI's list shows as Running);
* ``attempt``, ``restarts``, ``max_restarts`` — the current attempt (0-based) and the restart budget spent;
* ``progress`` — the ranks' latest step and metrics as node rank 0's agent last told the gang
  (``{"attempt", "step", "metrics", "at"}``), sent seldom (:func:`progress_interval`): the live per-rank view
  stays in the node activities' heartbeats and ``gangflow status``;
* ``goodput`` — once the call has ended, its ledger's line (engine.runtime.ledger ``goodput_line``), as its
  run looked it up.
* ``flavor`` — the flavor its placement was admitted on, where the queue file names flavors.

Pure: the standard library only (a workflow renders it).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "GANGS_SHOWN",
    "checkpoint_of",
    "format_metrics",
    "gang_details",
    "gang_line",
    "gang_status",
    "progress_interval",
    "progress_payload",
    "progress_text",
    "run_details",
]

#: metrics shown first, in this order, when a rank reports them
_FIRST = ("loss", "val_loss", "accuracy", "lr")
#: a run's details list every gang call that has not ended and the last ones that have, this many in all at most
#: (a run that calls a gang in a loop must not grow its details without bound)
GANGS_SHOWN = 12
#: how many metrics a progress report carries (a rank may report dozens; the page shows the first few)
_METRICS_SENT = 6
#: the progress reports' spacing: at least this often apart, then a tenth of the attempt's age, at most this
PROGRESS_MIN_S, PROGRESS_MAX_S = 15.0, 600.0


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def format_metrics(metrics: Mapping[str, Any]) -> str:
    """``loss 0.1234 · acc 0.9``: the usual metrics first, then the others in the order reported."""
    names = [k for k in _FIRST if k in metrics] + [k for k in metrics if k not in _FIRST]
    return " · ".join(f"{name} {_value(metrics[name])}" for name in names)


def progress_interval(age_s: float) -> float:
    """How long node rank 0's agent waits before it tells its gang the ranks' progress again, ``age_s`` into
    an attempt: every 15 s at first, then a tenth of the attempt's age, at most every 10 minutes. Each report is
    a signal in the gang's history and one in its run's: about 100 for a 10-hour attempt, 450 for 3 days."""
    return min(PROGRESS_MAX_S, max(PROGRESS_MIN_S, age_s / 10.0))


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def progress_payload(attempt: int, rows: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """What node rank 0's agent tells its gang, from its rank rows (``engine.rank.view.rank_rows``): the lowest
    rank that reported, its step and first few numeric metrics and when; None while no rank has reported."""
    for row in rows:
        step = row.get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            metrics = {k: v for k, v in (row.get("metrics") or {}).items() if _number(v)}
            at = row.get("reported_at")
            return {
                "attempt": attempt,
                "step": step,
                "metrics": dict(list(metrics.items())[:_METRICS_SENT]),
                "at": at if _number(at) else None,
            }
    return None


def checkpoint_of(details: Mapping[str, Any]) -> dict[str, Any] | None:
    """The last durable checkpoint of a node launch's lowest rank that reported one (its heartbeat details'
    ``progress``: ``engine.checkpoint.save`` puts ``ckpt_step``, ``ckpt_time`` and ``ckpt_s``, all saves'
    seconds, into a rank's reports), with when the rank first reported and its first step: what a GangTask
    tells the Scheduler (``workflows.gang``). None while no rank saved one."""
    progress = details.get("progress")
    reports = progress if isinstance(progress, Mapping) else {}
    for key in sorted(reports, key=lambda k: int(k) if str(k).isdigit() else 1 << 30):
        report = reports[key]
        if not isinstance(report, Mapping):
            continue
        step, at = report.get("ckpt_step"), report.get("ckpt_time")
        if isinstance(step, int) and not isinstance(step, bool) and _number(at):
            return {
                "step": step,
                "at": at,
                "s": report.get("ckpt_s") if _number(report.get("ckpt_s")) else 0.0,
                "since": report.get("since") if _number(report.get("since")) else None,
                "first_step": report.get("first_step") if isinstance(report.get("first_step"), int) else None,
            }
    return None


def progress_text(progress: Mapping[str, Any]) -> str:
    """``step 340, loss 0.41 (12:41:07 UTC)``: a progress report as a person reads it."""
    metrics = progress.get("metrics")
    shown = format_metrics(metrics) if isinstance(metrics, Mapping) else ""
    text = f"step {progress.get('step')}" + (f", {shown.replace(' · ', ', ')}" if shown else "")
    at = progress.get("at")
    if isinstance(at, int | float) and _number(at):
        text += f" ({datetime.fromtimestamp(float(at), UTC):%H:%M:%S} UTC)"
    return text


def _placed(state: Mapping[str, Any]) -> bool:
    return bool(state.get("placed") or state.get("placement"))


def gang_status(state: Mapping[str, Any], ended: str | None = None) -> str:
    """The gang call's status word: how it ended (``ended``: completed, failed, cancelled, ...), else
    ``running`` while it holds a placement and ``waiting`` while it does not."""
    if ended:
        return ended
    if isinstance(state.get("status"), str):  # what its run can say of a gang that tells it nothing (Nexus)
        return str(state["status"])
    return "running" if _placed(state) else "waiting"


def gang_line(state: Mapping[str, Any]) -> str:
    """The gang's state in one line: its phase, the ranks' last step and metrics where this attempt reported
    any, and the restarts spent (``attempt 2: 4 ranks running on n1, n2: step 340, loss 0.41 (12:41:07 UTC) ·
    restarts 1 of 3``)."""
    line = str(state.get("phase") or "starting")
    progress = state.get("progress")
    if isinstance(progress, Mapping) and progress.get("attempt") == state.get("attempt") and "step" in progress:
        line += f": {progress_text(progress)}"
    flavor = state.get("flavor")
    if isinstance(flavor, str) and flavor and state.get("placed", state.get("placement")):
        line += f" · flavor {flavor}"
    restarts, budget = state.get("restarts"), state.get("max_restarts")
    if isinstance(restarts, int) and restarts > 0:
        line += f" · restarts {restarts}" + (f" of {budget}" if isinstance(budget, int) else "")
    goodput = state.get("goodput")
    if isinstance(goodput, str) and goodput:
        line += f" · {goodput}"
    return line


def _cell(text: str) -> str:
    """Text as markdown shows it literally (``_`` inside a word, as in ids, is literal in CommonMark already)."""
    for char in "\\`*[]<>":
        text = text.replace(char, "\\" + char)
    return text


def gang_details(state: Mapping[str, Any], more: str = "") -> str:
    """A GangTask's own current details: its status word in bold first (a waiting gang says so, though the
    Web UI's list shows it Running), then :func:`gang_line`, then ``more`` (markdown: where its ranks run)."""
    status = gang_status(state, state.get("ended"))
    head = "**waiting** for a placement — " if status == "waiting" else f"**{status}** — "
    return head + _cell(gang_line(state)) + more


def run_details(head: str, gangs: Iterable[Mapping[str, Any]]) -> str:
    """A run's current details: ``head`` (its task counts, markdown) and a line per distributed task call
    (``{"call", "ended", **state}``), those that have not ended first, at most :data:`GANGS_SHOWN`."""
    rows = list(gangs)
    live = [g for g in rows if not g.get("ended")]
    ended = [g for g in rows if g.get("ended")]
    room = GANGS_SHOWN - len(live)
    shown = live + ended[-room:] if room > 0 and ended else live[:GANGS_SHOWN]
    lines = [head]
    if shown:
        lines.append("")
    for gang in shown:
        status = gang_status(gang, gang.get("ended"))
        lines.append(f"- **{_cell(str(gang.get('call')))}** · *{status}* · {_cell(gang_line(gang))}")
    if len(rows) > len(shown):
        lines.append(f"- … and {len(rows) - len(shown)} more distributed task calls (`gangflow status`)")
    return "\n".join(lines)
