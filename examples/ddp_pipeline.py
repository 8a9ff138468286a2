"""Distributed training: synthetic data → DDP on 2 nodes × 2 ranks → evaluation.

    gangflow dev --nodes 2 --gpus-per-node 2        # one machine standing in for 2 servers × 2 GPUs
    gangflow run examples/ddp_pipeline.py:pipeline --epochs 3
    gangflow logs <run-id> --task train --rank 3    # one rank's output

`train` runs on every rank (4 processes placed by gangflow's scheduler on the two node agents, each
pinned to its own GPU slot); the process group is ready before the body starts. Each rank trains on its
own shard; DDP averages the gradients, so all replicas stay identical, and rank 0's return value (the
model, saved as a File, and its metrics) is the task's result. On real GPUs the same code uses NCCL.
Each rank reports its step and loss (`engine.report`): `gangflow status <run-id>` shows them per rank, and
the attempt's goodput.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from pydantic import BaseModel

from engine import Directory, File, Resources, report, task, workflow
from plugins.pytorch import PyTorch


class TrainMetrics(BaseModel):
    epochs: int
    world_size: int
    final_loss: float
    samples_per_sec: float


class Trained(BaseModel):
    model: File
    metrics: TrainMetrics


class Report(BaseModel):
    accuracy: float
    metrics: TrainMetrics
    model: File


@task(resources=Resources(cpu=1))
def make_data(rows: int = 8000, features: int = 16, seed: int = 0) -> Directory:
    """A non-linear binary problem (XOR of two features, the rest noise), split into train and test."""
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features)).astype("float32")
    y = ((x[:, 0] > 0) ^ (x[:, 1] > 0)).astype("int64")
    out = Path(tempfile.mkdtemp(prefix="ddp-data-")) / "data"
    out.mkdir()
    split = int(rows * 0.8)
    np.savez(out / "train.npz", x=x[:split], y=y[:split])
    np.savez(out / "test.npz", x=x[split:], y=y[split:])
    return Directory(out)


def _net(features: int) -> object:
    import torch

    return torch.nn.Sequential(
        torch.nn.Linear(features, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2)
    )


@task(plugin=PyTorch(nnodes=2, nproc_per_node=2), resources=Resources(gpu=2, cpu=2))
def train(data: Directory, epochs: int = 3, lr: float = 0.003, batch_size: int = 64) -> Trained:
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    arrays = np.load(Path(data.path) / "train.npz")
    per_rank = len(arrays["y"]) // world  # equal shards: every rank must run the same number of steps
    x = torch.from_numpy(arrays["x"][rank * per_rank : (rank + 1) * per_rank]).to(device)
    y = torch.from_numpy(arrays["y"][rank * per_rank : (rank + 1) * per_rank]).to(device)
    torch.manual_seed(0)  # the same initial weights everywhere (DDP would broadcast rank 0's anyway)
    model = DistributedDataParallel(_net(x.shape[1]).to(device))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(rank)
    started, step = time.perf_counter(), 0
    for epoch in range(epochs):
        for batch in torch.randperm(per_rank, generator=generator).split(batch_size):
            opt.zero_grad()
            loss = loss_fn(model(x[batch]), y[batch])
            loss.backward()
            opt.step()
            step += 1
            # gangflow status's rank table and the run's goodput read it (written at most every few seconds)
            report(step, loss=loss.item(), epoch=epoch)
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        if rank == 0:
            print(f"epoch {epoch + 1}/{epochs}: loss {mean_loss.item() / world:.4f}")
    elapsed = time.perf_counter() - started
    metrics = TrainMetrics(
        epochs=epochs,
        world_size=world,
        final_loss=mean_loss.item() / world,
        samples_per_sec=epochs * per_rank * world / elapsed,
    )
    path = Path(tempfile.mkdtemp(prefix="ddp-model-")) / "model.pt"
    if rank == 0:  # only rank 0's return value becomes the task's result
        torch.save(model.module.state_dict(), path)
    del model, opt
    return Trained(model=File(path), metrics=metrics)


@task
def evaluate(trained: Trained, data: Directory) -> float:
    import numpy as np
    import torch

    arrays = np.load(Path(data.path) / "test.npz")
    x, y = torch.from_numpy(arrays["x"]), torch.from_numpy(arrays["y"])
    net = _net(x.shape[1])
    net.load_state_dict(torch.load(trained.model.path))
    with torch.no_grad():
        return float((net(x).argmax(1) == y).float().mean())


@workflow
async def pipeline(rows: int = 8000, epochs: int = 3) -> Report:
    data = await make_data(rows=rows)
    trained = await train(data=data, epochs=epochs)
    accuracy = await evaluate(trained=trained, data=data)
    return Report(accuracy=accuracy, metrics=trained.metrics, model=trained.model)
