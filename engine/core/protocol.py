"""The wire protocol: every name the workflows, the client, the runtime and the node agents share.

Workflow types and ids, signal / query / update names, activity types, task queues, namespaces, search
attribute names and the one tenant-name rule live here once, so that the client and the CLI never import
``workflows/`` (and with it ``temporalio.workflow``) to get a constant, and a name cannot drift between
the side that sends and the side that receives. Pure: the standard library only, safe in the sandbox.

Every string here is on the wire (in histories, in running workflows, in operators' scripts): changing one
is a protocol break that recorded histories in ``tests/histories`` catch.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

__all__ = [
    "APPLY_QUEUES_UPDATE",
    "APPROVE_UPDATE",
    "ATTEMPTS_MEMO",
    "ATTEMPT_LEDGER",
    "BADPUT",
    "CACHE_HIT",
    "CACHE_LOOKUP",
    "CACHE_RECORD",
    "CHECKPOINTED_SIGNAL",
    "CLOSED_OWNERS",
    "DEFAULT_TENANT",
    "DESCRIBE_QUERY",
    "DRAIN_NODE_UPDATE",
    "GANGS_QUEUE_PREFIX",
    "GANGS_SERVICE",
    "GANG_GOODPUT",
    "GANG_PROGRESS_SIGNAL",
    "GANG_STATE_SIGNAL",
    "GANG_TYPE",
    "HOLD_LEASE",
    "INPUT_UPDATE",
    "KIND_ATTRIBUTE",
    "KIND_CALL",
    "KIND_GANG",
    "KIND_LEASE",
    "KIND_RUN",
    "KIND_SCHEDULER",
    "KIND_VIEW",
    "LEASED_NODES",
    "LEASE_CHECK_SIGNAL",
    "LEDGER_SIGNAL",
    "LEGACY_GANG_TYPE",
    "MAP_CHUNK_TYPE",
    "NODE_LEASE_TYPE",
    "NODE_LOST_SIGNAL",
    "NODE_MEMO",
    "NODE_QUERY",
    "NOTICE",
    "PENDING_SIGNAL",
    "PING",
    "PIPELINE_ATTRIBUTE",
    "PLACEMENT_SIGNAL",
    "PLATFORM_NAMESPACE",
    "PREEMPTED_TYPE",
    "PREEMPT_SIGNAL",
    "PROGRESS_QUERY",
    "QUEUES_QUERY",
    "REGISTER_NODE_SIGNAL",
    "REJECTED_SIGNAL",
    "RELEASE_SIGNAL",
    "REMOTE_COMMAND",
    "RESERVE_PORT",
    "RUNS_ONLY",
    "RUN_RANKS",
    "SCHEDULED_BY_ATTRIBUTE",
    "SCHEDULER_EVENTS_ENV",
    "SCHEDULER_ID",
    "SCHEDULER_TYPE",
    "STATUS_QUERY",
    "SUBMIT_SIGNAL",
    "TASK_QUEUE",
    "TENANT_ATTRIBUTE",
    "TENANT_MAX_LENGTH",
    "TENANT_UID_BASE",
    "TENANT_UID_SPAN",
    "TENANT_VIEW_PREFIX",
    "TENANT_VIEW_TYPE",
    "USER_MEMO",
    "TenantRoute",
    "TenantUser",
    "check_tenant",
    "gang_endpoint",
    "gangs_queue",
    "hashed_user",
    "hit_id",
    "lease_id",
    "node_queue",
    "parse_hit_id",
    "scheduler_input",
    "tenant_namespace",
    "tenant_of_namespace",
    "tenant_of_queue",
    "tenant_user",
]

# -- task queues, namespaces, search attributes ---------------------------------------------------
#: the queue of the workflow + CPU task worker unless told otherwise (activities on it are dispatched eagerly)
TASK_QUEUE = "gangflow"
#: where the Scheduler, the gangs and the node agents' queues live (DESIGN.md, "Sharing a cluster")
PLATFORM_NAMESPACE = "gangflow-system"
#: the tenant of a run that names none (shared layout, no queue configuration)
DEFAULT_TENANT = "default"
PIPELINE_ATTRIBUTE = "GangflowPipeline"  # keyword: the user workflow's name
TENANT_ATTRIBUTE = "GangflowTenant"  # keyword: the run's tenant
SCHEDULED_BY_ATTRIBUTE = "TemporalScheduledById"  # keyword Temporal sets on a run a schedule started
#: keyword: what a workflow execution is to gangflow, so that one list query tells a user's runs from the
#: rest (``GangflowKind = "run"``). Set in the start options of each, never upserted:
KIND_ATTRIBUTE = "GangflowKind"
KIND_RUN = "run"  # a run: started by the client or a schedule
KIND_CALL = "call"  # a workflow a run starts for one of its calls: a child @workflow, an engine.map chunk
KIND_GANG = "gang"  # a GangTask (one distributed task call); it carries its run's tenant too
KIND_SCHEDULER = "scheduler"  # the Scheduler (it serves every tenant: it carries no tenant)
KIND_LEASE = "lease"  # a node's lease
KIND_VIEW = "view"  # a tenant's short look through its Nexus endpoint (TenantView)
#: the list query of a user's runs (``gangflow list``, ``gangflow usage``): runs only, not the child workflow
#: calls, map chunks, gangs, leases or the Scheduler. A run started before ``GangflowKind`` existed carries none
#: (nor did its child calls, which kept its pipeline): those still show as they did, by their pipeline.
RUNS_ONLY = f'({KIND_ATTRIBUTE} = "{KIND_RUN}" OR ({PIPELINE_ATTRIBUTE} IS NOT NULL AND {KIND_ATTRIBUTE} IS NULL))'


def node_queue(node_id: str) -> str:
    """The task queue one node agent polls: a node launch reaches exactly that node."""
    return f"node/{node_id}"


# -- the tenant-name rule -------------------------------------------------------------------------
#: a tenant is a DNS-1123 label short enough that its namespace ``gf-<tenant>`` is one too (63 at most)
TENANT_MAX_LENGTH = 60
_TENANT = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def check_tenant(tenant: str, what: str = "tenant") -> str:
    """``tenant`` if it is a valid tenant name, else ValueError naming the rule: one rule for the queue
    configuration, the namespaces, the Nexus endpoints and the CLI."""
    if len(tenant) > TENANT_MAX_LENGTH or not _TENANT.fullmatch(tenant):
        raise ValueError(
            f"{what} {tenant!r} is not a DNS-1123 label of at most {TENANT_MAX_LENGTH} characters (lowercase "
            "letters, digits and '-', starting and ending with a letter or digit; its namespace gf-<tenant> "
            "must be one too)"
        )
    return tenant


def tenant_namespace(tenant: str) -> str:
    """The Temporal namespace of a tenant (its name, as in a queue configuration, checked)."""
    return f"gf-{check_tenant(tenant)}"


#: tenants' OS users take uids (and gids, the same number) from [BASE, BASE + SPAN): far above the
#: distributions' ranges for people (1000-60000) and subordinate ids (100000 + 65536 per user), below 2**31
TENANT_UID_BASE = 1_000_000_000
TENANT_UID_SPAN = 1 << 28  # below the gangs' range (engine.executor.sandbox.UID_BASE): never a gang's uid


class TenantUser(NamedTuple):
    """The unprivileged OS user a tenant's code runs as where the platform runs as root."""

    name: str  # ``gf-`` + 12 hex digits: 15 characters, within Linux's 32 for any tenant name
    uid: int  # also the gid of the user's own group


def tenant_user(tenant: str) -> TenantUser:
    """The stable OS user of ``tenant``'s workers (``gangflow dev --auth``, ``gangflow worker --tenant``); its
    ranks run as a user per gang instead (``engine.executor.sandbox.gang_user``), in a range of uids of their
    own, so that no rank ever shares a uid with a worker holding a tenant's token.

    Derived from a hash, not a table, so every machine agrees without coordination: the same tenant is the
    same uid on every node. 48 bits name the user and 28 bits pick the uid; a collision (two tenants, one
    uid) is about n**2 / 2**29 for n tenants."""
    return TenantUser(*hashed_user(check_tenant(tenant), TENANT_UID_BASE, TENANT_UID_SPAN, uid_bytes=6))


def hashed_user(key: str, base: int, span: int, *, uid_bytes: int) -> tuple[str, int]:
    """The one derivation of gangflow's OS users (a tenant's workers', a gang's ranks'): the sha256 of ``key``
    names the user ``gf-<its first 6 bytes in hex>`` and picks the uid ``base + (4 bytes from uid_bytes) % span``.
    No passwd entry is needed: every machine computes the same pair."""
    digest = hashlib.sha256(key.encode()).digest()
    return f"gf-{digest[:6].hex()}", base + int.from_bytes(digest[uid_bytes : uid_bytes + 4], "big") % span


# -- the platform's Nexus service (workflows/platform.py holds its operation types) ---------------
GANGS_SERVICE = "gangflow.Gangs"
GANGS_QUEUE_PREFIX = "gangs/"


#: the workflow a tenant's client starts in its own namespace to read, through its endpoint, what the platform
#: holds of that tenant (its gangs' states and its queue rows): ``gangflow status``, ``cluster``, ``queues show``
TENANT_VIEW_TYPE = "GangflowTenantView"
#: its workflow ids (one per look, closed within seconds; ``gangflow list`` shows runs only)
TENANT_VIEW_PREFIX = "gangflow-view-"


def tenant_of_namespace(namespace: str) -> str | None:
    """``gf-team-a`` → ``team-a``: the tenant whose namespace this is, or None (the platform's, ``default``)."""
    tenant = namespace.removeprefix("gf-")
    if tenant == namespace:
        return None
    try:
        return check_tenant(tenant)
    except ValueError:
        return None


def gang_endpoint(tenant: str) -> str:
    """The tenant's Nexus endpoint (the dev gateway lets namespace ``gf-<tenant>`` use this one only)."""
    return f"gf-{tenant}-gangs"


def gangs_queue(tenant: str) -> str:
    """The platform task queue the tenant's endpoint targets: the handler's only source for the tenant."""
    return f"{GANGS_QUEUE_PREFIX}{tenant}"


def tenant_of_queue(task_queue: str) -> str | None:
    tenant = task_queue.removeprefix(GANGS_QUEUE_PREFIX)
    return tenant if task_queue.startswith(GANGS_QUEUE_PREFIX) and tenant else None


@dataclass(frozen=True)
class TenantRoute:
    """A tenant worker's configuration (``gangflow worker --tenant``), pinned over what a client declares:
    the run's tenant and artifact root, and the endpoint its gangs go through."""

    tenant: str
    artifacts: str

    @property
    def endpoint(self) -> str:
        return gang_endpoint(self.tenant)


# -- the Scheduler workflow -----------------------------------------------------------------------
SCHEDULER_ID = "gangflow-scheduler"
SCHEDULER_TYPE = "GangflowScheduler"
#: how many events one Scheduler run handles before it continues as new (tests force many cycles with a few)
SCHEDULER_EVENTS_ENV = "GANGFLOW_SCHEDULER_EVENTS_PER_RUN"


def scheduler_input(environ: Mapping[str, str] = os.environ) -> dict[str, int] | None:
    """What the Scheduler starts with, whoever starts it (the platform worker, a node agent, a client
    applying queues): only read when that start creates it."""
    events = environ.get(SCHEDULER_EVENTS_ENV, "")
    return {"max_events": int(events)} if events.isdigit() else None


REGISTER_NODE_SIGNAL = "register_node"  # signal: a node's capacity (from its lease; older agents: every 5 s)
NODE_LOST_SIGNAL = "node_lost"  # signal: a gang saw a node's activity time out, or the node's lease ended
SUBMIT_SIGNAL = "submit"  # signal: a gang request
RELEASE_SIGNAL = "release"  # signal: free a placement or withdraw a queued request
#: signal: a running gang's attempt saved a new durable checkpoint (engine.scheduling GangCheckpointed's fields)
CHECKPOINTED_SIGNAL = "gang_checkpointed"
#: signal: where a gang attempt's GPU-seconds went (its goodput ledger, told by its GangTask once it ended):
#: ``{"tenant", "flavor", "allocated_gpu_s", "productive_gpu_s", "badput": {cause: GPU-s}}``, counted for Prometheus
LEDGER_SIGNAL = "gang_ledger"
#: the goodput ledger's badput causes (engine.runtime.ledger), in the order they are shown
BADPUT = ("launch", "checkpoint", "restore", "lost_failure", "lost_preemption", "lost_drain", "hang", "idle")
APPLY_QUEUES_UPDATE = "apply_queues"  # update: a new queue configuration
DRAIN_NODE_UPDATE = "drain_node"  # update: start or end a node's drain
DESCRIBE_QUERY = "describe"  # query: nodes, running and pending gangs
NODE_QUERY = "node"  # query: one node's row of describe (None: never registered); what a starting agent asks
QUEUES_QUERY = "queues"  # query: tenants' usage and the configuration

# -- a node's lease (its liveness: workflows.node_lease) ---------------------------------------------
#: one small workflow per node agent that tells the Scheduler when the node comes and goes
NODE_LEASE_TYPE = "GangflowNodeLease"
#: the lease's memo entry: the node's spec (what a Scheduler started afresh re-learns its nodes from)
NODE_MEMO = "gangflow_node"
#: signal to a lease from the Scheduler: someone else (a gang) reported the node lost while its lease still
#: runs; the lease pings its agent and registers the node again if it answers
LEASE_CHECK_SIGNAL = "lease_check"


def lease_id(node_id: str) -> str:
    """The workflow id of a node's lease: one per node id, a restarted agent replaces its old one."""
    return f"gangflow-node-lease/{node_id}"


# -- the gang workflow (one distributed task call) ------------------------------------------------
#: one distributed task call: its gang request, placements and attempts, from the call to the last release
GANG_TYPE = "GangTask"
#: the same workflow's name before 0.2 (it is one task call, not a run): still registered, so gangs in flight
#: replay and finish, and a run in flight that started one keeps starting that type (workflows.shell)
LEGACY_GANG_TYPE = "GangRun"
PLACEMENT_SIGNAL = "placement"  # signal from the Scheduler: where the gang runs
REJECTED_SIGNAL = "rejected"  # signal from the Scheduler: the request can never be placed
PENDING_SIGNAL = "pending"  # signal from the Scheduler: why it waits
PREEMPT_SIGNAL = "preempt"  # signal from the Scheduler: the preemption notice
REMOTE_COMMAND = "remote_command"  # signal and query: MPI's remote-shell hook between agents
STATUS_QUERY = "status"  # query: phase, attempt, placement, ranks
#: signal from node rank 0's agent to its GangTask: the ranks' latest step and metrics (engine.core.glance says
#: how seldom: a few dozen per attempt-day, never one per report)
GANG_PROGRESS_SIGNAL = "gangflow_gang_progress"
#: signal from a GangTask to the run that called it: the gang's state (what the run's current details show)
GANG_STATE_SIGNAL = "gangflow_gang_state"
#: the memo key where a GangTask keeps its attempt list (what a finished gang's status reads, no worker needed)
ATTEMPTS_MEMO = "gangflow_attempts"
#: the error type a rank's attempt ends with when it was preempted (never spends a restart)
PREEMPTED_TYPE = "RankPreempted"
MAP_CHUNK_TYPE = "MapChunk"

# -- the user-workflow shell ----------------------------------------------------------------------
PROGRESS_QUERY = "gangflow_progress"  # query: task calls and their state
INPUT_UPDATE = "gangflow_input"  # update: a value for wait_for_input
APPROVE_UPDATE = "gangflow_approve"  # update: an answer for approve
#: a run's memo key: who started it, a plain string (the client's login name; behind the dev gateway the verified
#: token's subject, whatever the client wrote). The run puts it in its gangs' requests and its sub-workflows'
#: memos: fair share's ordering key within a tenant, never a permission (docs/security.md)
USER_MEMO = "gangflow_user"

# -- activity types -------------------------------------------------------------------------------
RUN_RANKS = "gangflow.run_ranks"  # a node launch, on the node's queue
RESERVE_PORT = "gangflow.reserve_port"
PING = "gangflow.ping"
NOTICE = "gangflow.notice"  # hand a preemption notice to a node's ranks
CLOSED_OWNERS = "gangflow.closed_owners"
HOLD_LEASE = "gangflow.hold_lease"  # a node's lease, held by its agent (on the node's queue) while it lives
LEASED_NODES = "gangflow.leased_nodes"  # the specs of the nodes whose leases are held (a fresh Scheduler's)
CACHE_LOOKUP = "gangflow.cache.lookup"
CACHE_RECORD = "gangflow.cache.record"
CACHE_HIT = "gangflow.cache.hit"
#: a local activity of a run's: a finished distributed task call's goodput line, for the run's current details
GANG_GOODPUT = "gangflow.gang_goodput"
#: an activity of a GangTask's: an ended attempt's goodput ledger, which it tells the Scheduler (``LEDGER_SIGNAL``)
ATTEMPT_LEDGER = "gangflow.attempt_ledger"


def hit_id(kind: str, task: str, run_id: str) -> str:
    """The hit marker's activity id: ``cached:<kind>:<task>:<run>`` (task names have no colon; the run id,
    which may, comes last)."""
    return f"cached:{kind}:{task}:{run_id}"


def parse_hit_id(activity_id: str) -> tuple[str, str, str] | None:
    """(kind, task, run id) of a hit marker's id, None for anything else."""
    parts = activity_id.split(":", 3)
    if len(parts) != 4 or parts[0] != "cached":
        return None
    return parts[1], parts[2], parts[3]
