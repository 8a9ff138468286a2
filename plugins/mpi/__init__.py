"""MPI (mpi4py) as a gangflow plugin, with MPICH's hydra launcher and no ssh.

    @task(plugin=MPI(nnodes=2, slots_per_node=2))
    def solve(n: int) -> float: ...      # runs on every MPI rank; `from mpi4py import MPI` works

Node rank 0 runs ``mpiexec -launcher manual -f <hostfile> -n N -genvnone python -m engine.executor.rank``.
Hydra does not ssh anywhere: it prints one ``HYDRA_LAUNCH:`` proxy command per host, and gangflow's node
agents run each on its own node (the engine passes the command through the gang's workflow). With
``-genvnone`` every rank inherits its own node's environment (GPU pinning, gangflow's variables), not
node 0's. Hosts in the hostfile are gangflow node ids (``node:slots``, MPICH's format); hydra never
resolves them in manual mode, and the proxies connect back to node 0's advertised address.

``MPI(script="solve.py", args=(...))`` runs an existing mpi4py program as every rank instead of the body,
and ``MPI(command=["./solver", "--n", "10"])`` any executable (C, Fortran, a shell script, ``hostname``);
hydra passes every rank's output to mpiexec, whose log (``gangflow logs RUN --task T``) then holds it,
each line prefixed with its rank (``[3] ...``), and a rank that exits non-zero fails the task with it.

Only MPICH is supported (``pip install mpi4py mpich``, the ``gangflow[mpi]`` extra). Open MPI 5 would
use ``--prtemca plm_ssh_agent`` with a gangflow remote-exec helper; it is not wired up yet.
"""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engine.core.gang import GangPlugin, ProcessSpec, RankContext
from engine.errors import DefinitionError
from plugins.script import Scripted, check_command

__all__ = ["MPI"]

_LAUNCH = re.compile(r"^HYDRA_LAUNCH:\s*(.+?)\s*$")
_PROXY_ID = re.compile(r"--proxy-id\s+(\d+)")
_CONTROL = re.compile(r"(--control-port\s+)([^\s:]+):(\d+)")
_PROXY = "hydra_pmi_proxy"
#: the options hydra's manual launcher gives its proxies (MPICH 4-5), each with one value
_PROXY_OPTIONS = {
    "--control-port",
    "--rmk",
    "--launcher",
    "--demux",
    "--pgid",
    "--retries",
    "--usize",
    "--pmi-port",
    "--gpus-per-proc",
    "--gpu-subdevs-per-proc",
    "--proxy-id",
}


@dataclass(frozen=True, init=False)
class MPI(Scripted, GangPlugin):
    """MPI (MPICH): mpiexec on node rank 0, its proxies started by the node agents, no ssh."""

    nnodes: int = 1
    slots_per_node: int = 1
    implementation: str = "mpich"
    #: run this Python script (path relative to the code bundle's root) as every MPI rank, e.g. an mpi4py program
    script: str | None = None
    args: tuple[str, ...] = field(default=())
    #: any executable and its arguments as every MPI rank (``command=`` when building the plugin); a
    #: relative program path is looked up in the code bundle's root
    program: tuple[str, ...] = field(default=())

    # written out because ``command`` is both the option users pass and the plugin hook ``command(rank)``
    def __init__(
        self,
        nnodes: int = 1,
        slots_per_node: int = 1,
        implementation: str = "mpich",
        *,
        script: str | None = None,
        args: Sequence[str] = (),
        command: Sequence[str] | None = None,
    ) -> None:
        for name, value in (
            ("nnodes", nnodes),
            ("slots_per_node", slots_per_node),
            ("implementation", implementation),
            ("script", script),
            ("args", args),
        ):
            object.__setattr__(self, name, value)
        if command is not None:
            if script is not None:
                raise DefinitionError(
                    f"MPI: give either script= or command=, not both (got {script!r} and {command!r})"
                )
            if args:
                raise DefinitionError("MPI: args= go with script=; with command= put the arguments in the command")
        object.__setattr__(self, "program", () if command is None else check_command("MPI", command))
        self.__post_init__()

    def __post_init__(self) -> None:
        if self.implementation != "mpich":
            raise ValueError(f"MPI implementation {self.implementation!r} is not supported; use 'mpich'")
        if self.slots_per_node < 1:
            raise ValueError("MPI slots_per_node must be >= 1")
        self._check_script()

    def command(self, rank: RankContext) -> list[str] | None:
        """What each rank runs: the program, the script, or (None) the task body. Under ``mpiexec`` it is the
        launcher's; ``engine.run_local`` runs it as a single process."""
        return list(self.program) if self.program else super().command(rank)

    @property
    def nproc_per_node(self) -> int:  # type: ignore[override]
        return self.slots_per_node

    def launcher(self, rank0: RankContext, hosts: list[tuple[str, int]], rank_command: list[str]) -> ProcessSpec:
        own = self.command(rank0)
        # an own program's output reaches only mpiexec's log (the rank runner writes one log per rank): say whose
        labels = ["-prepend-rank"] if own else []
        mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or "mpiexec"
        hostlist = ",".join(f"{name}:{slots}" for name, slots in hosts)
        return ProcessSpec(
            "mpiexec",
            [
                mpiexec,
                "-launcher",
                "manual",
                "-hosts",
                hostlist,
                "-n",
                str(sum(s for _, s in hosts)),
                "-genvnone",
                *labels,
                *(own or rank_command),
            ],
            # hydra's control port is the gang's fresh rendezvous port, reserved on this node
            {"MPIEXEC_PORT_RANGE": f"{rank0.master_port}:{rank0.master_port}"},
        )

    def remote_command(self, line: str, rank0: RankContext) -> tuple[int, list[str]] | None:
        match = _LAUNCH.match(line)
        proxy = _PROXY_ID.search(line) if match else None
        if not match or not proxy:
            return None
        # hydra names its own hostname as the control host; the other nodes reach node 0 at its
        # advertised address instead
        command = _CONTROL.sub(lambda m: f"{m.group(1)}{rank0.master_addr}:{m.group(3)}", match.group(1))
        return int(proxy.group(1)), command.split()

    def accepts_remote(self, command: list[str], rank0: RankContext, node_rank: int) -> bool:
        """Only hydra's own proxy from this installation, for this node, reporting to this gang's mpiexec (node
        rank 0's advertised address and the gang's fresh port): whatever else a signal carried is refused."""
        if not command or Path(command[0]).name != _PROXY or Path(command[0]).parent != Path(sys.executable).parent:
            return False
        options = dict(zip(command[1::2], command[2::2], strict=False))
        return (
            len(command) % 2 == 1
            and set(options) <= _PROXY_OPTIONS
            and options.get("--control-port") == f"{rank0.master_addr}:{rank0.master_port}"
            and options.get("--proxy-id") == str(node_rank)
        )

    def teardown(self, rank: RankContext) -> None:
        # The rank runner leaves with os._exit, which skips mpi4py's atexit MPI_Finalize; a rank that
        # exits without it makes hydra abort the whole job (killing rank 0 while it writes the result).
        from mpi4py import MPI as mpi

        if mpi.Is_initialized() and not mpi.Is_finalized():
            mpi.COMM_WORLD.Barrier()
            mpi.Finalize()
