"""The queue configuration: tenants, cohorts, quotas, priority classes and the preemption policy.

One YAML file, in the shape Kueue users know (``examples/queues.yaml`` is a commented example)::

    cohorts: [{name: research}]
    tenants:
      - {name: team-a, cohort: research, weight: 1, quota: {gpu: 2, cpu: 16, mem: 64Gi}}
    priority_classes: [{name: low, value: 10}, {name: high, value: 100, preemptible: false}]
    policy: {min_runtime: 60s, preemption_grace: 120s}

Semantics (Kueue's, where Kueue has the concept):

- **Tenant** — a team; its name is a DNS-1123 label because it also names the tenant's Temporal namespace.
- **Nominal quota** (``quota``) — what the tenant is entitled to at any time, per resource (``gpu``,
  ``cpu``, ``mem``). A resource missing from ``quota`` is not limited for that tenant. A tenant with no
  ``quota`` at all is limited only by the cluster.
- **Cohort** — tenants in one cohort lend each other their idle nominal quota. ``parent`` nests cohorts
  (a tree, as Kueue's hierarchical cohorts): capacity idle anywhere under a root cohort can be borrowed
  by any tenant under it. A tenant without a cohort never borrows and never lends.
- **borrowing_limit** — how much *above* its nominal quota the tenant may use by borrowing. Absent:
  unlimited; ``{gpu: 0}``: never borrows GPUs. Only on resources its ``quota`` limits (an unlimited
  resource has nothing to borrow), and only in a cohort.
- **lending_limit** — how much of its *idle* nominal quota the tenant lends to the cohort. Absent: lends
  all of it; ``{gpu: 0}``: keeps its GPUs for itself (they stay idle rather than lent). At most the
  nominal quota; only on resources its ``quota`` limits, and only in a cohort. Lent capacity is taken
  back by preemption (*reclaim*) when the lender needs it, subject to ``policy``.
- **weight** — the tenant's fair-share weight. Across tenants the policy admits first from the tenant
  with the lowest weighted dominant resource share (usage above nominal relative to what the cohort can
  lend, divided by ``weight``). ``0`` means never favoured (an infinite share, as in Kueue).
- **Priority classes** — ``value`` orders gangs within a tenant (higher first, then FIFO) and allows
  preemption of lower-priority gangs; ``preemptible: false`` protects a class's gangs from every kind of
  preemption. A gang without a class gets ``policy.default_priority``, or value 0 and preemptible when
  that is unset.
- **Policy knobs** — ``reclaim_within_cohort`` (``never`` | ``lower_priority`` | ``any``: which lent-out
  gangs a tenant may preempt to get back to its nominal quota), ``within_tenant`` (``never`` |
  ``lower_priority``: whether a tenant's gang may preempt its own lower-priority gangs), ``min_runtime``
  (no gang is preempted before it has run this long), ``preemption_grace`` (time between the notice and
  the kill, carried in every preemption decision; the node agents do not honour it yet and give 5 s),
  ``backfill`` (smaller gangs may use idle GPUs while a bigger one waits; they are preemptible and
  reclaimed when the big one fits).

Units: ``gpu`` whole GPUs; ``cpu`` stored as integer *millicores*; ``mem`` stored as integer *bytes*
(written ``68719476736``, ``"64Gi"``, ``"64G"``, ``"512Mi"``); durations stored as float seconds (written
``60``, ``"60s"``, ``"2m"``, ``"1h"``, ``"1m30s"``). See ``engine.scheduling.units``.

``cpu`` is the one resource whose plain number means two things. In a file (anything
``load_queue_config`` reads) it means CPUs, as in Kubernetes and Kueue: ``cpu: 16``, ``cpu: 0.5``, or
``cpu: "500m"``. In code (``ResourceAmounts(cpu=...)``, ``model_validate``, ``model_dump``) an int is the
stored millicores, so ``ResourceAmounts(cpu=q.cpu) == q`` and a pydantic round trip (Temporal's data
converter) is exact. Strings mean the same everywhere (``"16"`` = 16 CPUs, ``"500m"``), so
``dump_queue_config`` writes ``cpu`` as a Kubernetes quantity string (``"16"``, ``"1500m"``), which both
``load_queue_config`` and ``QueueConfig.model_validate`` read back exactly.

``load_queue_config`` checks everything before anything is used and raises ``QueueConfigError`` whose
message starts with the field at fault, e.g. ``tenants[1].quota.gpu: must be >= 0, got -1``.
"""

from __future__ import annotations

import difflib
import math
import pathlib
import re
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import yaml
from pydantic import BaseModel, PrivateAttr, ValidationError, field_validator, model_validator

from engine.core.protocol import check_tenant
from engine.scheduling.model import Frozen
from engine.scheduling.units import MILLI, cpus_of, parse_cpu, parse_duration, parse_gpu, parse_mem

__all__ = [
    "DEFAULT_PRIORITY",
    "DEFAULT_QUEUE_CONFIG",
    "CohortConfig",
    "PolicyConfig",
    "PriorityClass",
    "QueueConfig",
    "QueueConfigError",
    "ResourceAmounts",
    "TenantConfig",
    "dump_queue_config",
    "load_queue_config",
]

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_RESOURCES = ("gpu", "cpu", "mem")
_AMOUNT_FIELDS = ("quota", "borrowing_limit", "lending_limit")


class _WrittenCpus:
    """A plain number the user wrote for ``cpu`` in a file: CPUs, unlike a plain number in code (millicores)."""

    __slots__ = ("written",)

    def __init__(self, written: int | float) -> None:
        self.written = written

    def __repr__(self) -> str:  # pydantic shows the input in its own errors
        return repr(self.written)


class QueueConfigError(ValueError):
    """A queue configuration that cannot be used; the message starts with the field at fault."""


def _check_label(value: str, what: str) -> str:
    if len(value) > 63 or not _DNS_LABEL.fullmatch(value):
        raise ValueError(
            f"{what} {value!r} is not a DNS-1123 label (lowercase letters, digits and '-', starting and ending "
            "with a letter or digit, at most 63 characters)"
        )
    return value


def _check_number(value: object, what: str) -> object:
    # pydantic's lax mode reads ``true`` as 1; in a config file that is a typo, not a number
    if isinstance(value, bool):
        raise ValueError(f"must be {what}, got {value!r}")
    return value


class ResourceAmounts(Frozen):
    """A quota or a limit per resource; ``None`` = the resource is not limited. See the module docstring."""

    gpu: int | None = None
    #: millicores
    cpu: int | None = None
    #: bytes
    mem: int | None = None

    @field_validator("gpu", mode="before")
    @classmethod
    def _gpu(cls, value: object) -> int | None:
        return None if value is None else parse_gpu(value)

    @field_validator("cpu", mode="before")
    @classmethod
    def _cpu(cls, value: object) -> int | None:
        if value is None:
            return None
        if isinstance(value, _WrittenCpus):
            return parse_cpu(value.written)  # a plain number in a file: CPUs
        if isinstance(value, str):
            return parse_cpu(value)
        if isinstance(value, int | float) and not isinstance(value, bool):
            # in code, a plain number is the stored millicores (see the module docstring)
            if not math.isfinite(value):
                raise ValueError(f"must be a finite number, got {value!r}")
            if value < 0:
                raise ValueError(f"must be >= 0, got {value!r}")
            if value != int(value):
                raise ValueError(f"must be whole millicores here, got {value!r} (write '0.5' or '500m' for half a CPU)")
            return int(value)
        raise ValueError(f"must be a CPU quantity like 16, 0.5 or '500m', got {value!r}")

    @field_validator("mem", mode="before")
    @classmethod
    def _mem(cls, value: object) -> int | None:
        return None if value is None else parse_mem(value)

    def limited(self) -> tuple[str, ...]:
        """The resources this quota or limit sets, in ``gpu, cpu, mem`` order."""
        return tuple(name for name in _RESOURCES if getattr(self, name) is not None)


class CohortConfig(Frozen):
    """A group of tenants that lend each other idle quota; ``parent`` nests it under another cohort."""

    name: str
    parent: str | None = None

    @field_validator("name", "parent")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        return None if value is None else _check_label(value, "cohort name")


class TenantConfig(Frozen):
    """One team: nominal quota, cohort, borrowing and lending limits, fair-share weight."""

    name: str
    cohort: str | None = None
    weight: float = 1.0
    quota: ResourceAmounts = ResourceAmounts()
    borrowing_limit: ResourceAmounts | None = None
    lending_limit: ResourceAmounts | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_tenant(value, "tenant name")  # the one rule, so its namespace gf-<name> is valid too

    @field_validator("weight", mode="before")
    @classmethod
    def _weight_type(cls, value: object) -> object:
        return _check_number(value, "a number >= 0")

    @field_validator("weight")
    @classmethod
    def _weight(cls, value: float) -> float:
        if value < 0:
            raise ValueError(f"must be >= 0, got {value!r}")
        return value


class PriorityClass(Frozen):
    """A named priority: higher ``value`` goes first; ``preemptible=False`` is never preempted."""

    name: str
    value: int
    preemptible: bool = True

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not value or value != value.strip() or any(c.isspace() for c in value):
            raise ValueError(f"priority class name {value!r} must be non-empty and contain no spaces")
        return value

    @field_validator("value", mode="before")
    @classmethod
    def _value(cls, value: object) -> object:
        return _check_number(value, "an integer")


#: what a gang gets when it names no priority class and ``policy.default_priority`` is unset
DEFAULT_PRIORITY = PriorityClass(name="default", value=0, preemptible=True)


class PolicyConfig(Frozen):
    """The preemption and backfill knobs (see the module docstring); durations are seconds."""

    reclaim_within_cohort: Literal["never", "lower_priority", "any"] = "any"
    within_tenant: Literal["never", "lower_priority"] = "lower_priority"
    min_runtime: float = 60.0
    preemption_grace: float = 120.0
    backfill: bool = True
    default_priority: str | None = None

    @field_validator("min_runtime", "preemption_grace", mode="before")
    @classmethod
    def _duration(cls, value: object) -> float:
        return parse_duration(value)


class QueueConfig(Frozen):
    """The whole configuration. Constructing one checks every cross-reference (see ``_check_references``)."""

    cohorts: tuple[CohortConfig, ...] = ()
    tenants: tuple[TenantConfig, ...]
    priority_classes: tuple[PriorityClass, ...] = ()
    policy: PolicyConfig = PolicyConfig()

    # lookups the policy does on every event: built once, never part of the data
    _tenants: dict[str, TenantConfig] = PrivateAttr(default_factory=dict)
    _priorities: dict[str, PriorityClass] = PrivateAttr(default_factory=dict)
    _roots: dict[str, str | None] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> QueueConfig:
        _check_references(self)
        return self

    def model_post_init(self, context: Any, /) -> None:
        self._tenants = {t.name: t for t in self.tenants}
        self._priorities = {p.name: p for p in self.priority_classes}
        parents = {c.name: c.parent for c in self.cohorts}
        roots: dict[str, str | None] = {}
        for tenant in self.tenants:
            cohort = tenant.cohort
            # a cycle or an unknown parent is refused by _check; the bound only keeps this loop finite
            for _ in range(len(parents)):
                parent = parents.get(cohort) if cohort is not None else None
                if parent is None:
                    break
                cohort = parent
            roots[tenant.name] = cohort
        self._roots = roots

    def tenant(self, name: str) -> TenantConfig | None:
        """The tenant called ``name``, or None."""
        return self._tenants.get(name)

    def priority(self, name: str | None) -> PriorityClass:
        """The class called ``name``; ``None`` is the default class. An unknown name is a ``KeyError``."""
        if name is None:
            default = self.policy.default_priority
            return DEFAULT_PRIORITY if default is None else self._priorities[default]
        try:
            return self._priorities[name]
        except KeyError:
            known = ", ".join(sorted(self._priorities)) or "none are defined"
            raise KeyError(f"unknown priority class {name!r} (priority classes: {known})") from None

    def root_cohort(self, tenant: str) -> str | None:
        """The top of the tenant's cohort chain: tenants under one root share idle capacity. None if none."""
        return self._roots.get(tenant)


def _names(items: Iterable[Any]) -> str:
    return ", ".join(repr(item.name) for item in items)


def _unique(items: tuple[Any, ...], field: str, what: str) -> None:
    seen: dict[str, int] = {}
    for index, item in enumerate(items):
        if item.name in seen:
            raise QueueConfigError(
                f"{field}[{index}].name: duplicate {what} {item.name!r} (already {field}[{seen[item.name]}])"
            )
        seen[item.name] = index


def _check_cohorts(cohorts: tuple[CohortConfig, ...]) -> None:
    parents = {c.name: c.parent for c in cohorts}
    for index, cohort in enumerate(cohorts):
        if cohort.parent is not None and cohort.parent not in parents:
            raise QueueConfigError(
                f"cohorts[{index}].parent: unknown cohort {cohort.parent!r} (cohorts: {_names(cohorts)})"
            )
    for index, cohort in enumerate(cohorts):
        chain = [cohort.name]
        parent = cohort.parent
        while parent is not None:
            chain.append(parent)
            if parent == cohort.name:
                raise QueueConfigError(f"cohorts[{index}].parent: cohort parents form a cycle: {' -> '.join(chain)}")
            if len(chain) > len(cohorts) + 1:
                break  # a cycle above this cohort, reported at the cohort that is on it
            parent = parents[parent]


def _check_limits(index: int, tenant: TenantConfig) -> None:
    field = f"tenants[{index}]"
    for kind, limit in (("borrowing_limit", tenant.borrowing_limit), ("lending_limit", tenant.lending_limit)):
        if limit is None:
            continue
        if tenant.cohort is None:
            verb = "borrow from" if kind == "borrowing_limit" else "lend to"
            raise QueueConfigError(
                f"{field}.{kind}: tenant {tenant.name!r} is in no cohort, so it has nobody to {verb} and a "
                f"{kind} means nothing; set `cohort:` or remove `{kind}`"
            )
        for resource in limit.limited():
            nominal = getattr(tenant.quota, resource)
            if nominal is None:
                raise QueueConfigError(
                    f"{field}.{kind}.{resource}: the quota of tenant {tenant.name!r} does not limit {resource}, "
                    f"so a {kind} on it means nothing; add `quota.{resource}` or remove it"
                )
            amount = getattr(limit, resource)
            if kind == "lending_limit" and amount > nominal:
                raise QueueConfigError(
                    f"{field}.lending_limit.{resource}: {_amount(resource, amount)} is above the nominal quota of "
                    f"{_amount(resource, nominal)}; a tenant can lend only what it has"
                )


def _amount(resource: str, value: int) -> str:
    if resource == "cpu":
        return f"{cpus_of(value)} CPUs"
    if resource == "mem":
        return f"{value} bytes"
    return f"{value} GPUs"


def _check_references(config: QueueConfig) -> None:
    """Everything one field cannot check alone; raises ``QueueConfigError`` naming the field."""
    if not config.tenants:
        raise QueueConfigError("tenants: at least one tenant is required")
    _unique(config.cohorts, "cohorts", "cohort")
    _unique(config.tenants, "tenants", "tenant")
    _unique(config.priority_classes, "priority_classes", "priority class")
    _check_cohorts(config.cohorts)
    cohorts = {c.name for c in config.cohorts}
    for index, tenant in enumerate(config.tenants):
        if tenant.cohort is not None and tenant.cohort not in cohorts:
            known = f"cohorts: {_names(config.cohorts)}" if config.cohorts else "no cohorts are defined"
            raise QueueConfigError(f"tenants[{index}].cohort: unknown cohort {tenant.cohort!r} ({known})")
        _check_limits(index, tenant)
    default = config.policy.default_priority
    if default is not None and default not in {p.name for p in config.priority_classes}:
        known = _names(config.priority_classes) or "none are defined"
        raise QueueConfigError(
            f"policy.default_priority: unknown priority class {default!r} (priority classes: {known})"
        )


#: one tenant "default" with no quota: every gang is admitted in FIFO order, as before tenancy existed
DEFAULT_QUEUE_CONFIG = QueueConfig(tenants=(TenantConfig(name="default"),))


# --- reading -------------------------------------------------------------------------------------------


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


def load_queue_config(source: str | pathlib.Path | Mapping[str, Any]) -> QueueConfig:
    """Read and check a queue configuration: YAML text, a YAML file (a ``Path``), or a mapping.

    Raises ``QueueConfigError`` (never a raw pydantic or YAML error) whose message starts with the field at
    fault; all field errors are listed, one per line.
    """
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
            f"{where}the queue configuration must be a mapping with `tenants:`, got {_kind(data)}{hint}"
        )
    try:
        return QueueConfig.model_validate(_mark_written_cpus(data))
    except ValidationError as error:
        # field errors start with the field path (not the file name): callers can add the file themselves
        raise QueueConfigError(_explain(error)) from None


def _mark_written_cpus(data: Mapping[Any, Any]) -> dict[Any, Any]:
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
            for field in _AMOUNT_FIELDS:
                amounts = tenant.get(field)
                cpu = amounts.get("cpu") if isinstance(amounts, Mapping) else None
                if isinstance(cpu, int | float) and not isinstance(cpu, bool):
                    tenant[field] = {**amounts, "cpu": _WrittenCpus(cpu)}  # type: ignore[dict-item]
        marked.append(tenant)
    copied["tenants"] = marked
    return copied


def _cpu_quantity(millicores: int) -> str:
    whole, rest = divmod(millicores, MILLI)
    return str(whole) if rest == 0 else f"{millicores}m"


def dump_queue_config(config: QueueConfig) -> dict[str, Any]:
    """A JSON-able mapping that ``load_queue_config`` (and ``QueueConfig.model_validate``) read back equal.

    ``gpu`` is whole GPUs, ``mem`` plain integer bytes, durations float seconds, and ``cpu`` a Kubernetes
    quantity string (``"16"``, ``"1500m"``): a plain number would be read as CPUs by ``load_queue_config``
    but as millicores by ``model_validate`` (see the module docstring). Unset values are left out.
    """
    dumped = config.model_dump(mode="json", exclude_none=True)
    for tenant in dumped["tenants"]:
        for field in _AMOUNT_FIELDS:
            amounts = tenant.get(field)
            if amounts is not None and "cpu" in amounts:
                amounts["cpu"] = _cpu_quantity(amounts["cpu"])
    return dumped


# --- pydantic errors as field paths ---------------------------------------------------------------------


def _path(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _kind(value: object) -> str:
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    shown = repr(value)
    return f"{type(value).__name__} {shown if len(shown) <= 60 else shown[:57] + '...'}"


def _unwrap(annotation: Any) -> Any:
    """``X | None`` -> X; ``tuple[X, ...]`` stays (an index selects X)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        return members[0] if len(members) == 1 else annotation
    return annotation


def _model_at(loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model class whose fields live at ``loc`` (for listing the allowed keys), or None."""
    current: Any = QueueConfig
    for part in loc:
        if isinstance(part, int):
            if typing.get_origin(current) is not tuple:
                return None
            current = _unwrap(typing.get_args(current)[0])
        elif isinstance(current, type) and issubclass(current, BaseModel) and part in current.model_fields:
            current = _unwrap(current.model_fields[part].annotation)
        else:
            return None
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _explain_one(err: Any) -> str:
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
        model = _model_at(loc[:-1])
        allowed = list(model.model_fields) if model else []
        near = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        listed = f" (allowed: {', '.join(allowed)})" if allowed else ""
        return f"{path}: unknown key {loc[-1]!r}{listed}{hint}"
    if kind == "missing":
        return f"{path}: required" + ("; at least one tenant is" if loc == ("tenants",) else "")
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"{path}: must be a mapping, got {_kind(value)}"
    if kind in ("tuple_type", "list_type"):
        hint = " (write one `- name: ...` entry per item)" if isinstance(value, Mapping) else ""
        return f"{path}: must be a list, got {_kind(value)}{hint}"
    if kind == "string_type":
        hint = " (quote it: YAML reads yes/no/on/off/true/false as booleans)" if isinstance(value, bool) else ""
        return f"{path}: must be a string, got {_kind(value)}{hint}"
    if kind == "literal_error":
        return f"{path}: must be one of {ctx.get('expected', '')}, got {value!r}"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return f"{path}: must be an integer, got {_kind(value)}"
    if kind in ("float_parsing", "float_type", "finite_number"):
        return f"{path}: must be a finite number, got {_kind(value)}"
    if kind in ("bool_parsing", "bool_type"):
        return f"{path}: must be true or false, got {_kind(value)}"
    message = str(err["msg"])
    return f"{path}: {message[:1].lower()}{message[1:]}"


def _explain(error: ValidationError) -> str:
    lines = [_explain_one(err) for err in error.errors()]
    return "\n".join(dict.fromkeys(lines))  # one line per problem, in pydantic's (document) order
