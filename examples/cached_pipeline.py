"""Caching: prepare → train → evaluate, each ``@task(cache=True)``; a second run re-executes nothing.

    gangflow run examples/cached_pipeline.py:pipeline --rows 200 --epochs 3     # runs all three tasks
    gangflow run examples/cached_pipeline.py:pipeline --rows 200 --epochs 3     # all three cached
    gangflow run examples/cached_pipeline.py:pipeline --rows 200 --epochs 4     # prepare cached, the rest run

The data set and the model travel as Files, which count in the cache key by content: ``train`` is a hit
whenever ``prepare`` made the same bytes, whichever run or path they came from. ``log`` names a file each task
appends its name to when its body runs (the tests count executions with it; leave it empty otherwise).
"""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

from engine import File, task, workflow


def _note(log: str, name: str) -> None:
    if log:
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(name + "\n")


@task(cache=True, cache_version="1")
def prepare(rows: int, seed: int = 0, log: str = "") -> File:
    """A synthetic regression data set: y = 3x + 1 plus noise, one JSON row per line."""
    _note(log, "prepare")
    rng = random.Random(seed)
    out = Path(tempfile.mkdtemp(prefix="data-")) / "data.jsonl"
    with open(out, "w", encoding="utf-8") as handle:
        for _ in range(rows):
            x = rng.uniform(-1, 1)
            handle.write(json.dumps({"x": round(x, 6), "y": round(3 * x + 1 + rng.gauss(0, 0.1), 6)}) + "\n")
    return File(out)


@task(cache=True, cache_version="1")
def train(data: File, epochs: int, lr: float = 0.1, log: str = "") -> File:
    """Gradient descent on a line; the model is its two weights as JSON."""
    _note(log, "train")
    points = [json.loads(line) for line in Path(data.path).read_text().splitlines()]
    w = b = 0.0
    for _ in range(epochs * 20):
        gw = sum((w * p["x"] + b - p["y"]) * p["x"] for p in points) / len(points)
        gb = sum(w * p["x"] + b - p["y"] for p in points) / len(points)
        w, b = w - lr * 2 * gw, b - lr * 2 * gb
    out = Path(tempfile.mkdtemp(prefix="model-")) / "model.json"
    out.write_text(json.dumps({"w": round(w, 9), "b": round(b, 9)}))
    return File(out)


@task(cache=True, cache_version="1", lightweight=True)
def evaluate(model: File, data: File, log: str = "") -> float:
    """Mean squared error of the model on the data (a lightweight task: a local activity on the worker)."""
    _note(log, "evaluate")
    weights = json.loads(Path(model.path).read_text())
    points = [json.loads(line) for line in Path(data.path).read_text().splitlines()]
    return sum((weights["w"] * p["x"] + weights["b"] - p["y"]) ** 2 for p in points) / len(points)


@workflow
async def pipeline(rows: int = 200, epochs: int = 3, seed: int = 0, log: str = "") -> float:
    data = await prepare(rows=rows, seed=seed, log=log)
    model = await train(data=data, epochs=epochs, log=log)
    return await evaluate(model=model, data=data, log=log)
