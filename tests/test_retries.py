"""Retries mean what the README says: a lost worker never spends ``retries``; gang tasks honour
``non_retryable`` and ``max_interval``; a type mismatch in a rank's result is never retried."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from pathlib import Path
from typing import Any

import leaks
from conftest import failure_of, make_client, run


def test_a_lost_worker_does_not_spend_the_tasks_retries(server, spawn_worker, artifacts, tmp_path: Path):
    first = spawn_worker("lost-worker")

    async def main() -> int:
        client = await make_client(server, artifacts, queue="lost-worker")
        run_id = await client.start(leaks.lost_worker, {"marker_dir": str(tmp_path)})
        deadline = time.monotonic() + 60
        while not (tmp_path / "try.1").exists():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        first.kill()  # try 1 dies with its worker: a system failure
        spawn_worker("lost-worker")
        result: int = await client.result(run_id, leaks.lost_worker)
        status = await client.status(run_id)
        assert [(t.name, t.status, t.attempt) for t in status.tasks] == [("outlives_its_worker", "completed", 2)]
        return result

    # try 2 failed (the one retry that retries=1 allows), try 3 succeeded
    assert run(main()) == 3


def test_an_undelivered_input_does_not_spend_the_tasks_retries(server, worker, artifacts, tmp_path: Path):
    async def main() -> str:
        client = await make_client(server, artifacts)
        run_id = await client.start(leaks.undelivered_input, {"marker_dir": str(tmp_path), "store_root": artifacts})
        deadline = time.monotonic() + 90
        while True:  # read_input's first try failed: its input was not in the store
            tasks = {t.name: t for t in (await client.status(run_id)).tasks}
            if "read_input" in tasks and tasks["read_input"].attempt >= 2:
                break
            assert time.monotonic() < deadline, tasks
            await asyncio.sleep(0.2)
        hidden = tmp_path / "hidden"  # the store gets its object back: the next try is delivered it
        sha = hashlib.sha256(hidden.read_bytes()).hexdigest()
        os.rename(hidden, Path(artifacts, "cas", sha[:2], sha))
        result: str = await client.result(run_id, leaks.undelivered_input)
        return result

    # Retry(attempts=1): no retry at all, so only tries that did not spend it can have got here
    assert run(main()) == "delivered"


def _failed_gang(server: Any, artifacts: str, flow: Any, counter: Path) -> str:
    """Run a gang that must fail; returns the failure text."""

    async def main() -> str:
        return await failure_of(await make_client(server, artifacts), flow, {"counter": str(counter)})

    return str(run(main()))


def test_gang_honours_non_retryable(server, worker, cluster, artifacts, tmp_path: Path):
    error = _failed_gang(server, artifacts, leaks.non_retryable_gang, tmp_path / "calls")
    assert (tmp_path / "calls").read_text() == "x"  # attempts=4, but the body ran once
    assert "NotWorthRetrying is not retried" in error and "the input can never work" in error


def test_type_mismatch_in_a_ranks_result_is_never_retried(server, worker, cluster, artifacts, tmp_path: Path):
    error = _failed_gang(server, artifacts, leaks.mismatched_gang, tmp_path / "calls")
    assert (tmp_path / "calls").read_text() == "x"  # retries=3, yet the body ran once
    assert "TypeMismatch" in error and "expected int" in error


def test_gang_backoff_is_capped_by_max_interval(server, worker, cluster, artifacts, tmp_path: Path):
    counter = tmp_path / "calls"

    async def main() -> int:
        client = await make_client(server, artifacts)
        started = time.monotonic()
        result: int = await client.result(await client.start(leaks.capped_backoff, {"counter": str(counter)}))
        # uncapped, the two waits would be 30 s + 60 s; capped they are 0.5 s each (plus three launches)
        assert time.monotonic() - started < 45
        return result

    assert run(main()) == 3
