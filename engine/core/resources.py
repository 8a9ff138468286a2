"""Resource requests and retry policies: frozen value objects used as task options."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from engine.core.labels import check_label, check_name

__all__ = ["MEMORY_UNITS", "NEVER_RETRIED", "Resources", "Retry", "parse_memory", "to_timedelta"]

#: failure types that no retry can fix (gangflow's own error kinds, and code that cannot be found)
NEVER_RETRIED = (
    "TypeMismatch",
    "InputError",
    "PayloadTooLarge",
    "DefinitionError",
    "CodeNotFound",
    "SecretNotFound",
    "SecretError",
)

#: memory suffixes, case-insensitive, to bytes (decimal and binary, as Kubernetes quantities)
MEMORY_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "ki": 2**10,
    "kib": 2**10,
    "m": 10**6,
    "mb": 10**6,
    "mi": 2**20,
    "mib": 2**20,
    "g": 10**9,
    "gb": 10**9,
    "gi": 2**30,
    "gib": 2**30,
    "t": 10**12,
    "tb": 10**12,
    "ti": 2**40,
    "tib": 2**40,
}


def parse_memory(value: int | str | None) -> int | None:
    """Bytes from ``4Gi``, ``512M``, ``1_000_000`` or an int (Kubernetes-style quantities)."""
    if value is None or isinstance(value, int):
        return value
    match = re.fullmatch(r"\s*([0-9_.]+)\s*([a-zA-Z]*)\s*", value)
    if not match or match.group(2).lower() not in MEMORY_UNITS:
        raise ValueError(f"memory {value!r} is not a quantity like '512Mi', '4G' or a number of bytes")
    return int(float(match.group(1)) * MEMORY_UNITS[match.group(2).lower()])


def to_timedelta(value: float | int | timedelta | None, what: str) -> timedelta | None:
    """Seconds or a timedelta, validated to be positive."""
    if value is None:
        return None
    delta = value if isinstance(value, timedelta) else timedelta(seconds=float(value))
    if delta <= timedelta(0):
        raise ValueError(f"{what} must be positive, got {value!r}")
    return delta


@dataclass(frozen=True)
class Resources:
    """What one task call (or one rank of a distributed task) needs.

    ``mem`` accepts Kubernetes-style quantities (``"4Gi"``) and is stored in bytes.

    Where a distributed task's nodes may be (a plain task runs on a worker's CPU queue and may name none):
    ``flavor`` one flavor of the queue file (``"h100"``) or several, any of them, tried in the order given
    (``["h100", "a100"]``; kept as a tuple); ``node_selector`` labels every node of the gang must carry
    (``{"zone": "a"}``); ``tolerations`` the taints of flavors it accepts (``["spot"]``). Checked here
    against Kubernetes' name and label syntax; whether the cluster has them, when the run starts.
    """

    cpu: float = 1
    mem: int | str | None = None
    gpu: int = 0
    flavor: str | tuple[str, ...] | None = None
    # a dict is not hashable: two Resources with equal selectors still compare equal
    node_selector: Mapping[str, str] | None = field(default=None, hash=False)
    tolerations: Sequence[str] = ()

    def __post_init__(self) -> None:
        if self.cpu <= 0:
            raise ValueError(f"Resources.cpu must be positive, got {self.cpu!r}")
        if not isinstance(self.gpu, int) or self.gpu < 0:
            raise ValueError(f"Resources.gpu must be a non-negative int, got {self.gpu!r}")
        object.__setattr__(self, "mem", parse_memory(self.mem))
        object.__setattr__(self, "flavor", _flavor(self.flavor))
        object.__setattr__(self, "node_selector", _selector(self.node_selector))
        object.__setattr__(self, "tolerations", _tolerations(self.tolerations))

    @property
    def flavors(self) -> tuple[str, ...]:
        """The flavors asked for, in order (empty: any the tenant has)."""
        flavor = self.flavor
        return () if flavor is None else (flavor,) if isinstance(flavor, str) else tuple(flavor)

    @property
    def placed(self) -> bool:
        """Whether it says where its nodes may be (a flavor, a node selector or a toleration)."""
        return bool(self.flavor is not None or self.node_selector or self.tolerations)

    @property
    def mem_bytes(self) -> int | None:
        assert self.mem is None or isinstance(self.mem, int)
        return self.mem


def _flavor(value: object) -> str | tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return check_name(value, "Resources.flavor")
    if not isinstance(value, Sequence) or not value:
        raise ValueError(
            f"Resources.flavor must be a flavor's name or a non-empty list of them (any of, in order), got {value!r}"
        )
    names = tuple(check_name(v, "Resources.flavor") for v in value)
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"Resources.flavor names {', '.join(map(repr, twice))} more than once: {list(names)!r}")
    return names


def _selector(value: object) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError(f"Resources.node_selector must be a dict of node labels, e.g. {{'zone': 'a'}}, got {value!r}")
    try:
        return dict(check_label(k, v) for k, v in value.items())
    except ValueError as exc:
        raise ValueError(f"Resources.node_selector: {exc}") from None


def _tolerations(value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ValueError(f"Resources.tolerations must be a list of taints, e.g. ['spot'], got {value!r}")
    for taint in value:  # as the queue file's flavors write taints: any word (``spot``, ``nvidia.com/gpu``)
        if not isinstance(taint, str) or not taint or any(c.isspace() for c in taint):
            raise ValueError(f"Resources.tolerations: taint {taint!r} must be a non-empty string without spaces")
    return tuple(value)


@dataclass(frozen=True)
class Retry:
    """Retry policy of a task for *user* errors (an exception raised by the task body).

    ``attempts`` counts every try, the first included (``Retry(attempts=3)`` = up to 2 retries);
    ``retries=N`` on ``@task`` means ``Retry(attempts=N + 1)``. The wait before retry k is
    ``backoff * 2**(k-1)`` capped at ``max_interval``. ``non_retryable`` names exception types
    (classes or their names) that fail the task at once. Type mismatches are never retried.
    System failures (a worker that died mid-task) are retried separately and do not spend this budget.
    """

    attempts: int = 1
    backoff: float | timedelta = 1.0
    max_interval: float | timedelta | None = None
    non_retryable: tuple[str | type[BaseException], ...] = field(default=())

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or self.attempts < 1:
            raise ValueError(f"Retry.attempts must be an int >= 1, got {self.attempts!r}")
        object.__setattr__(self, "backoff", to_timedelta(self.backoff, "Retry.backoff"))
        object.__setattr__(self, "max_interval", to_timedelta(self.max_interval, "Retry.max_interval"))
        object.__setattr__(self, "non_retryable", tuple(self.non_retryable))

    @property
    def non_retryable_names(self) -> tuple[str, ...]:
        return tuple(n if isinstance(n, str) else n.__name__ for n in self.non_retryable)

    def retries(self, error_type: str | None, failures: int) -> bool:
        """Whether a failure of ``error_type`` (an exception's type name or gangflow error kind), the
        ``failures``-th user failure of this call, is tried again."""
        if failures >= self.attempts:
            return False
        return error_type not in (*NEVER_RETRIED, *self.non_retryable_names)

    def delay(self, failures: int) -> timedelta:
        """The wait before the next try after ``failures`` user failures: exponential, capped."""
        backoff = self.backoff if isinstance(self.backoff, timedelta) else timedelta(seconds=float(self.backoff))
        wait: timedelta = backoff * 2 ** max(0, failures - 1)
        cap = self.max_interval
        return min(wait, cap) if isinstance(cap, timedelta) else wait

    @classmethod
    def coerce(cls, value: int | Retry | None) -> Retry:
        if value is None:
            return cls()
        if isinstance(value, Retry):
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"retries must be a non-negative int or a Retry, got {value!r}")
        return cls(attempts=value + 1)
