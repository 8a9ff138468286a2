"""JAX multi-process (multi-controller) as a gangflow plugin.

    @task(plugin=Jax(nnodes=2, nproc_per_node=1))
    def train(steps: int) -> float: ...   # jax.distributed is initialised before the body runs

Each process gets Kubeflow Trainer's names (``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``,
``JAX_PROCESS_ID``); the coordinator service runs inside process 0 on the gang's fresh rendezvous port.
``jax.distributed.initialize`` is called with those values (JAX reads only the address from the
environment) and a bounded heartbeat: JAX's default of 100 s keeps a survivor alive long after its
peer died. gangflow stops the gang itself as soon as any process dies, whatever JAX's timeouts say.
A preemption notice comes as SIGUSR1, since JAX traps SIGTERM (``notice_signal``).
``script="train.py"`` runs an existing JAX script unchanged instead of the body: its own
``jax.distributed.initialize()``, without arguments, joins the gang.
jax is imported only inside a rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from engine.core.gang import GangPlugin, RankContext
from plugins.script import Scripted

__all__ = ["Jax"]


@dataclass(frozen=True)
class Jax(Scripted, GangPlugin):
    """JAX multi-process: jax.distributed initialised before the body, with a bounded heartbeat."""

    nnodes: int = 1
    nproc_per_node: int = 1
    #: seconds without a heartbeat before JAX's coordinator declares a process dead (JAX default: 100)
    heartbeat_timeout: int = 10
    #: seconds to wait for every process to join
    init_timeout: int = 120
    #: the preemption notice: JAX's own preemption notifier traps SIGTERM after ``jax.distributed.initialize``
    #: (the process neither stops nor lets ``engine.checkpoint.stop_requested()`` see it), so the notice comes
    #: as SIGUSR1. ``notice_signal="SIGTERM"`` hands it to JAX instead, for
    #: ``jax.experimental.multihost_utils.reached_preemption_sync_point`` (Orbax); ``engine.preemption()``
    #: still reads the notice file then.
    notice_signal: str = "SIGUSR1"
    #: run this script (path relative to the code bundle's root) on every process instead of the task body;
    #: its own bare ``jax.distributed.initialize()`` joins the gang (``plugins.jax.script``)
    script: str | None = None
    args: tuple[str, ...] = field(default=())
    _script_module: ClassVar[str | None] = "plugins.jax.script"

    def __post_init__(self) -> None:
        if self.heartbeat_timeout <= 0 or self.init_timeout <= 0:
            raise ValueError("Jax heartbeat_timeout and init_timeout must be positive")
        self._check_script()

    def rank_env(self, rank: RankContext) -> dict[str, str]:
        env = {
            "JAX_COORDINATOR_ADDRESS": f"{rank.master_addr}:{rank.master_port}",
            "JAX_NUM_PROCESSES": str(rank.world_size),
            "JAX_PROCESS_ID": str(rank.rank),
        }
        if not rank.gpu_ids:
            env["JAX_PLATFORMS"] = "cpu"  # no GPU was given to this process: do not probe for one
        return env

    def setup(self, rank: RankContext) -> None:
        import jax

        jax.distributed.initialize(
            coordinator_address=f"{rank.master_addr}:{rank.master_port}",
            num_processes=rank.world_size,
            process_id=rank.rank,
            initialization_timeout=self.init_timeout,
            heartbeat_timeout_seconds=self.heartbeat_timeout,
            shutdown_timeout_seconds=self.heartbeat_timeout,
        )

    def teardown(self, rank: RankContext) -> None:
        import jax

        jax.distributed.shutdown()  # type: ignore[no-untyped-call]
