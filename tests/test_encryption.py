"""Encryption at rest in Temporal's history: with GANGFLOW_ENCRYPTION_KEYS set for the client and the worker, a
run's inputs, results and failure messages are sealed (AES-GCM) before they reach the server; the raw history,
read without the key, holds none of them in plaintext, while gangflow itself shows them as usual."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import WorkerProcess, gangflow_cli

from engine.runtime import Endpoint, connect
from engine.runtime.encryption import KEYS_ENV, new_key

FLOW = """
from engine import task, workflow


@task
def shout(x: str) -> str:
    if x.startswith("fail"):
        raise ValueError(f"cannot shout {x}")
    return x.upper() + "-DONE"


@workflow
async def echo(x: str) -> str:
    return await shout(x=x)
"""


@pytest.fixture(scope="module")
def sealed_worker(server, tmp_path_factory) -> Any:
    keys = ",".join([new_key("k2"), new_key("k1")])
    proc = WorkerProcess(server.address, "sealed", tmp_path_factory.mktemp("sealed"), env={KEYS_ENV: keys}).start()
    yield keys
    proc.stop()


def cli(server: Any, keys: str, *args: str, cwd: Path) -> Any:
    return gangflow_cli(*args, cwd=cwd, GANGFLOW_ADDRESS=server.address, **{KEYS_ENV: keys})


async def raw_history(server: Any, run_id: str) -> bytes:
    # a client without the keys: what Temporal (and anyone reading its database) holds
    plain = await connect(Endpoint(server.address, "default"))
    history = await plain.get_workflow_handle(run_id).fetch_history()
    return history.to_json().encode()


def test_inputs_results_and_failures_are_sealed_in_history(server, sealed_worker, artifacts, tmp_path):
    import asyncio

    keys = sealed_worker
    (tmp_path / "flow.py").write_text(FLOW)
    secret = f"quokka-{os.urandom(6).hex()}"
    common = ["--task-queue", "sealed", "--artifacts", artifacts, "--json"]
    done = cli(server, keys, "run", "flow.py:echo", "--x", secret, *common, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["result"] == secret.upper() + "-DONE"  # gangflow reads it back with the key
    raw = asyncio.run(raw_history(server, answer["run_id"]))
    assert secret.encode() not in raw and secret.upper().encode() not in raw
    assert b"binary/encrypted" in raw or b"YmluYXJ5L2VuY3J5cHRlZA" in raw  # sealed payloads, not absent ones

    failing = cli(server, keys, "run", "flow.py:echo", "--x", f"fail-{secret}", *common, cwd=tmp_path)
    assert failing.returncode == 1
    run_id = json.loads(failing.stdout)["run_id"]
    status = cli(server, keys, "status", run_id, "--json", cwd=tmp_path)
    assert f"cannot shout fail-{secret}" in status.stdout  # the message, decrypted for the one with the key
    assert secret.encode() not in asyncio.run(raw_history(server, run_id))  # sealed: message and stack trace

    # without the key gangflow cannot read the run, and says so rather than showing ciphertext
    blind = gangflow_cli("status", answer["run_id"], "--json", cwd=tmp_path, GANGFLOW_ADDRESS=server.address)
    assert secret not in blind.stdout


def test_a_malformed_key_is_refused_before_anything_connects(tmp_path):
    done = gangflow_cli("list", GANGFLOW_ADDRESS="127.0.0.1:9", **{KEYS_ENV: "k1:not-base64"})
    assert done.returncode == 2 and "GANGFLOW_ENCRYPTION_KEYS: entry 'k1' is not <key id>:<base64 of 32 bytes>" in (
        " ".join(done.stderr.split())
    ), done.stderr


GANG_FLOW = """
import os
from dataclasses import dataclass

from engine import GangPlugin, Resources, task, workflow


@dataclass(frozen=True)
class Pair(GangPlugin):
    nnodes: int = 2
    nproc_per_node: int = 1


@task(plugin=Pair(), resources=Resources(gpu=1))
def spread(x: str) -> str:
    # the agents' key never reaches the ranks
    return f"{x}:{os.environ['RANK']}:{'GANGFLOW_ENCRYPTION_KEYS' in os.environ}"


@workflow
async def fan(x: str) -> str:
    return await spread(x=x)
"""


def test_a_sealed_stack_runs_gangs_across_node_agents(tmp_path_factory):
    import asyncio

    from conftest import NO_WARM_IMPORTS, Stack

    from engine.client import Client, load_workflow_file

    keys = new_key("stack")
    # its gang imports no torch, nor need the standbys
    stack = Stack(
        tmp_path_factory.mktemp("sealed-stack"), "s", count=2, gpus=1, env={KEYS_ENV: keys, **NO_WARM_IMPORTS}
    )
    folder = tmp_path_factory.mktemp("sealed-gang")
    (folder / "gangs.py").write_text(GANG_FLOW)
    secret = f"wombat-{os.urandom(6).hex()}"
    try:

        async def main() -> None:
            await stack.wait_nodes()  # with the key (below): even the Scheduler's answers are sealed
            client = Client(await connect(Endpoint.resolve(stack.server.address)), stack.artifacts)
            wf = load_workflow_file(f"{folder / 'gangs.py'}:fan")
            run_id = await client.start(wf, {"x": secret})
            assert await client.result(run_id, wf) == f"{secret}:0:False"
            plain = await connect(Endpoint(stack.server.address, "default"))
            for wid in (run_id, f"{run_id}.spread-1"):  # the run and its gang: nothing in the clear
                raw = (await plain.get_workflow_handle(wid).fetch_history()).to_json().encode()
                assert secret.encode() not in raw

        os.environ[KEYS_ENV] = keys
        asyncio.run(main())
    finally:
        os.environ.pop(KEYS_ENV, None)
        stack.close()
