"""The checks of a queue configuration that look across its fields (``QueueConfig`` runs ``check_references``
when it is built): each raises ``QueueConfigError`` whose message starts with the field at fault."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from engine.core.placement import HOST_LEVEL, label_key_problem
from engine.errors import QueueConfigError
from engine.scheduling.units import cpus_of

if TYPE_CHECKING:
    from engine.scheduling.config import CohortConfig, PriorityClass, QueueConfig, TenantConfig

__all__ = ["check_references", "for_flavor", "tenant_flavors"]

_A = TypeVar("_A")


def for_flavor(amounts: _A | Mapping[str, _A] | None, flavor: str | None) -> _A | None:
    """A quota or limit on one flavor: a per-resource one holds on every flavor; a per-flavor one without
    ``flavor`` (None: the queue file names no flavors) or naming another flavor is None (absent)."""
    if amounts is None or not isinstance(amounts, Mapping):
        return amounts
    return amounts.get(flavor) if flavor is not None else None


def tenant_flavors(config: QueueConfig, tenant: TenantConfig) -> tuple[str, ...]:
    """The flavors a tenant may use, in its order of preference: those its per-flavor quota names, else every
    declared flavor in the file's order; () without flavors."""
    if not config.flavors:
        return ()
    if isinstance(tenant.quota, Mapping):
        return tuple(tenant.quota)
    return tuple(f.name for f in config.flavors)


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


def check_cohorts(cohorts: tuple[CohortConfig, ...]) -> None:
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


def check_limits(index: int, tenant: TenantConfig, flavors: tuple[str, ...]) -> None:
    """Limits need a cohort and a quota on what they limit; per flavor with flavors (``flavors``, the
    tenant's), each flavor's limits against that flavor's quota."""
    field = f"tenants[{index}]"
    for kind, limits in (("borrowing_limit", tenant.borrowing_limit), ("lending_limit", tenant.lending_limit)):
        if limits is None:
            continue
        if tenant.cohort is None:
            verb = "borrow from" if kind == "borrowing_limit" else "lend to"
            raise QueueConfigError(
                f"{field}.{kind}: tenant {tenant.name!r} is in no cohort, so it has nobody to {verb} and a "
                f"{kind} means nothing; set `cohort:` or remove `{kind}`"
            )
        if isinstance(limits, Mapping):
            if not isinstance(tenant.quota, Mapping):
                raise QueueConfigError(
                    f"{field}.{kind}: per flavor, but the quota of tenant {tenant.name!r} is not: write its "
                    f"`quota` per flavor too ({{{', '.join(f'{n}: {{...}}' for n in limits)}}})"
                )
            for name in limits:
                if name not in tenant.quota:
                    raise QueueConfigError(
                        f"{field}.{kind}.{name}: the quota of tenant {tenant.name!r} names no flavor {name!r} "
                        f"(its flavors: {', '.join(tenant.quota)})"
                    )
        for flavor in flavors or (None,):
            limit = for_flavor(limits, flavor)
            if limit is None:
                continue
            at = f"{kind}.{flavor}" if isinstance(limits, dict) else kind
            quota = for_flavor(tenant.quota, flavor)
            where = f"quota.{flavor}." if isinstance(tenant.quota, Mapping) else "quota."
            named = f"the {flavor} quota" if isinstance(tenant.quota, Mapping) else "the quota"
            for resource in limit.limited():
                nominal = getattr(quota, resource) if quota is not None else None
                if nominal is None:
                    raise QueueConfigError(
                        f"{field}.{at}.{resource}: {named} of tenant {tenant.name!r} does not limit {resource}, "
                        f"so a {kind} on it means nothing; add `{where}{resource}` or remove it"
                    )
                amount = getattr(limit, resource)
                if kind == "lending_limit" and amount > nominal:
                    raise QueueConfigError(
                        f"{field}.{at}.{resource}: {_amount(resource, amount)} is above the nominal quota of "
                        f"{_amount(resource, nominal)}; a tenant can lend only what it has"
                    )


def check_flavors(config: QueueConfig) -> None:
    """Flavor names are unique, and a per-flavor quota names declared flavors only."""
    _unique(config.flavors, "flavors", "flavor")
    declared = [f.name for f in config.flavors]
    known = f"flavors: {', '.join(declared)}" if declared else "no flavors are declared: add `flavors:`"
    for index, tenant in enumerate(config.tenants):
        if isinstance(tenant.quota, Mapping):
            for name in tenant.quota:
                if name not in declared:
                    raise QueueConfigError(f"tenants[{index}].quota.{name}: no flavor named {name!r} ({known})")


def check_allowed_classes(index: int, tenant: TenantConfig, classes: tuple[PriorityClass, ...]) -> None:
    """A tenant's ``priority_classes`` name defined classes, each once."""
    defined = {c.name for c in classes}
    seen: set[str] = set()
    for at, name in enumerate(tenant.priority_classes or ()):
        field = f"tenants[{index}].priority_classes[{at}]"
        if name not in defined:
            known = _names(classes) or "none are defined"
            raise QueueConfigError(f"{field}: unknown priority class {name!r} (priority classes: {known})")
        if name in seen:
            raise QueueConfigError(f"{field}: priority class {name!r} is listed twice")
        seen.add(name)


def _amount(resource: str, value: int) -> str:
    if resource == "cpu":
        return f"{cpus_of(value)} CPUs"
    if resource == "mem":
        return f"{value} bytes"
    return f"{value} GPUs"


def check_levels(levels: tuple[str, ...]) -> None:
    """``topology``: node label keys, each once; ``host`` (the node itself) is implicit."""
    seen: dict[str, int] = {}
    for index, level in enumerate(levels):
        problem = label_key_problem(level)
        if problem is not None:
            raise QueueConfigError(f"topology[{index}]: {problem}")
        if level == HOST_LEVEL:
            raise QueueConfigError(
                f"topology[{index}]: {HOST_LEVEL!r} is the node itself, the innermost level, always there: "
                "list only the levels above it (node label keys such as block, rack)"
            )
        if level in seen:
            raise QueueConfigError(
                f"topology[{index}]: level {level!r} is listed twice (already topology[{seen[level]}])"
            )
        seen[level] = index


def check_references(config: QueueConfig) -> None:
    """Everything one field cannot check alone; raises ``QueueConfigError`` naming the field."""
    if not config.tenants:
        raise QueueConfigError("tenants: at least one tenant is required")
    _unique(config.cohorts, "cohorts", "cohort")
    _unique(config.tenants, "tenants", "tenant")
    _unique(config.priority_classes, "priority_classes", "priority class")
    check_flavors(config)
    check_cohorts(config.cohorts)
    cohorts = {c.name for c in config.cohorts}
    for index, tenant in enumerate(config.tenants):
        if tenant.cohort is not None and tenant.cohort not in cohorts:
            known = f"cohorts: {_names(config.cohorts)}" if config.cohorts else "no cohorts are defined"
            raise QueueConfigError(f"tenants[{index}].cohort: unknown cohort {tenant.cohort!r} ({known})")
        check_limits(index, tenant, tenant_flavors(config, tenant))
        check_allowed_classes(index, tenant, config.priority_classes)
    check_levels(config.topology)
    default = config.policy.default_priority
    if default is not None and default not in {p.name for p in config.priority_classes}:
        known = _names(config.priority_classes) or "none are defined"
        raise QueueConfigError(
            f"policy.default_priority: unknown priority class {default!r} (priority classes: {known})"
        )
