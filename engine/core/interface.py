"""Typed interfaces derived from function signatures.

An :class:`Interface` knows a function's parameters (name, declared type, default) and its return type,
and validates / encodes inputs and outputs with one :class:`~engine.types.ValueCodec` per type. It is
built once, eagerly, by ``@task`` and ``@workflow`` so a bad signature fails at import time.
"""

from __future__ import annotations

import inspect
import json
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from engine.errors import DefinitionError, InputError
from engine.types.codec import ValueCodec

__all__ = ["Interface", "Param", "is_type", "parse_text"]

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def is_type(annotation: Any, kind: type) -> bool:
    """``annotation`` is ``kind`` or ``Optional[kind]``."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return annotation is kind or (typing.get_origin(annotation) in (typing.Union, types.UnionType) and args == [kind])


def parse_text(annotation: Any, raw: str) -> Any:
    """A value typed on a command line (``gangflow run --x VALUE``, ``gangflow input RUN x VALUE``): a ``str``
    stays as given, ``true``/``no``/... for a ``bool``, otherwise JSON when it parses (``0.93``, ``[1, 2]``,
    ``{"lr": 0.1}``) and the text itself when not, for the type's codec to judge (dates, enum values, paths)."""
    if is_type(annotation, str):
        return raw
    if is_type(annotation, bool) and raw.lower() in _TRUE | _FALSE:
        return raw.lower() in _TRUE
    try:
        return json.loads(raw)
    except ValueError:
        return raw


_MISSING: Any = inspect.Parameter.empty


@dataclass(frozen=True)
class Param:
    name: str
    annotation: Any
    codec: ValueCodec
    default: Any = _MISSING

    @property
    def required(self) -> bool:
        return self.default is _MISSING


@dataclass(frozen=True)
class Interface:
    """Inputs and output of a task or workflow. ``owner`` (e.g. ``task 'train'``) prefixes messages."""

    owner: str
    params: tuple[Param, ...]
    output: ValueCodec
    signature: inspect.Signature

    @classmethod
    def from_function(cls, fn: Callable[..., Any], owner: str) -> Interface:
        sig = inspect.signature(fn)
        try:
            hints = typing.get_type_hints(fn, include_extras=True)
        except Exception as exc:  # unresolved forward references, typos in annotations
            raise DefinitionError(f"{owner}: cannot resolve type hints: {exc}") from None
        params = []
        for p in sig.parameters.values():
            if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                star = "*" if p.kind is inspect.Parameter.VAR_POSITIONAL else "**"
                raise DefinitionError(
                    f"{owner}: parameter '{star}{p.name}' is not supported; declare each input by name with a type"
                )
            if p.kind is inspect.Parameter.POSITIONAL_ONLY:
                raise DefinitionError(f"{owner}: parameter '{p.name}' is positional-only; inputs are passed by name")
            if p.name not in hints:
                raise DefinitionError(f"{owner}: parameter '{p.name}' has no type annotation")
            try:
                codec = ValueCodec(hints[p.name])
            except TypeError as exc:
                raise DefinitionError(f"{owner}: parameter '{p.name}' has an {exc}") from None
            if p.default is not _MISSING:
                try:
                    codec.validate(p.default, f"{owner}: default of '{p.name}'")
                except TypeError as exc:
                    raise DefinitionError(str(exc)) from None
            params.append(Param(p.name, hints[p.name], codec, p.default))
        if "return" not in hints:
            raise DefinitionError(f"{owner}: the return type is not annotated (use '-> None' if it returns nothing)")
        try:
            output = ValueCodec(hints["return"])
        except TypeError as exc:
            raise DefinitionError(f"{owner}: the return value has an {exc}") from None
        return cls(owner, tuple(params), output, sig)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def bind(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """Python call arguments → inputs by name (defaults not yet applied)."""
        try:
            bound = self.signature.bind_partial(*args, **kwargs)
        except TypeError as exc:
            raise InputError(f"{self.owner}: {exc}") from None
        return dict(bound.arguments)

    def _complete(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        unknown = [k for k in inputs if k not in self.names]
        if unknown:
            expected = ", ".join(self.names) or "no inputs"
            raise InputError(f"{self.owner}: unknown input {unknown[0]!r}; expected {expected}")
        out: dict[str, Any] = {}
        for p in self.params:
            if p.name in inputs:
                out[p.name] = inputs[p.name]
            elif p.required:
                raise InputError(f"{self.owner}: missing required input {p.name!r} ({p.codec.name})")
            else:
                out[p.name] = p.default
        return out

    def validate_inputs(self, inputs: Mapping[str, Any], context: dict[str, Any] | None = None) -> dict[str, Any]:
        """Inputs checked and coerced to their declared types, defaults filled in."""
        full = self._complete(inputs)
        return {p.name: p.codec.validate(full[p.name], f"{self.owner}: input {p.name!r}", context) for p in self.params}

    def inputs_to_wire(self, inputs: Mapping[str, Any], context: dict[str, Any] | None = None) -> dict[str, Any]:
        """What a caller gives (a person's JSON, a workflow's call) checked: a key no field of a structured
        input takes is refused (a typo would otherwise run the whole gang with the default)."""
        full = self._complete(inputs)
        return {
            p.name: p.codec.to_wire(full[p.name], f"{self.owner}: input {p.name!r}", context, strict_fields=True)
            for p in self.params
        }

    def inputs_from_wire(self, data: Mapping[str, Any], context: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.validate_inputs(data, context)

    def output_to_wire(self, value: Any, context: dict[str, Any] | None = None) -> Any:
        return self.output.to_wire(value, f"{self.owner}: return value", context)

    def output_from_wire(self, data: Any, context: dict[str, Any] | None = None) -> Any:
        return self.output.from_wire(data, f"{self.owner}: return value", context)

    def describe(self) -> str:
        """``rows: int = 10000, epochs: int = 3 -> Metrics`` for help texts."""
        parts = [f"{p.name}: {p.codec.name}" + ("" if p.required else f" = {p.default!r}") for p in self.params]
        return f"({', '.join(parts)}) -> {self.output.name}"
