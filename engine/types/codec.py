"""Validation and compact encoding of typed values (pydantic for types, msgpack for bytes on the wire).

Every value that crosses a task or workflow boundary goes through a :class:`ValueCodec` built from the
declared annotation: ``to_wire`` validates and turns the value into msgpack-ready data, ``from_wire``
validates the data back into the declared type. Both raise :class:`TypeMismatchError` naming where the
value was going, the expected type and what was given.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import pathlib
import types
import typing
import uuid
from collections.abc import Mapping
from typing import Any

import msgpack
from pydantic import PydanticSchemaGenerationError, TypeAdapter, ValidationError

from engine.errors import PayloadTooLargeError, TypeMismatchError
from engine.types import data
from engine.types.schema import SchemaViolation

__all__ = [
    "MAX_PAYLOAD_BYTES",
    "ValueCodec",
    "check_payload_size",
    "pack",
    "type_name",
    "unpack",
]

#: Temporal refuses payloads over 2 MiB; keep headroom for the envelope around a value.
MAX_PAYLOAD_BYTES = 2 * 1024 * 1024 - 64 * 1024


def type_name(annotation: Any) -> str:
    """A short human name for an annotation: ``int``, ``list[str]``, ``Optional[Metrics]``."""
    if annotation is type(None) or annotation is None:
        return "None"
    origin = typing.get_origin(annotation)
    if origin is None:
        return getattr(annotation, "__name__", repr(annotation).replace("typing.", ""))
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        names = [type_name(a) for a in args if a is not type(None)]
        inner = " | ".join(names)
        return f"Optional[{inner}]" if type(None) in args else inner
    if origin is typing.Literal:
        return f"Literal[{', '.join(repr(a) for a in args)}]"
    if origin is typing.Annotated:
        return type_name(args[0])
    base = getattr(origin, "__name__", str(origin))
    return f"{base}[{', '.join(type_name(a) for a in args)}]" if args else base


def _plain(value: Any) -> Any:
    """Turn pydantic's python-mode dump into data msgpack can carry (lists, dicts, scalars, bytes)."""
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return value
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = [_plain(v) for v in value]
        if isinstance(value, set | frozenset):
            items.sort(key=repr)  # deterministic bytes for the same set
        return items
    if isinstance(value, enum.Enum):
        return _plain(value.value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal | uuid.UUID | pathlib.PurePath):
        return str(value)
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value))
    raise TypeError(f"cannot encode a value of type {type(value).__name__}")


def _data_violation(exc: ValidationError) -> str | None:
    """The message of a data value's check (engine.types.data), complete on its own: it names the column."""
    err = exc.errors(include_url=False)[0]
    cause = (err.get("ctx") or {}).get("error")
    if not isinstance(cause, SchemaViolation):
        return None
    loc = ".".join(str(p) for p in err.get("loc", ()))
    return f"{cause}" + (f" (at {loc})" if loc else "")


def _first_error(exc: ValidationError) -> str:
    err = exc.errors(include_url=False)[0]
    loc = ".".join(str(p) for p in err.get("loc", ()))
    return f"{err['msg']}" + (f" (at {loc})" if loc else "")


class ValueCodec:
    """Codec for one declared type. Build once per parameter (TypeAdapter construction is costly)."""

    __slots__ = ("adapter", "annotation", "name")

    def __init__(self, annotation: Any) -> None:
        self.annotation = annotation
        self.name = type_name(annotation)
        try:
            # DataFrames, arrays, tensors: an Annotated form that passes them by reference (engine.types.data)
            self.adapter: TypeAdapter[Any] = TypeAdapter(data.prepare(annotation))
        except (PydanticSchemaGenerationError, TypeError, NameError) as exc:
            raise TypeError(f"unsupported type {self.name}: {exc}".splitlines()[0]) from None

    def validate(self, value: Any, where: str, context: dict[str, Any] | None = None) -> Any:
        try:
            return self.adapter.validate_python(value, context=context)
        except ValidationError as exc:
            violation = _data_violation(exc)
            if violation is not None:
                raise TypeMismatchError(f"{where}: {violation}") from None
            shown = data.brief(value) or repr(value)
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            raise TypeMismatchError(
                f"{where}: expected {self.name}, got {shown} ({type(value).__name__}): {_first_error(exc)}"
            ) from None

    def to_wire(self, value: Any, where: str, context: dict[str, Any] | None = None) -> Any:
        """Validate ``value`` against the declared type and return msgpack-ready data."""
        checked = self.validate(value, where, context)
        try:
            return _plain(self.adapter.dump_python(checked, mode="python", context=context))
        except (ValueError, TypeError) as exc:
            reason = str(exc).removeprefix("Error calling function `_serialize`: ")
            raise TypeMismatchError(f"{where}: cannot encode value as {self.name}: {reason}") from None

    def from_wire(self, data: Any, where: str, context: dict[str, Any] | None = None) -> Any:
        return self.validate(data, where, context)


def pack(data: Any) -> bytes:
    return msgpack.packb(data, use_bin_type=True)  # type: ignore[no-any-return]


def unpack(blob: bytes) -> Any:
    return msgpack.unpackb(blob, raw=False, strict_map_key=False)


def check_payload_size(blob: bytes, where: str) -> bytes:
    """Refuse a value too large for Temporal with a message that says what to do instead."""
    if len(blob) > MAX_PAYLOAD_BYTES:
        raise PayloadTooLargeError(
            f"{where} is {len(blob) / 1e6:.1f} MB encoded; values over {MAX_PAYLOAD_BYTES / 1e6:.1f} MB "
            "cannot travel through Temporal. Write the data to disk and return a File or Directory instead "
            "(it is uploaded to the artifact store and passed by reference)."
        )
    return blob
