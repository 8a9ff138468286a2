"""Pydantic's validation errors of a queue configuration as one line per problem, starting with the field.

``load_queue_config`` promises messages like ``tenants[1].quota.gpu: must be >= 0, got -1`` and
``policy.min_runtim: unknown key 'min_runtim' (allowed: ...); did you mean 'min_runtime'?``, never a raw
pydantic error: this module words them.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from engine.errors import QueueConfigError

__all__ = ["explain", "kind_of"]


#: the tags of a tenant's quota and limits, per resource or per flavor (``config.TenantAmounts``): never shown
_TAGS = ("ResourceAmounts", "PerFlavor")


def _path(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        if part in _TAGS:
            continue
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def kind_of(value: object) -> str:
    """What a message calls a value the user wrote: "a mapping", "a list", or its type and a short repr."""
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    shown = repr(value)
    return f"{type(value).__name__} {shown if len(shown) <= 60 else shown[:57] + '...'}"


def _unwrap(annotation: Any) -> Any:
    """``X | None`` -> X; ``tuple[X, ...]`` stays (an index selects X)."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _unwrap(members[0]) if len(members) == 1 else annotation
    return annotation


def _model_at(root: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model class whose fields live at ``loc`` (for listing the allowed keys), or None."""
    current: Any = root
    for part in loc:
        if part in _TAGS:  # one member of a tagged union: the model (per resource) or the mapping (per flavor)
            members = [_unwrap(a) for a in typing.get_args(current)]
            current = next((m for m in members if (typing.get_origin(m) is dict) == (part == "PerFlavor")), None)
        elif typing.get_origin(current) is dict:  # a key of a mapping (a flavor's name): its value's type
            current = _unwrap(typing.get_args(current)[1])
        elif isinstance(part, int):
            if typing.get_origin(current) is not tuple:
                return None
            current = _unwrap(typing.get_args(current)[0])
        elif isinstance(current, type) and issubclass(current, BaseModel) and part in current.model_fields:
            current = _unwrap(current.model_fields[part].annotation)
        else:
            return None
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _explain_one(err: Any, root: type[BaseModel]) -> str:
    loc: tuple[int | str, ...] = tuple(err["loc"])
    path = _path(loc) or "the queue configuration"
    kind: str = err["type"]
    value = err.get("input")
    ctx = err.get("ctx") or {}
    if kind == "value_error" and isinstance(ctx.get("error"), QueueConfigError):
        return str(ctx["error"])  # already names its field
    if kind == "value_error":
        return f"{path}: {ctx.get('error', err['msg'])}"
    if kind in ("extra_forbidden", "invalid_key"):
        parent = _path(loc[:-1])
        path = f"{parent}.{loc[-1]}" if parent else str(loc[-1])
        model = _model_at(root, loc[:-1])
        allowed = list(model.model_fields) if model else []
        near = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        listed = f" (allowed: {', '.join(allowed)})" if allowed else ""
        return f"{path}: unknown key {loc[-1]!r}{listed}{hint}"
    if kind == "missing":
        return f"{path}: required" + ("; at least one tenant is" if loc == ("tenants",) else "")
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"{path}: must be a mapping, got {kind_of(value)}"
    if kind in ("tuple_type", "list_type"):
        hint = " (write one `- name: ...` entry per item)" if isinstance(value, Mapping) else ""
        return f"{path}: must be a list, got {kind_of(value)}{hint}"
    if kind == "string_type":
        hint = " (quote it: YAML reads yes/no/on/off/true/false as booleans)" if isinstance(value, bool) else ""
        return f"{path}: must be a string, got {kind_of(value)}{hint}"
    if kind == "literal_error":
        return f"{path}: must be one of {ctx.get('expected', '')}, got {value!r}"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return f"{path}: must be an integer, got {kind_of(value)}"
    if kind in ("float_parsing", "float_type", "finite_number"):
        return f"{path}: must be a finite number, got {kind_of(value)}"
    if kind in ("bool_parsing", "bool_type"):
        return f"{path}: must be true or false, got {kind_of(value)}"
    message = str(err["msg"])
    return f"{path}: {message[:1].lower()}{message[1:]}"


def explain(error: ValidationError, root: type[BaseModel]) -> str:
    """The errors pydantic found validating ``root`` (the queue configuration), one line each, every line
    starting with the field at fault (``tenants[1].quota.gpu: must be >= 0, got -1``)."""
    lines = [_explain_one(err, root) for err in error.errors()]
    return "\n".join(dict.fromkeys(lines))  # one line per problem, in pydantic's (document) order
