"""What ``@task`` accepts: its keyword options, written once (:class:`TaskOptions`), and :class:`Gang`, the
options that only a distributed task has, grouped into one value checked where it is built.

    @task(plugin=PyTorch(nnodes=2), gang=Gang(max_restarts=1, hang_timeout=60, preemptible=False))

Before ``Gang`` the six gang options were keywords of ``@task`` of their own (``@task(max_restarts=1)``).
They keep working for one release: each one warns (DeprecationWarning, naming the new spelling) and is
mapped onto a ``Gang`` (:func:`gang_from_keywords`), so a task definition is the same either way.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypedDict

from engine.core.placement import Topology
from engine.core.resources import Resources, Retry, to_timedelta
from engine.core.secrets import Secret
from engine.errors import DefinitionError

__all__ = [
    "DEFAULT_LOST_NODE_WAIT",
    "DEFAULT_MAX_RESTARTS",
    "DEPRECATED_GANG_KEYWORDS",
    "MAX_PREEMPTION_GRACE",
    "Gang",
    "TaskOptions",
    "gang_from_keywords",
    "warn_deprecated_keywords",
]

#: system failures (a node lost, a rank killed from outside, a hung gang) a gang is relaunched after
DEFAULT_MAX_RESTARTS = 3
#: how long a gang waits for lost nodes to come back (a cluster restarting after maintenance)
DEFAULT_LOST_NODE_WAIT = timedelta(minutes=10)
#: a preempted gang holds GPUs that another gang waits for: a grace longer than a day is a mistake
MAX_PREEMPTION_GRACE = timedelta(days=1)
#: how Gang's own errors start; a task given the deprecated keywords names itself instead
_PREFIX = "Gang: "


@dataclass(frozen=True)
class Gang:
    """How a distributed task's gangs are restarted, watched, queued and preempted (``@task(gang=Gang(...))``,
    with ``plugin=`` only). Checked when it is built: a bad value raises a DefinitionError naming the option.

    ``max_restarts`` is the budget for *system* failures (a node lost, a rank killed from outside, a hung
    gang); each restart relaunches every rank from the latest checkpoint. An exception in the body is a user
    error and spends the task's ``retries`` instead.
    ``hang_timeout`` (seconds or a timedelta) treats a gang as hung when a rank has not called
    ``engine.report`` for that long (the clock starts at launch, so it must cover start-up too); off by default.
    ``lost_node_wait`` (default 10 min) is how long a gang that only lost nodes could hold waits for them to
    come back (a whole-cluster restart) before it fails as unschedulable.
    ``priority`` names the priority class of its gangs (one of the cluster's ``priority_classes``; checked when
    a run starts, since the classes belong to the cluster, not to the code); it wins over the run's
    ``--priority``. ``preemptible=False`` keeps its gangs from ever being preempted, whatever their class.
    ``preemption_grace`` is how long a preempted gang's ranks have to checkpoint and exit after the notice
    before they are killed (at most a day; default: the cluster's ``policy.preemption_grace``, 120 s); ranks
    that exit earlier release the GPUs at once.

    The durations are stored as timedeltas, whichever way they were given.
    """

    max_restarts: int = DEFAULT_MAX_RESTARTS
    hang_timeout: float | timedelta | None = None
    lost_node_wait: float | timedelta = DEFAULT_LOST_NODE_WAIT
    priority: str | None = None
    preemptible: bool = True
    preemption_grace: float | timedelta | None = None

    def __post_init__(self) -> None:
        try:
            hang = to_timedelta(self.hang_timeout, "hang_timeout")
            node_wait = to_timedelta(self.lost_node_wait, "lost_node_wait")
            grace = to_timedelta(self.preemption_grace, "preemption_grace")
        except (ValueError, TypeError) as exc:
            raise DefinitionError(f"{_PREFIX}{exc}") from None
        if node_wait is None:
            raise DefinitionError(f"{_PREFIX}lost_node_wait must be positive, got None")
        max_restarts, priority, preemptible = self.max_restarts, self.priority, self.preemptible
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
            raise DefinitionError(f"{_PREFIX}max_restarts must be a non-negative int, got {max_restarts!r}")
        # a class name as the queue configuration spells it: a stray space would only fail later, at run start
        if priority is not None and (not isinstance(priority, str) or not priority or priority != priority.strip()):
            raise DefinitionError(
                f"{_PREFIX}priority must name a priority class (a non-empty str without surrounding spaces), "
                f"got {priority!r}"
            )
        if not isinstance(preemptible, bool):
            raise DefinitionError(f"{_PREFIX}preemptible must be True or False, got {preemptible!r}")
        if grace is not None and grace > MAX_PREEMPTION_GRACE:
            raise DefinitionError(f"{_PREFIX}preemption_grace must be at most {MAX_PREEMPTION_GRACE}, got {grace}")
        object.__setattr__(self, "hang_timeout", hang)
        object.__setattr__(self, "lost_node_wait", node_wait)
        object.__setattr__(self, "preemption_grace", grace)


class TaskOptions(TypedDict, total=False):
    """The keyword options of ``@task`` (the one place its signature is written; see ``task``'s docstring)."""

    name: str | None
    version: str | None
    resources: Resources | None
    retries: int | Retry
    timeout: float | timedelta | None
    heartbeat_timeout: float | timedelta | None
    lightweight: bool
    plugin: Any
    gang: Gang | None
    placement: Topology | None
    secrets: Sequence[Secret] | None
    cache: bool
    cache_version: str | None
    # deprecated for one release, in favour of gang=Gang(...): still typed, so code using them type-checks
    max_restarts: int
    hang_timeout: float | timedelta | None
    lost_node_wait: float | timedelta | None
    priority: str | None
    preemptible: bool | None
    preemption_grace: float | timedelta | None


#: the former keywords of ``@task`` that are now fields of Gang (the same names)
DEPRECATED_GANG_KEYWORDS = (
    "max_restarts",
    "hang_timeout",
    "lost_node_wait",
    "priority",
    "preemptible",
    "preemption_grace",
)


def warn_deprecated_keywords(options: Mapping[str, object], stacklevel: int) -> dict[str, object]:
    """The deprecated gang keywords among ``options``, each warned about once; ``stacklevel`` as
    ``warnings.warn`` would take it in the caller (2: the caller's caller, the user's decorator line). None
    means "not given", as it did for the old keywords' defaults (max_restarts had none: it is checked)."""
    given = {k: options[k] for k in DEPRECATED_GANG_KEYWORDS if k in options}
    given = {k: v for k, v in given.items() if v is not None or k == "max_restarts"}
    for keyword in given:
        if options.get("plugin") is None and keyword == "max_restarts":
            # a plain task accepted max_restarts (and ignored it) before Gang: it still does, for one release
            message = "@task(max_restarts=...) is deprecated and has no effect on a task without plugin=: remove it"
        else:
            message = f"@task({keyword}=...) is deprecated: write @task(gang=Gang({keyword}=...))"
        warnings.warn(message, DeprecationWarning, stacklevel=stacklevel + 1)
    return given


def gang_from_keywords(owner: str, given: Mapping[str, Any]) -> Gang:
    """The Gang the deprecated keywords spell, its errors naming the task (the user wrote no ``Gang``)."""
    try:
        return Gang(**given)
    except DefinitionError as exc:
        raise DefinitionError(f"{owner}: {str(exc).removeprefix(_PREFIX)}") from None
