"""JAX, XGBoost and MPI gangs on real node agents (the session's 2-node cluster)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib
import os
import signal
import sys
import time
from pathlib import Path

import gangs
import pytest
from conftest import ROOT, alive, make_client, run
from temporalio.client import WorkflowFailureError
from temporalio.service import RPCError

sys.path.insert(0, str(ROOT / "examples"))


def test_jax_two_processes_on_two_nodes(server, worker, cluster, artifacts):
    pytest.importorskip("jax", reason="the jax extra is not installed")

    async def main() -> dict:
        client = await make_client(server, artifacts)
        run_id = await client.start(gangs.jax_job, {})
        return await client.result(run_id, gangs.jax_job)

    assert run(main()) == {"sum": 3.0, "processes": 2.0}  # 1 + 2: both processes took part


def test_xgboost_workers_train_one_model_from_both_shards(server, worker, cluster, artifacts):
    pytest.importorskip("xgboost", reason="the xgboost extra is not installed")

    async def main() -> tuple[str, object, str]:
        client = await make_client(server, artifacts)
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
        client = await make_client(server, artifacts)
        run_id = await client.start(gangs.mpi_job, {})
        result = await client.result(run_id, gangs.mpi_job)
        return result, await client.logs(run_id, "mpi_allreduce", rank=3)

    result, logs = run(main())
    assert result == [10, 10, 10, 10]  # 1 + 2 + 3 + 4 on every rank
    assert "MPI rank 3 of 4 on node 1: sum 10" in logs[0][1]  # rank 3 ran on the second node agent


@pytest.mark.parametrize("framework", ["torch", "jax", "xgboost", "mpi"])
def test_killed_rank_stops_the_gang_within_15_s(server, worker, cluster, artifacts, framework):
    """gangflow watches the processes itself: the frameworks' own timeouts (JAX 60 s here, XGBoost 120 s)
    do not decide how fast a dead rank is noticed."""
    pytest.importorskip({"torch": "torch", "jax": "jax", "xgboost": "xgboost", "mpi": "mpi4py"}[framework])

    async def main() -> tuple[float, str, list[int]]:
        client = await make_client(server, artifacts)
        run_id = await client.start(gangs.forever, {"framework": framework})
        gang_id = f"{run_id}.{framework}_forever-1"
        deadline = time.monotonic() + 90
        while True:
            with contextlib.suppress(RPCError):
                progress = {r: p for n in (await client.gang(gang_id))["nodes"] for r, p in n["progress"].items()}
                if len(progress) == 2 and all(p["step"] >= 3 for p in progress.values()):
                    break
            assert time.monotonic() < deadline, "the gang never got going"
            await asyncio.sleep(0.2)
        pids = [int(p["pid"]) for p in progress.values()]
        os.kill(int(progress["1"]["pid"]), signal.SIGKILL)
        killed = time.monotonic()
        with pytest.raises(WorkflowFailureError):
            await client.wait(run_id)
        elapsed = time.monotonic() - killed
        return elapsed, (await client.status(run_id)).error or "", pids

    elapsed, error, pids = run(main())
    print(f"{framework}: the run ended {elapsed:.1f} s after rank 1 was killed")
    assert elapsed < 15, f"{framework}: the run took {elapsed:.1f} s to end after the kill"
    assert "rank 1" in error or "proxy" in error or "mpiexec" in error
    time.sleep(0.5)
    assert not any(alive(pid) for pid in pids), "a rank outlived its gang"


@pytest.mark.parametrize("example", ["jax_pipeline", "xgboost_pipeline", "mpi_pipeline"])
def test_framework_examples_run_on_two_node_agents(server, worker, cluster, artifacts, example):
    pytest.importorskip({"jax_pipeline": "jax", "xgboost_pipeline": "xgboost", "mpi_pipeline": "mpi4py"}[example])
    module = importlib.import_module(example)

    async def main() -> object:
        client = await make_client(server, artifacts)
        run_id = await client.start(module.pipeline, {})
        try:
            return await client.result(run_id, module.pipeline)
        except WorkflowFailureError:
            pytest.fail((await client.status(run_id)).error or "failed")

    result = run(main())
    if example == "jax_pipeline":
        fit, mse = result
        assert fit.processes == 2 and mse < 0.05
        assert [round(w) for w in fit.weights] == [1, 2, 3, 4]
    elif example == "xgboost_pipeline":
        assert result < 1.0  # test RMSE of the model both workers trained
    else:
        assert result.ranks == 4 and abs(result.pi - 3.1416) < 0.01
