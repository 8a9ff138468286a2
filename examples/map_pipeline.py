"""``engine.map``: one task over a list, results in input order (the README's "Map over lists").

    gangflow run examples/map_pipeline.py:squares --n 50
    gangflow run examples/map_pipeline.py:squares --n 50 --min-success-ratio 1.0    # fails, naming item 13

``square`` takes one argument, so each item is that argument; ``scaled`` maps a two-argument task, so each item
is a dict of its arguments (and that task is lightweight: a local activity). Item 13 always fails: above
``min_success_ratio`` its slot is ``None``, below it the run fails with a summary naming the item and its error.
``naps`` is slow on purpose (the tests cancel it); ``sizes`` and ``copies`` move large values (the tests push a
chunk past Temporal's 2 MB payload limit).
"""

from __future__ import annotations

import time

import engine
from engine import task, workflow


@task
def square(x: int) -> int:
    if x == 13:
        raise ValueError(f"{x} is unlucky")
    return x * x


@task(lightweight=True)
def scale(x: int, by: int = 2) -> int:
    return x * by


@workflow
async def squares(n: int = 50, min_success_ratio: float = 0.9, chunk_size: int = 1000) -> list[int | None]:
    """``chunk_size``: items per child workflow on Temporal (the tests lower it to exercise chunking)."""
    return await engine.map(
        square, list(range(n)), concurrency=8, min_success_ratio=min_success_ratio, chunk_size=chunk_size
    )


@workflow
async def scaled(n: int = 5, by: int = 3) -> list[int]:
    return await engine.map(scale, [{"x": x, "by": by} for x in range(n)])


@task
def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@workflow
async def naps(n: int = 30, seconds: float = 1.0, chunk_size: int = 10) -> list[float]:
    return await engine.map(nap, [seconds] * n, concurrency=2, chunk_size=chunk_size)


@task
def size(text: str) -> int:
    return len(text)


@task
def copy(kb: int) -> str:
    return "x" * (kb * 1024)


@workflow
async def sizes(n: int = 10, kb: int = 300, chunk_size: int = 1000) -> list[int]:
    """The chunks' inputs: ``n`` strings of ``kb`` KiB each."""
    return await engine.map(size, ["x" * (kb * 1024)] * n, chunk_size=chunk_size)


@workflow
async def copies(n: int = 10, kb: int = 300, chunk_size: int = 1000) -> int:
    """The chunks' results: ``n`` strings of ``kb`` KiB each (only their count comes back)."""
    return len(await engine.map(copy, [kb] * n, chunk_size=chunk_size))
