"""Tokens need ``exp`` and the expected ``aud`` and ``iss`` (engine.runtime.tokens): a token minted for another
service, by another issuer, or valid forever is refused like a forged one."""

from __future__ import annotations

import time

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
        ({"exp": None, "aud": DEFAULT_AUDIENCE, "iss": DEFAULT_ISSUER}, "exp"),
        ({"exp": int(time.time()) - 60, "aud": DEFAULT_AUDIENCE, "iss": DEFAULT_ISSUER}, "expired"),
        ({"exp": int(time.time()) + 600, "aud": "another-service", "iss": DEFAULT_ISSUER}, "audience"),
        ({"exp": int(time.time()) + 600, "aud": None, "iss": DEFAULT_ISSUER}, "aud"),
        ({"exp": int(time.time()) + 600, "aud": DEFAULT_AUDIENCE, "iss": "someone-else"}, "issuer"),
        ({"exp": int(time.time()) + 600, "aud": DEFAULT_AUDIENCE, "iss": None}, "iss"),
    ],
)
def test_tokens_without_exp_or_for_another_audience_or_issuer_are_refused(tmp_path, claims, why):
    keys = DevKeys.load_or_create(tmp_path)
    verifier = TokenVerifier.from_file(keys.jwks_file)
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
