"""JAX, XGBoost and MPI gangs on real node agents (the session's 2-node cluster)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import gangs
import pytest
from conftest import run

from engine.client import Client
from engine.runtime import Endpoint, connect


async def _client(server, artifacts: str) -> Client:
    return Client(await connect(Endpoint.resolve(server.address)), artifacts)


def test_jax_two_processes_on_two_nodes(server, worker, cluster, artifacts):
    pytest.importorskip("jax", reason="the jax extra is not installed")

    async def main() -> dict:
        client = await _client(server, artifacts)
        run_id = await client.start(gangs.jax_job, {})
        return await client.result(run_id, gangs.jax_job)

    assert run(main()) == {"sum": 3.0, "processes": 2.0}  # 1 + 2: both processes took part


def test_xgboost_workers_train_one_model_from_both_shards(server, worker, cluster, artifacts):
    pytest.importorskip("xgboost", reason="the xgboost extra is not installed")

    async def main() -> tuple[str, object, str]:
        client = await _client(server, artifacts)
        run_id = await client.start(gangs.xgb_job, {"rows": 4000})
        model, single = await client.result(run_id, gangs.xgb_job)
        return run_id, model, single

    run_id, model, one_shard = run(main())
    folder = Path(artifacts, "checkpoints", run_id, "xgb_train-1")
    digests = [(folder / f"model.rank{r}.sha256").read_text() for r in range(2)]
    assert digests[0] == digests[1]  # both workers hold the same model
    assert digests[0] != one_shard  # ... which is not what shard 0 alone gives
    assert (
        model.name == "model.rank0.json"
        and model.sha256 == hashlib.sha256((folder / "model.rank0.json").read_bytes()).hexdigest()
    )


def test_mpi_allreduce_across_two_node_agents(server, worker, cluster, artifacts):
    pytest.importorskip("mpi4py", reason="the mpi extra is not installed")

    async def main() -> tuple[list[int], list]:
        client = await _client(server, artifacts)
        run_id = await client.start(gangs.mpi_job, {})
        result = await client.result(run_id, gangs.mpi_job)
        return result, await client.logs(run_id, "mpi_allreduce", rank=3)

    result, logs = run(main())
    assert result == [10, 10, 10, 10]  # 1 + 2 + 3 + 4 on every rank
    assert "MPI rank 3 of 4 on node 1: sum 10" in logs[0][1]  # rank 3 ran on the second node agent
