"""Where a distributed task's nodes may be: ``Topology``, a task's placement option, and topology level names.

A topology level is a node label key the queue file's ``topology: [block, rack]`` declares (outermost first);
nodes with the same value of it form one *topology domain* (one rack). The node itself is the innermost level,
``host`` (Kueue's ``kubernetes.io/hostname``), implicit and never declared. The scheduler's side is
``engine.scheduling.topology``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta

__all__ = ["HOST_LEVEL", "Topology", "label_key_problem"]

#: the innermost topology level: the node itself (every node is a domain of its own)
HOST_LEVEL = "host"

# a Kubernetes label key: an optional DNS-subdomain prefix and "/", then a name of at most 63 characters,
# alphanumerics with "-", "_", "." inside
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def label_key_problem(key: object) -> str | None:
    """What is wrong with ``key`` as a node label key (a topology level), or None."""
    if not isinstance(key, str):
        return f"must be a node label key (a string), got {type(key).__name__} {key!r}"
    prefix, _, name = key.rpartition("/")
    if not key or not name:
        return f"must be a non-empty node label key, got {key!r}"
    if len(name) > 63 or not _NAME.fullmatch(name) or (prefix and (len(prefix) > 253 or not _PREFIX.fullmatch(prefix))):
        return (
            f"{key!r} is not a node label key (letters, digits, '-', '_' and '.', at most 63 characters, "
            "optionally after a DNS prefix and '/', as 'rack' or 'example.com/rack')"
        )
    return None


@dataclass(frozen=True)
class Topology:
    """A distributed task's placement: ``Topology(required="rack")`` puts all its nodes in one domain of that
    level (one rack) or it waits; ``Topology(preferred="block")`` spans as few domains of it as the scheduler
    finds free now. Exactly one of them; the level is a node label key the queue file's ``topology`` declares
    (or ``host``, the node itself). A level the queue file does not declare is rejected when the gang is
    submitted, naming the declared ones.

    ``wait`` (with ``preferred`` only; seconds or a timedelta, stored as a timedelta): once the gang could
    start over several domains but not in one, it waits up to that long for one, as a required gang waits,
    then takes several (Slurm's ``--switches=1@<max-time>``). None: it never waits for one."""

    required: str | None = None
    preferred: str | None = None
    wait: float | timedelta | None = None

    def __post_init__(self) -> None:
        if (self.required is None) == (self.preferred is None):
            raise ValueError(
                "Topology needs exactly one of required= or preferred= (a topology level such as 'rack'), "
                f"got required={self.required!r}, preferred={self.preferred!r}"
            )
        which = "required" if self.required is not None else "preferred"
        problem = label_key_problem(getattr(self, which))
        if problem is not None:
            raise ValueError(f"Topology.{which}: {problem}")
        wait = self.wait
        if wait is None:
            return
        if self.required is not None:
            raise ValueError("Topology.wait applies to preferred= only: a required gang waits for its domain anyway")
        if isinstance(wait, bool) or not isinstance(wait, int | float | timedelta):
            raise ValueError(f"Topology.wait must be seconds or a timedelta, got {wait!r}")
        delta = wait if isinstance(wait, timedelta) else timedelta(seconds=wait)
        if delta <= timedelta(0):
            raise ValueError(f"Topology.wait must be positive, got {wait!r}")
        object.__setattr__(self, "wait", delta)

    @property
    def wait_s(self) -> float | None:
        """``wait`` in seconds (None: it never waits for one domain)."""
        wait = self.wait
        if wait is None:
            return None
        return wait.total_seconds() if isinstance(wait, timedelta) else float(wait)

    @property
    def level(self) -> str:
        """The level it names (required or preferred)."""
        return self.required if self.required is not None else str(self.preferred)
