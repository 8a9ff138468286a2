"""Reading a queue configuration file: YAML text or a file into plain data, with messages a user can act on.

The YAML is read safely (no arbitrary objects) and strictly: a key given twice is an error (PyYAML
silently keeps the last one, and a tenant would vanish). A plain number written for ``cpu`` in a file
means CPUs, unlike a plain number in code (millicores): ``mark_written_cpus`` marks those numbers for
``ResourceAmounts`` (``engine.scheduling.config``) to read as CPUs.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from typing import Any

import yaml

from engine.errors import QueueConfigError
from engine.scheduling.config_errors import kind_of

__all__ = ["AMOUNT_FIELDS", "WrittenCpus", "mark_written_cpus", "read_queue_source"]

#: the fields of a tenant that hold resource amounts (a ``cpu`` in any of them is a CPU quantity)
AMOUNT_FIELDS = ("quota", "borrowing_limit", "lending_limit")


class WrittenCpus:
    """A plain number the user wrote for ``cpu`` in a file: CPUs, unlike a plain number in code (millicores)."""

    __slots__ = ("written",)

    def __init__(self, written: int | float) -> None:
        self.written = written

    def __repr__(self) -> str:  # pydantic shows the input in its own errors
        return repr(self.written)


# a SafeLoader that refuses a key given twice (PyYAML silently keeps the last one: a tenant would vanish);
# built with type() because PyYAML ships no type hints, so mypy cannot see SafeLoader as a class
_Loader: Any = type("_Loader", (yaml.SafeLoader,), {})


def _construct_mapping(loader: Any, node: Any) -> dict[Any, Any]:
    seen: dict[Any, Any] = {}
    for key_node, _ in node.value:
        # before merging: keys brought in by ``<<: *anchor`` may be overridden, as YAML allows
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node)
        try:
            duplicate = key in seen
        except TypeError:  # an unhashable key; construct_mapping below reports it
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first at line {seen[key].line + 1})", key_node.start_mark
            )
        seen[key] = key_node.start_mark
    mapping: dict[Any, Any] = loader.construct_mapping(node)
    return mapping


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _parse_yaml(text: str, origin: str | None) -> Any:
    where = f"{origin}: " if origin else ""
    try:
        return yaml.load(text, Loader=_Loader)  # a SafeLoader: no arbitrary objects
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        context = f" ({error.context})" if error.context else ""
        raise QueueConfigError(f"{where}{at}invalid YAML: {error.problem or 'syntax error'}{context}") from None
    except yaml.YAMLError as error:
        raise QueueConfigError(f"{where}invalid YAML: {error}") from None


def read_queue_source(source: str | pathlib.Path | Mapping[str, Any]) -> Mapping[Any, Any]:
    """The mapping a queue configuration source holds: YAML text, a YAML file (a ``Path``), or a mapping as it
    is. Raises ``QueueConfigError`` (never a raw YAML or OS error), prefixed with the file's name."""
    origin: str | None = None
    if isinstance(source, pathlib.Path):
        origin = str(source)
        try:
            text = source.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise QueueConfigError(f"{source}: no such file") from None
        except (OSError, UnicodeDecodeError) as error:
            raise QueueConfigError(f"{source}: cannot read the queue configuration: {error}") from None
        data: Any = _parse_yaml(text, origin)
    elif isinstance(source, str):
        data = _parse_yaml(source, None)
    elif isinstance(source, Mapping):
        data = source
    else:
        raise QueueConfigError(
            f"the queue configuration must be YAML text, a pathlib.Path or a mapping, got {type(source).__name__}"
        )
    where = f"{origin}: " if origin else ""
    if data is None:
        raise QueueConfigError(f"{where}the queue configuration is empty; at least `tenants:` is required")
    if not isinstance(data, Mapping):
        hint = ""
        if isinstance(data, str) and data.endswith((".yaml", ".yml")):
            hint = " (to read a file, pass a pathlib.Path, not its name as a str)"
        raise QueueConfigError(
            f"{where}the queue configuration must be a mapping with `tenants:`, got {kind_of(data)}{hint}"
        )
    return data


def mark_written_cpus(data: Mapping[Any, Any]) -> dict[Any, Any]:
    """A shallow copy of ``data`` in which each plain number under ``tenants[i].<amounts>.cpu`` means CPUs.

    Anything of an unexpected shape is left alone for the model to report with its field path.
    """
    copied = dict(data)
    tenants = copied.get("tenants")
    if not isinstance(tenants, list | tuple):
        return copied
    marked: list[Any] = []
    for tenant in tenants:
        if isinstance(tenant, Mapping):
            tenant = dict(tenant)
            for field in AMOUNT_FIELDS:
                amounts = tenant.get(field)
                if isinstance(amounts, Mapping) and amounts and all(isinstance(v, Mapping) for v in amounts.values()):
                    tenant[field] = {name: _marked(each) for name, each in amounts.items()}  # per flavor
                elif amounts is not None:
                    tenant[field] = _marked(amounts)
        marked.append(tenant)
    copied["tenants"] = marked
    return copied


def _marked(amounts: Any) -> Any:
    cpu = amounts.get("cpu") if isinstance(amounts, Mapping) else None
    if isinstance(cpu, int | float) and not isinstance(cpu, bool):
        return {**amounts, "cpu": WrittenCpus(cpu)}
    return amounts
