"""``python -P -m plugins.jax.script SCRIPT ARGS...``: a JAX script run unchanged as a gang's rank.

JAX reads only ``JAX_COORDINATOR_ADDRESS`` from the environment; the process count and id of a bare
``jax.distributed.initialize()`` come from a cluster it recognises (Slurm, Open MPI, Cloud TPU, ...).
Before the script runs, this registers the gang as such a cluster, ahead of the others (a node agent
started by Slurm or in a Kubernetes pod would otherwise be taken for the job), reading the variables
the Jax plugin gives every rank, so the script's own ``jax.distributed.initialize()`` joins its gang.
Arguments the script passes itself still win.
"""

from __future__ import annotations

import os
import sys

from plugins.script import run_script

__all__ = ["main", "register_gang_cluster"]

_VARS = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


def register_gang_cluster() -> None:
    """Make ``jax.distributed.initialize()`` without arguments find the gang's process count and id."""
    from jax._src import clusters

    class GangflowCluster(clusters.ClusterEnv):  # type: ignore[no-untyped-call]
        name = "gangflow"
        opt_in_only_method = False

        @classmethod
        def is_env_present(cls) -> bool:
            return all(var in os.environ for var in _VARS)

        @classmethod
        def get_coordinator_address(cls, timeout_secs: int | None, override_coordinator_port: str | None) -> str:
            return os.environ["JAX_COORDINATOR_ADDRESS"]

        @classmethod
        def get_process_count(cls) -> int:
            return int(os.environ["JAX_NUM_PROCESSES"])

        @classmethod
        def get_process_id(cls) -> int:
            return int(os.environ["JAX_PROCESS_ID"])

    # defining the subclass appended it; the gang's own variables come first
    types = clusters.ClusterEnv._cluster_types
    types.remove(GangflowCluster)
    types.insert(0, GangflowCluster)


def main() -> None:
    register_gang_cluster()
    run_script(sys.argv[1:])


if __name__ == "__main__":
    main()
