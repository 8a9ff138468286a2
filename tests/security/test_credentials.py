"""Attacks on the credentials of the dev stack (`gangflow dev --auth`, the session's shared stack), each as a
tenant would try it, each refused.

From a plain task of team-a (it runs in team-a's worker, as team-a's own user, in a network namespace of its
own): reading the token signing key, team-b's token, team-b's secret, team-b's artifacts, Temporal's database,
team-b's worker's environment (its GANGFLOW_API_KEY), the platform's and the node agents' environments;
connecting to any port this machine listens on (the dev server's gRPC and HTTP API ports, the node agents', the
codec server's). With a token: an expired one, one without exp, one for another audience or from another
issuer. From the CLI: `secret set` without a token or with another tenant's. The codec server: team-a's token
for a payload sealed with team-b's key, and a page of a foreign origin.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from conftest import ROOT, AuthStack, gangflow_cli, run
from temporalio.service import RPCError

from engine.core.protocol import tenant_user
from engine.runtime.tokens import DEFAULT_AUDIENCE, DEFAULT_ISSUER, DevKeys

pytestmark = pytest.mark.slow

as_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="tenants are kept apart by OS user only where the stack runs as root"
)

PROBE = """
import os, socket
from engine import task, workflow


def _read(path):
    try:
        with open(path, "rb") as handle:
            return "READ " + handle.read(64).decode(errors="replace")
    except OSError as exc:
        return f"refused ({type(exc).__name__})"


def _connect(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return "CONNECTED"
    except OSError as exc:
        return f"refused ({type(exc).__name__})"


@task
def probe(files: list[str], pids: list[int], ports: list[int]) -> dict:
    return {
        "files": {path: _read(path) for path in files},
        "environ": {str(pid): _read(f"/proc/{pid}/environ") for pid in pids},
        "ports": {str(port): _connect(port) for port in ports},
        "uid": os.getuid(),
        "pid": os.getpid(),
        "secrets_dir": os.environ.get("GANGFLOW_SECRETS_DIR"),
    }


@workflow
async def pipeline(files: list[str], pids: list[int], ports: list[int]) -> dict:
    return await probe(files=files, pids=pids, ports=ports)
"""


def _pids(stack: AuthStack, *needles: str) -> list[int]:
    """The stack's processes (children of its dev process) whose command line holds every one of ``needles``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if parent == stack.proc.pid and all(n in cmdline for n in needles):
                found.append(int(entry.name))
    return found


def _listening() -> list[int]:
    """Every TCP port this machine (its host network namespace) listens on, on loopback or any address."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, _, state = line.split()[1:4]
            if state == "0A":  # LISTEN
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return sorted(ports)


def _cli(stack: AuthStack, tenant: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return gangflow_cli(*args, env={**stack.env(tenant), **env}, timeout=240)


def _secret_set(stack: AuthStack, tenant: str, value: str, token: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GANGFLOW_API_KEY"}
    if token is not None:
        env["GANGFLOW_API_KEY"] = token
    return subprocess.run(
        [sys.executable, "-m", "engine.cli", "secret", "set", tenant, "probe-token", "--state-dir", str(stack.state)],
        input=value,
        text=True,
        capture_output=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )


def test_secret_set_needs_the_tenants_own_token(auth_stack: AuthStack) -> None:
    none = _secret_set(auth_stack, "team-b", "planted", None)
    assert none.returncode == 2 and "needs team-b's token" in none.stderr, none.stderr
    other = _secret_set(auth_stack, "team-b", "planted", auth_stack.token("team-a"))
    assert other.returncode == 2 and "no write role on gf-team-b" in other.stderr, other.stderr
    forged = _secret_set(
        auth_stack, "team-b", "planted", DevKeys.load_or_create(auth_stack.state.parent / "x").tenant_token("team-b")
    )
    assert forged.returncode == 2 and "token was refused" in forged.stderr, forged.stderr
    assert not (auth_stack.state / "secrets" / "team-b" / "probe-token").exists()
    own = _secret_set(auth_stack, "team-b", "b-secret-4c1d", auth_stack.token("team-b"))
    assert own.returncode == 0, own.stderr


@as_root
def test_a_plain_task_reaches_nothing_of_another_tenant_or_the_platform(auth_stack: AuthStack, tmp_path: Path) -> None:
    state = auth_stack.state
    assert _secret_set(auth_stack, "team-b", "b-secret-4c1d", auth_stack.token("team-b")).returncode == 0
    planted = state / "artifacts" / "team-b" / "planted.txt"  # what team-b's client wrote into its root
    planted.write_text("team-b's data")
    (team_b_worker,) = _pids(auth_stack, "worker", "--tenant team-b")
    (team_a_worker,) = _pids(auth_stack, "worker", "--tenant team-a")
    nodes = _pids(auth_stack, "engine.cli node", "--node-id")
    assert len(nodes) == 2, nodes
    files = [
        state / "auth" / "dev-key.pem",
        state / "auth" / "tokens" / "team-b.jwt",
        state / "auth" / "tokens" / "team-a.jwt",  # even its own token file: it has the token in its environment
        state / "secrets" / "team-b" / "probe-token",
        planted,
        state / "temporal.sqlite",
        state / "worker-team-b.log",
    ]
    ports = _listening()
    upstream_port = int(auth_stack.upstream.rsplit(":", 1)[1])
    assert upstream_port in ports
    flow = tmp_path / "probe.py"
    flow.write_text(PROBE)
    pids = [team_b_worker, auth_stack.proc.pid, *nodes]
    inputs = json.dumps({"files": [str(f) for f in files], "pids": pids, "ports": ports})
    done = _cli(
        auth_stack, "team-a", "run", f"{flow}:pipeline", "--input-json", inputs, "--json", "--run-id", "cred-probe"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])["result"]
    # it ran in team-a's worker process, as team-a's user, with no directory of every tenant's secrets
    assert seen["pid"] == team_a_worker and seen["uid"] == tenant_user("team-a").uid, seen
    assert seen["secrets_dir"] is None
    read = {path: what for path, what in seen["files"].items() if not what.startswith("refused")}
    assert read == {}, read
    environ = {pid: what for pid, what in seen["environ"].items() if not what.startswith("refused")}
    assert environ == {}, environ
    # not one port of this machine: Temporal's gRPC and HTTP API, the gateway's TCP port, the node agents'
    connected = {port: what for port, what in seen["ports"].items() if not what.startswith("refused")}
    assert connected == {}, connected


@as_root
def test_the_dev_servers_address_is_not_on_a_command_line(auth_stack: AuthStack) -> None:
    """/proc/<pid>/cmdline is anyone's to read: the node agents get the server's address in their environment."""
    upstream = auth_stack.upstream
    nodes = _pids(auth_stack, "engine.cli node", "--node-id")
    assert len(nodes) == 2, nodes
    for pid in nodes:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        assert upstream not in cmdline and "--address" not in cmdline, cmdline
    # and the state holding the key, the tokens and the database is the platform's
    state = auth_stack.state
    for path, mode in (
        (state / "auth", 0o700),
        (state / "auth" / "dev-key.pem", 0o600),
        (state / "temporal.sqlite", 0o600),
    ):
        assert path.stat().st_mode & 0o777 == mode and path.stat().st_uid == 0, path
    own = state / "secrets" / "team-a"
    assert own.stat().st_uid == tenant_user("team-a").uid and own.stat().st_mode & 0o777 == 0o700


def _token(stack: AuthStack, **claims: Any) -> str:
    keys = DevKeys.load(stack.state)
    now = int(time.time())
    payload = {"sub": "team-a", "permissions": ["gf-team-a:write"], "iat": now, "exp": now + 600}
    payload |= {"aud": DEFAULT_AUDIENCE, "iss": DEFAULT_ISSUER, **claims}
    return jwt.encode(
        {k: v for k, v in payload.items() if v is not None}, keys.key, algorithm="RS256", headers={"kid": keys.kid}
    )


def test_tokens_expired_without_exp_or_for_another_audience_or_issuer_are_refused(auth_stack: AuthStack) -> None:
    async def lists(token: str) -> bool:
        try:  # a token the gateway refuses fails every call, the connection's first one included
            client = await auth_stack.client("gf-team-a", token)
            [w async for w in client.list_workflows()]
        except (RPCError, RuntimeError) as exc:
            assert "Request unauthorized" in str(exc), exc
            return False
        return True

    assert run(lists(_token(auth_stack)))  # the control: a well-formed token of the stack's key works
    for claims in (
        {"exp": int(time.time()) - 60},
        {"exp": None},
        {"aud": "another-service"},
        {"aud": None},
        {"iss": "someone-else"},
        {"iss": None},
    ):
        assert not run(lists(_token(auth_stack, **claims))), claims


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_codec_server_opens_only_the_callers_namespace_and_answers_only_its_origin(auth_stack: AuthStack) -> None:
    from temporalio.api.common.v1 import Payload

    from engine.runtime.encryption import EncryptionCodec, new_key

    keys = ",".join([new_key("gf-team-a"), new_key("gf-team-b")])
    port, ui = _free_port(), "https://ui.example.com"
    env = {**os.environ, "GANGFLOW_ENCRYPTION_KEYS": keys}
    command = [sys.executable, "-m", "engine.cli", "codec-server", "--port", str(port), "--allow-origin", ui]
    command += ["--jwks", str(auth_stack.state / "auth" / "jwks.json")]
    proc = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import urllib.error
        import urllib.request

        from engine.runtime.encryption import keys_from_env

        key_b = {k: v for k, v in (keys_from_env(keys) or {}).items() if k == "gf-team-b"}
        inner = Payload(metadata={"encoding": b"json/plain"}, data=b'{"b": "secret"}')
        (sealed,) = asyncio.run(EncryptionCodec(key_b).encode([inner]))
        wire = {
            "metadata": {k: base64.b64encode(v).decode() for k, v in sealed.metadata.items()},
            "data": base64.b64encode(sealed.data).decode(),
        }

        def post(namespace: str, token: str, origin: str | None = None) -> tuple[int, Any]:
            headers = {"Content-Type": "application/json", "X-Namespace": namespace, "Authorization": f"Bearer {token}"}
            if origin:
                headers["Origin"] = origin
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/decode", data=json.dumps({"payloads": [wire]}).encode(), headers=headers
            )
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    return response.status, json.loads(response.read())["payloads"][0]
            except urllib.error.HTTPError as exc:
                return exc.code, None

        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "the codec server did not start"
                time.sleep(0.1)
        team_a, team_b = auth_stack.token("team-a"), auth_stack.token("team-b")
        # team-a's token, whichever namespace it names: team-b's payload stays sealed
        assert post("gf-team-a", team_a) == (200, wire)
        assert post("gf-team-b", team_a) == (200, wire)
        # the control: team-b's own token opens it
        status, opened = post("gf-team-b", team_b)
        assert status == 200 and base64.b64decode(opened["data"]) == b'{"b": "secret"}'
        # a page of another origin (a site, a local server) is refused, even with team-b's token
        assert post("gf-team-b", team_b, "https://evil.example")[0] == 403
        assert post("gf-team-b", team_b, "http://127.0.0.1:8233")[0] == 403
        assert post("gf-team-b", team_b, ui)[0] == 200
    finally:
        proc.terminate()
        proc.wait(30)
