"""Existing programs as gangs on the session's 2-node cluster: ``script=`` on Jax, XGBoost and MPI, and
``MPI(command=[...])`` for any executable. Each program (examples/scripts/) is written as its framework's
docs write one; PyTorch's ``script=`` is run by tests/test_executor.py::test_torchrun_style_script_runs_unchanged."""

from __future__ import annotations

import sys
import time

import pytest
from conftest import ROOT, failure_of, make_client, run

sys.path.insert(0, str(ROOT / "examples"))

import any_command


async def _logs_of(server, artifacts, wf) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """Run ``wf`` to success; (run id, every log of the run joined)."""
    client = await make_client(server, artifacts)
    run_id = await client.start(wf, {})
    assert await client.wait(run_id) is None  # a program's task returns None
    return run_id, "\n".join(text for _, text in await client.logs(run_id))


def test_jax_script_initializes_without_arguments(server, worker, cluster, artifacts):
    pytest.importorskip("jax", reason="the jax extra is not installed")
    _, logs = run(_logs_of(server, artifacts, any_command.jax_script))
    for process in range(2):  # both processes joined one gang: each saw the other's contribution
        assert f"allgather: process {process} of 2, 2 devices, sum 3" in logs


def test_xgboost_script_joins_the_communicator_itself(server, worker, cluster, artifacts):
    pytest.importorskip("xgboost", reason="the xgboost extra is not installed")
    _, logs = run(_logs_of(server, artifacts, any_command.xgboost_script))
    lines = [line for line in logs.splitlines() if line.startswith("worker ")]
    assert sorted(line.split(":")[0] for line in lines) == ["worker 0 of 2", "worker 1 of 2"]
    assert len({line.split("model ")[1] for line in lines}) == 1  # one model, trained together
    assert all("5 rounds" in line and line.endswith("sum 3") for line in lines)


def test_mpi4py_script_runs_as_every_rank(server, worker, cluster, artifacts):
    pytest.importorskip("mpi4py", reason="the mpi extra is not installed")
    _, logs = run(_logs_of(server, artifacts, any_command.mpi_script))
    for rank in range(4):
        assert f"mpi4py rank {rank} of 4 on " in logs and logs.count(": sum 10") == 4


def test_mpi_command_runs_any_executable_on_both_nodes(server, worker, cluster, artifacts):
    pytest.importorskip("mpi4py", reason="the mpi extra is not installed")
    _, logs = run(_logs_of(server, artifacts, any_command.mpi_command))
    seen = {line.split("] ", 1)[1] for line in logs.splitlines() if " of 4 (local " in line}
    assert seen == {
        f"rank {rank} of 4 (local {rank % 2} of 2) on node rank {rank // 2}" for rank in range(4)
    }  # hydra's variables, and ranks 2 and 3 ran on the second node agent


@pytest.mark.parametrize(
    ("wf", "inputs", "expected"),
    [
        (any_command.mpi_command, {"fail": True}, "[1] rank 1: giving up"),
        (any_command.failing_script, {}, "process 1: cannot read the shard"),
    ],
    ids=["mpi-command", "torch-script"],
)
def test_a_failing_program_fails_the_task_with_its_output(server, worker, cluster, artifacts, wf, inputs, expected):
    if wf is any_command.mpi_command:
        pytest.importorskip("mpi4py", reason="the mpi extra is not installed")

    async def main() -> str:
        return await failure_of(await make_client(server, artifacts), wf, inputs)

    started = time.monotonic()
    error = run(main())
    print(error)
    assert "exited with code 1" in error and expected in error, error
    assert time.monotonic() - started < 30
