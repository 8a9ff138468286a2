"""Connecting to Temporal: address, namespace and credentials from flags or the environment, search attributes.

Credentials: an API key (``--api-key`` / ``GANGFLOW_API_KEY``, sent as ``authorization: Bearer <key>``, what
Temporal Cloud and a server with a JWT authorizer take) and TLS (``--tls`` for the system's roots, or
``--tls-ca FILE``; mutual TLS with ``--tls-cert FILE --tls-key FILE``). They are read and checked before
anything connects, and never printed."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.converter import DataConverter
from temporalio.service import RPCError, RPCStatusCode, TLSConfig

from engine.core.protocol import (
    KIND_ATTRIBUTE,
    PIPELINE_ATTRIBUTE,
    SCHEDULED_BY_ATTRIBUTE,
    TENANT_ATTRIBUTE,
    tenant_namespace,
)
from engine.errors import GangflowError, InputError
from engine.runtime.encryption import encrypting_converter, keys_from_env

__all__ = [
    "AUDIENCE_ENV",
    "CREDENTIAL_ENV",
    "DEFAULT_ADDRESS",
    "DEFAULT_AUDIENCE",
    "DEFAULT_ISSUER",
    "DEFAULT_NAMESPACE",
    "ISSUER_ENV",
    "KIND",
    "PIPELINE",
    "SCHEDULED_BY",
    "SEARCH_ATTRIBUTES",
    "TENANT",
    "CredentialsRefused",
    "Endpoint",
    "call_refused",
    "connect",
    "credentials_refused",
    "ensure_search_attributes",
    "expected_audience",
    "expected_issuer",
    "kind_attributes",
    "token_problem",
]

DEFAULT_ADDRESS = "localhost:7233"
DEFAULT_NAMESPACE = "default"

PIPELINE = SearchAttributeKey.for_keyword(PIPELINE_ATTRIBUTE)
TENANT = SearchAttributeKey.for_keyword(TENANT_ATTRIBUTE)
SCHEDULED_BY = SearchAttributeKey.for_keyword(SCHEDULED_BY_ATTRIBUTE)  # Temporal's own: not ours to register
KIND = SearchAttributeKey.for_keyword(KIND_ATTRIBUTE)
SEARCH_ATTRIBUTES = {PIPELINE.name: "Keyword", TENANT.name: "Keyword", KIND.name: "Keyword"}


def kind_attributes(kind: str, tenant: str | None = None) -> TypedSearchAttributes:
    """The start-time search attributes of a workflow gangflow starts that is no run (the Scheduler, a lease, a
    tenant's look): its ``GangflowKind`` (engine.core.protocol ``KIND_*``) and, where it has one, its tenant."""
    pairs = [SearchAttributePair(KIND, kind)]
    if tenant is not None:
        pairs.append(SearchAttributePair(TENANT, tenant))
    return TypedSearchAttributes(pairs)


#: the ``aud`` and ``iss`` a token must name (engine.runtime.tokens): read here too, where a client says why a
#: server refused its token
AUDIENCE_ENV, DEFAULT_AUDIENCE = "GANGFLOW_TOKEN_AUDIENCE", "gangflow"
ISSUER_ENV, DEFAULT_ISSUER = "GANGFLOW_TOKEN_ISSUER", "gangflow-dev"


def expected_audience() -> str:
    """The ``aud`` a token must name (``$GANGFLOW_TOKEN_AUDIENCE``, default ``gangflow``)."""
    return os.environ.get(AUDIENCE_ENV) or DEFAULT_AUDIENCE


def expected_issuer() -> str:
    """The ``iss`` a token must name (``$GANGFLOW_TOKEN_ISSUER``, default ``gangflow-dev``)."""
    return os.environ.get(ISSUER_ENV) or DEFAULT_ISSUER


#: the environment variables that hold a process's credentials: a node agent keeps them out of its ranks
CREDENTIAL_ENV = (
    "GANGFLOW_API_KEY",
    "GANGFLOW_TLS_CERT",
    "GANGFLOW_TLS_KEY",
    "GANGFLOW_TLS_CA",
    "GANGFLOW_TLS",
    "GANGFLOW_ENCRYPTION_KEYS",
)


@dataclass(frozen=True)
class Endpoint:
    address: str
    namespace: str
    api_key: str | None = None
    #: None: plain TCP; True: TLS with the system's roots; a TLSConfig: a CA and/or a client certificate
    tls: bool | TLSConfig | None = None
    #: payload encryption keys (engine.runtime.encryption), the first one sealing: from GANGFLOW_ENCRYPTION_KEYS
    encryption: tuple[tuple[str, bytes], ...] = ()

    @classmethod
    def resolve(
        cls,
        address: str | None = None,
        namespace: str | None = None,
        *,
        api_key: str | None = None,
        tls: bool = False,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tenant: str | None = None,
    ) -> Endpoint:
        """Flags first, then ``GANGFLOW_ADDRESS``, ``GANGFLOW_NAMESPACE``, ``GANGFLOW_API_KEY``, ``GANGFLOW_TLS``
        (1/true), ``GANGFLOW_TLS_CA``, ``GANGFLOW_TLS_CERT``, ``GANGFLOW_TLS_KEY``. Raises InputError naming
        the problem (a certificate without its key, a file that cannot be read) before anything connects.
        A namespace with ``{tenant}`` in it (``GANGFLOW_NAMESPACE='gf-{tenant}'``) is the tenant's: ``tenant``,
        else ``GANGFLOW_TENANT``, else ``default``."""
        env = os.environ
        space = namespace or env.get("GANGFLOW_NAMESPACE") or DEFAULT_NAMESPACE
        if "{tenant}" in space:
            who = tenant or env.get("GANGFLOW_TENANT") or "default"
            try:
                tenant_namespace(who)  # the same names as a queue configuration's
            except ValueError as exc:
                raise InputError(str(exc)) from None
            space = space.replace("{tenant}", who)
        key = api_key or env.get("GANGFLOW_API_KEY") or None
        ca, cert, private = (
            tls_ca or env.get("GANGFLOW_TLS_CA"),
            tls_cert or env.get("GANGFLOW_TLS_CERT"),
            tls_key or env.get("GANGFLOW_TLS_KEY"),
        )
        if bool(cert) != bool(private):
            given, missing = ("--tls-cert", "--tls-key") if cert else ("--tls-key", "--tls-cert")
            raise InputError(f"{given} needs {missing} too (mutual TLS takes a certificate and its private key)")
        config: bool | TLSConfig | None = None
        if ca or cert:
            config = TLSConfig(
                server_root_ca_cert=_read(ca, "--tls-ca") if ca else None,
                client_cert=_read(cert, "--tls-cert") if cert else None,
                client_private_key=_read(private, "--tls-key") if private else None,
            )
        elif tls or env.get("GANGFLOW_TLS", "").lower() in ("1", "true", "yes"):
            config = True
        return cls(
            address or env.get("GANGFLOW_ADDRESS") or DEFAULT_ADDRESS,
            space,
            key,
            config,
            tuple((keys_from_env() or {}).items()),
        )


def _read(path: str, option: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise InputError(f"{option} {path}: {exc.strerror or exc}") from None
    if b"-----BEGIN " not in data:
        raise InputError(f"{option} {path}: not a PEM file (no '-----BEGIN' line)")
    return data


class CredentialsRefused(GangflowError, RuntimeError):
    """The server (or the dev stack's gateway) refused the credentials: ``PermissionDenied`` or
    ``Unauthenticated`` on connecting. A RuntimeError as well, what ``connect`` raised before for it."""

    kind = "CredentialsRefused"


#: the status codes a refusal of the credentials comes with (gRPC's names, as the SDK's core spells them)
_REFUSED = ("PermissionDenied", "Unauthenticated", "PERMISSION_DENIED", "UNAUTHENTICATED")


def call_refused(exc: BaseException) -> bool:
    """Whether ``exc`` is Temporal refusing the caller's credentials on a call (an RPCError PERMISSION_DENIED
    or UNAUTHENTICATED; on connecting, ``credentials_refused`` reads the error's text): asking again with the
    same credentials cannot help, and the caller should say so."""
    return isinstance(exc, RPCError) and exc.status in (RPCStatusCode.PERMISSION_DENIED, RPCStatusCode.UNAUTHENTICATED)


def _utc(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _ago(seconds: float) -> str:
    minutes = seconds / 60
    return f"{seconds:.0f} s" if seconds < 120 else f"{minutes:.0f} min" if minutes < 120 else f"{minutes / 60:.1f} h"


def token_problem(api_key: str | None, now: float | None = None) -> str | None:
    """Why a server would refuse ``api_key``, as far as its claims tell without the server's keys (read, never
    verified): none given, not a JWT, expired (when), not valid yet, no expiry, another audience or issuer than
    gangflow's verifiers expect (engine.runtime.tokens). None when the claims look right: only the signature is
    left, the server's to check."""
    if not api_key:
        return "no token was given (--api-key or $GANGFLOW_API_KEY)"
    parts = api_key.split(".")
    try:
        if len(parts) != 3:
            raise ValueError("not three parts")
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
        if not isinstance(claims, dict):
            raise ValueError("claims that are not an object")
    except (ValueError, binascii.Error, UnicodeDecodeError):
        return "the API key is not a JWT (a token has three base64url parts separated by dots)"
    now = time.time() if now is None else now
    exp, nbf = claims.get("exp"), claims.get("nbf")
    if not isinstance(exp, int | float):
        return 'the token has no expiry (an "exp" claim): none is valid forever'
    if exp <= now:
        return f"token expired at {_utc(exp)} ({_ago(now - exp)} ago)"
    if isinstance(nbf, int | float) and nbf > now:
        return f"token not valid before {_utc(nbf)}"
    audience, issuer = expected_audience(), expected_issuer()
    aud = claims.get("aud")
    if aud is not None and audience not in (aud if isinstance(aud, list) else [aud]):
        return f"the token is for audience {aud!r}, not {audience!r} (${AUDIENCE_ENV})"
    if claims.get("iss") not in (None, issuer):
        return f"the token is from issuer {claims.get('iss')!r}, not {issuer!r} (${ISSUER_ENV})"
    return None


#: what is left when the claims look right
_SIGNATURE = (
    "its claims (expiry, audience, issuer) look valid, so the server did not accept its signature: a token "
    "signed by another key (another stack's?) or altered"
)


def credentials_refused(error: BaseException | str, endpoint: Endpoint) -> CredentialsRefused | None:
    """``error`` as "Temporal at ADDRESS refused the credentials: <why>" when it is a refusal of them
    (``PermissionDenied`` / ``Unauthenticated`` on connecting), else None."""
    text = str(error)
    if not any(code in text for code in _REFUSED):
        return None
    why = token_problem(endpoint.api_key) or _SIGNATURE
    return CredentialsRefused(f"Temporal at {endpoint.address} refused the credentials: {why}")


async def connect(endpoint: Endpoint, *, wait: float = 0.0) -> Client:
    """Connect; with ``wait`` > 0 keep trying that many seconds (a worker started beside a server that
    is still booting, or restarting, should wait for it rather than exit). Refused credentials are not
    retried: CredentialsRefused saying why (an expired token, when)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while True:
        try:
            return await Client.connect(
                endpoint.address,
                namespace=endpoint.namespace,
                api_key=endpoint.api_key,
                tls=endpoint.tls or False,
                data_converter=encrypting_converter(DataConverter.default, dict(endpoint.encryption)),
            )
        except RuntimeError as exc:
            refused = credentials_refused(exc, endpoint)
            if refused is not None:
                raise refused from None
            if loop.time() >= deadline:
                raise
            await asyncio.sleep(0.25)


async def ensure_search_attributes(client: Client) -> None:
    """Register gangflow's search attributes if the namespace lacks them (an unregistered attribute
    makes every workflow task fail forever rather than failing the run)."""
    existing = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace)
    )
    missing = {n: t for n, t in SEARCH_ATTRIBUTES.items() if n not in existing.custom_attributes}
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(
                namespace=client.namespace,
                search_attributes={
                    n: IndexedValueType.Value(f"INDEXED_VALUE_TYPE_{t.upper()}") for n, t in missing.items()
                },
            )
        )
