"""A fixed number of DDP training steps (gloo, CPU): the workload of ``bench_launch.py``.

    torchrun --standalone --nproc_per_node=2 ddp_steps.py --steps 200

A plain torchrun-style script: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT come from the environment
(``env://``), so it runs unchanged under torchrun and as a gangflow ``PyTorch(script=...)`` task. Rank 0
prints one line ``STEPS_PER_SEC <float>`` measured over the training loop only (not over start-up,
rendezvous or teardown), and one line ``PHASES {json}`` of wall-clock timestamps (epoch seconds: process
start, imports done, process group up, loop start and end, process group destroyed) so the launcher's own
share of the wall time can be told apart from the script's.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

#: the default step count, overridable by ``--steps`` or this environment variable
STEPS_ENV = "GANGFLOW_BENCH_STEPS"
DEFAULT_STEPS = 400
BATCH = 64
WIDTH = 512


def process_start_time() -> float:
    """When this process was created (epoch seconds, 10 ms resolution), from /proc; now if unknown."""
    try:
        with open("/proc/self/stat") as handle:
            started = int(handle.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime") as handle:  # the same clock (since boot) as the start time above
            uptime = float(handle.read().split()[0])
        return time.time() - (uptime - started)
    except (OSError, ValueError, IndexError):
        return time.time()


def model() -> torch.nn.Module:
    """An MLP of about 0.4 M parameters."""
    return torch.nn.Sequential(
        torch.nn.Linear(256, WIDTH),
        torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, WIDTH),
        torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, 10),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="fixed-length DDP training (gloo)")
    parser.add_argument("--steps", type=int, default=int(os.environ.get(STEPS_ENV, DEFAULT_STEPS)))
    args = parser.parse_args()
    stamps = {"proc_start": process_start_time(), "imported": time.time()}

    dist.init_process_group("gloo")
    stamps["pg_ready"] = time.time()
    rank = dist.get_rank()
    torch.manual_seed(0)  # identical initial weights on every rank
    ddp = DistributedDataParallel(model())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1000 + rank)  # different data on every rank
    xs = torch.randn(16, BATCH, 256, generator=gen)
    ys = torch.randint(0, 10, (16, BATCH), generator=gen)
    loss_fn = torch.nn.CrossEntropyLoss()

    dist.barrier()  # start the clock together
    stamps["loop_start"] = time.time()
    t0 = time.perf_counter()
    for step in range(args.steps):
        i = step % xs.shape[0]
        loss = loss_fn(ddp(xs[i]), ys[i])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    dist.barrier()
    elapsed = time.perf_counter() - t0
    stamps["loop_end"] = time.time()

    if rank == 0:
        print(f"loss {loss.item():.4f} after {args.steps} steps in {elapsed:.3f} s", flush=True)
        print(f"STEPS_PER_SEC {args.steps / elapsed:.3f}", flush=True)
    # DDP objects still alive at destroy time make gloo abort at exit now and then
    del ddp, opt
    gc.collect()
    dist.destroy_process_group()
    stamps["pg_destroyed"] = time.time()
    if rank == 0:
        print(f"PHASES {json.dumps(stamps)}", flush=True)


if __name__ == "__main__":
    main()
