"""Encryption at rest in Temporal's history: an AES-GCM payload codec, with a key id in each payload's metadata.

Temporal stores workflow inputs, results, signals and failures as it gets them. With
``GANGFLOW_ENCRYPTION_KEYS=<id>:<base64 of 32 bytes>[,<id>:<key>...]`` every gangflow process (client, worker,
node agent) encrypts what it sends and decrypts what it reads; the first key encrypts, the others only decrypt
(rotation). A key per tenant namespace: each tenant's processes are given their namespace's keys, and a payload
names the key it was sealed with, so one tenant's key opens nothing of another's. Failure messages and stack
traces are encoded too (Temporal's ``DefaultFailureConverterWithEncodedAttributes``).

What stays in the clear, as Temporal never encodes it: workflow ids, workflow and activity type names, task
queue names, search attributes and the current-details line. gangflow puts no user data there (a run id is the
workflow's name and a random suffix, unless the user chooses one).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import os
from collections.abc import Sequence

from temporalio.api.common.v1 import Payload
from temporalio.converter import DataConverter, DefaultFailureConverterWithEncodedAttributes, PayloadCodec

from engine.errors import InputError

__all__ = ["ENCODING", "KEYS_ENV", "EncryptionCodec", "encrypting_converter", "keys_from_env", "new_key"]

KEYS_ENV = "GANGFLOW_ENCRYPTION_KEYS"
#: the encoding of an encrypted payload (its metadata also names the key)
ENCODING = b"binary/encrypted"
_KEY_ID = "encryption-key-id"
_NONCE = 12


def new_key(key_id: str) -> str:
    """A fresh key in the form ``GANGFLOW_ENCRYPTION_KEYS`` takes: ``<id>:<base64 of 32 random bytes>``."""
    return f"{key_id}:{base64.b64encode(os.urandom(32)).decode()}"


def keys_from_env(value: str | None = None) -> dict[str, bytes] | None:
    """The keys ``GANGFLOW_ENCRYPTION_KEYS`` lists (in order: the first encrypts), or None when it is unset.
    Raises InputError naming the entry that is not ``<id>:<base64 of 32 bytes>``."""
    text = os.environ.get(KEYS_ENV, "") if value is None else value
    if not text.strip():
        return None
    keys: dict[str, bytes] = {}
    for entry in (e.strip() for e in text.split(",")):
        key_id, sep, encoded = entry.partition(":")
        try:
            key = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            key = b""
        if not sep or not key_id or len(key) != 32:
            shown = key_id if sep else entry[:8] + "..."
            raise InputError(f"{KEYS_ENV}: entry {shown!r} is not <key id>:<base64 of 32 bytes> (see new_key)")
        keys[key_id] = key
    return keys


class EncryptionCodec(PayloadCodec):
    """AES-256-GCM per payload: a random nonce, the whole payload (metadata included) sealed."""

    def __init__(self, keys: dict[str, bytes]) -> None:
        try:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        except ImportError:
            raise InputError(f"{KEYS_ENV} needs the cryptography package: pip install 'gangflow[auth]'") from None
        self._ciphers = {key_id: AESGCM(key) for key_id, key in keys.items()}
        self._current = next(iter(keys))

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        cipher = self._ciphers[self._current]
        out = []
        for payload in payloads:
            nonce = os.urandom(_NONCE)
            sealed = nonce + cipher.encrypt(nonce, payload.SerializeToString(), None)
            metadata = {"encoding": ENCODING, _KEY_ID: self._current.encode()}
            out.append(Payload(metadata=metadata, data=sealed))
        return out

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        out = []
        for payload in payloads:
            if payload.metadata.get("encoding") != ENCODING:
                out.append(payload)  # written before encryption was turned on
                continue
            key_id = payload.metadata.get(_KEY_ID, b"").decode()
            cipher = self._ciphers.get(key_id)
            if cipher is None:
                raise ValueError(f"payload sealed with encryption key {key_id!r}, which this process does not have")
            inner = Payload()
            inner.ParseFromString(cipher.decrypt(payload.data[:_NONCE], payload.data[_NONCE:], None))
            out.append(inner)
        return out


def encrypting_converter(converter: DataConverter, keys: dict[str, bytes] | None) -> DataConverter:
    """``converter`` sealing payloads and failure details with ``keys`` (unchanged without keys)."""
    if not keys:
        return converter
    return dataclasses.replace(
        converter,
        payload_codec=EncryptionCodec(keys),
        failure_converter_class=DefaultFailureConverterWithEncodedAttributes,
    )
