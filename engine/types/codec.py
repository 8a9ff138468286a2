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
import difflib
import enum
import pathlib
import types
import typing
import uuid
from collections.abc import Mapping
from typing import Any

import msgpack
from pydantic import BaseModel, PydanticSchemaGenerationError, TypeAdapter, ValidationError

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


#: pydantic's error types for a key the declared model or dataclass has no field for
_UNKNOWN_FIELD = frozenset({"extra_forbidden", "unexpected_keyword_argument"})


def _fields(annotation: Any) -> dict[str, Any] | None:
    """Field name -> annotation of a pydantic model or dataclass annotation (None for anything else)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {name: f.annotation for name, f in annotation.model_fields.items()}
    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        hints = typing.get_type_hints(annotation, include_extras=True)
        return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(annotation)}
    return None


def _inner(annotation: Any) -> list[Any]:
    """The annotations one level inside: a model's or dataclass's fields, else the type's arguments."""
    fields = _fields(annotation)
    return list(fields.values()) if fields is not None else list(typing.get_args(annotation))


def _allows_extra(annotation: Any, seen: frozenset[Any] = frozenset()) -> bool:
    """Whether a model reachable from ``annotation`` says ``extra="allow"``: its author wants unknown keys
    kept, so refusing them would be wrong (a plain model or dataclass ignores them, which hides typos)."""
    if annotation in seen or annotation is Any:
        return False
    if (
        isinstance(annotation, type)
        and issubclass(annotation, BaseModel)
        and annotation.model_config.get("extra") == "allow"
    ):
        return True
    try:
        return any(_allows_extra(a, seen | {annotation}) for a in _inner(annotation))
    except (TypeError, NameError):  # an annotation get_type_hints cannot resolve: nothing to learn from it
        return False


def _unwrap(annotation: Any) -> Any:
    """``X`` of ``X | None`` and ``Annotated[X, ...]`` (in a union, its first model or dataclass)."""
    while typing.get_origin(annotation) in (typing.Union, types.UnionType, typing.Annotated):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation = next((a for a in args if _fields(a) is not None), args[0] if args else Any)
    return annotation


def _step(annotation: Any, step: str | int) -> Any:
    """The annotation one location step inside ``annotation`` (a field name, a list index, a dict key)."""
    annotation = _unwrap(annotation)
    fields = _fields(annotation)
    if fields is not None:
        return fields.get(str(step), Any)
    args = list(typing.get_args(annotation))
    return args[-1] if args else Any  # list[X] -> X, dict[K, V] -> V


def _unknown_field(exc: ValidationError, annotation: Any) -> str | None:
    """ "unknown field 'stpes' (did you mean 'steps'?)" for the first key no field takes, None otherwise."""
    err = next((e for e in exc.errors(include_url=False) if e["type"] in _UNKNOWN_FIELD), None)
    if err is None:
        return None
    *path, key = err.get("loc", ()) or ("?",)
    owner = annotation
    for step in path:  # walk to the model the key was given to, for its field names
        owner = _step(owner, step)
    where = f" (at {'.'.join(str(p) for p in path)})" if path else ""
    close = difflib.get_close_matches(str(key), list(_fields(_unwrap(owner)) or ()), n=1, cutoff=0.5)
    return f"unknown field {str(key)!r}{where}" + (f" (did you mean {close[0]!r}?)" if close else "")


class ValueCodec:
    """Codec for one declared type. Build once per parameter (TypeAdapter construction is costly)."""

    __slots__ = ("adapter", "annotation", "name", "refuses_unknown")

    def __init__(self, annotation: Any) -> None:
        self.annotation = annotation
        self.name = type_name(annotation)
        try:
            # DataFrames, arrays, tensors: an Annotated form that passes them by reference (engine.types.data)
            self.adapter: TypeAdapter[Any] = TypeAdapter(data.prepare(annotation))
        except (PydanticSchemaGenerationError, TypeError, NameError) as exc:
            raise TypeError(f"unsupported type {self.name}: {exc}".splitlines()[0]) from None
        self.refuses_unknown = not _allows_extra(annotation)

    def validate(
        self, value: Any, where: str, context: dict[str, Any] | None = None, *, strict_fields: bool = False
    ) -> Any:
        """``value`` checked and coerced; ``strict_fields``: a key no field of a model or dataclass takes is an
        error (what a person typed: ``--cfg '{"stpes": 5}'``), unless the model itself allows extra keys."""
        extra: typing.Literal["forbid"] | None = "forbid" if strict_fields and self.refuses_unknown else None
        try:
            return self.adapter.validate_python(value, context=context, extra=extra)
        except ValidationError as exc:
            violation = _data_violation(exc) or _unknown_field(exc, self.annotation)
            if violation is not None:
                raise TypeMismatchError(f"{where}: {violation}") from None
            shown = data.brief(value) or repr(value)
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            raise TypeMismatchError(
                f"{where}: expected {self.name}, got {shown} ({type(value).__name__}): {_first_error(exc)}"
            ) from None

    def to_wire(
        self, value: Any, where: str, context: dict[str, Any] | None = None, *, strict_fields: bool = False
    ) -> Any:
        """Validate ``value`` against the declared type and return msgpack-ready data."""
        checked = self.validate(value, where, context, strict_fields=strict_fields)
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
