"""The executor on real node agents: 2 nodes × 2 GPU slots, real rank processes, gloo DDP on CPU."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import gangs
import pytest
from conftest import ROOT, alive, failure_of, make_client, run, until
from temporalio.client import WorkflowFailureError


def test_ddp_on_two_nodes_gives_each_rank_its_environment(server, worker, cluster, artifacts):
    async def main() -> dict:
        client = await make_client(server, artifacts)
        run_id = await client.start(gangs.ddp, {"steps": 5})
        result = await client.result(run_id, gangs.ddp)
        status = await client.status(run_id)
        assert [(t.name, t.kind, t.status) for t in status.tasks] == [("ddp_train", "gang", "completed")]
        logs = await client.logs(run_id, "ddp_train", rank=3)
        assert len(logs) == 1 and "rank 3 done" in logs[0][1]
        return result

    result = run(main())
    assert result["identical"] is True  # DDP kept the four replicas in sync
    envs = result["envs"]
    assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "0", "1"]
    assert [e["NODE_RANK"] for e in envs] == ["0", "0", "1", "1"] == [e["PET_NODE_RANK"] for e in envs]
    assert {e["WORLD_SIZE"] for e in envs} == {"4"} and {e["LOCAL_WORLD_SIZE"] for e in envs} == {"2"}
    assert {e["MASTER_ADDR"] for e in envs} == {"127.0.0.1"} and len({e["MASTER_PORT"] for e in envs}) == 1
    assert {e["PET_NNODES"] for e in envs} == {"2"} and {e["OMP_NUM_THREADS"] for e in envs} == {"1"}
    # each rank is pinned to its own GPU slot on its node
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", "1", "0", "1"]
    assert {e["GANGFLOW_ATTEMPT"] for e in envs} == {"0"}
    assert len({e["GANGFLOW_CHECKPOINT_DIR"] for e in envs}) == 1


def test_ddp_pipeline_example_end_to_end(server, worker, cluster, artifacts):
    env = dict(os.environ, GANGFLOW_ADDRESS=server.address, GANGFLOW_ARTIFACTS=artifacts)
    done = subprocess.run(
        [sys.executable, "-m", "engine.cli", "run", "examples/ddp_pipeline.py:pipeline", "--epochs", "2", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["result"]["metrics"]["world_size"] == 4 and out["result"]["accuracy"] > 0.8
    logs = subprocess.run(
        [sys.executable, "-m", "engine.cli", "logs", out["run_id"], "--task", "train", "--rank", "0"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )
    assert "epoch 2/2" in logs.stdout
    # its ranks report their steps (engine.report): the attempt says how far it got, its goodput is known
    status = subprocess.run(
        [sys.executable, "-m", "engine.cli", "status", out["run_id"], "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )
    [attempt] = next(t for t in json.loads(status.stdout)["tasks"] if t["name"] == "train")["attempts"]
    assert attempt["last_step"] > 1, attempt


def test_rank_exception_fails_the_gang_with_rank_and_log_tail(server, worker, cluster, artifacts):
    async def main() -> str:
        started = time.monotonic()
        error = await failure_of(await make_client(server, artifacts), gangs.broken, {"bad_rank": 1})
        assert time.monotonic() - started < 25  # the survivors (sleeping 30 s) were stopped, not awaited
        return error

    error = run(main())
    assert "task 'rank_raises' failed" in error
    assert "rank 1 (node node-0, local rank 1) exited with code 1: ValueError: rank 1 cannot read its shard" in error
    assert "about to fail on purpose" in error  # the tail of that rank's log


def test_cancel_leaves_no_rank_process_behind(server, worker, cluster, artifacts, tmp_path):
    async def main() -> list[int]:
        client = await make_client(server, artifacts)
        run_id = await client.start(gangs.hold, {"marker_dir": str(tmp_path), "seconds": 120})
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("pid.*"))) < 4:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.2)
        pids = [int(p.name.split(".")[1]) for p in tmp_path.glob("pid.*")]
        assert all(alive(pid) for pid in pids)
        # ps tells whose each rank is, adopted from a warm standby (started as "... rank --standby torch") or not
        for marker in tmp_path.glob("pid.*"):
            shown = subprocess.run(
                ["ps", "-o", "args=", "-p", marker.name.split(".")[1]], capture_output=True, text=True
            )
            assert shown.stdout.strip() == f"gangflow rank {marker.read_text()}/4 sleepy attempt 0 run {run_id}", shown
        cancelled = time.monotonic()
        await client.cancel(run_id)
        while any(alive(pid) for pid in pids):
            assert time.monotonic() - cancelled < 5, "ranks must be gone within 5 s of the cancel"
            await asyncio.sleep(0.1)
        with pytest.raises(WorkflowFailureError):
            await client.wait(run_id)
        status = await client.status(run_id)
        assert status.status == "CANCELED"
        # the gang's one attempt, as its GangTask recorded it when the cancel stopped it (no worker asked)
        (gang,) = [t for t in status.tasks if t.kind == "gang"]
        (attempt,) = gang.attempts
        assert (gang.status, gang.attempt, attempt["attempt"], attempt["ended"]) == ("cancelled", 0, 0, "cancelled")
        assert attempt["duration_s"] > 0 and len(attempt["nodes"]) == 2, attempt
        return pids

    run(main())


def test_gangs_that_each_need_the_whole_cluster_never_overlap(server, worker, cluster, artifacts, tmp_path):
    async def main() -> None:
        client = await make_client(server, artifacts)
        first = await client.start(gangs.exclusive, {"marker_dir": str(tmp_path), "tag": "a"})
        second = await client.start(gangs.exclusive, {"marker_dir": str(tmp_path), "tag": "b"})
        assert {await client.wait(first), await client.wait(second)} == {"a", "b"}

    run(main())
    spans = sorted(
        (float((tmp_path / f"{t}.start").read_text()), float((tmp_path / f"{t}.end").read_text())) for t in "ab"
    )
    assert spans[0][1] <= spans[1][0], f"the gangs overlapped: {spans}"


def test_a_user_holding_gpus_waits_behind_a_colleague_of_the_same_tenant(
    server, worker, cluster, artifacts, tmp_path, monkeypatch
):
    """Fair share inside a tenant on real agents: alice holds the whole cluster (two one-node gangs) and queues a
    third, then bob queues one of the same shape. bob's goes first, in the queue and onto the node alice's
    filler frees, though alice's was submitted first: she still holds the other node, he holds nothing. The
    user is each run's login name (``LOGNAME``; the token's subject behind the gateway, test_isolation_e2e)."""

    def gang(run_id: str) -> str:
        return f"{run_id}.one_node-1"

    async def started(tag: str) -> None:
        async def there() -> bool:
            return (tmp_path / f"{tag}.start").exists()

        await until(f"{tag} started", there, timeout=120)

    async def main() -> None:
        client = await make_client(server, artifacts)

        async def start(user: str, tag: str) -> str:
            monkeypatch.setenv("LOGNAME", user)  # what the client names as the run's user (getpass)
            return await client.start(gangs.half, {"marker_dir": str(tmp_path), "tag": tag})

        runs: dict[str, str] = {}
        try:
            runs["long"] = await start("alice", "long")
            await started("long")
            runs["filler"] = await start("alice", "filler")
            await started("filler")
            runs["alice"] = await start("alice", "alice")
            runs["bob"] = await start("bob", "bob")

            async def both_pending() -> list[str] | None:
                pending = [g["gang_id"] for g in (await client.queue())["pending"]]
                return pending if len(pending) == 2 else None

            assert await until("both gangs queued", both_pending) == [gang(runs["bob"]), gang(runs["alice"])]
            (tmp_path / "filler.release").touch()
            await started("bob")
            assert not (tmp_path / "alice.start").exists()  # alice's waits: her long gang holds the other node
            running = {g["gang_id"] for g in (await client.queue())["running"]}
            assert running == {gang(runs["long"]), gang(runs["bob"])}
        finally:  # the cluster is shared: nothing is left holding it, whatever failed
            for tag in ("long", "filler", "bob", "alice"):
                (tmp_path / f"{tag}.release").touch()
        assert [await client.result(runs[tag], gangs.half) for tag in runs] == list(runs)

    run(main())


def test_gang_larger_than_the_cluster_waits_for_a_node_then_fails_saying_why(server, worker, cluster, artifacts):
    """3 nodes asked of a 2-node cluster: it waits (a node may be registering) for its lost_node_wait, 3 s here,
    then fails as unschedulable, naming what it needed and what the cluster has."""

    async def main() -> str:
        started = time.monotonic()
        error = await failure_of(await make_client(server, artifacts), gangs.oversized_gang, {})
        assert time.monotonic() - started < 60
        return error

    error = run(main())
    assert "Unschedulable" in error and "needs 6 GPUs on 3 nodes" in error, error
    assert "no node that can hold it registered within 3 s" in error, error


def test_torchrun_style_script_runs_unchanged(server, worker, cluster, artifacts):
    async def main() -> str:
        client = await make_client(server, artifacts)
        run_id = await client.start(gangs.scripted, {})
        assert await client.wait(run_id) is None
        return run_id

    run_id = run(main())
    folder = Path(artifacts, "checkpoints", run_id, "allreduce-1")
    assert sorted(p.name for p in folder.iterdir()) == [f"sum.rank{r}" for r in range(4)]
    assert {p.read_text() for p in folder.iterdir()} == {"10.0"}  # 1 + 2 + 3 + 4 on every rank


def test_pending_gang_says_why_and_queue_shows_it(server, worker, cluster, artifacts, tmp_path):
    env = dict(os.environ, GANGFLOW_ADDRESS=server.address, GANGFLOW_ARTIFACTS=artifacts)

    def cli(*args: str) -> dict:
        done = subprocess.run(
            [sys.executable, "-m", "engine.cli", *args, "--json"],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    async def main() -> None:
        client = await make_client(server, artifacts)
        # the holder keeps the cluster until the CLI calls below are done (or 120 s), however busy the machine
        holder = await client.start(gangs.exclusive, {"marker_dir": str(tmp_path), "tag": "holder", "seconds": 120})
        while not (tmp_path / "holder.start").exists():
            await asyncio.sleep(0.2)
        waiting = await client.start(gangs.ddp, {"steps": 1})
        deadline = time.monotonic() + 20
        while True:
            tasks = cli("status", waiting)["tasks"]
            if tasks and (tasks[0]["detail"] or "").startswith("pending"):
                break
            assert time.monotonic() < deadline, tasks
            await asyncio.sleep(0.3)
        assert "needs 4 GPUs on 2 nodes" in tasks[0]["detail"]
        queue = cli("cluster")
        assert [g["gang_id"] for g in queue["running"]] == [f"{holder}.whole_cluster-1"]
        assert [g["gang_id"] for g in queue["pending"]] == [f"{waiting}.ddp_train-1"]
        assert queue["totals"]["gpus_free"] == 0
        (tmp_path / "holder.release").touch()
        assert (await client.result(holder, gangs.exclusive)) == "holder"
        assert (await client.result(waiting, gangs.ddp))["identical"]  # admitted once the holder finished

    run(main())


def test_ranks_die_with_their_node_agent(server, worker, cluster, artifacts, tmp_path):
    """SIGKILL of a node agent takes its ranks with it (parent-death signal), within a second or two."""
    node = cluster[1]

    async def main() -> None:
        client = await make_client(server, artifacts)
        run_id = await client.start(gangs.hold, {"marker_dir": str(tmp_path), "seconds": 120})
        while len(list(tmp_path.glob("pid.*"))) < 4:
            await asyncio.sleep(0.2)
        on_node = {int(p.name.split(".")[1]) for p in tmp_path.glob("pid.*") if p.read_text() in ("2", "3")}
        node.stop(signal.SIGKILL)
        killed = time.monotonic()
        while any(alive(pid) for pid in on_node):
            assert time.monotonic() - killed < 3, "ranks outlived their node agent"
            await asyncio.sleep(0.05)
        await client.cancel(run_id)
        with pytest.raises(WorkflowFailureError):
            await client.wait(run_id)
        pids = [int(p.name.split(".")[1]) for p in tmp_path.glob("pid.*")]
        assert not any(alive(pid) for pid in pids)

    try:
        run(main())
    finally:
        node.restart()
