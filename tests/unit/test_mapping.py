"""engine.map without Temporal: in plain Python (DirectDispatcher) and under run_local."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import engine
from engine import InputError, task, workflow
from engine.core.mapping import MapFailedError, settle
from plugins.pytorch import PyTorch


@task
def square(x: int) -> int:
    if x % 10 == 3:
        raise ValueError(f"{x} is unlucky")
    return x * x


@task
def scale(x: int, by: int = 2) -> int:
    return x * by


@task
def nothing() -> int:
    return 0


@task(plugin=PyTorch(nproc_per_node=1))
def train(x: int) -> int:
    return x


def _map(fn: Any, items: Any, **options: Any) -> Any:
    return asyncio.run(engine.map(fn, items, **options))


# -- results ------------------------------------------------------------------------------------------
def test_results_come_back_in_input_order_with_failed_slots_none() -> None:
    assert _map(square, list(range(12)), min_success_ratio=0.5) == [None if x % 10 == 3 else x * x for x in range(12)]


def test_several_arguments_come_as_dicts_with_defaults_filled_in() -> None:
    assert _map(scale, [{"x": 1}, {"x": 2, "by": 10}, {"by": 0, "x": 5}]) == [2, 20, 0]


def test_an_empty_list_maps_to_an_empty_list() -> None:
    assert _map(square, []) == []


def test_concurrency_bounds_the_items_in_flight() -> None:
    running = peak = 0

    @task
    async def slow(x: int) -> int:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1
        return x

    assert _map(slow, list(range(20)), concurrency=3) == list(range(20))
    assert peak == 3


def test_run_local_maps_with_the_same_checks_and_results() -> None:
    @workflow
    async def squares(n: int, ratio: float) -> list[int | None]:
        return await engine.map(square, list(range(n)), concurrency=4, min_success_ratio=ratio)

    assert engine.run_local(squares, n=5, ratio=0.8) == [0, 1, 4, None, 16]
    with pytest.raises(MapFailedError, match=r"1 of 5 items failed \(item 3\)"):
        engine.run_local(squares, n=5, ratio=1.0)


# -- the success ratio ----------------------------------------------------------------------------
def test_below_the_ratio_the_map_fails_naming_the_items_and_their_errors() -> None:
    with pytest.raises(MapFailedError) as caught:
        _map(square, list(range(20)), min_success_ratio=0.95)
    message = str(caught.value)
    assert "engine.map(square): 2 of 20 items failed (items 3, 13); 18 succeeded" in message
    assert "below min_success_ratio=0.95 (needs 19)" in message
    assert "item 3: ValueError: 3 is unlucky; item 13: ValueError: 13 is unlucky" in message
    assert caught.value.kind == "MapFailed"


def test_the_summary_spells_out_the_first_few_failures_only() -> None:
    with pytest.raises(MapFailedError) as caught:
        _map(square, list(range(100)))
    message = str(caught.value)
    assert "10 of 100 items failed (items 3, 13, 23, 33, 43, 53, 63, 73, 83, 93)" in message
    assert "item 43: ValueError: 43 is unlucky; and 5 more" in message
    assert "item 53:" not in message


def test_the_ratio_counts_exactly_at_the_boundary() -> None:
    # 0.9 * 50 is 45.000000000000004 in floating point: 45 successes are enough
    results = settle("t", list(range(50)), [(i, "boom") for i in range(5)], 0.9)
    assert results[:6] == [None] * 5 + [5]
    with pytest.raises(MapFailedError, match="needs 45"):
        settle("t", list(range(50)), [(i, "boom") for i in range(6)], 0.9)
    assert settle("t", [1, 2], [(0, "x"), (1, "y")], 0.0) == [None, None]


# -- bad input: refused before anything runs --------------------------------------------------------
def test_a_wrong_item_is_refused_naming_its_index_before_any_item_runs() -> None:
    ran: list[int] = []

    @task
    def record(x: int) -> int:
        ran.append(x)
        return x

    with pytest.raises(InputError, match=r"engine.map\(record\): item 2: task 'record': input 'x': expected int"):
        _map(record, [1, 2, "three", 4])
    assert ran == []


def test_several_arguments_need_dict_items() -> None:
    with pytest.raises(InputError, match=r"item 1 must be a dict of the task's inputs \(x, by\), got int: 7"):
        _map(scale, [{"x": 1}, 7])
    with pytest.raises(InputError, match=r"item 0: task 'scale': unknown input 'y'"):
        _map(scale, [{"y": 1}])
    with pytest.raises(InputError, match=r"item 0: task 'scale': missing required input 'x'"):
        _map(scale, [{"by": 1}])


@pytest.mark.parametrize(
    ("fn", "items", "options", "message"),
    [
        (square, (1, 2), {}, None),  # a tuple is fine
        (square, {1, 2}, {}, "items must be a list, got set"),
        (square, "123", {}, "items must be a list, got str"),
        (square, [1], {"concurrency": 0}, "concurrency must be an int >= 1, got 0"),
        (square, [1], {"concurrency": 2.5}, "concurrency must be an int >= 1, got 2.5"),
        (square, [1], {"min_success_ratio": 1.5}, "min_success_ratio must be a number from 0 to 1, got 1.5"),
        (square, [1], {"min_success_ratio": "all"}, "min_success_ratio must be a number from 0 to 1, got 'all'"),
        (square, [1], {"chunk_size": 0}, "chunk_size must be an int >= 1, got 0"),
        (len, [1], {}, "engine.map expects a @task, got <built-in function len>"),
        (nothing, [1], {}, "task 'nothing' takes no inputs"),
        (train, [1], {}, "engine.map takes plain tasks; task 'train' is distributed"),
    ],
)
def test_bad_arguments_are_refused_with_a_clear_message(fn: Any, items: Any, options: Any, message: str | None) -> None:
    if message is None:
        assert _map(fn, items, **options) == [1, 4]
        return
    with pytest.raises(InputError) as caught:
        _map(fn, items, **options)
    assert message in str(caught.value)
