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
from engine.core.placement import HOST_LEVEL

from ._prepare import TenancyError, workflow_tasks

__all__ = ["check_fleet", "fleet_asks", "fleet_facts", "label_sets", "own_flavors", "topology_levels"]

#: at most this many distinct labels are named in a refusal (a thousand-node cluster has many hostnames)
_MAX_NAMED = 24


def topology_levels(task: TaskDefinition) -> list[str]:
    """The topology level a task's ``placement=Topology(required=..., preferred=...)`` names (none without)."""
    return [] if task.placement is None else [task.placement.level]


def fleet_asks(defn: WorkflowDefinition) -> dict[str, TaskDefinition]:
    """The distributed tasks of the workflow that say where their nodes may be (a flavor, a node selector, a
    toleration, a topology level)."""
    return {
        name: task
        for name, task in workflow_tasks(defn).items()
        if task.gang is not None and (task.resources.placed or topology_levels(task))
    }


def fleet_facts(
    queues: Mapping[str, Any] | None, tenant: str
) -> tuple[list[str] | None, list[str] | None, list[str] | None]:
    """(flavor names, topology levels, the flavors ``tenant`` may use) of the cluster, from a ``queues`` answer
    (the Scheduler's, with its ``config``; a tenant's look, with ``flavors``, ``topology`` and ``own_flavors``).
    None for what it cannot tell (a Scheduler from before flavors says nothing of them; a tenant with a quota
    per resource may use every flavor); no answer at all (no Scheduler): none declared."""
    if queues is None:
        return [], [], None
    config = queues.get("config")
    source = config if isinstance(config, Mapping) else queues
    if "flavors" not in source and not isinstance(config, Mapping):
        return None, None, None
    flavors = [str(f.get("name")) for f in source.get("flavors") or [] if isinstance(f, Mapping)]
    flavors += [f for f in source.get("flavors") or [] if isinstance(f, str)]  # a tenant's look: names only
    topology = source.get("topology")
    levels = [str(level) for level in topology] if isinstance(topology, list) else []
    return flavors, levels, own_flavors(source, tenant)


def own_flavors(config: Mapping[str, Any], tenant: str) -> list[str] | None:
    """The flavors ``tenant`` may use where its quota is per flavor (``{h100: {gpu: 8}}``: those it names), from
    a dumped configuration or a tenant's look (``own_flavors``); None: every declared flavor."""
    if "own_flavors" in config:
        named = config["own_flavors"]
        return [str(f) for f in named] if isinstance(named, list) else None
    for entry in config.get("tenants") or []:
        if isinstance(entry, Mapping) and entry.get("name") == tenant:
            quota = entry.get("quota")
            if isinstance(quota, Mapping) and quota and all(isinstance(v, Mapping) for v in quota.values()):
                return [str(name) for name in quota]
    return None


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
    facts: tuple[list[str] | None, list[str] | None, list[str] | None],
    nodes: list[dict[str, str]] | None,
    tenant: str,
) -> None:
    """Refuse (TenancyError, naming what exists) a task asking for a flavor the cluster does not declare (or
    only flavors its ``tenant`` may not use), a topology level it does not declare, or a node selector that no
    label set of ``nodes`` holds whole. ``facts``: ``fleet_facts``; None for any part: not known, not checked."""
    flavors, topology, usable = facts
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
            asked = task.resources.flavors
            if usable is not None and asked and not set(asked) & set(usable):
                raise TenancyError(
                    f"{who} asks for flavor {' or '.join(map(repr, asked))}, which tenant {tenant!r} may not use: its "
                    f"quota names {_known(usable)} (tenants[].quota in the queue configuration; gangflow queues show)"
                )
        if topology is not None:
            for level in topology_levels(task):
                if level not in topology and level != HOST_LEVEL:
                    declared = f"its levels are {_known([*topology, HOST_LEVEL])}" if topology else "it declares none"
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
