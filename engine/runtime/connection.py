"""Connecting to Temporal: address, namespace and credentials from flags or the environment, search attributes.

Credentials: an API key (``--api-key`` / ``GANGFLOW_API_KEY``, sent as ``authorization: Bearer <key>``, what
Temporal Cloud and a server with a JWT authorizer take) and TLS (``--tls`` for the system's roots, or
``--tls-ca FILE``; mutual TLS with ``--tls-cert FILE --tls-key FILE``). They are read and checked before
anything connects, and never printed."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.common import SearchAttributeKey
from temporalio.converter import DataConverter
from temporalio.service import TLSConfig

from engine.core.protocol import PIPELINE_ATTRIBUTE, SCHEDULED_BY_ATTRIBUTE, TENANT_ATTRIBUTE, tenant_namespace
from engine.errors import InputError
from engine.runtime.encryption import encrypting_converter, keys_from_env

__all__ = [
    "CREDENTIAL_ENV",
    "DEFAULT_ADDRESS",
    "DEFAULT_NAMESPACE",
    "PIPELINE",
    "SCHEDULED_BY",
    "SEARCH_ATTRIBUTES",
    "TENANT",
    "Endpoint",
    "connect",
    "ensure_search_attributes",
]

DEFAULT_ADDRESS = "localhost:7233"
DEFAULT_NAMESPACE = "default"

PIPELINE = SearchAttributeKey.for_keyword(PIPELINE_ATTRIBUTE)
TENANT = SearchAttributeKey.for_keyword(TENANT_ATTRIBUTE)
SCHEDULED_BY = SearchAttributeKey.for_keyword(SCHEDULED_BY_ATTRIBUTE)  # Temporal's own: not ours to register
SEARCH_ATTRIBUTES = {PIPELINE.name: "Keyword", TENANT.name: "Keyword"}


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


async def connect(endpoint: Endpoint, *, wait: float = 0.0) -> Client:
    """Connect; with ``wait`` > 0 keep trying that many seconds (a worker started beside a server that
    is still booting, or restarting, should wait for it rather than exit)."""
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
        except RuntimeError:
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
