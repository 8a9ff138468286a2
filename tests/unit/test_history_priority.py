"""A distributed task call's priority class, read from its run's history (engine.runtime.history): the first
argument of its GangTask child (a GangSpec) or of its Nexus ``run_gang`` call (a GangCall), sealed or not."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio.converter import DataConverter

from engine.core.gang import GangShape
from engine.runtime.encryption import EncryptionCodec, keys_from_env, new_key
from engine.runtime.history import _spec_priority
from workflows.gang_spec import GangSpec
from workflows.platform import GangCall


def spec(priority: str | None) -> GangSpec:
    shape = GangShape(nnodes=2, nproc_per_node=1, gpus_per_node=1, cpus_per_node=1.0, mem_per_node=None)
    return GangSpec(
        task="train",
        call="train-1",
        shape=shape,
        timeout_s=60.0,
        heartbeat_timeout_s=30.0,
        tenant="a",
        priority=priority,
    )


def read(value: Any, *, nexus: bool, codec: EncryptionCodec | None = None) -> str | None:
    async def go() -> str | None:
        payload = DataConverter.default.payload_converter.to_payloads([value])[0]
        if codec is not None:
            payload = (await codec.encode([payload]))[0]
        return await _spec_priority(payload, codec, nexus=nexus)

    return asyncio.run(go())


def test_the_class_of_a_gang_task_child_and_of_a_nexus_call() -> None:
    assert read(spec("high"), nexus=False) == "high"
    assert read(spec(None), nexus=False) is None  # named none: the default class
    assert read(GangCall.of(spec("low"), b"blob", "run", "run-id"), nexus=True) == "low"


def test_a_sealed_input_is_opened_with_the_clients_codec_and_unreadable_input_is_none() -> None:
    keys = keys_from_env(new_key("k1"))
    assert keys is not None
    codec = EncryptionCodec(keys)
    assert read(spec("high"), nexus=False, codec=codec) == "high"
    other = keys_from_env(new_key("k2"))
    assert other is not None

    async def sealed_for_another() -> str | None:
        payload = DataConverter.default.payload_converter.to_payloads([spec("high")])[0]
        return await _spec_priority((await codec.encode([payload]))[0], EncryptionCodec(other), nexus=False)

    assert asyncio.run(sealed_for_another()) is None  # a key this client lacks: counted under the default class
    assert read("not a spec", nexus=False) is None and read({"spec": 3}, nexus=True) is None
    assert asyncio.run(_spec_priority(None, None, nexus=False)) is None
