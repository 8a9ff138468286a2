"""Workflow parameters from the command line: ``--total-steps 5`` / ``--total_steps=5`` / ``--input-json``.

Values are parsed against the declared type: strings stay strings, everything else is read as JSON
when it parses (``3``, ``[1, 2]``, ``{"lr": 0.1}``, ``true``) and validated by the type's codec, so
``--rows abc`` for an ``int`` fails with the parameter name, the expected type and the value given.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Sequence
from typing import Any

from engine.core.interface import Interface, Param
from engine.errors import InputError

__all__ = ["parse_params"]

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _is(annotation: Any, kind: type) -> bool:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return annotation is kind or (typing.get_origin(annotation) in (typing.Union, types.UnionType) and args == [kind])


def _convert(param: Param, raw: str) -> Any:
    if _is(param.annotation, str):
        return raw
    if _is(param.annotation, bool) and raw.lower() in _TRUE | _FALSE:
        return raw.lower() in _TRUE
    try:
        return json.loads(raw)
    except ValueError:
        return raw  # let the type's validator judge it (dates, enum values, paths ...)


def _usage(interface: Interface) -> str:
    return ", ".join(f"--{p.name.replace('_', '-')} ({p.codec.name})" for p in interface.params) or "none"


def parse_params(interface: Interface, tokens: Sequence[str], input_json: str | None = None) -> dict[str, Any]:
    """CLI tokens (and an optional JSON object) → raw inputs by name; validation happens when they are
    encoded for the run."""
    inputs: dict[str, Any] = {}
    if input_json:
        try:
            loaded = json.loads(input_json)
        except ValueError as exc:
            raise InputError(f"--input-json is not valid JSON: {exc}") from None
        if not isinstance(loaded, dict):
            raise InputError("--input-json must be a JSON object of parameter names to values")
        inputs.update(loaded)
    by_name = {p.name: p for p in interface.params}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--") or token == "--":
            raise InputError(f"unexpected argument {token!r}; parameters are given as --name value")
        key, eq, value = token[2:].partition("=")
        name = key.replace("-", "_")
        negated = name.startswith("no_") and name[3:] in by_name and _is(by_name[name[3:]].annotation, bool)
        if negated:
            inputs[name[3:]] = False
            i += 1
            continue
        if name not in by_name:
            raise InputError(f"unknown parameter --{key}; {interface.owner} takes: {_usage(interface)}")
        param = by_name[name]
        if not eq:
            nxt = tokens[i + 1] if i + 1 < len(tokens) else None
            if nxt is None or (nxt.startswith("--") and len(nxt) > 2 and not nxt[2].isdigit()):
                if _is(param.annotation, bool):
                    inputs[name] = True
                    i += 1
                    continue
                raise InputError(f"parameter --{key} ({param.codec.name}) needs a value")
            value = nxt
            i += 1
        inputs[name] = _convert(param, value)
        i += 1
    return inputs
