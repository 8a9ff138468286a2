"""JAX data-parallel training across 2 processes on 2 node agents.

    gangflow dev --nodes 2
    gangflow run examples/jax_pipeline.py:pipeline --steps 100

Each process fits the same linear model on its own shard of the data; every step the gradients are
averaged across processes (a cross-process all-gather), so the two copies stay identical.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from pydantic import BaseModel

from engine import Directory, current_rank, task, workflow
from plugins.jax import Jax


class Fit(BaseModel):
    weights: list[float]
    train_loss: float
    processes: int


@task
def make_data(rows: int = 4000, features: int = 4, seed: int = 0) -> Directory:
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features)).astype("float32")
    w = np.arange(1, features + 1, dtype="float32")
    y = x @ w + rng.normal(scale=0.1, size=rows).astype("float32")
    out = Path(tempfile.mkdtemp(prefix="jax-data-")) / "data"
    out.mkdir()
    np.savez(out / "data.npz", x=x, y=y)
    return Directory(out)


@task(plugin=Jax(nnodes=2, nproc_per_node=1))
def train(data: Directory, steps: int = 100, lr: float = 0.1) -> Fit:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import multihost_utils

    me = current_rank()
    arrays = np.load(Path(data.path) / "data.npz")
    x, y = jnp.asarray(arrays["x"][me.rank :: me.world_size]), jnp.asarray(arrays["y"][me.rank :: me.world_size])

    def loss(w: jax.Array) -> jax.Array:
        return jnp.mean((x @ w - y) ** 2)

    grad = jax.jit(jax.grad(loss))
    w = jnp.zeros(x.shape[1])
    for _ in range(steps):
        # the cross-process reduction: average this step's gradient over every process
        g = multihost_utils.process_allgather(np.asarray(grad(w))).mean(axis=0)
        w = w - lr * g
    total = multihost_utils.process_allgather(np.asarray([loss(w)])).mean()
    return Fit(weights=[float(v) for v in w], train_loss=float(total), processes=jax.process_count())


@task
def evaluate(fit: Fit, data: Directory) -> float:
    import numpy as np

    arrays = np.load(Path(data.path) / "data.npz")
    return float(np.mean((arrays["x"] @ np.asarray(fit.weights, dtype="float32") - arrays["y"]) ** 2))


@workflow
async def pipeline(rows: int = 4000, steps: int = 100) -> tuple[Fit, float]:
    data = await make_data(rows=rows)
    fit = await train(data=data, steps=steps)
    return fit, await evaluate(fit=fit, data=data)
