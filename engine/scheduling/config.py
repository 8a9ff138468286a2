"""The queue configuration: tenants, cohorts, quotas, priority classes and the preemption policy.

One YAML file, in the shape Kueue users know (``examples/queues.yaml`` is a commented example)::

    cohorts: [{name: research}]
    tenants:
      - {name: team-a, cohort: research, weight: 1, quota: {gpu: 2, cpu: 16, mem: 64Gi}, priority_classes: [low]}
    priority_classes: [{name: low, value: 10}, {name: high, value: 100, preemptible: false}]
    policy: {min_runtime: 60s, preemption_grace: 120s, max_pending: 1000, usage_half_life: 7d}
    flavors: [{name: h100, node_labels: {gpu: h100}}, {name: spot-l4, node_labels: {gpu: l4}, taints: [spot]}]
    topology: [block, rack]

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
  that is unset. A tenant's ``priority_classes: [low, ...]`` lists the classes its runs and tasks may
  name (absent: every class; ``[]``: none, only the default a gang gets by naming none); a gang naming
  another is rejected, and the client refuses such a run before it starts.
- **Lent capacity is always reclaimable.** A gang that is not preemptible (its class, or its task's
  ``Gang(preemptible=False)``) is admitted only within its tenant's nominal quota: a tenant's protected
  gangs together never hold more than its nominal quota, so whatever it borrows is held by gangs that
  can be preempted, and reclaim (below) can always take it back (under ``reclaim_within_cohort: any``,
  the default; ``lower_priority`` lets a borrower of a higher class keep it, as in Kueue: allow such a
  class only to the tenants that may).
- **max_pending** — how many gangs a tenant may have waiting at once (``policy.max_pending``, default
  1,000; a tenant's own ``max_pending`` wins). One more is rejected, naming the cap; a preempted gang
  coming back is never refused for it.
- **Policy knobs** — ``reclaim_within_cohort`` (``never`` | ``lower_priority`` | ``any``: which lent-out
  gangs a tenant may preempt to get back to its nominal quota), ``within_tenant`` (``never`` |
  ``lower_priority``: whether a tenant's gang may preempt its own lower-priority gangs), ``min_runtime``
  (no gang is preempted before it has run this long), ``checkpoint_wait`` (a victim whose next checkpoint
  is expected within this long, from the interval of its last two, is preempted just after it: it then
  loses next to nothing; default 0, off; ``engine.scheduling.lost_work``), ``preemption_grace`` (time
  between the notice and the kill, carried in every preemption decision; the node agents do not honour it
  yet and give 5 s),
  ``backfill`` (smaller gangs may use idle GPUs while a bigger one waits; they are preemptible and
  reclaimed when the big one fits), ``usage_half_life`` (fair share with memory, below).
- **usage_half_life** — fair share remembers: a tenant's share also counts its recent usage above nominal
  (GPU-seconds and the other resources it is measured on), each second of it weighing
  ``2^(-age / usage_half_life)`` (Slurm's ``PriorityDecayHalfLife``, Kueue's admission fair sharing). So a
  tenant that used the whole cluster yesterday yields today to one that did not. Absent (the default):
  the share counts current usage only. The history lives in the Scheduler's state, on its clock, and
  survives continue-as-new and a new configuration (which drops it when the key is removed). See
  ``engine.scheduling.usage_decay``.

- **Flavors** (Kueue's ResourceFlavor): ``flavors: [{name: h100, node_labels: {gpu: h100}, taints: [spot]}]``
  names kinds of nodes by the labels their agents report (``gangflow node --labels``). A tenant's
  ``quota`` is then either per flavor, ``{h100: {gpu: 8}, a100: {gpu: 16, cpu: 128}}`` (it may use only
  the flavors it names, in that order of preference), or today's ``{gpu: 8}``, which then holds on *each*
  declared flavor (as no ``quota`` at all means unlimited on each), in the file's order of flavors.
  ``borrowing_limit`` and ``lending_limit`` hold per flavor the same way (flat: the same on each flavor).
  Quota, borrowing, lending and reclaim are per flavor: a cohort pools each flavor apart. A gang is
  admitted on one flavor; which, and what a flavor's ``taints`` and a gang's node selector do, is
  ``engine.scheduling.flavors``. No ``flavors:`` (the default): one implicit flavor that every node
  belongs to, and every decision is what it was before flavors existed.
- **flavor_fungibility** (``policy``), Kueue's knobs, with Kueue's defaults: ``when_can_borrow: borrow``
  (a gang takes its first flavor even if that means borrowing idle capacity there: the tenant's order of
  preference wins over staying within quota; ``try_next_flavor`` looks for a later flavor within quota
  first) and ``when_can_preempt: try_next_flavor`` (before preempting anyone on its first flavor, a gang
  looks for a later flavor where it starts without preempting: destroying work is the last resort;
  ``preempt`` preempts on the first flavor that allows it).
- **topology** — the topology levels, outermost first, each a node label key (``[block, rack]``: nodes with
  the same ``rack`` label are one rack). The node itself is the innermost level, ``host``, always there
  and never listed. A gang asks for one level (``Topology(required="rack")`` or ``preferred="rack"``):
  required puts all its nodes in one domain of that level or it waits, preferred spans as few domains as
  the policy finds now. A node without a level's label is in no domain of that level: a gang requiring
  that level never runs there. See ``engine.scheduling.topology``.

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

import math
import pathlib
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, PrivateAttr, Tag, ValidationError, field_validator, model_validator

from engine.core.protocol import check_tenant
from engine.errors import QueueConfigError
from engine.scheduling.config_checks import check_references, for_flavor, tenant_flavors
from engine.scheduling.config_errors import explain
from engine.scheduling.config_yaml import AMOUNT_FIELDS, WrittenCpus, mark_written_cpus, read_queue_source
from engine.scheduling.model import Frozen
from engine.scheduling.units import MILLI, parse_cpu, parse_duration, parse_gpu, parse_mem

__all__ = [
    "DEFAULT_MAX_PENDING",
    "DEFAULT_PRIORITY",
    "DEFAULT_QUEUE_CONFIG",
    "CohortConfig",
    "FlavorConfig",
    "FlavorFungibility",
    "PolicyConfig",
    "PriorityClass",
    "QueueConfig",
    "QueueConfigError",
    "ResourceAmounts",
    "TenantAmounts",
    "TenantConfig",
    "dump_queue_config",
    "for_flavor",
    "load_queue_config",
]

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_RESOURCES = ("gpu", "cpu", "mem")


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
        if isinstance(value, WrittenCpus):
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


def _amounts_kind(value: object) -> str:
    """Which of the two shapes a quota or limit is written in: per resource (``{gpu: 8}``) or per flavor
    (``{h100: {gpu: 8}}``: every value a mapping). The tags never show in an error (``config_errors``)."""
    if isinstance(value, ResourceAmounts):
        return "ResourceAmounts"
    if (
        isinstance(value, Mapping)
        and value
        and not set(value) <= set(_RESOURCES)  # ``{mem: {...}}`` is a bad amount, not a flavor named mem
        and all(isinstance(v, Mapping | ResourceAmounts) for v in value.values())
    ):
        return "PerFlavor"
    return "ResourceAmounts"


#: a tenant's quota or limit: per resource (no flavors, or the same on each flavor), or per flavor
TenantAmounts = Annotated[
    Annotated[ResourceAmounts, Tag("ResourceAmounts")] | Annotated[dict[str, ResourceAmounts], Tag("PerFlavor")],
    Discriminator(_amounts_kind),
]


class FlavorConfig(Frozen):
    """A kind of node (Kueue's ResourceFlavor): the nodes whose labels carry all of ``node_labels``; a gang
    goes on a flavor with ``taints`` only if it tolerates every one of them (``Resources(tolerations=...)``)."""

    name: str
    node_labels: dict[str, str] = Field(default_factory=dict)
    taints: tuple[str, ...] = ()

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if value in _RESOURCES:  # a quota ``{gpu: {...}}`` would read as a bad amount, not as this flavor
            raise ValueError(f"flavor name {value!r} is the name of a resource; call it e.g. '{value}-pool'")
        return _check_label(value, "flavor name")

    @field_validator("taints")
    @classmethod
    def _taints(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for taint in value:
            if not taint or any(c.isspace() for c in taint):
                raise ValueError(f"taint {taint!r} must be non-empty and contain no spaces")
        return value


class FlavorFungibility(Frozen):
    """What a gang does when its first flavor would need borrowing or preemption (Kueue's flavorFungibility;
    the module docstring says why these defaults)."""

    when_can_borrow: Literal["borrow", "try_next_flavor"] = "borrow"
    when_can_preempt: Literal["preempt", "try_next_flavor"] = "try_next_flavor"


class CohortConfig(Frozen):
    """A group of tenants that lend each other idle quota; ``parent`` nests it under another cohort."""

    name: str
    parent: str | None = None

    @field_validator("name", "parent")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        return None if value is None else _check_label(value, "cohort name")


class TenantConfig(Frozen):
    """One team: nominal quota, cohort, borrowing and lending limits, fair-share weight, the priority classes
    it may name (None: every class) and its cap on pending gangs (None: ``policy.max_pending``)."""

    name: str
    cohort: str | None = None
    weight: float = 1.0
    quota: TenantAmounts = ResourceAmounts()
    borrowing_limit: TenantAmounts | None = None
    lending_limit: TenantAmounts | None = None
    priority_classes: tuple[str, ...] | None = None
    max_pending: int | None = None

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

    @field_validator("max_pending", mode="before")
    @classmethod
    def _max_pending(cls, value: object) -> object:
        return value if value is None else _check_count(value)


def _check_count(value: object) -> object:
    _check_number(value, "an integer >= 0")
    if isinstance(value, int) and value < 0:
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
#: how many gangs a tenant may have waiting at once unless the configuration says otherwise
DEFAULT_MAX_PENDING = 1000


class PolicyConfig(Frozen):
    """The preemption and backfill knobs (see the module docstring); durations are seconds."""

    reclaim_within_cohort: Literal["never", "lower_priority", "any"] = "any"
    within_tenant: Literal["never", "lower_priority"] = "lower_priority"
    min_runtime: float = 60.0
    preemption_grace: float = 120.0
    #: seconds; a victim whose next checkpoint is expected within it is preempted just after it (0: off)
    checkpoint_wait: float = 0.0
    backfill: bool = True
    default_priority: str | None = None
    max_pending: int = DEFAULT_MAX_PENDING
    #: seconds; None: fair share counts the usage of now only (engine.scheduling.usage_decay)
    usage_half_life: float | None = None
    flavor_fungibility: FlavorFungibility = FlavorFungibility()

    @field_validator("min_runtime", "preemption_grace", "checkpoint_wait", mode="before")
    @classmethod
    def _duration(cls, value: object) -> float:
        return parse_duration(value)

    @field_validator("usage_half_life", mode="before")
    @classmethod
    def _half_life(cls, value: object) -> float | None:
        if value is None:
            return None
        # 0 would forget at once and no decay at all never forgets: leave the key out for today's share
        positive = f"must be a duration > 0 like '7d', '12h' or 3600, got {value!r} (leave it out for no memory)"
        try:
            seconds = parse_duration(value)
        except ValueError as error:
            if str(error).startswith("must be >= 0"):
                raise ValueError(positive) from None
            raise
        if not math.isfinite(seconds) or seconds <= 0:
            raise ValueError(positive)
        return seconds

    @field_validator("max_pending", mode="before")
    @classmethod
    def _max_pending(cls, value: object) -> object:
        return _check_count(value)


class QueueConfig(Frozen):
    """The whole configuration. Constructing one checks every cross-reference (see ``_check_references``)."""

    cohorts: tuple[CohortConfig, ...] = ()
    tenants: tuple[TenantConfig, ...]
    priority_classes: tuple[PriorityClass, ...] = ()
    policy: PolicyConfig = PolicyConfig()
    flavors: tuple[FlavorConfig, ...] = ()
    #: topology levels, outermost first, each a node label key (``engine.scheduling.topology``)
    topology: tuple[str, ...] = ()

    # lookups the policy does on every event: built once, never part of the data
    _tenants: dict[str, TenantConfig] = PrivateAttr(default_factory=dict)
    _priorities: dict[str, PriorityClass] = PrivateAttr(default_factory=dict)
    _roots: dict[str, str | None] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> QueueConfig:
        check_references(self)
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

    def tenant_flavors(self, name: str) -> tuple[str, ...]:
        """The flavors the tenant may use, in its order of preference: those its per-flavor quota names, else
        every declared flavor in the file's order; () without flavors (or for an unknown tenant)."""
        entry = self._tenants.get(name)
        return () if entry is None else tenant_flavors(self, entry)

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

    def allows(self, tenant: str, priority: str | None) -> bool:
        """Whether the tenant may name the priority class (None, naming none, always may: it gets the default)."""
        entry = self._tenants.get(tenant)
        allowed = entry.priority_classes if entry is not None else None
        return priority is None or allowed is None or priority in allowed

    def max_pending(self, tenant: str) -> int:
        """How many gangs the tenant may have waiting at once: its own ``max_pending``, else the policy's."""
        entry = self._tenants.get(tenant)
        own = entry.max_pending if entry is not None else None
        return self.policy.max_pending if own is None else own


#: one tenant "default" with no quota: every gang is admitted in FIFO order, as before tenancy existed
DEFAULT_QUEUE_CONFIG = QueueConfig(tenants=(TenantConfig(name="default"),))


# --- reading and writing (the YAML itself: engine.scheduling.config_yaml; its errors: config_errors) -------


def load_queue_config(source: str | pathlib.Path | Mapping[str, Any]) -> QueueConfig:
    """Read and check a queue configuration: YAML text, a YAML file (a ``Path``), or a mapping.

    Raises ``QueueConfigError`` (never a raw pydantic or YAML error) whose message starts with the field at
    fault; all field errors are listed, one per line.
    """
    data = read_queue_source(source)  # engine.scheduling.config_yaml
    try:
        return QueueConfig.model_validate(mark_written_cpus(data))
    except ValidationError as error:
        # field errors start with the field path (not the file name): callers can add the file themselves
        raise QueueConfigError(explain(error, QueueConfig)) from None


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
    if not config.flavors:  # a configuration without flavors dumps as before they existed
        del dumped["flavors"]
    if config.policy.flavor_fungibility == FlavorFungibility():
        del dumped["policy"]["flavor_fungibility"]
    if not dumped.get("topology"):  # absent, as before topology existed (snapshots stay byte for byte)
        dumped.pop("topology", None)
    for tenant in dumped["tenants"]:
        for field in AMOUNT_FIELDS:
            amounts = tenant.get(field)
            per_flavor = isinstance(getattr(config.tenant(tenant["name"]), field), dict)
            for each in (amounts or {}).values() if per_flavor else [amounts]:
                if each is not None and "cpu" in each:
                    each["cpu"] = _cpu_quantity(each["cpu"])
    return dumped
