"""Quickstart: synthetic data → train a small torch model → evaluate → retrain if it is not good enough.

    gangflow dev                                   # in one shell (Temporal + Web UI + a worker)
    gangflow run examples/quickstart.py:pipeline --epochs 1 --target-accuracy 0.9

Each @task runs as a durable Temporal activity; the @workflow body is plain Python whose `if` decides
at run time whether to train again. The dataset travels as a Directory and the model as a File: both
go to the artifact store and only references pass through Temporal.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from pydantic import BaseModel

from engine import Directory, File, Resources, task, workflow


class TrainMetrics(BaseModel):
    epochs: int
    final_loss: float
    train_accuracy: float


class Model(BaseModel):
    weights: File
    metrics: TrainMetrics


class Report(BaseModel):
    accuracy: float
    epochs: int
    retrained: bool
    model: File


@task(resources=Resources(cpu=1), retries=2)
def make_dataset(rows: int = 4000, features: int = 8, seed: int = 0) -> Directory:
    """Two interleaved classes (an XOR of two features plus noise dimensions): not linearly separable."""
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features)).astype("float32")
    y = ((x[:, 0] > 0) ^ (x[:, 1] > 0)).astype("int64")
    out = Path(tempfile.mkdtemp(prefix="dataset-")) / "dataset"
    out.mkdir()
    split = int(rows * 0.8)
    np.savez(out / "train.npz", x=x[:split], y=y[:split])
    np.savez(out / "test.npz", x=x[split:], y=y[split:])
    print(f"dataset: {split} train / {rows - split} test rows, {features} features")
    return Directory(out)


def _load(data: Directory, split: str) -> tuple[object, object]:
    import numpy as np
    import torch

    arrays = np.load(Path(data.path) / f"{split}.npz")
    return torch.from_numpy(arrays["x"]), torch.from_numpy(arrays["y"])


def _net(features: int) -> object:
    import torch

    return torch.nn.Sequential(torch.nn.Linear(features, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))


@task(resources=Resources(cpu=2), retries=1)
def train(data: Directory, epochs: int = 1, lr: float = 0.003, seed: int = 0) -> Model:
    import torch

    torch.manual_seed(seed)
    x, y = _load(data, "train")
    net = _net(x.shape[1])
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    for epoch in range(epochs):
        for batch in torch.randperm(len(x)).split(64):
            opt.zero_grad()
            loss = loss_fn(net(x[batch]), y[batch])
            loss.backward()
            opt.step()
        print(f"epoch {epoch + 1}/{epochs} loss {loss.item():.4f}")
    with torch.no_grad():
        accuracy = (net(x).argmax(1) == y).float().mean().item()
    path = Path(tempfile.mkdtemp(prefix="model-")) / "model.pt"
    torch.save(net.state_dict(), path)
    return Model(
        weights=File(path), metrics=TrainMetrics(epochs=epochs, final_loss=loss.item(), train_accuracy=accuracy)
    )


@task
def evaluate(model: Model, data: Directory) -> float:
    import torch

    x, y = _load(data, "test")
    net = _net(x.shape[1])
    net.load_state_dict(torch.load(model.weights.path))
    with torch.no_grad():
        accuracy = (net(x).argmax(1) == y).float().mean().item()
    print(f"test accuracy {accuracy:.3f}")
    return accuracy


@workflow
async def pipeline(rows: int = 4000, epochs: int = 1, target_accuracy: float = 0.9) -> Report:
    data = await make_dataset(rows=rows)
    model = await train(data=data, epochs=epochs)
    accuracy = await evaluate(model=model, data=data)
    retrained = accuracy < target_accuracy
    if retrained:  # dynamic branching is plain Python
        model = await train(data=data, epochs=epochs * 5)
        accuracy = await evaluate(model=model, data=data)
    return Report(accuracy=accuracy, epochs=model.metrics.epochs, retrained=retrained, model=model.weights)
