"""Credentials for Temporal as flags or environment: read and checked before anything connects, and the node
agent's own never reach its ranks."""

from __future__ import annotations

import pytest
from temporalio.service import TLSConfig

from engine.errors import InputError
from engine.runtime import Endpoint
from engine.runtime.connection import CREDENTIAL_ENV

PEM = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in (*CREDENTIAL_ENV, "GANGFLOW_ADDRESS", "GANGFLOW_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)


def test_no_credentials_is_plain_tcp():
    endpoint = Endpoint.resolve()
    assert (endpoint.address, endpoint.namespace, endpoint.api_key, endpoint.tls) == (
        "localhost:7233",
        "default",
        None,
        None,
    )


def test_flags_win_over_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("GANGFLOW_API_KEY", "from-env")
    monkeypatch.setenv("GANGFLOW_TLS", "1")
    assert Endpoint.resolve().api_key == "from-env" and Endpoint.resolve().tls is True
    assert Endpoint.resolve(api_key="from-flag").api_key == "from-flag"
    (tmp_path / "ca.pem").write_bytes(PEM)
    (tmp_path / "cert.pem").write_bytes(PEM)
    (tmp_path / "key.pem").write_bytes(PEM.replace(b"CERTIFICATE", b"PRIVATE KEY"))
    monkeypatch.setenv("GANGFLOW_TLS_CA", str(tmp_path / "ca.pem"))
    tls = Endpoint.resolve(tls_cert=str(tmp_path / "cert.pem"), tls_key=str(tmp_path / "key.pem")).tls
    assert isinstance(tls, TLSConfig)
    assert tls.server_root_ca_cert == PEM and tls.client_cert == PEM
    assert b"PRIVATE KEY" in (tls.client_private_key or b"")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tls_cert": "c.pem"}, "--tls-cert needs --tls-key too"),
        ({"tls_key": "k.pem"}, "--tls-key needs --tls-cert too"),
        ({"tls_ca": "/nonexistent/ca.pem"}, "--tls-ca /nonexistent/ca.pem: No such file or directory"),
    ],
)
def test_bad_tls_options_are_input_errors(options, message):
    with pytest.raises(InputError, match=message):
        Endpoint.resolve(**options)


def test_a_file_that_is_not_pem_is_refused(tmp_path):
    (tmp_path / "ca.pem").write_text("hello")
    with pytest.raises(InputError, match="not a PEM file"):
        Endpoint.resolve(tls_ca=str(tmp_path / "ca.pem"))


def test_the_node_agents_credentials_stay_out_of_its_ranks(monkeypatch):
    from engine.runtime.node import _own_env

    monkeypatch.setenv("GANGFLOW_API_KEY", "platform-secret")
    monkeypatch.setenv("GANGFLOW_TLS_KEY", "/etc/gangflow/tls/key.pem")
    monkeypatch.setenv("GANGFLOW_ARTIFACTS", "/shared/artifacts")
    env = _own_env()
    assert "GANGFLOW_API_KEY" not in env and "GANGFLOW_TLS_KEY" not in env
    assert env["GANGFLOW_ARTIFACTS"] == "/shared/artifacts"  # the rest of the agent's environment is kept


def _token(claims: dict[str, object]) -> str:
    """A JWT's shape with these claims (no real signature: the client never verifies one)."""
    import base64
    import json

    def part(data: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'RS256', 'kid': 'k'})}.{part(claims)}.c2ln"


NOW = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC
VALID = {"sub": "team-a", "exp": NOW + 3600, "aud": "gangflow", "iss": "gangflow-dev"}


@pytest.mark.parametrize(
    ("key", "why"),
    [
        (None, "no token was given (--api-key or $GANGFLOW_API_KEY)"),
        ("not-a-jwt", "the API key is not a JWT"),
        ("a.!!!.c", "the API key is not a JWT"),
        (_token({**VALID, "exp": NOW - 7200}), "token expired at 2027-01-15 06:00:00 UTC (2.0 h ago)"),
        (_token({**VALID, "exp": NOW - 30}), "token expired at 2027-01-15 07:59:30 UTC (30 s ago)"),
        (_token({k: v for k, v in VALID.items() if k != "exp"}), 'the token has no expiry (an "exp" claim)'),
        (_token({**VALID, "nbf": NOW + 60}), "token not valid before 2027-01-15 08:01:00 UTC"),
        (_token({**VALID, "aud": ["billing"]}), "the token is for audience ['billing'], not 'gangflow'"),
        (_token({**VALID, "iss": "elsewhere"}), "the token is from issuer 'elsewhere', not 'gangflow-dev'"),
        (_token(VALID), None),  # only its signature is left, the server's to check
    ],
)
def test_a_refused_token_says_what_is_wrong_with_it(key, why):
    from engine.runtime.connection import token_problem

    found = token_problem(key, now=NOW)
    assert found == why if why is None else found is not None and found.startswith(why), found


def test_only_a_refusal_of_the_credentials_is_one(monkeypatch):
    from engine.runtime.connection import CredentialsRefused, credentials_refused

    endpoint = Endpoint("127.0.0.1:7233", "default", api_key=_token(VALID))
    refused = credentials_refused('Status { code: PermissionDenied, message: "Request unauthorized." }', endpoint)
    assert isinstance(refused, CredentialsRefused) and isinstance(refused, RuntimeError)
    assert str(refused).startswith("Temporal at 127.0.0.1:7233 refused the credentials: its claims (expiry, ")
    assert credentials_refused("Connection refused (os error 111)", endpoint) is None
