"""What a rank imports: checkpoints, the stop request and the preemption notice (``engine.rank.checkpoint``,
public as ``engine.checkpoint``), progress reports (``engine.report``), and the view of those reports that
the node agent's heartbeat and the CLI show (``engine.rank.view``). Standard library only: a rank starts
fast and a plugin can import it without pulling in Temporal.
"""

from engine.rank.checkpoint import NOTICE_FILE_ENV, NOTICE_SIGNAL_ENV, Preemption, preemption, stop_requested
from engine.rank.progress import report
from engine.rank.view import RankRow, format_age, format_metrics, rank_rows, summary_line

__all__ = [
    "NOTICE_FILE_ENV",
    "NOTICE_SIGNAL_ENV",
    "Preemption",
    "RankRow",
    "format_age",
    "format_metrics",
    "preemption",
    "rank_rows",
    "report",
    "stop_requested",
    "summary_line",
]
