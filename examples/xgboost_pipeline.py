"""Distributed XGBoost: 2 workers on 2 node agents train one model, each on its own shard.

    gangflow dev --nodes 2
    gangflow run examples/xgboost_pipeline.py:pipeline --rounds 20

gangflow starts a fresh Rabit tracker for the attempt on node rank 0 and runs the task body inside
XGBoost's communicator on every worker; rank 0's model comes back as a File.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from engine import Directory, File, current_rank, task, workflow
from plugins.xgboost import XGBoost


@task
def make_data(rows: int = 8000, seed: int = 0) -> Directory:
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 10))
    y = 2 * x[:, 0] + np.sin(3 * x[:, 1]) + x[:, 2] * x[:, 3] + rng.normal(scale=0.1, size=rows)
    out = Path(tempfile.mkdtemp(prefix="xgb-data-")) / "data"
    out.mkdir()
    split = int(rows * 0.8)
    np.savez(out / "train.npz", x=x[:split], y=y[:split])
    np.savez(out / "test.npz", x=x[split:], y=y[split:])
    return Directory(out)


@task(plugin=XGBoost(n_workers=2))
def train(data: Directory, rounds: int = 20, max_depth: int = 4) -> File:
    import numpy as np
    import xgboost as xgb

    me = current_rank()
    arrays = np.load(Path(data.path) / "train.npz")
    shard = slice(me.rank, None, me.world_size)  # this worker's rows
    booster = xgb.train(
        {"tree_method": "hist", "max_depth": max_depth, "seed": 0},
        xgb.DMatrix(arrays["x"][shard], arrays["y"][shard]),
        num_boost_round=rounds,
    )
    path = Path(tempfile.mkdtemp(prefix="xgb-model-")) / "model.json"
    booster.save_model(path)
    return File(path)


@task
def evaluate(model: File, data: Directory) -> float:
    import numpy as np
    import xgboost as xgb

    booster = xgb.Booster()
    booster.load_model(model.path)
    arrays = np.load(Path(data.path) / "test.npz")
    prediction = booster.predict(xgb.DMatrix(arrays["x"]))
    return float(np.sqrt(np.mean((prediction - arrays["y"]) ** 2)))


@workflow
async def pipeline(rows: int = 8000, rounds: int = 20) -> float:
    data = await make_data(rows=rows)
    model = await train(data=data, rounds=rounds)
    return await evaluate(model=model, data=data)
