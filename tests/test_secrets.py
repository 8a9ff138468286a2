"""Secrets on a real stack (dev server, worker and two node agents with a secrets directory): a plain task and the
ranks of a gang get a tenant's secret in their own process only; the value never reaches Temporal's history
(read raw, without any codec), ``gangflow logs`` or a failure message, though the tasks print it and raise
with it; a secret that only another tenant has fails the task at once, naming neither that tenant nor a value."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Stack, alive, gangflow_cli, stack_fixture
from temporalio.api.history.v1 import History
from temporalio.client import WorkflowFailureError

from engine.client import Client, load_workflow_file
from engine.runtime import Endpoint, connect

FLOW = """
import hashlib
import os
from pathlib import Path

import engine
from engine import Secret, task, workflow
from plugins.pytorch import PyTorch


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


@task(secrets=[Secret("hf-token", env="HF_TOKEN", mount="token.txt")], retries=2)
def plain(marker: str, fail: bool = False) -> dict:
    value = engine.secret("hf-token")
    print(f"{marker}: the token is {value}")
    if fail:
        raise ValueError(f"token {value} was rejected")
    worker_env = Path(f"/proc/{os.getppid()}/environ").read_bytes()
    mount = Path(os.environ["GANGFLOW_SECRET_MOUNTS"], "token.txt")
    return {
        "env": digest(os.environ["HF_TOKEN"]),
        "mount": digest(mount.read_text()),
        "api": digest(value),
        "mount_mode": oct(mount.stat().st_mode & 0o777),
        "in_worker_env": value.encode() in worker_env,
        "secrets_dir_visible": "GANGFLOW_SECRETS_DIR" in os.environ,
    }


@task
def unprotected() -> bool:
    # a task without secrets runs in the worker's thread: the worker's environment has no secret folder
    return "GANGFLOW_SECRET_VALUES" in os.environ


@workflow
async def single(marker: str, fail: bool = False) -> dict:
    out = await plain(marker=marker, fail=fail)
    out["unprotected_sees_secrets"] = await unprotected()
    return out


@task(secrets=[Secret("hf-token")], heartbeat_timeout=5)
def hold(marker_dir: str) -> None:
    import time

    Path(marker_dir, f"{os.getpid()}.pid").write_text(engine.secret("hf-token")[:2])
    time.sleep(300)


@workflow
async def holding(marker_dir: str) -> None:
    await hold(marker_dir=marker_dir)


@task(secrets=[Secret("b-only")], retries=3)
def needs_b() -> str:
    return "never"


@workflow
async def foreign() -> str:
    return await needs_b()


@task(plugin=PyTorch(nnodes=2, nproc_per_node=1, timeout=60), secrets=[Secret("hf-token", env="HF_TOKEN")])
def ranks(marker: str, fail: bool = False) -> list:
    import torch.distributed as dist

    value = engine.secret("hf-token")
    rank = dist.get_rank()
    print(f"{marker}: rank {rank} has {value}", flush=True)
    if fail and rank == 1:
        raise ValueError(f"rank 1 refused {value}")
    if fail:  # no collective: rank 0 must not fail first on its broken peer, the report is rank 1's
        return [None, None]
    got = [None, None]
    dist.all_gather_object(got, digest(os.environ["HF_TOKEN"]))
    return got


@workflow
async def gang(marker: str, fail: bool = False) -> list:
    return await ranks(marker=marker, fail=fail)
"""


class SecretStack(Stack):
    """A stack whose worker and node agents have a secrets directory: ``value`` is default's hf-token (team-b
    has b-only), ``flow`` the workflow file, in a folder of its own (the bundle holds that folder: not the
    stack's state)."""

    def __init__(self, root: Path, prefix: str, count: int, gpus: int, events: int | None, env: Any) -> None:
        secrets = root / "secrets"
        self.value = f"numbat-{os.urandom(8).hex()}"
        for tenant, name, content in (("default", "hf-token", self.value), ("team-b", "b-only", f"b-{self.value}")):
            (secrets / tenant).mkdir(parents=True, exist_ok=True, mode=0o700)
            (secrets / tenant / name).write_text(content + "\n")
        code = root.with_name(f"{root.name}-flow")
        code.mkdir()
        self.flow = code / "flow.py"
        self.flow.write_text(FLOW)
        super().__init__(root, prefix, count, gpus, events, {**(env or {}), "GANGFLOW_SECRETS_DIR": str(secrets)})


stack = stack_fixture("sec", count=2, kind=SecretStack, ready=None)


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


async def _client(stack: Any) -> Client:
    return Client(await connect(Endpoint.resolve(stack.server.address)), stack.artifacts)


async def _raw_history(stack: Any, *workflow_ids: str) -> bytes:
    """The histories as Temporal stores them: serialized protobuf, read by a client without any codec."""
    plain = await connect(Endpoint(stack.server.address, "default"))
    raw = b""
    for wid in workflow_ids:
        history = await plain.get_workflow_handle(wid).fetch_history()
        raw += History(events=history.events).SerializeToString()
    return raw


def _logs(stack: Any, run_id: str) -> str:
    done = gangflow_cli("logs", run_id, GANGFLOW_ADDRESS=stack.server.address, GANGFLOW_ARTIFACTS=stack.artifacts)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_plain_task_gets_its_secret_in_its_own_process_only(stack):
    value, marker = stack.value, f"marker-{os.urandom(4).hex()}"

    async def main() -> tuple[str, dict[str, Any], bytes]:
        client = await _client(stack)
        wf = load_workflow_file(f"{stack.flow}:single")
        run_id = await client.start(wf, {"marker": marker})
        result = await client.result(run_id, wf)
        return run_id, result, await _raw_history(stack, run_id)

    run_id, result, raw = asyncio.run(main())
    assert result["env"] == result["mount"] == result["api"] == _digest(value)
    assert result["mount_mode"] == "0o600"
    assert result["in_worker_env"] is False and result["secrets_dir_visible"] is False
    assert result["unprotected_sees_secrets"] is False
    assert marker.encode() in raw  # the search below reads real payloads
    assert value.encode() not in raw
    logs = _logs(stack, run_id)
    assert f"{marker}: the token is [secret:hf-token]" in logs and value not in logs


def test_a_plain_tasks_failure_and_log_are_redacted(stack):
    value, marker = stack.value, f"marker-{os.urandom(4).hex()}"

    async def main() -> tuple[str, str, bytes]:
        client = await _client(stack)
        wf = load_workflow_file(f"{stack.flow}:single")
        run_id = await client.start(wf, {"marker": marker, "fail": True})
        with pytest.raises(WorkflowFailureError):
            await client.wait(run_id)
        error = str((await client.status(run_id)).error)
        return run_id, error, await _raw_history(stack, run_id)

    run_id, error, raw = asyncio.run(main())
    assert "token [secret:hf-token] was rejected" in error and "ValueError" in error
    assert value not in error and value.encode() not in raw
    logs = _logs(stack, run_id)
    assert logs.count("the token is [secret:hf-token]") == 3  # retried as an in-thread task would be: 3 tries
    assert "ValueError: token [secret:hf-token] was rejected" in logs and value not in logs


def test_cancelling_a_run_kills_the_tasks_own_process(stack, tmp_path):
    async def main() -> int:
        client = await _client(stack)
        wf = load_workflow_file(f"{stack.flow}:holding")
        run_id = await client.start(wf, {"marker_dir": str(tmp_path)})
        deadline = time.monotonic() + 60
        while not (found := list(tmp_path.glob("*.pid"))):
            assert time.monotonic() < deadline, "the task never started"
            await asyncio.sleep(0.1)
        pid = int(found[0].stem)
        assert alive(pid)
        await client.cancel(run_id)
        with pytest.raises(WorkflowFailureError):
            await client.wait(run_id)
        assert (await client.status(run_id)).status == "CANCELED"
        return pid

    pid = asyncio.run(main())
    deadline = time.monotonic() + 30
    while alive(pid):
        assert time.monotonic() < deadline, f"the task's process {pid} outlived the cancel"
        time.sleep(0.2)


def test_another_tenants_secret_fails_at_once_without_naming_it(stack):
    async def main() -> tuple[str, int]:
        client = await _client(stack)
        wf = load_workflow_file(f"{stack.flow}:foreign")
        run_id = await client.start(wf, {})
        with pytest.raises(WorkflowFailureError):
            await client.wait(run_id)
        error = str((await client.status(run_id)).error)
        history = (
            await (await connect(Endpoint(stack.server.address, "default"))).get_workflow_handle(run_id).fetch_history()
        )
        started = sum(1 for e in history.events if e.HasField("activity_task_started_event_attributes"))
        return error, started

    error, started = asyncio.run(main())
    assert "secret 'b-only' of tenant 'default' is not set" in error and "SecretNotFound" in error
    assert "team-b" not in error and stack.value not in error
    assert started == 1  # never retried, though the task allows 3 retries


def test_the_ranks_of_a_gang_get_the_secret_and_their_logs_and_failures_hide_it(stack):
    value, marker = stack.value, f"marker-{os.urandom(4).hex()}"

    async def main() -> tuple[str, list[str], bytes, str, str, bytes]:
        await stack.wait_nodes()
        client = await _client(stack)
        wf = load_workflow_file(f"{stack.flow}:gang")
        run_id = await client.start(wf, {"marker": marker})
        result = await client.result(run_id, wf)
        raw = await _raw_history(stack, run_id, f"{run_id}.ranks-1")
        failing = await client.start(wf, {"marker": marker, "fail": True})
        with pytest.raises(WorkflowFailureError):
            await client.wait(failing)
        error = str((await client.status(failing)).error)
        return run_id, result, raw, failing, error, await _raw_history(stack, failing, f"{failing}.ranks-1")

    run_id, result, raw, failing, error, failed_raw = asyncio.run(main())
    assert result == [_digest(value)] * 2
    assert marker.encode() in raw and value.encode() not in raw
    logs = _logs(stack, run_id)
    for rank in (0, 1):
        assert f"{marker}: rank {rank} has [secret:hf-token]" in logs
    assert value not in logs
    assert "rank 1 refused [secret:hf-token]" in error and value not in error
    assert value.encode() not in failed_raw
    failed_logs = _logs(stack, failing)
    assert "refused [secret:hf-token]" in failed_logs and value not in failed_logs
