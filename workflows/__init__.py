"""Durable Temporal workflows: the user-workflow shell (GangRun and the Scheduler come with the executor)."""

from workflows.shell import PROGRESS_QUERY, UserWorkflow, configure

__all__ = ["PROGRESS_QUERY", "UserWorkflow", "configure"]
