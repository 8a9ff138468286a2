"""Distributed tasks: the plugin contract and the rank environment every backend gives a rank.

A *plugin* (``@task(plugin=PyTorch(nnodes=2, nproc_per_node=2))``) describes a gang: how many nodes,
how many ranks per node, the framework's environment variables and, optionally, its own rank command;
inside each rank it sets the framework up before the task body runs and tears it down after. Plugins
are plain config objects: they never import Temporal or process machinery, and import their framework
only inside a rank, so a workflow module that names one stays cheap to import.

The rank environment is the same on every backend, so one training script runs under gangflow,
torchrun and Kubeflow Trainer unchanged (DESIGN.md, "Contracts").
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from engine.core.resources import Resources
from engine.errors import DefinitionError

if TYPE_CHECKING:  # imported where a notice is read: every rank and plugin imports this module, cheaply
    from engine.scheduling.events import Preempted

__all__ = [
    "NOTICE_SIGNALS",
    "PER_RANK_ENV",
    "GangPlugin",
    "GangShape",
    "NodeLaunch",
    "Plugin",
    "ProcessSpec",
    "RankContext",
    "base_rank_env",
    "current_rank",
    "gang_contexts",
    "gang_shape",
    "notice_of",
    "notice_payload",
    "own_rank_env",
    "rank_env",
    "rank_files_key",
    "scope_of",
]


@dataclass(frozen=True)
class GangShape:
    """The layout of a gang, from its plugin and the task's resources (checked when the task is decorated):
    ``nnodes`` nodes with ``nproc_per_node`` ranks each.
    ``resources`` of the task are per node (as per pod in Flyte and Kubeflow); GPUs are split evenly
    between the node's ranks."""

    nnodes: int
    nproc_per_node: int
    gpus_per_node: int
    cpus_per_node: float
    mem_per_node: int | None

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node


#: (rank, size, local rank, local size) as MPICH's hydra and Open MPI name them
_MPI_NAMES = (
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
)


@dataclass(frozen=True)
class RankContext:
    """Where one rank sits in its gang (what the environment variables say, as one object)."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    nnodes: int
    master_addr: str
    master_port: int
    gpu_ids: tuple[int, ...]
    run_id: str
    attempt: int
    checkpoint_dir: str

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RankContext:
        e = dict(os.environ if env is None else env)
        if "RANK" not in e:  # started by an MPI launcher: take the rank from its own variables
            for rank, size, local, local_size in _MPI_NAMES:
                if rank in e:
                    e.update(RANK=e[rank], WORLD_SIZE=e[size], LOCAL_RANK=e[local], LOCAL_WORLD_SIZE=e[local_size])
                    break
        gpus = e.get("GANGFLOW_GPU_IDS", "")
        if "GANGFLOW_NODE_GPU_IDS" in e:  # one launcher per node: split the node's GPUs by local rank
            node_gpus = [g for g in e["GANGFLOW_NODE_GPU_IDS"].split(",") if g]
            per = len(node_gpus) // int(e["LOCAL_WORLD_SIZE"])
            gpus = ",".join(node_gpus[int(e["LOCAL_RANK"]) * per : (int(e["LOCAL_RANK"]) + 1) * per])
        return cls(
            rank=int(e["RANK"]),
            local_rank=int(e["LOCAL_RANK"]),
            world_size=int(e["WORLD_SIZE"]),
            local_world_size=int(e["LOCAL_WORLD_SIZE"]),
            node_rank=int(e["NODE_RANK"]),
            nnodes=int(e["GANGFLOW_NNODES"]),
            master_addr=e["MASTER_ADDR"],
            master_port=int(e["MASTER_PORT"]),
            gpu_ids=tuple(int(g) for g in gpus.split(",") if g),
            run_id=e.get("GANGFLOW_RUN_ID", ""),
            attempt=int(e.get("GANGFLOW_ATTEMPT", "0")),
            checkpoint_dir=e.get("GANGFLOW_CHECKPOINT_DIR", ""),
        )


@dataclass(frozen=True)
class ProcessSpec:
    """A process a plugin asks the engine to run beside the ranks, e.g. XGBoost's tracker.

    A coordinator is started on node rank 0 before the ranks, listens on ``MASTER_PORT`` (fresh for
    each attempt) and is stopped when the gang ends; if it fails first, the gang fails.
    """

    name: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)


@runtime_checkable
class Plugin(Protocol):
    """What a distributed-task plugin provides. See docs/plugins.md; ``GangPlugin`` has the defaults."""

    nnodes: int
    nproc_per_node: int

    def rank_env(self, rank: RankContext) -> dict[str, str]:
        """Framework variables for one rank, added to the base rank environment."""
        ...

    def command(self, rank: RankContext) -> list[str] | None:
        """The rank's command, or None to run the task body through gangflow's rank runner."""
        ...

    def setup(self, rank: RankContext) -> None:
        """Inside the rank, before the task body (e.g. init the process group)."""
        ...

    def teardown(self, rank: RankContext) -> None:
        """Inside the rank, after the task body, also when it raised."""
        ...


def current_rank() -> RankContext:
    """Where the calling rank sits in its gang (rank, world size, node rank, ...), e.g. to pick its shard.
    Under ``engine.run_local`` a distributed task is rank 0 of 1."""
    if "RANK" not in os.environ:
        raise RuntimeError("current_rank() is only available inside a rank of a distributed task")
    return RankContext.from_env()


class GangPlugin:
    """Convenient base for plugins: every hook has a do-nothing default, so a plugin overrides only what
    its framework needs. Subclasses are (frozen) dataclasses with ``nnodes`` and ``nproc_per_node``."""

    nnodes: int
    nproc_per_node: int
    #: the signal that carries a preemption notice to the ranks (with the notice file, ``engine.preemption()``);
    #: a plugin whose framework traps SIGTERM itself picks another one (Jax)
    notice_signal: str = "SIGTERM"

    def rank_env(self, rank: RankContext) -> dict[str, str]:
        return {}

    def command(self, rank: RankContext) -> list[str] | None:
        return None

    def coordinator(self, rank0: RankContext) -> ProcessSpec | None:
        """A process to run on node rank 0 for this attempt (started before the ranks), or None."""
        return None

    def launcher(self, rank0: RankContext, hosts: list[tuple[str, int]], rank_command: list[str]) -> ProcessSpec | None:
        """A process on node rank 0 that starts every rank itself (``mpiexec``), instead of one process
        per rank started by each node agent. ``hosts`` are (name, slots) in node-rank order. What it
        cannot start on other nodes it prints as lines that ``remote_command`` recognises; the engine
        runs those commands through the node agents (no ssh)."""
        return None

    def remote_command(self, line: str, rank0: RankContext) -> tuple[int, list[str]] | None:
        """(node rank, command) when a line of the launcher's output asks for a process on a node."""
        return None

    def accepts_remote(self, command: list[str], rank0: RankContext, node_rank: int) -> bool:
        """Whether a node agent may run ``command`` for node ``node_rank``: it arrives through the gang's
        workflow, where anyone allowed to signal that workflow could put another one, so a launcher plugin
        says exactly which commands its launcher sends (none by default)."""
        return False

    def setup(self, rank: RankContext) -> None:
        return None

    def teardown(self, rank: RankContext) -> None:
        return None


#: signals that may carry a preemption notice: each stops a rank that does not handle it, as SIGTERM does
NOTICE_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT", "SIGHUP")


def gang_shape(plugin: Any, resources: Resources, owner: str) -> GangShape:
    """Validate a plugin's layout against the task's resources (at decoration time)."""
    if not isinstance(plugin, Plugin):
        raise DefinitionError(
            f"{owner}: plugin {plugin!r} is not a gangflow plugin (it needs nnodes, nproc_per_node, "
            "rank_env, command, setup and teardown)"
        )
    notice = getattr(plugin, "notice_signal", "SIGTERM")
    if notice not in NOTICE_SIGNALS:
        raise DefinitionError(
            f"{owner}: the plugin's notice_signal must be one of {', '.join(NOTICE_SIGNALS)}, got {notice!r}"
        )
    nnodes, nproc = plugin.nnodes, plugin.nproc_per_node
    if not (isinstance(nnodes, int) and nnodes >= 1 and isinstance(nproc, int) and nproc >= 1):
        raise DefinitionError(f"{owner}: nnodes and nproc_per_node must be ints >= 1, got {nnodes}, {nproc}")
    if resources.gpu % nproc:
        raise DefinitionError(
            f"{owner}: resources.gpu={resources.gpu} is per node and must split evenly over nproc_per_node={nproc}"
        )
    return GangShape(nnodes, nproc, resources.gpu, float(resources.cpu), resources.mem_bytes)


#: the variables that differ between the ranks of one node: a launcher (MPI) starts its ranks with the node's
#: environment (``rank_env(..., launcher=True)``, without them) and each rank sets them itself (``own_rank_env``)
PER_RANK_ENV = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "CUDA_VISIBLE_DEVICES",
        "GANGFLOW_GPU_IDS",
    }
)


def own_rank_env(rank: RankContext) -> dict[str, str]:
    """The variables of ``PER_RANK_ENV`` for one rank."""
    gpus = ",".join(str(g) for g in rank.gpu_ids)
    return {
        "RANK": str(rank.rank),
        "LOCAL_RANK": str(rank.local_rank),
        "WORLD_SIZE": str(rank.world_size),
        "LOCAL_WORLD_SIZE": str(rank.local_world_size),
        "ROLE_RANK": str(rank.rank),
        "ROLE_WORLD_SIZE": str(rank.world_size),
        # a rank that asked for no GPU must not see (and grab) the node's GPUs
        "CUDA_VISIBLE_DEVICES": gpus,
        "GANGFLOW_GPU_IDS": gpus,
    }


def base_rank_env(rank: RankContext, *, cpus_per_rank: float) -> dict[str, str]:
    """The environment every rank gets, whatever the framework: torchrun's names, Kubeflow Trainer's
    ``PET_*`` names, GPU pinning and gangflow's own."""
    group = str(rank.node_rank)
    shared = {
        "GROUP_RANK": group,
        "NODE_RANK": group,
        "GROUP_WORLD_SIZE": str(rank.nnodes),
        "ROLE_NAME": "default",
        "MASTER_ADDR": rank.master_addr,
        "MASTER_PORT": str(rank.master_port),
        "PET_NNODES": str(rank.nnodes),
        "PET_NPROC_PER_NODE": str(rank.local_world_size),
        "PET_NODE_RANK": group,
        "PET_MASTER_ADDR": rank.master_addr,
        "PET_MASTER_PORT": str(rank.master_port),
        "OMP_NUM_THREADS": str(max(1, int(cpus_per_rank))),
        "GANGFLOW_NODE_RANK": group,
        "GANGFLOW_NNODES": str(rank.nnodes),
        "GANGFLOW_RUN_ID": rank.run_id,
        "GANGFLOW_ATTEMPT": str(rank.attempt),
        "GANGFLOW_CHECKPOINT_DIR": rank.checkpoint_dir,
        "TORCHELASTIC_RUN_ID": rank.run_id,
        "TORCHELASTIC_RESTART_COUNT": str(rank.attempt),
        "PYTHONUNBUFFERED": "1",
    }
    return {**own_rank_env(rank), **shared}


def rank_env(plugin: Any, rank: RankContext, *, cpus_per_rank: float, launcher: bool = False) -> dict[str, str]:
    """The one place a rank's environment is built (node agents and ``run_local``): the base rank
    environment and the plugin's framework variables. ``launcher=True``: the environment of a whole node
    whose ranks a launcher (MPI) starts: ``rank`` then holds the node's GPUs, the per-rank variables are left
    out, and each rank takes its share of ``GANGFLOW_NODE_GPU_IDS`` (``RankContext.from_env``)."""
    env = base_rank_env(rank, cpus_per_rank=cpus_per_rank)
    if not launcher:
        return {**env, **plugin.rank_env(rank)}
    shared = {k: v for k, v in env.items() if k not in PER_RANK_ENV}
    return {**shared, **plugin.rank_env(rank), "GANGFLOW_NODE_GPU_IDS": ",".join(map(str, rank.gpu_ids))}


def gang_contexts(
    *,
    node_rank: int,
    nnodes: int,
    nproc_per_node: int,
    gpu_ids: list[int] | tuple[int, ...],
    master_addr: str,
    master_port: int,
    run_id: str,
    attempt: int,
    checkpoint_dir: str,
) -> list[RankContext]:
    """The ranks of one node of a gang, local rank 0 first; the node's GPUs are split evenly between them."""
    per_rank = len(gpu_ids) // nproc_per_node
    return [
        RankContext(
            rank=node_rank * nproc_per_node + local,
            local_rank=local,
            world_size=nnodes * nproc_per_node,
            local_world_size=nproc_per_node,
            node_rank=node_rank,
            nnodes=nnodes,
            master_addr=master_addr,
            master_port=master_port,
            gpu_ids=tuple(gpu_ids[local * per_rank : (local + 1) * per_rank]),
            run_id=run_id,
            attempt=attempt,
            checkpoint_dir=checkpoint_dir,
        )
        for local in range(nproc_per_node)
    ]


@dataclass(frozen=True)
class NodeLaunch:
    """A *node launch*: what one node agent is asked to start for one attempt of a gang, its node's share of
    the placement (sent by GangTask as the input of the ``gangflow.run_ranks`` activity)."""

    gang_id: str
    task: str
    node_id: str
    node_rank: int
    nnodes: int
    nproc_per_node: int
    gpu_ids: list[int]
    cpus_per_node: float
    master_addr: str
    master_port: int
    attempt: int
    checkpoint_dir: str
    log_name: str
    hang_timeout_s: float | None = None
    hosts: list[str] = field(default_factory=list)  # node ids in node-rank order (for MPI hostfiles)

    def contexts(self, run_id: str) -> list[RankContext]:
        return gang_contexts(
            node_rank=self.node_rank,
            nnodes=self.nnodes,
            nproc_per_node=self.nproc_per_node,
            gpu_ids=self.gpu_ids,
            master_addr=self.master_addr,
            master_port=self.master_port,
            run_id=run_id,
            attempt=self.attempt,
            checkpoint_dir=self.checkpoint_dir,
        )


# The preemption notice on its way Scheduler -> GangTask -> node agent: a ``Preempted`` decision, on the wire
# without the two fields its receiver knows already (``kind``, and ``gang_id``: the gang it is sent to). The
# payload keeps the field names the recorded histories hold, so both sides of a version change read it.
_NOTICE_OMITS = frozenset({"kind", "gang_id"})


def notice_payload(notice: Preempted, **extra: float) -> dict[str, Any]:
    """The notice as a signal or activity payload. GangTask's to its node agents says which grace applies
    (``grace_s``: the task's own, else the Scheduler's) and when it came (``noticed_at``). A notice without
    a cost (``cost_gpu_s``, from a Scheduler before it) is the payload it was then."""
    omit = set(_NOTICE_OMITS) | ({"cost_gpu_s"} if notice.cost_gpu_s is None else set())
    return {**notice.model_dump(mode="json", exclude=omit), **extra}


def notice_of(payload: Any, gang_id: str) -> Preempted | None:
    """The notice a payload carries to gang ``gang_id``, or None when it is malformed (a handler logs and
    drops it: it must never raise). Keys beyond ``Preempted``'s (``noticed_at``) are read past."""
    from pydantic import ValidationError

    from engine.scheduling.events import Preempted

    if not isinstance(payload, dict):
        return None
    fields = {k: v for k, v in payload.items() if k in Preempted.model_fields and k not in _NOTICE_OMITS}
    try:
        return Preempted.model_validate({**fields, "gang_id": gang_id})
    except ValidationError:
        return None


def scope_of(workflow_id: str, run_id: str) -> str:
    """A sub-workflow's id below its run's (``<run>.prep-1`` -> ``prep-1``, a tenant's prefix before the run's id
    too); "" for the run's own workflow."""
    _, below, scope = workflow_id.partition(f"{run_id}.")
    return scope if below else ""


def rank_files_key(scope: str, call: str) -> str:
    """The name a distributed call's rank logs and saved rank reports go by in its run's store: its call id
    (``train-1``), after the id of the sub-workflow that made it where one did (``prep-1~train-1``: a call id
    counts per workflow, so a sub-workflow's ``train-1`` and its run's are two calls). No dots: a log's name
    is ``<key>.<rank>.attempt<n>.log``."""
    return f"{scope.replace('.', '~')}~{call}" if scope else call
