"""The CLI as a newcomer meets it, through real ``python -m engine.cli`` processes on a real server:
``logs`` answers an unknown run, an unknown task and a silent task each with one clear line, ``list``
never cuts a run id short, ``dev`` prints its export line whole, and ``release`` frees a gang."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import NodeAgent, Stack, gangflow_cli
from temporalio.client import Client
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from engine.errors import GangflowError
from engine.runtime import free_port
from engine.runtime.connection import PIPELINE, TENANT

FLOW = """
from engine import task, workflow


@task
def chatty(n: int) -> int:
    print(f"chatty says {n}")
    return n


@task
def quiet(n: int) -> int:
    return n


@workflow
async def talk(n: int = 1) -> int:
    return await chatty(n=n) + await quiet(n=n)


@workflow
async def hush(n: int = 1) -> int:
    return await quiet(n=n)


@workflow
async def nest(n: int = 1) -> int:
    return await hush(n=n) + 1
"""


def cli(address: str, *args: str, columns: int = 100, cwd: Path | None = None, **env: str):
    return gangflow_cli(*args, cwd=cwd, GANGFLOW_ADDRESS=address, COLUMNS=str(columns), **env)


@pytest.fixture(scope="module")
def runs(server, worker, state_root, tmp_path_factory):
    """Three finished runs of the flow above: one whose task printed, one whose task printed nothing, and one
    that calls a child workflow."""
    tmp_path = tmp_path_factory.mktemp("cli-commands")
    artifacts = str(state_root / "artifacts")  # the `artifacts` fixture's folder (that one is per test)
    (tmp_path / "flow.py").write_text(FLOW)
    suffix = os.urandom(4).hex()
    ids = {name: f"{name}-run-with-a-rather-long-id-{suffix}" for name in ("talk", "hush", "nest")}
    for name, run_id in ids.items():
        done = cli(
            server.address,
            "run",
            f"flow.py:{name}",
            "--run-id",
            run_id,
            "--json",
            cwd=tmp_path,
            GANGFLOW_ARTIFACTS=artifacts,
        )
        assert done.returncode == 0, done.stderr
    return ids


def test_logs_says_which_of_unknown_run_unknown_task_or_silent_task(server, runs):
    unknown = cli(server.address, "logs", "no-such-run-xyz")
    assert unknown.returncode == 1 and "Traceback" not in unknown.stderr
    assert unknown.stderr.strip().startswith("error: run 'no-such-run-xyz'") and len(unknown.stderr.splitlines()) == 1

    no_task = cli(server.address, "logs", runs["talk"], "--task", "nope")
    assert no_task.returncode == 1 and "Traceback" not in no_task.stderr
    assert "has no task 'nope'; its tasks: chatty, quiet" in " ".join(no_task.stderr.split())

    silent = cli(server.address, "logs", runs["hush"], "--task", "quiet")
    assert silent.returncode == 0 and silent.stdout == ""
    assert "task 'quiet' of run" in silent.stderr and "it ran and printed nothing" in silent.stderr

    whole_run = cli(server.address, "logs", runs["hush"])
    assert whole_run.returncode == 0 and "its tasks ran and printed nothing" in whole_run.stderr

    chatty = cli(server.address, "logs", runs["talk"], "--task", "chatty")
    assert chatty.returncode == 0 and "chatty says 1" in chatty.stdout
    # into a pipe (no $COLUMNS: lines are never wrapped there), each file's header rule stays 100 wide
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    piped = gangflow_cli("logs", runs["talk"], "--task", "chatty", env=env, GANGFLOW_ADDRESS=server.address)
    assert "chatty says 1" in piped.stdout and "chatty." in piped.stdout.splitlines()[0], piped.stdout
    assert max(len(line) for line in piped.stdout.splitlines()) == 100

    no_rank = cli(server.address, "logs", runs["talk"], "--task", "chatty", "--rank", "1")
    assert no_rank.returncode == 1 and "--rank is for distributed tasks" in " ".join(no_rank.stderr.split())


@pytest.mark.parametrize("columns", [40, 60, 200])
def test_list_never_cuts_a_run_id_short(server, runs, columns):
    for pipeline, run_id in runs.items():
        listed = cli(server.address, "list", "--pipeline", pipeline, "--limit", "50", columns=columns)
        assert listed.returncode == 0, listed.stderr
        assert any(run_id in line for line in listed.stdout.splitlines()), listed.stdout
        assert "…" not in listed.stdout


def test_list_shows_runs_not_their_child_workflow_calls(server, runs):
    """The child call of ``nest`` keeps its run's pipeline; ``GangflowKind`` tells it from the run."""
    listed = cli(server.address, "list", "--pipeline", "nest", "--limit", "50", "--json")
    assert listed.returncode == 0, listed.stderr
    ids = [row["run_id"] for row in json.loads(listed.stdout)]
    assert runs["nest"] in ids
    assert not [i for i in ids if i.startswith(f"{runs['nest']}.")], ids  # its child call: not a run


def test_list_still_shows_a_run_started_before_gangflow_kind(server):
    """A run from before ``GangflowKind`` carries only its pipeline: it stays listed (nobody polls its queue:
    it only has to exist)."""
    legacy = f"legacy-{os.urandom(4).hex()}"

    async def start() -> Any:
        client = await Client.connect(server.address)
        pairs = [SearchAttributePair(PIPELINE, "legacy"), SearchAttributePair(TENANT, "default")]
        return await client.start_workflow(
            "legacy", id=legacy, task_queue="nobody-polls", search_attributes=TypedSearchAttributes(pairs)
        )

    handle = asyncio.run(start())
    try:
        listed = cli(server.address, "list", "--pipeline", "legacy", "--json")
        assert listed.returncode == 0, listed.stderr
        assert legacy in [row["run_id"] for row in json.loads(listed.stdout)]
    finally:
        asyncio.run(handle.terminate("test over"))


def test_dev_prints_the_export_line_whole_in_a_narrow_terminal(tmp_path):
    state = tmp_path / "a-state-folder-with-a-long-name-so-that-the-line-would-wrap"
    ports = ["--port", str(free_port()), "--ui-port", str(free_port())]
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine.cli", "dev", "--headless", *ports, "--state-dir", str(state)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, COLUMNS="40", PYTHONUNBUFFERED="1"),
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        while not any("gangflow run" in line for line in lines):
            assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
            lines.append(proc.stdout.readline())
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    export = [line for line in lines if line.startswith("  export ")]
    assert len(export) == 1, lines
    assert "GANGFLOW_ADDRESS=127.0.0.1:" in export[0]
    assert f"GANGFLOW_ARTIFACTS={state.resolve() / 'artifacts'}\n" in export[0]


def test_release_frees_a_gang_and_refuses_what_it_cannot(tmp_path):
    """A throwaway stack of its own (server, worker, one node agent): the Scheduler's state is shared
    by every gang on a server, and this test hands it requests by hand."""
    stack = Stack(tmp_path, "n", count=0)
    try:
        # the worker keeps the Scheduler running, node agents or not: it answers that it holds no such gang
        none_yet = cli(stack.server.address, "release", "some-gang")
        assert none_yet.returncode == 1 and "Traceback" not in none_yet.stderr
        assert "the Scheduler holds no gang 'some-gang' (0 running, 0 pending)" in none_yet.stderr
        assert len(none_yet.stderr.splitlines()) == 1

        stack.nodes["n0"] = NodeAgent(stack.server.address, "n0", 2, tmp_path / "nodes")
        asyncio.run(_release_scenario(stack))
    finally:
        stack.close()


async def _release_scenario(stack: Stack) -> None:
    client = await stack.client()
    await stack.wait_nodes()  # the node agent starts the Scheduler when it registers
    address = stack.server.address
    scheduler = client.temporal.get_workflow_handle("gangflow-scheduler")

    async def gang(gang_id: str) -> Any:
        """A gang request whose owner is a workflow no worker serves: it stands in for a live GangTask
        (the Scheduler's owner check releases what a closed owner held)."""
        owner = await client.temporal.start_workflow("StandInGangTask", id=gang_id, task_queue="nobody-polls-this")
        await scheduler.signal("submit", {"gang_id": gang_id, "nnodes": 1, "gpus_per_node": 2, "cpus_per_node": 1})
        return owner

    async def until(running: list[str], pending: list[str]) -> None:
        def held(view: dict[str, Any]) -> tuple[list[str], list[str]]:
            return [g["gang_id"] for g in view["running"]], [g["gang_id"] for g in view["pending"]]

        await stack.wait_for(f"running {running}, pending {pending}", lambda v: held(v) == (running, pending), 30)

    def release(*args: str) -> subprocess.CompletedProcess[str]:
        return cli(address, "release", *args)

    owner1 = await gang("owner-1")
    await until(["owner-1"], [])
    await gang("owner-2")  # the node's 2 GPUs are taken: queued
    await until(["owner-1"], ["owner-2"])

    unknown = await asyncio.to_thread(release, "no-such-gang")
    assert unknown.returncode == 1
    assert "the Scheduler holds no gang 'no-such-gang' (1 running, 1 pending)" in unknown.stderr
    in_use = await asyncio.to_thread(release, "owner-1")
    assert in_use.returncode == 1 and "gang 'owner-1' is still in use" in in_use.stderr
    assert "--force" in in_use.stderr and "Traceback" not in in_use.stderr

    withdrawn = await asyncio.to_thread(release, "owner-2", "--force")
    assert withdrawn.returncode == 0, withdrawn.stderr
    assert "withdrew the queued request of gang owner-2" in withdrawn.stdout
    await until(["owner-1"], [])

    # Its owner gone, a gang is released without --force (unless the owner check got there first).
    await owner1.terminate()
    try:
        entry = await client.release("owner-1")
        assert entry["state"] == "running" and entry["nodes"][0]["gpu_ids"] == [0, 1]
    except GangflowError as exc:
        assert "holds no gang 'owner-1'" in str(exc)
    await until([], [])

    await gang("owner-3")
    await until(["owner-3"], [])
    freed = await asyncio.to_thread(release, "owner-3", "--force", "--json")
    assert freed.returncode == 0, freed.stderr
    entry = json.loads(freed.stdout)
    assert entry["state"] == "running" and entry["nodes"][0]["node_id"] == "n0"
    assert sorted(entry["nodes"][0]["gpu_ids"]) == [0, 1]
    view = await client.queue()
    assert view["running"] == [] and view["pending"] == [] and view["totals"]["gpus_free"] == 2


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--tls-cert", "cert.pem"], "--tls-cert needs --tls-key too"),
        (["--tls-key", "key.pem"], "--tls-key needs --tls-cert too"),
        (["--tls-ca", "missing.pem"], "--tls-ca missing.pem: No such file or directory"),
        (["--tls-ca", "flow.py"], "--tls-ca flow.py: not a PEM file"),
    ],
)
def test_bad_credentials_options_are_refused_before_connecting(tmp_path, options, message):
    (tmp_path / "flow.py").write_text(FLOW)
    # an address nothing listens on: a command that got as far as connecting would say so instead
    done = cli("127.0.0.1:9", "list", *options, cwd=tmp_path)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    node = cli("127.0.0.1:9", "node", "--node-id", "n", *options, cwd=tmp_path)  # the node agent takes them too
    assert node.returncode == 2 and message in node.stderr, node.stderr


def test_an_api_key_travels_and_tls_against_a_plain_server_fails_clearly(server, runs):
    # the dev server has no authorizer: it ignores the key, which proves the key does not break a connection
    listed = cli(server.address, "list", "--json", "--api-key", "not-checked-here", GANGFLOW_TLS="")
    assert listed.returncode == 0 and runs["talk"] in listed.stdout, listed.stderr
    assert "not-checked-here" not in listed.stdout + listed.stderr  # never printed
    via_env = cli(server.address, "list", "--json", GANGFLOW_API_KEY="not-checked-here")
    assert via_env.returncode == 0, via_env.stderr
    tls = cli(server.address, "list", "--tls")
    assert tls.returncode == 1 and f"cannot reach Temporal at {server.address}" in tls.stderr, tls.stderr


def test_a_node_agent_that_would_advertise_a_loopback_address_says_so(tmp_path):
    # the host name resolves to a loopback address on many machines (127.0.1.1 on Debian): other machines could
    # not reach this node's rank 0. Said before it connects: here nothing listens, and the agent would wait.
    import socket

    if not socket.gethostbyname(socket.gethostname()).startswith("127."):
        pytest.skip("this machine's host name resolves to a routable address")
    command = [sys.executable, "-m", "engine.cli", "node", "--node-id", "w", "--gpus", "0", "--address", "127.0.0.1:9"]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "300"})
    try:
        line = proc.stderr.readline() if proc.stderr else ""
        assert "this node advertises 127." in line and "pass --advertise-addr" in line, line
    finally:
        proc.kill()
        proc.wait()
