"""The gang of one distributed task call (``GangSpec``, what the run's workflow hands GangTask) and the gang
request GangTask submits for it to the Scheduler (``gang_request``), with the failure a submit ends in when no
Scheduler ever answers. Workflow code: temporalio.workflow's world and the pure packages only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from temporalio.exceptions import ApplicationError

from engine.core.gang import GangShape, rank_files_key
from engine.core.resources import Retry
from engine.scheduling import DEFAULT_LOST_NODE_WAIT_S, GangRequest

__all__ = ["GangSpec", "gang_request", "no_scheduler"]

_FLEET_FIELDS = (
    "flavors",
    "node_selector",
    "tolerations",
    "topology_required",
    "topology_preferred",
    "topology_wait_s",
)


@dataclass(frozen=True)
class GangSpec:
    """The *gang* of one distributed task call, as the run's workflow hands it to GangTask: the task's layout
    (``shape``) and its limits. GangTask submits it to the Scheduler as a gang request (``gang_request``)."""

    task: str
    call: str  # unique per task call within the run, e.g. "train-1": names logs and checkpoints
    shape: GangShape  # the task's layout: nodes, ranks per node, what each node offers
    timeout_s: float
    heartbeat_timeout_s: float
    tenant: str
    max_restarts: int = 3
    user_attempts: int = 1
    retry_backoff_s: float = 1.0
    hang_timeout_s: float | None = None
    retry_max_interval_s: float | None = None
    non_retryable: list[str] = field(default_factory=list)
    lost_node_wait_s: float = DEFAULT_LOST_NODE_WAIT_S
    priority: str | None = None  # a priority class name: the task's own, else the run's
    preemptible: bool = True  # False (the task's own): never preempted, whatever its class says
    preemption_grace_s: float | None = None  # the task's own grace; None: the cluster's (in the notice)
    # where its nodes may be (``Resources(flavor=, node_selector=, tolerations=)``); empty: anywhere its tenant's
    # quota reaches. Lists, not tuples: what the payload converter reads back the same
    flavors: list[str] = field(default_factory=list)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[str] = field(default_factory=list)
    topology_required: str | None = None  # the task's ``placement=Topology(required=...)``: one domain of it
    topology_preferred: str | None = None  # ``Topology(preferred=...)``: as few domains of it as can be
    topology_wait_s: float | None = None  # ``Topology(wait=...)``: how long it waits for one domain of it
    # the sub-workflow that calls it, as its id below the run's ("prep-1"; "" in the run's own workflow): a
    # call id counts per workflow, so a sub-workflow's train-1 and its run's train-1 need their own checkpoints
    scope: str = ""
    # who started the run (its ``gangflow_user`` memo): fair share's ordering key within its tenant; "": none
    user: str = ""

    @property
    def checkpoint_key(self) -> str:
        """Its checkpoints' folder below the run's: the call id, under its sub-workflow's id where it has one."""
        return f"{self.scope}/{self.call}" if self.scope else self.call

    @property
    def files_key(self) -> str:
        """The name its rank logs and saved rank reports go by in the run's store (``rank_files_key``)."""
        return rank_files_key(self.scope, self.call)

    @property
    def retry(self) -> Retry:
        return Retry(
            attempts=self.user_attempts,
            backoff=self.retry_backoff_s,
            max_interval=self.retry_max_interval_s,
            non_retryable=tuple(self.non_retryable),
        )


def gang_request(spec: GangSpec, gang_id: str) -> dict[str, Any]:
    """The gang request this gang submits, as the Scheduler's ``submit`` signal carries it."""
    try:
        request = GangRequest(
            gang_id=gang_id,
            nnodes=spec.shape.nnodes,
            gpus_per_node=spec.shape.gpus_per_node,
            cpus_per_node=spec.shape.cpus_per_node,
            mem_per_node=spec.shape.mem_per_node,
            tenant=spec.tenant,
            priority=spec.priority,
            preemptible=spec.preemptible,
            lost_node_wait_s=spec.lost_node_wait_s,
            flavors=tuple(spec.flavors),
            node_selector=dict(spec.node_selector),
            tolerations=tuple(spec.tolerations),
            topology_required=spec.topology_required,
            topology_preferred=spec.topology_preferred,
            topology_wait_s=spec.topology_wait_s,
            user=spec.user,
        )
    except ValidationError as exc:
        raise ApplicationError(f"a malformed gang request: {exc}", type="Unschedulable", non_retryable=True) from None
    # only when set: a request without them is what a Scheduler from before priorities accepts
    unset = {"priority"} if spec.priority is None else set()
    if spec.preemptible:
        unset.add("preemptible")
    # fleet fields (flavors, selectors, topology) likewise: a request that names none keeps its old payload
    unset.update(name for name in _FLEET_FIELDS if not getattr(request, name))
    if not spec.user:  # and a run with no user (started before users, or by a client with no login name)
        unset.add("user")
    return request.model_dump(mode="json", exclude=unset)


def no_scheduler(spec: GangSpec) -> ApplicationError:
    return ApplicationError(
        f"no gangflow Scheduler ran within {spec.lost_node_wait_s:g} s: the worker of the platform's queue starts "
        "it ('gangflow worker', not a tenant's; 'gangflow dev')",
        type="Unschedulable",
        non_retryable=True,
    )
