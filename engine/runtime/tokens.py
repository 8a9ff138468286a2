"""JWTs in the form Temporal's default JWT claim mapper reads, for the dev stack (``gangflow dev --auth``).

A token is an RS256 JWT with a ``kid`` header, ``sub`` (the tenant) and a ``permissions`` claim listing
``"<namespace>:<role>"`` (roles read, write, worker, admin; ``temporal-system:<role>`` is a role on the whole
cluster). The dev stack makes one RSA key in ``<state>/auth/`` and publishes its public half as a JWKS file
beside it: what a production server's ``global.authorization.jwtKeyProvider.keySourceURIs`` points to, so the
same tokens work unchanged against a server with Temporal's default claim mapper and authorizer.

Every token carries ``exp``, ``aud`` and ``iss``, and a verifier refuses one without ``exp`` or whose ``aud`` /
``iss`` is not the expected one: a token minted for another service (another audience) or by another issuer is
not a token here, and none is valid forever. The expected values are ``$GANGFLOW_TOKEN_AUDIENCE`` (default
``gangflow``) and ``$GANGFLOW_TOKEN_ISSUER`` (default ``gangflow-dev``), read where a token is made or checked;
a production server's claim mapper is configured with the same audience.

Needs PyJWT and cryptography (``pip install 'gangflow[auth]'``); nothing else imports this module.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from engine.core.atomic import write_atomic
from engine.core.protocol import PLATFORM_NAMESPACE, tenant_namespace
from engine.errors import GangflowError
from engine.runtime.connection import (  # where a client reads them too, without this module's PyJWT
    AUDIENCE_ENV,
    DEFAULT_AUDIENCE,
    DEFAULT_ISSUER,
    ISSUER_ENV,
    expected_audience,
    expected_issuer,
)

__all__ = [
    "AUDIENCE_ENV",
    "DEFAULT_AUDIENCE",
    "DEFAULT_ISSUER",
    "DEFAULT_TTL_S",
    "ISSUER_ENV",
    "PLATFORM_NAMESPACE",
    "ROLES",
    "SYSTEM_NAMESPACE",
    "Claims",
    "DevKeys",
    "TokenError",
    "TokenVerifier",
    "expected_audience",
    "expected_issuer",
    "tenant_namespace",
]

#: Temporal's roles, a bitmask (authorization/roles.go): a check compares the OR of what a caller holds with
#: the role an API needs, so write covers read, admin covers both, and worker alone covers nothing
ROLES = {"worker": 1, "read": 2, "write": 4, "admin": 8}
#: permissions on this "namespace" are the caller's roles on the whole cluster (the claim mapper's rule)
SYSTEM_NAMESPACE = "temporal-system"
DEFAULT_TTL_S = 86400

_KEY_FILE, _JWKS_FILE = "dev-key.pem", "jwks.json"


class TokenError(GangflowError):
    """A token was refused (bad signature, expired, unknown key, malformed): the reason is for the log only."""

    kind = "TokenError"


@dataclass(frozen=True)
class Claims:
    """What the default claim mapper makes of a token: the subject and its roles per namespace."""

    subject: str = ""
    system: int = 0
    namespaces: Mapping[str, int] = field(default_factory=dict)

    def role_in(self, namespace: str | None) -> int:
        """The roles that count for a call on ``namespace`` (None: a cluster-wide call, the system roles)."""
        return self.system if namespace is None else self.system | self.namespaces.get(namespace, 0)


def _claims(payload: Mapping[str, Any]) -> Claims:
    subject = payload.get("sub")
    if not isinstance(subject, str):
        raise TokenError('the "sub" claim is missing or not a string')
    system, namespaces = 0, dict[str, int]()
    permissions = payload.get("permissions")
    # like the claim mapper: entries that are not "namespace:role" strings are ignored, unknown roles add nothing
    for permission in permissions if isinstance(permissions, list) else ():
        if not isinstance(permission, str) or ":" not in permission:
            continue
        namespace, role = permission.split(":", 1)
        bits = ROLES.get(role.lower(), 0)
        if namespace == SYSTEM_NAMESPACE:
            system |= bits
        else:
            namespaces[namespace] = namespaces.get(namespace, 0) | bits
    return Claims(subject, system, namespaces)


class TokenVerifier:
    """Checks bearer tokens against a JWKS, as Temporal's key provider and claim mapper do, and their ``exp``
    (required), ``aud`` and ``iss`` (``audience`` / ``issuer``, by default :func:`expected_audience` and
    :func:`expected_issuer`)."""

    def __init__(self, jwks: Mapping[str, Any], *, audience: str | None = None, issuer: str | None = None) -> None:
        self.keys = {key.key_id: key for key in jwt.PyJWKSet.from_dict(dict(jwks)).keys if key.key_id}
        self.audience = audience or expected_audience()
        self.issuer = issuer or expected_issuer()

    @classmethod
    def from_file(
        cls, path: str | os.PathLike[str], *, audience: str | None = None, issuer: str | None = None
    ) -> TokenVerifier:
        return cls(json.loads(Path(path).read_text()), audience=audience, issuer=issuer)

    def claims(self, authorization: str | None) -> Claims:
        """The claims of an ``authorization`` header's value; no header: no roles at all."""
        if not authorization:
            return Claims()
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise TokenError("expected 'Bearer <token>'")
        try:
            kid = jwt.get_unverified_header(token).get("kid")
            if not isinstance(kid, str) or kid not in self.keys:
                raise TokenError(f"unknown key id {kid!r}")
            payload = jwt.decode(
                token,
                self.keys[kid].key,
                algorithms=["RS256"],
                audience=self.audience,
                issuer=self.issuer,
                options={"require": ["exp", "aud", "iss", "sub"]},
            )
        except jwt.PyJWTError as exc:
            raise TokenError(str(exc)) from None
        return _claims(payload)


class DevKeys:
    """The dev stack's signing key (``<state>/auth/dev-key.pem``) and its JWKS (``<state>/auth/jwks.json``)."""

    def __init__(self, directory: Path, key: rsa.RSAPrivateKey) -> None:
        self.directory, self.key = directory, key
        self.jwk: dict[str, Any] = dict(RSAAlgorithm.to_jwk(key.public_key(), as_dict=True))
        # an RFC 7638 thumbprint: the same key always gets the same id
        self.kid = _thumbprint(self.jwk)
        self.jwk.update(kid=self.kid, use="sig", alg="RS256")

    @staticmethod
    def directory_of(state_dir: str | os.PathLike[str]) -> Path:
        return Path(state_dir).resolve() / "auth"

    @classmethod
    def load(cls, state_dir: str | os.PathLike[str]) -> DevKeys:
        """The key made by ``gangflow dev --auth`` (FileNotFoundError naming the file when there is none)."""
        directory = cls.directory_of(state_dir)
        pem = (directory / _KEY_FILE).read_bytes()
        key = serialization.load_pem_private_key(pem, password=None)
        if not isinstance(key, rsa.RSAPrivateKey):
            raise ValueError(f"{directory / _KEY_FILE}: not an RSA private key")
        return cls(directory, key)

    @classmethod
    def load_or_create(cls, state_dir: str | os.PathLike[str]) -> DevKeys:
        """Made once per state dir, so tokens handed out stay valid across restarts of the dev stack."""
        directory = cls.directory_of(state_dir)
        if not (directory / _KEY_FILE).exists():
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            pem = key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
            write_atomic(directory / _KEY_FILE, pem)
            os.chmod(directory / _KEY_FILE, 0o600)
        keys = cls.load(state_dir)
        write_atomic(keys.jwks_file, json.dumps({"keys": [keys.jwk]}, indent=2).encode())
        return keys

    @property
    def jwks_file(self) -> Path:
        return self.directory / _JWKS_FILE

    def issue(self, subject: str, permissions: Sequence[str], ttl_s: float = DEFAULT_TTL_S) -> str:
        """A token for ``subject`` with ``permissions``, valid ``ttl_s`` seconds, for :func:`expected_audience`
        from :func:`expected_issuer`."""
        now = int(time.time())
        payload = {
            "sub": subject,
            "permissions": list(permissions),
            "iat": now,
            "exp": now + int(ttl_s),
            "aud": expected_audience(),
            "iss": expected_issuer(),
        }
        return jwt.encode(payload, self.key, algorithm="RS256", headers={"kid": self.kid})

    def tenant_token(self, tenant: str, role: str = "write", ttl_s: float = DEFAULT_TTL_S) -> str:
        """A token for one tenant's namespace (``gf-<tenant>:<role>``)."""
        if role not in ROLES:
            raise ValueError(f"role {role!r}: expected one of {', '.join(ROLES)}")
        return self.issue(tenant, [f"{tenant_namespace(tenant)}:{role}"], ttl_s)


def _thumbprint(jwk: Mapping[str, Any]) -> str:
    canonical = json.dumps({k: jwk[k] for k in ("e", "kty", "n")}, separators=(",", ":"), sort_keys=True)
    return base64.urlsafe_b64encode(hashlib.sha256(canonical.encode()).digest()).rstrip(b"=").decode()
