"""Connecting to Temporal: address and namespace from flags or the environment, search attributes."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.common import SearchAttributeKey

__all__ = [
    "DEFAULT_ADDRESS",
    "DEFAULT_NAMESPACE",
    "PIPELINE",
    "SEARCH_ATTRIBUTES",
    "TASK_QUEUE",
    "TENANT",
    "Endpoint",
    "connect",
    "ensure_search_attributes",
]

DEFAULT_ADDRESS = "localhost:7233"
DEFAULT_NAMESPACE = "default"
#: the queue of the workflow + CPU task worker (activities on it are dispatched eagerly)
TASK_QUEUE = "gangflow"

PIPELINE = SearchAttributeKey.for_keyword("GangflowPipeline")
TENANT = SearchAttributeKey.for_keyword("GangflowTenant")
SEARCH_ATTRIBUTES = {PIPELINE.name: "Keyword", TENANT.name: "Keyword"}


@dataclass(frozen=True)
class Endpoint:
    address: str
    namespace: str

    @classmethod
    def resolve(cls, address: str | None = None, namespace: str | None = None) -> Endpoint:
        return cls(
            address or os.environ.get("GANGFLOW_ADDRESS") or DEFAULT_ADDRESS,
            namespace or os.environ.get("GANGFLOW_NAMESPACE") or DEFAULT_NAMESPACE,
        )


async def connect(endpoint: Endpoint, *, wait: float = 0.0) -> Client:
    """Connect; with ``wait`` > 0 keep trying that many seconds (a worker started beside a server that
    is still booting, or restarting, should wait for it rather than exit)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while True:
        try:
            return await Client.connect(endpoint.address, namespace=endpoint.namespace)
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
