"""The other gangs of ``bench_recovery.py --busy N``: checkpointed 2-node DDP training that keeps running.

Each ``busy`` run is one gang like the measured one (``examples/resilient_training.py``: the same model, a
report every step, a checkpoint every ``checkpoint_every`` steps) that trains until it is cancelled. Its
ranks ask for one GPU slot each, and only the bench's extra node agents offer GPU slots (logical ones on a
CPU box, gloo): so the busy gangs never land on the agents the measured gang uses, and the measured gang's
kill never touches them. ``work`` forward/backward passes per step (a fixed count, the same on every rank:
each one is a DDP all-reduce) set how much CPU the busy ranks take from the rest, as real training does.

A code bundle of its own (not imported by the benchmark at its import time): the client packs this file.
"""

from __future__ import annotations

import time

from engine import Gang, Resources, checkpoint, report, task, workflow
from plugins.pytorch import PyTorch

__all__ = ["busy", "busy_train"]


@task(
    plugin=PyTorch(nnodes=2, nproc_per_node=1, timeout=60),
    resources=Resources(cpu=1, gpu=1),
    gang=Gang(max_restarts=10),
)
def busy_train(total_steps: int, checkpoint_every: int, step_seconds: float, work: int) -> int:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start, _state = checkpoint.load_torch(model, opt)
    report(step=start, force=True)
    for step in range(start, total_steps):
        for _ in range(max(1, work)):
            x = torch.randn(64, 64)
            loss = ((model(x) - x.sum(1, keepdim=True).sin()) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        report(step=step + 1, loss=loss.item())
        time.sleep(step_seconds)
        if (step + 1) % checkpoint_every == 0:
            checkpoint.save_torch(model, opt, step=step + 1)
    del model, opt
    return total_steps


@workflow
async def busy(
    total_steps: int = 1_000_000, checkpoint_every: int = 20, step_seconds: float = 0.1, work: int = 1
) -> int:
    return await busy_train(
        total_steps=total_steps, checkpoint_every=checkpoint_every, step_seconds=step_seconds, work=work
    )
