"""Tokens need ``exp`` and the expected ``aud`` and ``iss`` (engine.runtime.tokens): a token minted for another
service, by another issuer, or valid forever is refused like a forged one."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import jwt
import pytest

from engine.runtime.tokens import (
    AUDIENCE_ENV,
    DEFAULT_AUDIENCE,
    DEFAULT_ISSUER,
    ISSUER_ENV,
    DevKeys,
    TokenError,
    TokenVerifier,
)


def _signed(keys: DevKeys, **claims: object) -> str:
    payload = {"sub": "team-a", "permissions": ["gf-team-a:write"], "iat": int(time.time()), **claims}
    payload = {k: v for k, v in payload.items() if v is not None}
    return jwt.encode(payload, keys.key, algorithm="RS256", headers={"kid": keys.kid})


def test_a_dev_token_names_its_audience_and_issuer_and_expires(tmp_path):
    keys = DevKeys.load_or_create(tmp_path)
    token = keys.tenant_token("team-a")
    claims = jwt.decode(token, options={"verify_signature": False})
    assert claims["aud"] == DEFAULT_AUDIENCE and claims["iss"] == DEFAULT_ISSUER and claims["exp"] > time.time()
    verified = TokenVerifier.from_file(keys.jwks_file).claims(f"Bearer {token}")
    assert verified.subject == "team-a" and verified.role_in("gf-team-a")


@pytest.mark.parametrize(
    ("claims", "why"),
    [
        # exp as seconds from when the test runs (a suite may reach it long after collecting it)
        ({"exp": None, "aud": DEFAULT_AUDIENCE, "iss": DEFAULT_ISSUER}, "exp"),
        ({"exp": -60, "aud": DEFAULT_AUDIENCE, "iss": DEFAULT_ISSUER}, "expired"),
        ({"exp": 600, "aud": "another-service", "iss": DEFAULT_ISSUER}, "audience"),
        ({"exp": 600, "aud": None, "iss": DEFAULT_ISSUER}, "aud"),
        ({"exp": 600, "aud": DEFAULT_AUDIENCE, "iss": "someone-else"}, "issuer"),
        ({"exp": 600, "aud": DEFAULT_AUDIENCE, "iss": None}, "iss"),
    ],
)
def test_tokens_without_exp_or_for_another_audience_or_issuer_are_refused(tmp_path, claims, why):
    keys = DevKeys.load_or_create(tmp_path)
    verifier = TokenVerifier.from_file(keys.jwks_file)
    if claims["exp"] is not None:
        claims = {**claims, "exp": int(time.time()) + claims["exp"]}
    with pytest.raises(TokenError, match=f"(?i){why}"):
        verifier.claims(f"Bearer {_signed(keys, **claims)}")


def test_audience_and_issuer_are_configurable(tmp_path, monkeypatch):
    keys = DevKeys.load_or_create(tmp_path)
    monkeypatch.setenv(AUDIENCE_ENV, "temporal.example.com")
    monkeypatch.setenv(ISSUER_ENV, "https://idp.example.com")
    token = keys.tenant_token("team-a")
    assert TokenVerifier.from_file(keys.jwks_file).claims(f"Bearer {token}").subject == "team-a"
    with pytest.raises(TokenError, match=r"(?i)audience"):
        TokenVerifier.from_file(keys.jwks_file, audience=DEFAULT_AUDIENCE).claims(f"Bearer {token}")
    with pytest.raises(TokenError, match=r"(?i)issuer"):
        TokenVerifier.from_file(keys.jwks_file, issuer=DEFAULT_ISSUER).claims(f"Bearer {token}")


@pytest.mark.skipif(os.geteuid() != 0, reason="tenants' folders are given to their own users as root only")
def test_as_root_the_state_is_the_platforms_and_each_tenants_folders_its_users(request):
    """``dev --auth``'s layout as root: the key, the tokens, the database and logs are root's (0700 / 0600); a
    tenant's secrets and artifact root are its user's, and what root writes in that root later stays readable
    and writable by that user (a default ACL) and by no other tenant's user."""
    from engine.cli.auth import DevAuth
    from engine.core.protocol import tenant_user

    # a folder the tenants' users may search (pytest's own are 0700: a worker's mount namespace covers those)
    top = Path(tempfile.mkdtemp(prefix="gf-layout-"))
    request.addfinalizer(lambda: shutil.rmtree(top, ignore_errors=True))
    os.chmod(top, 0o711)
    state = top / "state"
    keys = DevKeys.load_or_create(state)
    (state / "temporal.sqlite").write_bytes(b"")
    DevAuth(keys, ("team-a", "team-b"), keys.directory / "tokens").lock_down(state)
    mode = {p: p.stat().st_mode & 0o777 for p in (state, state / "auth", state / "auth" / "dev-key.pem")}
    assert mode == {state: 0o711, state / "auth": 0o700, state / "auth" / "dev-key.pem": 0o600}
    assert (state / "temporal.sqlite").stat().st_mode & 0o777 == 0o600
    a, b = tenant_user("team-a"), tenant_user("team-b")
    for kind in ("artifacts", "secrets", "home"):
        folder = state / kind / "team-a"
        assert folder.stat().st_uid == a.uid and folder.stat().st_mode & 0o700 == 0o700, folder
    written = state / "artifacts" / "team-a" / "cas" / "ab"
    written.mkdir(parents=True)  # as a client run as root would
    (written / "object").write_text("team-a's")

    def as_user(uid: int, script: str) -> int:
        command = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sh", "-c", script]
        return subprocess.run(command, capture_output=True, timeout=30).returncode

    assert as_user(a.uid, f"cat {written}/object && echo more >> {written}/object && touch {written}/new") == 0
    assert as_user(b.uid, f"cat {written}/object") != 0
    assert as_user(b.uid, f"cat {state}/auth/dev-key.pem") != 0
    assert as_user(a.uid, f"cat {state}/auth/dev-key.pem") != 0
    assert as_user(a.uid, f"ls {state}/secrets/team-b") != 0


def test_a_tenants_worker_is_started_with_its_own_tenant_only(tmp_path, monkeypatch):
    """What ``dev --auth`` hands each tenant's worker: its token, its own secrets folder, no directory of every
    tenant's secrets and no other credential; as root, its own user and network namespace."""
    import engine.cli.auth as auth
    from engine.core.protocol import tenant_user

    keys = DevKeys.load_or_create(tmp_path)
    tokens = keys.directory / "tokens"
    tokens.mkdir()
    for tenant in ("team-a", "team-b"):
        (tokens / f"{tenant}.jwt").write_text(keys.tenant_token(tenant) + "\n")
    monkeypatch.setenv("GANGFLOW_SECRETS_DIR", str(tmp_path / "secrets"))
    monkeypatch.setenv("GANGFLOW_API_KEY", "the-platforms")
    monkeypatch.setenv("GANGFLOW_SECRET_HF_TOKEN", "someone-elses")
    started: list[tuple[list[str], dict[str, str]]] = []
    monkeypatch.setattr(auth, "spawn", lambda command, log, env: started.append((list(command), dict(env))))
    auth.DevAuth(keys, ("team-a", "team-b"), tokens).spawn_workers("127.0.0.1:7233", tmp_path)
    (a_command, a_env), (_, b_env) = started
    assert a_env["GANGFLOW_API_KEY"] == (tokens / "team-a.jwt").read_text().strip() != b_env["GANGFLOW_API_KEY"]
    assert "GANGFLOW_SECRETS_DIR" not in a_env and "GANGFLOW_SECRET_HF_TOKEN" not in a_env
    assert a_command[a_command.index("--tenant-secrets") + 1] == str(tmp_path / "secrets" / "team-a")
    assert a_env["HOME"] == str(tmp_path / "home" / "team-a")
    if os.geteuid() == 0:
        uid = tenant_user("team-a").uid
        assert a_command[1:4] == ["--net", "--mount", "--"] and a_command[0].endswith("unshare")
        assert f"--reuid={uid}" in a_command and "--no-new-privs" in a_command and "--inh-caps=-all" in a_command
        assert a_env["GANGFLOW_GATEWAY_SOCKET"] == str(tmp_path / "gateway" / "gateway.sock")


@pytest.mark.skipif(os.geteuid() != 0, reason="the gateway's socket is made as root only")
def test_a_state_dir_too_long_for_the_gateways_socket_is_refused(tmp_path):
    from engine.cli.auth import DevAuth

    state = tmp_path / ("s" * 100)
    keys = DevKeys.load_or_create(state)
    with pytest.raises(OSError, match="too long a path for the gateway's Unix socket"):
        DevAuth(keys, ("team-a",), keys.directory / "tokens").lock_down(state)
