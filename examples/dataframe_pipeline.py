"""DataFrames, numpy arrays and torch tensors as typed task inputs and outputs.

    gangflow dev                                             # in one shell (Temporal + Web UI + a worker)
    gangflow run examples/dataframe_pipeline.py:pipeline --rows 64
    gangflow run examples/dataframe_pipeline.py:broken       # fails: column 'label' is float64, not int64

``load`` returns a DataFrame checked against ``Rows`` (columns ``x: float64`` and ``label: int64``) as it
leaves the task; ``featurize`` receives it and returns a numpy array and a torch tensor; ``fit`` receives all
three. Each value is written to the run's artifact store (parquet, .npy, torch.save) and passed on by
reference: only a small File reference goes through Temporal, and in the workflow body the values are
references (pass them on; look inside them in tasks).
"""

from __future__ import annotations

from typing import Annotated

import numpy as np
import pandas as pd
import torch
from pydantic import BaseModel

from engine import Schema, task, workflow

#: what every frame of labelled rows must have (extra columns are allowed)
Rows = Annotated[pd.DataFrame, Schema(x="float64", label="int64")]


class Fit(BaseModel):
    rows: int
    slope: float
    positives: int
    first_id: int


@task
def load(rows: int = 64, seed: int = 0) -> Rows:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=rows)
    frame = pd.DataFrame({"x": x, "label": (x > 0).astype("int64")})
    frame.index = pd.Index(range(100, 100 + rows), name="id")  # a non-default index travels too
    return frame


@task
def featurize(frame: Rows) -> tuple[np.ndarray, torch.Tensor]:
    features = np.stack([frame["x"].to_numpy(), frame["x"].to_numpy() ** 2], axis=1)
    return features, torch.tensor(frame["label"].to_numpy(), dtype=torch.float32)


@task
def fit(frame: Rows, features: np.ndarray, target: torch.Tensor) -> Fit:
    x = torch.from_numpy(features[:, :1]).float()
    slope = float(torch.linalg.lstsq(x, target.unsqueeze(1)).solution.item())
    return Fit(rows=len(frame), slope=slope, positives=int(target.sum().item()), first_id=int(frame.index[0]))


@workflow
async def pipeline(rows: int = 64, seed: int = 0) -> Fit:
    frame = await load(rows=rows, seed=seed)
    features, target = await featurize(frame=frame)
    return await fit(frame=frame, features=features, target=target)


@task
def load_unlabelled(rows: int = 8) -> Rows:
    """Breaks the schema on purpose: its label column is float64, so the task fails as it returns."""
    return pd.DataFrame({"x": np.linspace(0, 1, rows), "label": np.full(rows, 0.5)})


@workflow
async def broken(rows: int = 8) -> Fit:
    frame = await load_unlabelled(rows=rows)
    features, target = await featurize(frame=frame)
    return await fit(frame=frame, features=features, target=target)


@workflow
async def sample(rows: int = 8) -> pd.DataFrame:
    """A workflow's result can be a DataFrame too: the client downloads it."""
    return await load(rows=rows)
