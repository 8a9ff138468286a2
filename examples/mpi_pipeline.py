"""MPI with mpi4py across 2 node agents × 2 slots: a Monte Carlo estimate of pi.

    gangflow dev --nodes 2
    gangflow run examples/mpi_pipeline.py:pipeline --samples 2000000

Node rank 0 runs mpiexec (MPICH hydra, manual launcher); the other node's share of the ranks is started
by its own node agent, not over ssh. The body runs on every MPI rank; rank 0's return is the result.
"""

from __future__ import annotations

from pydantic import BaseModel

from engine import task, workflow
from plugins.mpi import MPI


class Estimate(BaseModel):
    pi: float
    ranks: int
    samples: int


@task(plugin=MPI(nnodes=2, slots_per_node=2))
def estimate_pi(samples: int = 1_000_000) -> Estimate:
    import numpy as np
    from mpi4py import MPI as mpi

    comm = mpi.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    mine = samples // size
    points = np.random.default_rng(rank).random((mine, 2))
    inside = comm.allreduce(int(((points**2).sum(axis=1) <= 1.0).sum()), op=mpi.SUM)
    return Estimate(pi=4.0 * inside / (mine * size), ranks=size, samples=mine * size)


@workflow
async def pipeline(samples: int = 1_000_000) -> Estimate:
    return await estimate_pi(samples=samples)
