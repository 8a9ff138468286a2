"""Workflow bodies are deterministic or fail loudly; heavy imports never trip the deadlock detector.

Real dev server, real `gangflow worker` processes: every call a workflow body must not make fails the
run with a message naming it and its replacement; the same calls run fine in a task; the replay-safe
helpers (engine.now / random / uuid4 / sleep) work and a replay of their run succeeds; a workflow module
whose import takes seconds (time.sleep, torch) runs on a fresh worker without a failed workflow task.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import replay_safe
from conftest import failure_of, make_client, run
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError

from engine.client import load_workflow_file
from engine.runtime.worker import build_replayer

#: call -> (what the message names, the advice it gives)
EXPECTED = {
    "time.time": ("time.time()", "use engine.now()"),
    "time.time_ns": ("time.time_ns()", "use engine.now()"),
    "time.monotonic": ("time.monotonic()", "use engine.now()"),
    "time.perf_counter": ("time.perf_counter()", "use engine.now()"),
    "time.sleep": ("time.sleep()", "use await engine.sleep()"),
    "datetime.now": ("datetime.datetime.now()", "use engine.now()"),
    "datetime.utcnow": ("datetime.datetime.utcnow()", "use engine.now()"),
    "datetime.today": ("datetime.datetime.today()", "use engine.now()"),
    "date.today": ("datetime.date.today()", "use engine.now()"),
    "random.random": ("random.random()", "use engine.random()"),
    "random.randint": ("random.randint()", "use engine.random()"),
    "random.choice": ("random.choice()", "use engine.random()"),
    "random.shuffle": ("random.shuffle()", "use engine.random()"),
    "random.seed": ("random.seed()", "use engine.random()"),
    "uuid.uuid4": ("uuid.uuid4()", "use engine.uuid4()"),
    "uuid.uuid1": ("uuid.uuid1()", "use engine.uuid4()"),
    "os.urandom": ("os.urandom()", "use engine.random()"),
    "open": ("open()", "read and write files in a @task"),
    "Path.read_text": ("pathlib.Path.read_text()", "read and write files in a @task"),
    "socket.getaddrinfo": ("socket.getaddrinfo()", "do network I/O in a @task"),
    "socket.socket": ("socket.socket()", "do network I/O in a @task"),
    "urlopen": ("urllib.request.urlopen()", "do network I/O in a @task"),
    "subprocess.run": ("subprocess.run()", "run commands in a @task"),
}


def test_every_forbidden_call_fails_its_run_naming_the_call_and_the_replacement(server, worker, artifacts):
    assert set(EXPECTED) == set(replay_safe.FORBIDDEN)

    async def main() -> dict[str, str]:
        client = await make_client(server, artifacts)
        ids = {call: await client.start(replay_safe.forbidden, {"call": call}) for call in EXPECTED}

        async def error_of(run_id: str) -> str:
            try:
                return f"completed: {await client.wait(run_id)}"
            except WorkflowFailureError:
                return str((await client.status(run_id)).error)

        errors = await asyncio.gather(*(error_of(i) for i in ids.values()))
        return dict(zip(ids, errors, strict=True))

    errors = run(main())
    wrong = {}
    for call, (name, advice) in EXPECTED.items():
        want = f"{name} inside workflow 'forbidden' is not replayable; {advice}"
        if want not in errors[call]:
            wrong[call] = (want, errors[call][:300])
    assert not wrong, wrong


def test_a_forbidden_call_fails_the_run_once_not_the_workflow_task_forever(server, worker, artifacts):
    async def main() -> tuple[str, list[int]]:
        client = await make_client(server, artifacts)
        run_id = await client.start(replay_safe.forbidden, {"call": "time.time"})
        with pytest.raises(WorkflowFailureError):
            await client.wait(run_id)
        error = str((await client.status(run_id)).error)
        events = [e.event_type async for e in client.handle(run_id).fetch_history_events()]
        return error, events

    error, events = run(main())
    assert "NonDeterministicCall" in error
    assert EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED in events
    assert EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED not in events


def test_asyncio_tasks_started_by_the_body_are_guarded_too(server, worker, artifacts):
    async def main() -> str:
        return await failure_of(await make_client(server, artifacts), replay_safe.forbidden_in_gathered_task, {"n": 2})

    error = run(main())
    assert "time.time() inside workflow 'forbidden_in_gathered_task' is not replayable; use engine.now()" in error


def test_a_body_that_swallows_the_error_still_fails(server, worker, artifacts):
    async def main() -> str:
        return await failure_of(await make_client(server, artifacts), replay_safe.swallowed, {"n": 1})

    error = run(main())
    assert "datetime.datetime.now() inside workflow 'swallowed' is not replayable; use engine.now()" in error


def test_the_same_calls_are_fine_in_a_task_body(server, worker, artifacts):
    async def main() -> Any:
        client = await make_client(server, artifacts)
        run_id = await client.start(replay_safe.calls_in_a_task, {"n": 1})
        return await client.result(run_id, replay_safe.calls_in_a_task)

    assert run(main()) == list(EXPECTED)


def _replay_safe_result(result: dict[str, str], n: int = 3) -> None:
    assert result["tz"] == "UTC"
    assert float(result["slept"]) >= 1.0  # engine.sleep(1) took at least its second, by engine.now()
    draws = [float(d) for d in result["draws"].split(",")]
    assert len(draws) == n and all(0 <= d < 1 for d in draws) and len(set(draws)) == n
    assert result["versions"] == ",".join(["4"] * n) and len(set(result["ids"].split(","))) == n
    assert result["flips"] == ",".join("heads" if d < 0.5 else "tails" for d in draws)


def test_replay_safe_helpers_in_a_run_and_its_replay(server, worker, artifacts):
    async def main() -> tuple[Any, Any, list[Any]]:
        client = await make_client(server, artifacts)
        run_id = await client.start(replay_safe.replay_safe, {"n": 3})
        result = await client.result(run_id, replay_safe.replay_safe)
        handle = client.handle(run_id)
        history = await handle.fetch_history()
        return result, history, [e.event_type for e in history.events]

    result, history, events = run(main())
    _replay_safe_result(result)
    assert EventType.EVENT_TYPE_TIMER_STARTED in events  # engine.sleep() is a durable timer
    assert EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED not in events
    # Logging and printing from the body worked (the worker's output has both lines).
    deadline = time.monotonic() + 10
    while b"replay_safe body printing" not in worker.log.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.1)
    output = worker.log.read_text()
    assert "replay_safe body logging: draws=" in output and "replay_safe body printing" in output
    # A replay in this process, with the worker's own runner (guard included), sees the same now(),
    # random() and uuid4() values: it schedules the same heads / tails tasks and succeeds.
    replayed = run(build_replayer().replay_workflow(history, raise_on_replay_failure=False))
    assert replayed.replay_failure is None, replayed.replay_failure


def test_a_refused_run_replays_too(server, worker, artifacts):
    """The guard is itself deterministic: the replay of a refused run refuses at the same point."""

    async def main() -> Any:
        client = await make_client(server, artifacts)
        run_id = await client.start(replay_safe.forbidden, {"call": "uuid.uuid4"})
        with pytest.raises(WorkflowFailureError):
            await client.wait(run_id)
        return await client.handle(run_id).fetch_history()

    history = run(main())
    replayed = run(build_replayer().replay_workflow(history, raise_on_replay_failure=False))
    assert replayed.replay_failure is None, replayed.replay_failure


def test_replay_safe_helpers_under_run_local():
    import engine

    _replay_safe_result(engine.run_local(replay_safe.replay_safe, n=3))
    with pytest.raises(engine.NonDeterministicCall, match=r"random\.randint\(\) inside workflow 'forbidden'"):
        engine.run_local(replay_safe.forbidden, call="random.randint")
    assert engine.run_local(replay_safe.calls_in_a_task) == list(EXPECTED)


# -- heavy imports -------------------------------------------------------------------------------
def _run_on_a_fresh_worker(
    server: Any, spawn_worker: Any, artifacts: str, tmp_path: Path, source: str, target: str, inputs: dict[str, Any]
) -> Any:
    """Write ``source`` to a flow file, run its workflow ``target`` on a worker started for it (so the
    module is first imported there, in its first workflow task) and return the result; no workflow task
    may have failed and the worker may not have reported a deadlock."""
    flow = tmp_path / f"{target}_flow.py"
    flow.write_text(textwrap.dedent(source))
    wf = load_workflow_file(f"{flow}:{target}")
    fresh = spawn_worker(target.replace("_", "-"))

    async def main() -> tuple[Any, list[Any]]:
        client = await make_client(server, artifacts, fresh.queue)
        run_id = await client.start(wf, inputs)
        result = await asyncio.wait_for(client.result(run_id, wf), 120)
        return result, [e async for e in client.handle(run_id).fetch_history_events()]

    result, events = run(main())
    failed = [e for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED]
    log = fresh.log.read_text(errors="replace")
    assert not failed, f"{failed[0].workflow_task_failed_event_attributes.failure.message}\n{log[-3000:]}"
    assert "deadlock" not in log.lower()
    return result


def test_a_module_that_takes_3s_to_import_runs_on_a_fresh_worker(server, spawn_worker, artifacts, tmp_path):
    source = """
        import time

        time.sleep(3)  # stands in for a heavy import (torch takes 1.2 s+, more under load)

        from engine import task, workflow


        @task
        def double(x: int) -> int:
            return 2 * x


        @workflow
        async def slow_import(x: int = 2) -> int:
            return await double(x=x)
        """
    assert _run_on_a_fresh_worker(server, spawn_worker, artifacts, tmp_path, source, "slow_import", {"x": 21}) == 42


def test_a_flow_file_that_imports_torch_runs_on_a_fresh_worker(server, spawn_worker, artifacts, tmp_path):
    pytest.importorskip("torch")
    source = """
        import torch

        from engine import task, workflow


        @task
        def total(n: int) -> float:
            return float(torch.arange(n, dtype=torch.float32).sum())


        @workflow
        async def torch_sum(n: int = 4) -> float:
            return await total(n=n)
        """
    assert _run_on_a_fresh_worker(server, spawn_worker, artifacts, tmp_path, source, "torch_sum", {"n": 5}) == 10.0


def test_now_is_timezone_aware_utc_outside_any_workflow():
    import engine

    before = dt.datetime.now(dt.UTC)
    assert before <= engine.now() <= dt.datetime.now(dt.UTC)
