"""Waiting for people on a real server and worker: examples/approval_pipeline.py stops for a typed input and an
approval; ``gangflow status`` says what it waits for; ``gangflow input`` refuses a wrong type, an unknown name
and a second value with exit 2 while the run keeps waiting; approve, reject and timeout end the run as a user
expects; a value sent before its wait is kept."""

from __future__ import annotations

import asyncio
import os
import queue
import subprocess
import sys
import threading
from typing import Any

import pytest
import waits_flows
from conftest import ROOT, gangflow_cli, make_client, run, until
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import WorkflowFailureError

from engine.client import InputRefused, RunNotWaiting, approve, send_input, waiting
from engine.runtime.worker import build_replayer

sys.path.insert(0, str(ROOT / "examples"))
import approval_pipeline


async def _cli(address: str, *args: str) -> Any:
    return await asyncio.to_thread(gangflow_cli, *args, GANGFLOW_ADDRESS=address, COLUMNS="200")


async def _details(client: Any, run_id: str) -> str:
    """What the Temporal UI shows as the run's current details."""
    metadata = await client.handle(run_id).query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return str(metadata.current_details)


async def _replays(client: Any, run_id: str) -> None:
    """The finished run replays from its history with the current code: what a worker that restarts while
    the run waits does (the wait, its timer and the updates that answered it come back the same)."""
    history = await client.handle(run_id).fetch_history()
    result = await build_replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure


async def _waits_for(client: Any, run_id: str, kind: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        return next((w for w in await waiting(client, run_id) if w["kind"] == kind), None)

    return await until(f"{run_id} waits for {kind}", probe, timeout=30)


def test_input_and_approval_through_the_cli(server, worker, artifacts):
    async def main() -> None:
        client = await make_client(server, artifacts)
        run_id = await client.start(approval_pipeline.pipeline, {"name": "resnet"})
        wait = await _waits_for(client, run_id, "input")
        assert (wait["name"], wait["type"]) == ("threshold", "float")
        assert "minimum accuracy to promote resnet" in wait["prompt"]
        assert "**waiting for input: threshold (float)**" in await _details(client, run_id)

        status = await _cli(server.address, "status", run_id)
        assert status.returncode == 0, status.stderr
        assert "waiting for input 'threshold' (float) since " in status.stdout

        wrong = await _cli(server.address, "input", run_id, "threshold", "abc")
        assert wrong.returncode == 2, wrong.stdout + wrong.stderr
        assert "input 'threshold': expected float, got 'abc'" in wrong.stderr
        assert "the run keeps waiting" in wrong.stderr
        with pytest.raises(InputRefused, match="does not wait for input 'treshold'; it waits for input 'threshold'"):
            await send_input(client, run_id, "treshold", 0.9)
        assert [w["name"] for w in await waiting(client, run_id)] == ["threshold"]  # still waiting

        sent = await _cli(server.address, "input", run_id, "threshold", "0.9")
        assert sent.returncode == 0, sent.stderr
        with pytest.raises(InputRefused, match="'threshold' was already given"):
            await send_input(client, run_id, "threshold", 0.5)

        wait = await _waits_for(client, run_id, "approval")
        assert wait["name"] == "promote resnet (accuracy 0.93)?"
        assert "**waiting for approval: promote resnet (accuracy 0.93)?**" in await _details(client, run_id)
        ok = await _cli(server.address, "approve", run_id, "--comment", "looks good", "--by", "ana")
        assert ok.returncode == 0, ok.stderr
        assert "approved 'promote resnet (accuracy 0.93)?'" in ok.stdout

        result = await client.result(run_id, approval_pipeline.pipeline)
        assert (result.threshold, result.promoted, result.approved_by, result.comment) == (
            0.9,
            True,
            "ana",
            "looks good",
        )
        [promote] = [t for t in (await client.status(run_id)).tasks if t.name == "promote"]
        assert promote.status == "completed"
        await _replays(client, run_id)

        late = await _cli(server.address, "approve", run_id)
        assert late.returncode == 1
        assert f"run '{run_id}' is COMPLETED: it waits for nothing" in late.stderr

    run(main())


def test_gangflow_run_says_what_its_run_waits_for(server, worker, artifacts):
    """``gangflow run`` follows its run: where the output is a script's log (no spinner is drawn there), it still
    names the run and, once each, what the run waits for with the command that answers it, rather than
    looking hung until someone answers."""
    env = dict(os.environ, GANGFLOW_ADDRESS=server.address, GANGFLOW_ARTIFACTS=artifacts, COLUMNS="200")
    cmd = [sys.executable, "-m", "engine.cli", "run", "examples/approval_pipeline.py:pipeline", "--name", "vit"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout or ()], daemon=True).start()
    try:
        started = lines.get(timeout=60)
        assert started.startswith("started pipeline-") and "Ctrl-C stops following it, not the run" in started
        run_id = started.split()[1].rstrip(";")
        asked = lines.get(timeout=60)
        assert asked.startswith("waiting for input 'threshold' (float) since "), asked
        assert asked.rstrip().endswith(f"(gangflow input {run_id} threshold VALUE)"), asked
        assert gangflow_cli("input", run_id, "threshold", "0.5", env=env).returncode == 0
        asked = lines.get(timeout=60)
        assert asked.startswith("waiting for approval: promote vit (accuracy 0.93)? (since "), asked
        assert asked.rstrip().endswith(f"; gangflow approve {run_id})"), asked
        assert gangflow_cli("approve", run_id, "--reject", "--comment", "stale", env=env).returncode == 0
        assert proc.wait(timeout=60) == 1
        assert "rejected by" in (proc.stderr.read() if proc.stderr else "")
        assert lines.empty()  # each wait was said once, not at every poll
    finally:
        proc.kill()


def test_reject_fails_the_run_with_the_comment(server, worker, artifacts):
    async def main() -> None:
        client = await make_client(server, artifacts)
        run_id = await client.start(approval_pipeline.pipeline, {"name": "vit"})
        await _waits_for(client, run_id, "input")
        with pytest.raises(InputRefused, match="does not wait for an approval"):
            await approve(client, run_id)  # nothing asked yet
        await send_input(client, run_id, "threshold", 0.5)
        await _waits_for(client, run_id, "approval")
        await approve(client, run_id, reject=True, comment="eval set is stale", by="bo")
        with pytest.raises(WorkflowFailureError):
            await client.wait(run_id)
        error = (await client.status(run_id)).error or ""
        assert "rejected by bo: 'promote vit (accuracy 0.93)?': eval set is stale" in error
        assert "promote" not in [t.name for t in (await client.status(run_id)).tasks]

    run(main())


def test_an_unanswered_wait_times_out_naming_what_it_waited_for(server, worker, artifacts):
    async def main() -> None:
        client = await make_client(server, artifacts)
        run_id = await client.start(approval_pipeline.pipeline, {"input_timeout_s": 1.0})
        with pytest.raises(WorkflowFailureError):
            await client.wait(run_id)
        error = (await client.status(run_id)).error or ""
        assert "WaitTimedOut" in error and "no answer to input 'threshold' (float) within 1 s" in error
        with pytest.raises(RunNotWaiting, match="is FAILED: it waits for nothing"):
            await send_input(client, run_id, "threshold", 0.5)

    run(main())


def test_a_value_sent_before_its_wait_is_kept(server, worker, artifacts):
    async def main() -> None:
        client = await make_client(server, artifacts)
        run_id = await client.start(waits_flows.several_inputs, {})
        await _waits_for(client, run_id, "input")
        kept = await _cli(server.address, "input", run_id, "second", "7", "--early")
        assert kept.returncode == 0, kept.stderr
        assert "kept second = 7" in kept.stdout
        await send_input(client, run_id, "retries", "many", early=True)  # an int is asked for: dropped then
        await send_input(client, run_id, "first", 1.5)

        async def dropped() -> dict[str, Any] | None:
            return next((w for w in await waiting(client, run_id) if w["name"] == "retries"), None)

        wait = await until("the run waits for retries", dropped, timeout=30)
        assert "a value sent before the run waited was dropped: input 'retries': expected int" in wait["note"]
        await send_input(client, run_id, "retries", 3)
        assert await client.result(run_id, waits_flows.several_inputs) == [1.5, 7, 3, 1.5]
        await _replays(client, run_id)

    run(main())


def test_a_wait_survives_a_worker_restart(server, spawn_worker, artifacts):
    async def main() -> None:
        client = await make_client(server, artifacts, queue="waits-restart")
        first = spawn_worker("waits-restart")
        run_id = await client.start(approval_pipeline.pipeline, {"name": "bert", "input_timeout_s": 600.0})
        await _waits_for(client, run_id, "input")
        first.stop()  # a deploy: the worker goes away while the run waits
        spawn_worker("waits-restart")
        await send_input(client, run_id, "threshold", 0.9)
        await _waits_for(client, run_id, "approval")
        await approve(client, run_id)
        assert (await client.result(run_id, approval_pipeline.pipeline)).promoted is True

    run(main())
