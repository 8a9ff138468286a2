"""Two teams sharing 4 GPU slots: quota, borrowing and reclaim, with training that resumes after preemption.

    gangflow dev --nodes 2 --gpus-per-node 2 --queues examples/queues.yaml
    gangflow run examples/multitenant.py:pipeline --tenant team-a --detach   # team-a's quota: 2 GPUs
    gangflow run examples/multitenant.py:pipeline --tenant team-a --detach   # 2 more, borrowed from team-b
    gangflow queues show                                                      # team-a borrowed 2, team-b lent 2
    gangflow run examples/multitenant.py:pipeline --tenant team-b            # team-b takes its quota back
    gangflow cluster                                                          # one team-a gang was preempted

Each run trains one gang of 2 ranks on one node, 1 GPU slot each (on a machine without GPUs the ranks
train on CPU with gloo and only the slots are accounted). The preempted team-a gang gets a notice
(SIGTERM; ``checkpoint.stop_requested()`` turns true), saves a checkpoint at the step it reached and
returns, which gives its GPUs to team-b at once. It queues again at its old place and, when GPUs free up,
resumes from that checkpoint with GANGFLOW_ATTEMPT + 1: no restart of its budget is spent, and no step is
lost or applied twice. ``cooperate=False`` ignores the notice: SIGTERM then stops the ranks at once and
the gang resumes from its last periodic checkpoint (what a plain SIGTERM-and-kill preemption costs).
"""

from __future__ import annotations

import os
import time
from typing import Any

from pydantic import BaseModel

from engine import Resources, checkpoint, report, task, workflow
from plugins.pytorch import PyTorch


class Trained(BaseModel):
    steps: int  # the final step reached
    optimizer_steps: int  # updates in the model's lineage: equal to `steps` when no step ran twice
    first_step: int  # where the final attempt started (> 0 after a resume)
    attempt: int  # GANGFLOW_ATTEMPT of the final attempt
    final_loss: float


def _stop_agreed(dist: Any, torch: Any) -> bool:
    """Whether any rank was asked to stop (a preemption notice), agreed by all ranks: a rank that stopped
    alone would leave the others waiting in the next all-reduce."""
    flag = torch.tensor([1.0 if checkpoint.stop_requested() else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


@task(plugin=PyTorch(nnodes=1, nproc_per_node=2), resources=Resources(gpu=2, cpu=1))
def train(steps: int = 200, checkpoint_every: int = 10, step_seconds: float = 0.1, cooperate: bool = True) -> Trained:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    start, state = checkpoint.load_torch(model, opt)  # (0, {}) on the first attempt
    applied = int(state.get("optimizer_steps", 0))
    print(f"attempt {os.environ['GANGFLOW_ATTEMPT']}: rank {dist.get_rank()} starts at step {start}")
    generator = torch.Generator().manual_seed(1000 + dist.get_rank())
    loss = torch.zeros(())
    for step in range(start, steps):
        if cooperate and _stop_agreed(dist, torch):  # every rank stops at the same step: save it and return
            checkpoint.save_torch(model, opt, step=step, optimizer_steps=applied)
            print(f"rank {dist.get_rank()}: {checkpoint.preemption() or 'asked to stop'}; saved step {step}")
            break
        x = torch.randn(32, 8, generator=generator)
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        applied += 1
        report(step=step + 1, loss=loss.item())
        time.sleep(step_seconds)  # stands in for a heavier step
        if (step + 1) % checkpoint_every == 0:
            checkpoint.save_torch(model, opt, step=step + 1, optimizer_steps=applied)
    return Trained(
        steps=steps,
        optimizer_steps=applied,
        first_step=start,
        attempt=int(os.environ["GANGFLOW_ATTEMPT"]),
        final_loss=loss.item(),
    )


@workflow
async def pipeline(
    steps: int = 200, checkpoint_every: int = 10, step_seconds: float = 0.1, cooperate: bool = True
) -> Trained:
    return await train(steps=steps, checkpoint_every=checkpoint_every, step_seconds=step_seconds, cooperate=cooperate)
