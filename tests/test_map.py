"""engine.map on a real Temporal dev server and a real worker: chunks as child workflows, order, ratio, cancel."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import failure_of, gangflow_cli, make_client, run, until
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
from temporalio.service import RPCError, RPCStatusCode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import map_flows
import map_pipeline


async def _chunk_status(client, run_id: str, task: str, chunk: int) -> WorkflowExecutionStatus | None:
    """The status of chunk ``chunk`` of the run's first map of ``task``; None if it was never started."""
    try:
        desc = await client.temporal.get_workflow_handle(f"{run_id}.map-{task}-1.{chunk}").describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    return desc.status


def test_map_keeps_input_order_across_chunks_and_leaves_a_failed_slot_none(server, worker, artifacts):
    async def main() -> None:
        client = await make_client(server, artifacts)
        # 50 items in chunks of 20: three MapChunk children (20, 20, 10 items), item 13 fails in the first
        run_id = await client.start(map_pipeline.squares, {"n": 50, "min_success_ratio": 0.9, "chunk_size": 20})
        result = await client.result(run_id, map_pipeline.squares)
        assert result == [None if x == 13 else x * x for x in range(50)]
        statuses = [await _chunk_status(client, run_id, "square", c) for c in range(4)]
        assert statuses == [WorkflowExecutionStatus.COMPLETED] * 3 + [None]
        info = await client.status(run_id)  # gangflow status reads a map run's history
        assert info.status == "COMPLETED"
        # each chunk under its items' task, as the author wrote it (not the MapChunk workflow type)
        assert [(t.name, t.kind, t.status, t.detail) for t in info.tasks] == [
            ("square", "map", "completed", f"chunk {c}") for c in range(3)
        ]
        return run_id

    run_id = run(main())
    # its items printed nothing: the task is known by that name, and said to have run
    said = gangflow_cli(
        "logs", run_id, "--task", "square", GANGFLOW_ADDRESS=server.address, GANGFLOW_ARTIFACTS=artifacts
    )
    assert said.returncode == 0, said.stderr
    assert "task 'square' of run" in said.stderr and "printed nothing" in said.stderr, said.stderr


def test_map_below_its_success_ratio_fails_naming_the_item_and_its_error(server, worker, artifacts):
    async def main() -> str:
        client = await make_client(server, artifacts)
        return await failure_of(client, map_pipeline.squares, {"n": 30, "min_success_ratio": 1.0, "chunk_size": 10})

    error = run(main())
    assert "engine.map(square): 1 of 30 items failed (item 13)" in error
    assert "item 13: task 'square' failed: ValueError: 13 is unlucky" in error
    assert "MapFailed" in error


def test_map_of_several_arguments_takes_dict_items(server, worker, artifacts):
    async def main() -> list[int]:
        client = await make_client(server, artifacts)
        run_id = await client.start(map_pipeline.scaled, {"n": 4, "by": 5})
        return await client.result(run_id, map_pipeline.scaled)  # type: ignore[no-any-return]

    assert run(main()) == [0, 5, 10, 15]


def test_cancel_mid_map_leaves_no_chunk_running(server, worker, artifacts):
    async def main() -> None:
        client = await make_client(server, artifacts)
        # 3 chunks of 10 one-second naps, 2 at a time: ~5 s per chunk
        run_id = await client.start(map_pipeline.naps, {"n": 30, "seconds": 1.0, "chunk_size": 10})

        async def first_chunk_running() -> bool:
            return await _chunk_status(client, run_id, "nap", 0) == WorkflowExecutionStatus.RUNNING

        await until("the first chunk runs", first_chunk_running, timeout=30)
        await client.cancel(run_id)
        with pytest.raises(WorkflowFailureError):
            await client.wait(run_id)
        assert (await client.status(run_id, with_tasks=False)).status == "CANCELED"
        assert await _chunk_status(client, run_id, "nap", 0) == WorkflowExecutionStatus.CANCELED
        # the chunks after the cancelled one never started
        assert await _chunk_status(client, run_id, "nap", 1) is None
        assert await _chunk_status(client, run_id, "nap", 2) is None

    run(main())


def test_chunks_past_the_payload_limit_fail_saying_to_lower_chunk_size(server, worker, artifacts):
    async def main() -> tuple[str, str, int]:
        client = await make_client(server, artifacts)
        # ten 300 KiB values: 3 MB per chunk of 10, over the 2 MB payload limit; chunks of 5 fit
        inputs = await failure_of(client, map_pipeline.sizes, {"n": 10, "kb": 300})
        results = await failure_of(client, map_pipeline.copies, {"n": 10, "kb": 300})
        run_id = await client.start(map_pipeline.copies, {"n": 10, "kb": 300, "chunk_size": 5})
        return inputs, results, await client.result(run_id, map_pipeline.copies)

    inputs, results, count = run(main())
    assert "the inputs of engine.map(size) chunk 0 (items 0-9) are 3.1 MB encoded" in inputs
    assert "pass a smaller chunk_size to engine.map (this chunk holds 10 items)" in inputs
    assert "the results of engine.map(copy) items 0-9 are 3.1 MB encoded" in results
    assert "pass a smaller chunk_size" in results
    assert count == 10


def test_a_cached_task_mapped_again_runs_only_the_new_items(server, worker, artifacts, tmp_path):
    log = tmp_path / "executions.log"

    done: dict[str, list[int]] = {}

    async def runs() -> None:
        client = await make_client(server, artifacts)
        for n in (3, 4):
            run_id = await client.start(map_flows.cached_map, {"n": n, "log": str(log)})
            done[f"n={n}"] = await client.result(run_id, map_flows.cached_map)

    run(runs())
    assert done == {"n=3": [0, 10, 20], "n=4": [0, 10, 20, 30]}
    assert sorted(int(x) for x in log.read_text().split()) == [0, 1, 2, 3]  # items 0-2 came from the cache


def test_each_item_gets_the_tasks_own_retries(server, worker, artifacts, tmp_path):
    async def main() -> tuple[list[int | None], str]:
        client = await make_client(server, artifacts)
        run_id = await client.start(map_flows.wobbly_map, {"marker_dir": str(tmp_path), "min_success_ratio": 0.5})
        result = await client.result(run_id, map_flows.wobbly_map)
        for marker in tmp_path.iterdir():
            marker.unlink()
        error = await failure_of(client, map_flows.wobbly_map, {"marker_dir": str(tmp_path), "min_success_ratio": 1})
        return result, error

    result, error = run(main())
    assert result == [0, 1, None]  # item 1 failed once and succeeded on its retry
    assert "1 of 3 items failed (item 2)" in error
    assert "item 2: task 'wobbly' failed after 2 attempts: RuntimeError: item 2 wobbled" in error
