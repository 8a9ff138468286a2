"""An mpi4py program as mpi4py's docs write one: it knows nothing about gangflow."""

import socket

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
total = comm.allreduce(rank + 1, op=MPI.SUM)
print(f"mpi4py rank {rank} of {size} on {socket.gethostname()}: sum {total}", flush=True)
