"""Distributed XGBoost (Rabit / collective) as a gangflow plugin.

    @task(plugin=XGBoost(n_workers=2))
    def train(data: Directory) -> File: ...   # runs on every worker, inside the communicator

For each attempt the engine starts a fresh tracker (``xgboost.tracker.RabitTracker``) on node rank 0,
on the gang's fresh port, and gives every worker Kubeflow Trainer's names (``DMLC_TRACKER_URI``,
``DMLC_TRACKER_PORT``, ``DMLC_TASK_ID``, ``DMLC_NUM_WORKER``). The body runs inside
``xgboost.collective.CommunicatorContext``, so plain ``xgb.train`` on the worker's shard trains one
model together; ``engine.current_rank()`` tells the worker which shard is its own. Waits are bounded:
a dead worker never leaves the tracker or its peers waiting forever. xgboost is imported only inside a
worker (use ``xgboost-cpu`` where no GPU is wanted: the plain package pulls 350 MB of NCCL).
``script="train.py"`` runs an existing worker script unchanged instead of the body, beside the same
tracker: it opens ``CommunicatorContext`` itself from the ``DMLC_*`` variables.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from engine.core.gang import GangPlugin, ProcessSpec, RankContext
from plugins.script import Scripted

__all__ = ["XGBoost"]


@dataclass(frozen=True)
class XGBoost(Scripted, GangPlugin):
    """Distributed XGBoost: a fresh tracker per attempt, the body inside the communicator."""

    n_workers: int = 1
    workers_per_node: int = 1
    #: seconds a worker waits on a peer (XGBoost's ``dmlc_timeout``) and the tracker waits for workers
    timeout: int = 300
    #: run this script (path relative to the code bundle's root) on every worker instead of the task body; it
    #: opens ``xgboost.collective.CommunicatorContext`` itself from the ``DMLC_*`` variables
    script: str | None = None
    args: tuple[str, ...] = field(default=())
    _context: list[Any] = field(default_factory=list, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.n_workers < 1 or self.workers_per_node < 1 or self.n_workers % self.workers_per_node:
            raise ValueError(
                f"XGBoost n_workers={self.n_workers} must be a positive multiple of workers_per_node="
                f"{self.workers_per_node}"
            )
        self._check_script()

    @property
    def nnodes(self) -> int:  # type: ignore[override]
        return self.n_workers // self.workers_per_node

    @property
    def nproc_per_node(self) -> int:  # type: ignore[override]
        return self.workers_per_node

    def rank_env(self, rank: RankContext) -> dict[str, str]:
        return {
            "DMLC_TRACKER_URI": rank.master_addr,
            "DMLC_TRACKER_PORT": str(rank.master_port),
            "DMLC_TASK_ID": str(rank.rank),
            "DMLC_NUM_WORKER": str(rank.world_size),
        }

    def coordinator(self, rank0: RankContext) -> ProcessSpec:
        return ProcessSpec(
            "tracker",
            [
                sys.executable,
                "-m",
                "plugins.xgboost.tracker",
                "--workers",
                str(rank0.world_size),
                "--host",
                rank0.master_addr,
                "--port",
                str(rank0.master_port),
                "--timeout",
                str(self.timeout),
            ],
        )

    def setup(self, rank: RankContext) -> None:
        from xgboost import collective

        context = collective.CommunicatorContext(
            dmlc_tracker_uri=rank.master_addr,
            dmlc_tracker_port=rank.master_port,
            dmlc_task_id=str(rank.rank),
            dmlc_timeout=self.timeout,
            dmlc_retry=30,  # the tracker (started beside rank 0) may still be coming up
        )
        context.__enter__()
        self._context.append(context)

    def teardown(self, rank: RankContext) -> None:
        while self._context:
            self._context.pop().__exit__(None, None, None)
