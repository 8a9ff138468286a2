"""Training that survives node loss: DDP on 2 nodes with a checkpoint every N steps.

    gangflow dev --nodes 3                                    # 2 nodes for the gang + a spare
    gangflow run examples/resilient_training.py:pipeline --total-steps 200
    # now kill one node agent (kill -9 <pid of 'gangflow node'>) and watch:
    gangflow status <run-id>                                  # the gang restarts on the spare node

When a node dies, its ranks die with it; the survivors' collective breaks at once, GangTask probes the
nodes still running (a dead agent does not answer within 1 s; a node with no survivor to notice is
caught by the heartbeat timeout), stops the survivors, reports the node lost, gets a new placement and
relaunches every rank with GANGFLOW_ATTEMPT + 1. The ranks load the latest checkpoint from
GANGFLOW_CHECKPOINT_DIR (the same for every attempt) and continue from there, so at most
`checkpoint_every` steps are lost. A rank that stops making progress for `hang_timeout` seconds is
treated the same way.
"""

from __future__ import annotations

import os
import time

from pydantic import BaseModel

from engine import Gang, Resources, checkpoint, report, task, workflow
from plugins.pytorch import PyTorch


class Summary(BaseModel):
    steps: int  # the final step reached
    optimizer_steps: int  # optimizer updates in the model's lineage (redone steps are not counted twice)
    first_step: int  # where the final attempt started (> 0 after a resume)
    attempt: int  # GANGFLOW_ATTEMPT of the final attempt
    world_size: int
    final_loss: float


@task(
    plugin=PyTorch(nnodes=2, nproc_per_node=1, timeout=30),
    resources=Resources(cpu=1),
    gang=Gang(max_restarts=3, hang_timeout=20),
)
def train(total_steps: int = 100, checkpoint_every: int = 10, step_seconds: float = 0.05) -> Summary:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    start, state = checkpoint.load_torch(model, opt)  # (0, {}) on the first attempt
    applied = int(state.get("optimizer_steps", 0))
    report(step=start, force=True)
    print(f"attempt {os.environ['GANGFLOW_ATTEMPT']}: rank {rank} starts at step {start}")
    generator = torch.Generator().manual_seed(1000 + rank)
    loss = torch.zeros(())
    for step in range(start, total_steps):
        x = torch.randn(32, 8, generator=generator)
        loss = ((model(x) - x.sum(1, keepdim=True).sin()) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        applied += 1
        report(step=step + 1, loss=loss.item())
        time.sleep(step_seconds)  # stands in for a heavier step
        if (step + 1) % checkpoint_every == 0:
            checkpoint.save_torch(model, opt, step=step + 1, optimizer_steps=applied)
    summary = Summary(
        steps=total_steps,
        optimizer_steps=applied,
        first_step=start,
        attempt=int(os.environ["GANGFLOW_ATTEMPT"]),
        world_size=dist.get_world_size(),
        final_loss=loss.item(),
    )
    del model, opt
    return summary


@workflow
async def pipeline(total_steps: int = 100, checkpoint_every: int = 10, step_seconds: float = 0.05) -> Summary:
    return await train(total_steps=total_steps, checkpoint_every=checkpoint_every, step_seconds=step_seconds)
