"""Where a run's gangs may go, checked against the cluster before the run starts: a flavor its queue
configuration does not declare, node labels no registered node carries, a topology level it does not declare.

Each would leave the gang pending for ever; refused at start (``TenancyError``, ``gangflow run`` exits 2), the
message names what exists. The tasks are those ``workflow_tasks`` finds in the workflow's code; a task reached
another way is judged by the Scheduler only, when its gang asks for a placement.

What the checks read: the Scheduler's ``queues`` answer (its ``config``: ``flavors``, ``topology``) and, only
when some task has a node selector, its ``describe`` answer (each node's ``labels``). In a tenant's namespace
of the isolated layout the tenant's look through its Nexus endpoint answers instead
(engine.scheduling.tenant_view): the flavors and topology levels by name, and the nodes' distinct label sets
without the nodes (``label_sets``). A Scheduler that cannot be asked lets the run through: the platform judges
its gangs when they ask for a placement.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from engine.core.definitions import TaskDefinition, WorkflowDefinition
from engine.core.labels import format_labels

from ._prepare import TenancyError, workflow_tasks

__all__ = ["check_fleet", "fleet_asks", "fleet_facts", "label_sets", "topology_levels"]

#: at most this many distinct labels are named in a refusal (a thousand-node cluster has many hostnames)
_MAX_NAMED = 24


def topology_levels(task: TaskDefinition) -> list[str]:
    """The topology levels a task's ``placement=Topology(required=..., preferred=...)`` names. The hook for
    the option engine/core defines: read by attribute, so a definition without it names none."""
    placement = getattr(task, "placement", None)
    return [
        level for level in (getattr(placement, a, None) for a in ("required", "preferred")) if isinstance(level, str)
    ]


def fleet_asks(defn: WorkflowDefinition) -> dict[str, TaskDefinition]:
    """The distributed tasks of the workflow that say where their nodes may be (a flavor, a node selector, a
    toleration, a topology level)."""
    return {
        name: task
        for name, task in workflow_tasks(defn).items()
        if task.gang is not None and (task.resources.placed or topology_levels(task))
    }


def fleet_facts(queues: Mapping[str, Any] | None) -> tuple[list[str] | None, list[str] | None]:
    """(flavor names, topology levels) of the cluster, from a ``queues`` answer (the Scheduler's, with its
    ``config``; a tenant's look, with ``flavors`` and ``topology``). None for what it cannot tell (a Scheduler
    from before flavors says nothing of them); no answer at all (no Scheduler): none declared."""
    if queues is None:
        return [], []
    config = queues.get("config")
    source = config if isinstance(config, Mapping) else queues
    if "flavors" not in source and not isinstance(config, Mapping):
        return None, None
    flavors = [str(f.get("name")) for f in source.get("flavors") or [] if isinstance(f, Mapping)]
    flavors += [f for f in source.get("flavors") or [] if isinstance(f, str)]  # a tenant's look: names only
    topology = source.get("topology")
    return flavors, [str(level) for level in topology] if isinstance(topology, list) else []


def label_sets(nodes: Iterable[Mapping[str, Any]]) -> list[dict[str, str]]:
    """The distinct label sets of the nodes of a ``describe`` answer (a node without labels carries none)."""
    out: list[dict[str, str]] = []
    for node in nodes:
        labels = node.get("labels")
        own = {str(k): str(v) for k, v in labels.items()} if isinstance(labels, Mapping) else {}
        if own not in out:
            out.append(own)
    return sorted(out, key=format_labels)


def _known(names: Iterable[str]) -> str:
    names = list(names)
    shown = ", ".join(names[:_MAX_NAMED]) + (f" and {len(names) - _MAX_NAMED} more" if len(names) > _MAX_NAMED else "")
    return shown or "none"


def check_fleet(
    asks: Mapping[str, TaskDefinition],
    flavors: list[str] | None,
    topology: list[str] | None,
    nodes: list[dict[str, str]] | None,
) -> None:
    """Refuse (TenancyError, naming what exists) a task asking for a flavor not in ``flavors``, a topology level
    not in ``topology``, or a node selector that no label set of ``nodes`` holds whole. None: not known, not
    checked."""
    for name, task in asks.items():
        who = f"task {name!r}"
        if flavors is not None:
            for flavor in task.resources.flavors:
                if flavor not in flavors:
                    declared = f"the cluster's flavors are {_known(flavors)}" if flavors else "it declares no flavors"
                    raise TenancyError(
                        f"{who} asks for flavor {flavor!r}, which the cluster's queue configuration does not declare: "
                        f"{declared} (flavors in the queue configuration; gangflow queues show)"
                    )
        if topology is not None:
            for level in topology_levels(task):
                if level not in topology:
                    declared = f"its levels are {_known(topology)}" if topology else "it declares none"
                    raise TenancyError(
                        f"{who} asks for topology level {level!r}, which the cluster's queue configuration does not "
                        f"declare: {declared} (topology in the queue configuration)"
                    )
        selector = task.resources.node_selector or {}
        if nodes is not None and selector and not any(selector.items() <= own.items() for own in nodes):
            carried = sorted({f"{k}={v}" for own in nodes for k, v in own.items()})
            missing = [f"{k}={v}" for k, v in sorted(selector.items()) if not any(own.get(k) == v for own in nodes)]
            what = (
                f"no registered node carries {', '.join(missing)}"
                if missing
                else "no registered node carries all of them"
            )
            there = f"the nodes' labels are {_known(carried)}" if nodes else "no node is registered"
            raise TenancyError(
                f"{who} asks for nodes labelled {format_labels(selector)}: {what}; {there} (gangflow cluster)"
            )
