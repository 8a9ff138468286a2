"""The per-rank view of a gang: one row per rank (node, rank, pid, last ``engine.report`` step and metrics,
and how long ago that report was), built from what node agents heartbeat for their ranks.

A node agent's heartbeat details (``engine/runtime/node.py``) are ``{"node", "pids", "ranks", "progress",
"summary"}``: ``ranks`` maps each rank on the node to its pid, ``progress`` each rank that has reported to
its latest report (``{"step", "time", "pid", "first_step", **metrics}``), and ``summary`` is :func:`summary_line` of
those rows, the line a person reads in the Web UI. Heartbeats go through JSON, so rank keys arrive as
strings; agents from before ``ranks`` existed send ``pids`` only (then a rank's pid is known once it
reports). Pure: used by the node agent, the client and the CLI alike.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from engine.core.glance import format_metrics  # its one home: a workflow's current details use it too

__all__ = ["RankRow", "format_age", "format_metrics", "rank_rows", "summary_line"]

#: the report's own keys; everything else in a report is a metric the rank chose to report
_REPORT_KEYS = frozenset(
    {"step", "time", "pid", "first_step", "since", "ckpt_step", "ckpt_time", "ckpt_s", "idle_s", "ckpt_idle_s"}
)

RankRow = dict[str, Any]


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def rank_rows(nodes: Iterable[Mapping[str, Any]], now: float) -> list[RankRow]:
    """One row per rank found in ``nodes`` (node agents' heartbeat details), ordered by rank:
    ``{"node", "rank", "pid", "step", "metrics", "reported_at", "age_s"}``; ``step``, ``reported_at`` and
    ``age_s`` are None for a rank that has not reported yet. Malformed entries are skipped, never raised on
    (a heartbeat is whatever an agent of any version sent)."""
    rows: dict[int, RankRow] = {}
    for details in nodes:
        if not isinstance(details, Mapping):
            continue
        node = str(details.get("node") or "?")
        pids = details.get("ranks")
        for key, pid in pids.items() if isinstance(pids, Mapping) else ():
            rank = _int(key)
            if rank is not None:
                rows[rank] = _row(node, rank, _int(pid))
        progress = details.get("progress")
        for key, report in progress.items() if isinstance(progress, Mapping) else ():
            rank = _int(key)
            if rank is None or not isinstance(report, Mapping):
                continue
            row = rows.setdefault(rank, _row(node, rank, None))
            row["pid"] = _int(report.get("pid")) or row["pid"]
            row["step"] = _int(report.get("step"))
            row["metrics"] = {k: v for k, v in report.items() if k not in _REPORT_KEYS}
            at = _number(report.get("time"))
            row["reported_at"] = at
            # a clock a little ahead on the rank's machine must not read as "-1 s ago"
            row["age_s"] = max(0.0, now - at) if at is not None else None
    return [rows[rank] for rank in sorted(rows)]


def _row(node: str, rank: int, pid: int | None) -> RankRow:
    return {"node": node, "rank": rank, "pid": pid, "step": None, "metrics": {}, "reported_at": None, "age_s": None}


def format_age(seconds: float | None) -> str:
    """How long ago a report came, as a person says it: ``3 s ago``, ``4 min ago``, ``2 h 5 min ago``;
    ``no report yet`` when there is none."""
    if seconds is None or not math.isfinite(seconds):
        return "no report yet"
    whole = int(max(0.0, seconds))
    if whole < 60:
        return f"{whole} s ago"
    if whole < 3600:
        return f"{whole // 60} min ago"
    hours, minutes = divmod(whole // 60, 60)
    return f"{hours} h {minutes} min ago" if minutes else f"{hours} h ago"


def summary_line(rows: Iterable[RankRow]) -> str:
    """One line for all ``rows``: ``rank 0 (pid 412) step 40 loss 0.12, 1 s ago; rank 1 (pid 413) no
    report yet`` (a heartbeat's ``summary``, what the Web UI shows)."""
    parts = []
    for row in rows:
        head = f"rank {row['rank']}" + (f" (pid {row['pid']})" if row["pid"] is not None else "")
        if row["step"] is None:
            parts.append(f"{head} {format_age(None)}")
            continue
        metrics = format_metrics(row["metrics"])
        parts.append(f"{head} step {row['step']}{' ' + metrics if metrics else ''}, {format_age(row['age_s'])}")
    return "; ".join(parts)
