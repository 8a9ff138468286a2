"""PyTorch distributed (DDP, FSDP, ...) as a gangflow plugin.

    @task(plugin=PyTorch(nnodes=2, nproc_per_node=2), resources=Resources(gpu=2))
    def train(data: Directory, epochs: int) -> Model: ...      # the body runs on every rank

Each rank gets torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...) and
Kubeflow Trainer's PET_* names; the process group is initialised before the body (``env://``, with a
bounded timeout so a hung peer cannot stall the gang for torch's default 30 minutes) and destroyed after.
``script="train.py"`` runs an existing torchrun-style script unchanged as the rank command instead
(``plugins.script``).
torch is imported only inside a rank.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from datetime import timedelta

from engine.core.gang import GangPlugin, RankContext
from plugins.script import Scripted

__all__ = ["PyTorch"]

_BACKENDS = ("auto", "nccl", "gloo")


@dataclass(frozen=True)
class PyTorch(Scripted, GangPlugin):
    """PyTorch distributed: torchrun's environment, the process group ready before the body."""

    nnodes: int = 1
    nproc_per_node: int = 1
    backend: str = "auto"
    #: bound on rendezvous and on every collective; torch's default is 30 minutes
    timeout: float = 300.0
    #: run this torchrun-style script (path relative to the code bundle's root) instead of the task body
    script: str | None = None
    args: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.backend not in _BACKENDS:
            raise ValueError(f"PyTorch backend must be one of {', '.join(_BACKENDS)}, got {self.backend!r}")
        if self.timeout <= 0:
            raise ValueError(f"PyTorch timeout must be positive, got {self.timeout!r}")
        self._check_script()

    def rank_env(self, rank: RankContext) -> dict[str, str]:
        env = {"GANGFLOW_TORCH_BACKEND": self.backend, "GANGFLOW_TORCH_TIMEOUT": str(self.timeout)}
        if rank.gpu_ids:
            env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"  # fail a collective on a dead peer instead of hanging
        return env

    def resolved_backend(self, rank: RankContext) -> str:
        if self.backend != "auto":
            return self.backend
        import torch

        # GPU ids on a CPU-only machine are logical slots (gangflow dev): those ranks use gloo
        return "nccl" if rank.gpu_ids and torch.cuda.is_available() else "gloo"

    def setup(self, rank: RankContext) -> None:
        import torch
        import torch.distributed as dist

        backend = self.resolved_backend(rank)
        if backend == "nccl":
            torch.cuda.set_device(0)  # CUDA_VISIBLE_DEVICES holds this rank's GPU(s) only
        dist.init_process_group(backend, timeout=timedelta(seconds=self.timeout))

    def teardown(self, rank: RankContext) -> None:
        import torch.distributed as dist

        gc.collect()  # DDP objects still alive at destroy time make gloo abort at exit now and then
        if dist.is_initialized():
            dist.destroy_process_group()
