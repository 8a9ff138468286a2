"""Existing programs as distributed tasks: ``script=`` / ``args=`` on every plugin, ``MPI(command=[...])`` for
any executable. The programs in ``scripts/`` are written as their frameworks' docs write them; gangflow
places the gang, gives each rank its framework's environment, and runs the program unchanged.

    gangflow dev --nodes 2 --gpus-per-node 2
    gangflow run examples/any_command.py:jax_script
    gangflow run examples/any_command.py:mpi_command
    gangflow logs <run id> --task ranks
"""

from engine import Gang, task, workflow
from plugins.jax import Jax
from plugins.mpi import MPI
from plugins.pytorch import PyTorch
from plugins.xgboost import XGBoost


@task(plugin=Jax(nnodes=2, script="scripts/jax_allgather.py", args=("allgather",)))
def allgather() -> None:
    """The body is not used: each process runs `python scripts/jax_allgather.py allgather`."""


@task(plugin=XGBoost(n_workers=2, script="scripts/xgb_collective.py", args=("--rounds", 5)))
def boost() -> None:
    """Each worker runs the script beside a fresh tracker; the script joins the communicator itself."""


@task(plugin=MPI(nnodes=2, slots_per_node=2, script="scripts/mpi_allreduce.py"))
def allreduce() -> None:
    """mpiexec runs `python scripts/mpi_allreduce.py` as 4 MPI ranks on 2 nodes."""


@task(plugin=MPI(nnodes=2, slots_per_node=2, command=["./scripts/ranks.sh"]))
def ranks() -> None:
    """Any executable under mpiexec: a shell script here, a compiled solver as well."""


@task(
    plugin=MPI(nnodes=2, slots_per_node=1, command=["sh", "scripts/ranks.sh", "--fail-on", "1"]),
    gang=Gang(max_restarts=0),
)
def ranks_fail() -> None:
    """Rank 1's program exits 1: the task fails with its output."""


@task(plugin=PyTorch(nnodes=2, script="scripts/fails.py", args=("1",)), gang=Gang(max_restarts=0))
def fails() -> None:
    """Process 1's script exits 1: the task fails with its stderr."""


@workflow
async def jax_script() -> None:
    await allgather()


@workflow
async def xgboost_script() -> None:
    await boost()


@workflow
async def mpi_script() -> None:
    await allreduce()


@workflow
async def mpi_command(fail: bool = False) -> None:
    await (ranks_fail() if fail else ranks())


@workflow
async def failing_script() -> None:
    await fails()
