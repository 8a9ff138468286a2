"""End to end on a real Temporal dev server with real `gangflow worker` processes."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import subprocess
import time
from typing import Any

import flows
import pytest
from conftest import WorkerProcess, failure_of, gangflow_cli, make_client, run
from temporalio.client import WorkflowFailureError

from engine.runtime import DevServer


def _gangflow(*args: str, server: Any, artifacts: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return gangflow_cli(*args, timeout=timeout, GANGFLOW_ADDRESS=server.address, GANGFLOW_ARTIFACTS=artifacts)


def _everything() -> flows.Everything:
    when = dt.datetime(2026, 11, 30, 12, 30, tzinfo=dt.UTC)
    return flows.Everything(
        i=7,
        f=2.5,
        b=True,
        s="héllo",
        raw=b"\x00\xff\x10",
        nothing=None,
        maybe=None,
        either="text",
        items=[1, 2, 3],
        mapping={"a": 1.5},
        pair=(1, "one"),
        unique={3, 1, 2},
        color=flows.Color.BLUE,
        when=when,
        point=flows.Point(1.0, -2.0),
        metrics=flows.Metrics(loss=0.1, tags=["x"], at=when, nested={"p": flows.Point(0.5, 0.25)}),
    )


def test_every_supported_type_round_trips_through_a_task(server, worker, artifacts):
    async def main() -> None:
        client = await make_client(server, artifacts)
        value = _everything()
        run_id = await client.start(flows.roundtrip, {"value": value})
        assert await client.result(run_id, flows.roundtrip) == value

    run(main())


def test_files_and_directories_travel_by_reference(server, worker, artifacts):
    async def main() -> None:
        client = await make_client(server, artifacts)
        run_id = await client.start(flows.artifacts, {"text": "payload", "n": 3, "repeat": 100_000})
        assert await client.result(run_id, flows.artifacts) == "payloadx700000:0,1,2"
        # a 700 kB file went from one task to another, yet no history event carries more than a reference
        async for event in client.handle(run_id).fetch_history_events():
            assert event.ByteSize() < 8_000

    run(main())


def test_lightweight_tasks_and_child_workflows(server, worker, artifacts):
    async def main() -> None:
        client = await make_client(server, artifacts)
        run_id = await client.start(flows.parent, {"n": 5})
        assert await client.result(run_id, flows.parent) == sum(i * i for i in range(5))
        status = await client.status(run_id)
        assert [(t.name, t.kind, t.status) for t in status.tasks] == [("squares", "workflow", "completed")]
        child = await client.status(f"{run_id}.squares-1")
        assert {(t.name, t.kind) for t in child.tasks} == {("square", "lightweight")}
        assert len(child.tasks) == 5

    run(main())


def test_task_fails_twice_then_succeeds_under_retries(server, worker, artifacts, tmp_path):
    async def main() -> None:
        client = await make_client(server, artifacts)
        run_id = await client.start(flows.retrying, {"counter": str(tmp_path / "n"), "failures": 2})
        assert await client.result(run_id, flows.retrying) == 3
        status = await client.status(run_id)
        assert [(t.name, t.status, t.attempt) for t in status.tasks] == [("flaky", "completed", 2)]  # try 3: attempt 2

    run(main())


def test_user_error_fails_the_run_with_task_name_and_traceback(server, worker, artifacts):
    async def main() -> None:
        error = await failure_of(await make_client(server, artifacts), flows.failing, {"message": "the data is bad"})
        assert "task 'boom' failed: ValueError: the data is bad" in error
        assert 'flows.py", line' in error and "raise ValueError(message)" in error

    run(main())


def test_type_mismatch_fails_at_once_without_retries(server, worker, artifacts, tmp_path):
    async def main() -> None:
        counter = tmp_path / "calls"
        error = await failure_of(await make_client(server, artifacts), flows.mismatch, {"counter": str(counter)})
        assert counter.read_text() == "1"  # retries=3, yet the body ran once
        assert "TypeMismatch" in error and "expected int, got 'not a number'" in error

    run(main())


def test_oversized_value_says_to_return_a_file(server, worker, artifacts):
    async def main() -> None:
        error = await failure_of(await make_client(server, artifacts), flows.oversized, {"mb": 3})
        assert "PayloadTooLarge" in error and "return a File or Directory" in error
        assert "TMPRL1103" not in error

    run(main())


def test_quickstart_end_to_end_via_cli(server, worker, artifacts):
    done = _gangflow("run", "examples/quickstart.py:pipeline", "--json", server=server, artifacts=artifacts)
    assert done.returncode == 0, done.stderr + done.stdout
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["status"] == "COMPLETED"
    assert out["result"]["retrained"] is True and out["result"]["accuracy"] > 0.9
    assert out["result"]["model"]["kind"] == "file"
    status = _gangflow("status", out["run_id"], "--json", server=server, artifacts=artifacts)
    tasks = [t["name"] for t in json.loads(status.stdout)["tasks"]]
    assert tasks == ["make_dataset", "train", "evaluate", "train", "evaluate"]
    logs = _gangflow("logs", out["run_id"], "--task", "train", server=server, artifacts=artifacts)
    assert logs.returncode == 0 and "epoch 5/5" in logs.stdout


def test_bad_cli_input_exits_2_and_starts_nothing(server, artifacts):
    done = _gangflow("run", "examples/quickstart.py:pipeline", "--rows", "many", server=server, artifacts=artifacts)
    assert done.returncode == 2
    assert "input 'rows': expected int, got 'many'" in done.stderr
    unknown = _gangflow("run", "examples/quickstart.py:pipeline", "--row", "5", server=server, artifacts=artifacts)
    assert unknown.returncode == 2 and "unknown parameter --row" in unknown.stderr

    async def count() -> int:
        client = await make_client(server, artifacts)
        return (
            await client.temporal.count_workflows("GangflowPipeline = 'pipeline' AND ExecutionStatus != 'Completed'")
        ).count

    assert run(count()) == 0


def test_detached_run_keeps_its_code_when_the_file_is_edited(server, worker, artifacts, tmp_path):
    flow_dir = tmp_path / "proj"
    flow_dir.mkdir()
    source = flow_dir / "edited.py"
    source.write_text(
        "from engine import task, workflow\n"
        "@task\ndef version() -> str:\n    return 'v1'\n"
        "@task\ndef pause(seconds: float) -> None:\n    import time; time.sleep(seconds)\n"
        "@workflow\nasync def which(seconds: float = 3.0) -> str:\n"
        "    await pause(seconds=seconds)\n    return await version()\n"
    )
    started = _gangflow("run", f"{source}:which", "--detach", "--json", server=server, artifacts=artifacts)
    assert started.returncode == 0, started.stderr
    run_id = json.loads(started.stdout)["run_id"]
    source.write_text(source.read_text().replace("'v1'", "'v2'"))  # edited while the run is in flight
    second = _gangflow("run", f"{source}:which", "--seconds", "0", "--json", server=server, artifacts=artifacts)
    assert json.loads(second.stdout)["result"] == "v2"

    async def result() -> Any:
        client = await make_client(server, artifacts)
        return await client.wait(run_id)

    assert run(result()) == "v1"


def test_worker_killed_mid_run_resumes_without_rerunning_finished_tasks(server, spawn_worker, artifacts, tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    first = spawn_worker("kill-test")

    async def main() -> None:
        client = await make_client(server, artifacts, queue="kill-test")
        run_id = await client.start(flows.steps, {"marker_dir": str(markers), "count": 4, "seconds": 1.5})
        deadline = time.monotonic() + 30
        while not list(markers.glob("step1.*")):  # step 0 done, step 1 running
            assert time.monotonic() < deadline
            await _sleep(0.1)
        first.kill()
        spawn_worker("kill-test")
        assert await client.wait(run_id) == [0, 1, 2, 3]

    run(main())
    runs = {i: len(list(markers.glob(f"step{i}.*"))) for i in range(4)}
    assert runs[0] == 1 and runs[2] == 1 and runs[3] == 1  # finished tasks never ran again
    assert runs[1] == 2  # the interrupted one ran again on the new worker


def test_server_restart_mid_run_completes(artifacts, tmp_path):
    srv = DevServer(tmp_path / "restart", ui=False).start()  # its own server: this test stops it
    markers = tmp_path / "markers"
    markers.mkdir()
    try:
        wproc = WorkerProcess(srv.address, "gangflow", tmp_path / "wk").start()

        async def main() -> None:
            client = await make_client(srv, artifacts)
            run_id = await client.start(flows.steps, {"marker_dir": str(markers), "count": 3, "seconds": 1.0})
            while not list(markers.glob("step1.*")):
                await _sleep(0.1)
            srv.stop()
            await _sleep(1.0)
            srv.start()  # same sqlite file, same port
            assert await client.wait(run_id) == [0, 1, 2]

        run(main())
        wproc.stop()
    finally:
        srv.stop()


def test_cancel_stops_the_run(server, worker, artifacts, tmp_path):
    async def main() -> None:
        client = await make_client(server, artifacts)
        run_id = await client.start(flows.steps, {"marker_dir": str(tmp_path), "count": 5, "seconds": 8.0})
        while not list(tmp_path.glob("step0.*")):
            await _sleep(0.1)
        await client.cancel(run_id)
        with pytest.raises(WorkflowFailureError):
            await client.wait(run_id)
        info = await client.status(run_id)
        assert info.status == "CANCELED"
        # the task the cancel stopped says so (its own end is never in the run's history)
        assert [(t.name, t.status) for t in info.tasks][-1] == ("step", "cancelled")
        return run_id

    run_id = run(main())
    time.sleep(7)  # past the task's next heartbeat (every 5 s at most), which learns that the run is gone
    assert not list(tmp_path.glob("step1.*"))
    # the task's activity learnt of the cancel (its run gone) without a traceback in the worker's log, where it
    # read as the task's own failure
    assert f"'workflow_id': '{run_id}'" not in worker.log.read_text(errors="replace")
    # a run that has ended: nothing to cancel, said (Temporal takes the request and does nothing with it)
    again = _gangflow("cancel", run_id, server=server, artifacts=artifacts)
    assert again.returncode == 1 and f"run {run_id!r} is CANCELED: there is nothing to cancel" in again.stderr


async def _sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)
