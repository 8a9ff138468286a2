"""Permissions on the dev stack: `gangflow dev --auth` as a user runs it, tenants' temporalio clients with
tokens against its gateway. A team-a token acts in gf-team-a and is refused everything in gf-team-b; a read
token reads only; no token, an expired one or one signed by another key is refused (one without exp, or for
another audience or issuer: tests/security/test_credentials.py); the JWKS the stack publishes verifies its
tokens (what a real server's default claim mapper would be given)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import jwt
import pytest
from conftest import ROOT, AuthStack, gangflow_cli, run, until
from temporalio.api.command.v1 import Command, SignalExternalWorkflowExecutionCommandAttributes
from temporalio.api.enums.v1 import CommandType
from temporalio.api.workflowservice.v1 import (
    GetClusterInfoRequest,
    ListWorkflowExecutionsRequest,
    RespondWorkflowTaskCompletedRequest,
)
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from engine.runtime.gateway import authorized
from engine.runtime.tokens import DEFAULT_AUDIENCE, DEFAULT_ISSUER, Claims, DevKeys

WORKFLOW = "gangflow.auth.NoWorkerNeeded"  # started by type name: nothing polls its queue


@pytest.fixture
def stack(auth_stack: AuthStack) -> AuthStack:
    """The session's shared stack (conftest.auth_stack): these tests only start and end workflows of their own."""
    return auth_stack


async def _denied(action: Callable[[], Awaitable[Any]]) -> None:
    with pytest.raises(RPCError) as caught:
        await action()
    assert caught.value.status == RPCStatusCode.PERMISSION_DENIED, caught.value
    assert caught.value.message == "Request unauthorized."


async def _ids(client: Client) -> list[str]:
    return [w.id async for w in client.list_workflows()]


async def _listed(client: Client, workflow_id: str) -> None:
    """Visibility lags a start by a moment."""

    async def probe() -> bool | None:
        return True if workflow_id in await _ids(client) else None

    await until(f"{workflow_id} listed", probe, timeout=30)


def test_banner_names_the_gateway_tokens_and_jwks(stack: AuthStack) -> None:
    text = stack.log.read_text()
    assert f"the gateway on {stack.address} checks" in text
    # the port clients use comes first, before Temporal's own (the platform's)
    first = next(line for line in text.splitlines() if line.startswith("gangflow dev"))
    assert first.startswith(f"gangflow dev --auth: clients connect to the gateway on {stack.address}; "), text
    assert text.index(stack.address) < text.index(stack.upstream), text
    assert str(stack.state / "auth" / "jwks.json") in text
    assert f"GANGFLOW_ADDRESS={stack.address} GANGFLOW_NAMESPACE='gf-{{tenant}}' GANGFLOW_TENANT=team-a" in text


def test_a_tenant_acts_in_its_namespace_and_is_denied_in_another(stack: AuthStack) -> None:
    async def go() -> None:
        a = await stack.client("gf-team-a", stack.token("team-a"))
        mine = await a.start_workflow(WORKFLOW, id="a-run", task_queue="gf-nobody")
        await _listed(a, "a-run")
        assert (await mine.describe()).status == WorkflowExecutionStatus.RUNNING
        await mine.signal("poke", 1)
        await mine.cancel()
        await mine.terminate("done")
        assert (await mine.describe()).status == WorkflowExecutionStatus.TERMINATED

        b = await stack.client("gf-team-b", stack.token("team-b"))
        await b.start_workflow(WORKFLOW, id="b-run", task_queue="gf-nobody")
        a_in_b = await stack.client("gf-team-b", stack.token("team-a"))
        theirs = a_in_b.get_workflow_handle("b-run")
        await _denied(lambda: _ids(a_in_b))
        await _denied(theirs.describe)
        await _denied(lambda: theirs.signal("poke", 1))
        await _denied(theirs.cancel)
        await _denied(lambda: theirs.terminate("mine now"))
        await _denied(lambda: a_in_b.start_workflow(WORKFLOW, id="a-in-b", task_queue="gf-nobody"))
        # nothing reached B's run
        described = await b.get_workflow_handle("b-run").describe()
        assert described.status == WorkflowExecutionStatus.RUNNING
        events = [e.event_type async for e in b.get_workflow_handle("b-run").fetch_history_events()]
        assert len(events) <= 3, events  # started, its first workflow task: no signal, no cancel request
        # and the platform namespace is not a tenant's either
        system = await stack.client("gangflow-system", stack.token("team-a"))
        await _denied(lambda: _ids(system))
        await b.get_workflow_handle("b-run").terminate("test over")

    run(go())


def test_a_read_token_from_the_cli_reads_but_cannot_signal(stack: AuthStack) -> None:
    made = gangflow_cli("auth", "token", "team-a", "--role", "read", "--state-dir", str(stack.state))
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert token.count(".") == 2 and "\n" not in token

    async def go() -> None:
        writer = await stack.client("gf-team-a", stack.token("team-a"))
        await writer.start_workflow(WORKFLOW, id="read-me", task_queue="gf-nobody")
        reader = await stack.client("gf-team-a", token)
        await _listed(reader, "read-me")
        handle = reader.get_workflow_handle("read-me")
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
        await _denied(lambda: handle.signal("poke", 1))
        await _denied(handle.cancel)
        await _denied(lambda: handle.terminate("no"))
        await writer.get_workflow_handle("read-me").terminate("test over")

    run(go())


def test_no_token_is_denied(stack: AuthStack) -> None:
    async def go() -> None:
        # connecting asks GetSystemInfo, which a real server answers without a token too
        anonymous = await stack.client("gf-team-a", None)
        await _denied(lambda: _ids(anonymous))
        await _denied(anonymous.get_workflow_handle("a-run").describe)
        await _denied(lambda: anonymous.start_workflow(WORKFLOW, id="anon", task_queue="gf-nobody"))

    run(go())


def test_an_expired_or_foreign_token_is_denied(stack: AuthStack, tmp_path: Path) -> None:
    expired = DevKeys.load(stack.state).tenant_token("team-a", ttl_s=-60)
    foreign = DevKeys.load_or_create(tmp_path).tenant_token("team-a")  # the right claims, another key
    tampered = stack.token("team-a")[:-6] + "AAAAAA"

    async def go() -> None:
        for token in (expired, foreign, tampered, "not-a-jwt"):
            # a token the claim mapper refuses fails every call, the connection's first one included
            with pytest.raises(RuntimeError, match=r"PermissionDenied.*Request unauthorized"):
                await stack.client("gf-team-a", token)

    run(go())


def test_the_cli_says_why_a_token_was_refused(
    stack: AuthStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway (like Temporal) answers a bad token with "Request unauthorized." only: the CLI reads the
    token's own claims to say what is wrong with it, never "cannot reach Temporal ... start one"."""
    keys = DevKeys.load(stack.state)
    expired = keys.tenant_token("team-a", ttl_s=-600)
    exp = jwt.decode(expired, options={"verify_signature": False})["exp"]
    monkeypatch.setenv("GANGFLOW_TOKEN_AUDIENCE", "billing")
    other_audience = keys.tenant_token("team-a")
    monkeypatch.delenv("GANGFLOW_TOKEN_AUDIENCE")
    foreign = DevKeys.load_or_create(tmp_path).tenant_token("team-a")
    refused = f"error: Temporal at {stack.address} refused the credentials: "
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(exp))
    for token, why in [
        (expired, f"token expired at {when} (10 min ago)"),
        (other_audience, "the token is for audience 'billing', not 'gangflow' ($GANGFLOW_TOKEN_AUDIENCE)"),
        (foreign, "its claims (expiry, audience, issuer) look valid, so the server did not accept its signature"),
        ("not-a-jwt", "the API key is not a JWT"),
    ]:
        for command in (["list"], ["cluster"]):
            done = gangflow_cli(*command, env={**stack.env("team-a"), "GANGFLOW_API_KEY": token})
            assert done.returncode == 1, (command, done.stdout, done.stderr)
            assert refused + why in done.stderr, (command, done.stderr)
            assert "cannot reach" not in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_secret_set_and_auth_token_find_the_running_stack_without_state_dir(stack: AuthStack, tmp_path: Path) -> None:
    """Run from any folder with the banner's environment: they act on that stack's state dir, never on a
    ./.gangflow of the current folder; when no running stack answers to it they refuse (exit 2)."""
    env = stack.env("team-a")
    made = gangflow_cli("auth", "token", "team-a", "--role", "read", env=env, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    claims = jwt.decode(made.stdout.strip(), options={"verify_signature": False})
    assert claims["permissions"] == ["gf-team-a:read"]
    key = jwt.PyJWKSet.from_dict(json.loads((stack.state / "auth" / "jwks.json").read_text()))
    jwt.decode(
        made.stdout.strip(),
        key[jwt.get_unverified_header(made.stdout.strip())["kid"]].key,
        algorithms=["RS256"],
        audience=DEFAULT_AUDIENCE,
    )  # signed with this stack's key
    command = [sys.executable, "-m", "engine.cli", "secret", "set", "team-a", "found-stack"]
    done = subprocess.run(command, input="v", text=True, capture_output=True, env=env, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (stack.state / "secrets" / "team-a" / "found-stack").read_text() == "v\n"
    assert not (tmp_path / ".gangflow").exists()
    listed = gangflow_cli("secret", "list", "team-a", env=env, cwd=tmp_path)
    assert listed.returncode == 0 and "found-stack" in listed.stdout.split(), listed.stderr

    nowhere = {**env, "GANGFLOW_ADDRESS": "127.0.0.1:1"}
    for args in (["auth", "token", "team-a"], ["secret", "list", "team-a"]):
        refused = gangflow_cli(*args, env=nowhere, cwd=tmp_path)
        assert refused.returncode == 2, refused
        assert "no running 'gangflow dev' serves $GANGFLOW_ADDRESS=127.0.0.1:1; pass --state-dir DIR" in (
            refused.stderr
        ), refused.stderr
    alone = {k: v for k, v in env.items() if k != "GANGFLOW_ADDRESS"} | {"GANGFLOW_CACHE": str(tmp_path / "c")}
    refused = gangflow_cli("auth", "token", "team-a", env=alone, cwd=tmp_path)
    assert refused.returncode == 2 and "no running 'gangflow dev' found" in refused.stderr, refused.stderr
    assert not (tmp_path / ".gangflow").exists()


def test_the_jwks_verifies_the_tokens(stack: AuthStack) -> None:
    jwks = json.loads((stack.state / "auth" / "jwks.json").read_text())
    assert "d" not in jwks["keys"][0], "the JWKS must hold the public key only"
    token = stack.token("team-b")
    key = jwt.PyJWKSet.from_dict(jwks)[jwt.get_unverified_header(token)["kid"]]
    # what a real server's claim mapper would check, with the audience it is configured with
    claims = jwt.decode(token, key.key, algorithms=["RS256"], audience=DEFAULT_AUDIENCE, issuer=DEFAULT_ISSUER)
    assert claims["sub"] == "team-b" and claims["aud"] == DEFAULT_AUDIENCE and claims["iss"] == DEFAULT_ISSUER
    assert claims["permissions"] == ["gf-team-b:write"]
    assert 86000 < claims["exp"] - claims["iat"] <= 86400
    assert oct((stack.state / "auth" / "dev-key.pem").stat().st_mode & 0o777) == "0o600"


def test_the_cli_refuses_bad_input(tmp_path: Path) -> None:
    for args, expected in [
        (["--role", "admin"], "--role 'admin': expected write or read"),
        (["--ttl", "0"], "--ttl must be between 1 and"),
        (["--state-dir", str(tmp_path / "none")], "no dev key"),
    ]:
        state = [] if "--state-dir" in args else ["--state-dir", str(tmp_path)]
        DevKeys.load_or_create(tmp_path)
        done = gangflow_cli("auth", "token", "team-a", *state, *args)
        assert done.returncode == 2, done
        assert expected in done.stderr.replace("\n", ""), done.stderr
    done = gangflow_cli("auth", "token", "Team_A", "--state-dir", str(tmp_path))
    assert done.returncode == 2 and "tenant 'Team_A'" in done.stderr, done.stderr
    # without the auth extra: exit 2 before anything starts, saying what to install
    no_jwt = "import sys; sys.modules['jwt'] = None; from engine.cli import main; main()"
    blocked = subprocess.run(
        [sys.executable, "-c", no_jwt, "dev", "--auth", "--headless", "--state-dir", str(tmp_path / "s")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert blocked.returncode == 2, blocked
    assert "pip install 'gangflow[auth]'" in blocked.stderr
    assert not (tmp_path / "s").exists()


def test_the_authorizer_follows_temporals_rules() -> None:
    """The decisions of Temporal's default authorizer that the tests above do not reach."""
    list_a = ListWorkflowExecutionsRequest(namespace="gf-team-a")
    method = "/temporal.api.workflowservice.v1.WorkflowService/"
    worker_only = Claims("w", namespaces={"gf-team-a": 1})
    assert not authorized(worker_only, method + "ListWorkflowExecutions", list_a)  # worker alone grants nothing
    cluster_admin = Claims("ops", system=8)
    assert authorized(cluster_admin, method + "ListWorkflowExecutions", list_a)
    tenant = Claims("team-a", namespaces={"gf-team-a": 4})
    # cluster-wide calls need a role on temporal-system; GetSystemInfo and the health check need none
    assert not authorized(tenant, method + "GetClusterInfo", GetClusterInfoRequest())
    assert authorized(Claims(), method + "GetSystemInfo", None)
    assert authorized(Claims(), "/grpc.health.v1.Health/Check", None)
    # a namespace admin only: adding search attributes is an OperatorService (admin) call
    from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest

    add = AddSearchAttributesRequest(namespace="gf-team-a")
    operator = "/temporal.api.operatorservice.v1.OperatorService/AddSearchAttributes"
    assert not authorized(tenant, operator, add)
    assert authorized(Claims("a", namespaces={"gf-team-a": 8}), operator, add)
    # a workflow task of A's that signals into B needs write in B too
    signal_b = Command(
        command_type=CommandType.COMMAND_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION,
        signal_external_workflow_execution_command_attributes=SignalExternalWorkflowExecutionCommandAttributes(
            namespace="gf-team-b"
        ),
    )
    completed = RespondWorkflowTaskCompletedRequest(namespace="gf-team-a", commands=[signal_b])
    assert not authorized(tenant, method + "RespondWorkflowTaskCompleted", completed)
    both = Claims("ab", namespaces={"gf-team-a": 4, "gf-team-b": 4})
    assert authorized(both, method + "RespondWorkflowTaskCompleted", completed)
