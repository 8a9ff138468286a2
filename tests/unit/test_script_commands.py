"""``script=`` / ``args=`` on every plugin and ``MPI(command=[...])``: checked when the plugin is built, turned
into each rank's command on the node agent, and (JAX) a bare ``jax.distributed.initialize()`` finding the gang."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine import Resources, task
from engine.core.gang import RankContext
from engine.errors import DefinitionError
from plugins.jax import Jax
from plugins.mpi import MPI
from plugins.pytorch import PyTorch
from plugins.xgboost import XGBoost

RANK0 = RankContext(0, 0, 4, 2, 0, 2, "10.0.0.7", 41709, (), "run-1", 0, "/ckpt")
PLUGINS: list[Any] = [PyTorch, Jax, XGBoost, MPI]


@pytest.mark.parametrize("plugin", PLUGINS, ids=lambda p: p.__name__)
def test_script_and_args_become_every_ranks_command(plugin):
    built = plugin(script="train.py", args=["--steps", 3, 0.5, Path("data/x.csv")])
    assert built.args == ("--steps", "3", "0.5", "data/x.csv")  # numbers and paths written out
    command = built.command(RANK0)
    assert command[0] == sys.executable and command[-5:] == ["train.py", "--steps", "3", "0.5", "data/x.csv"]
    assert plugin().command(RANK0) is None  # no script: the task body runs through the rank runner


def test_a_jax_script_runs_through_the_module_that_registers_the_gang():
    assert Jax(script="train.py").command(RANK0) == [sys.executable, "-P", "-m", "plugins.jax.script", "train.py"]


@pytest.mark.parametrize("plugin", PLUGINS, ids=lambda p: p.__name__)
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"script": "train.py", "args": "--steps 3"}, "args must be a list or tuple of strings, got the string"),
        ({"script": "train.py", "args": ["--on", True]}, "args[1] must be a string (or a number), got True"),
        ({"script": "train.py", "args": 3}, "args must be a list or tuple of strings, got 3"),
        ({"args": ["--steps", "3"]}, "are the script's arguments: add script="),
        ({"script": ""}, "script must be a path to a Python file"),
        ({"script": 7}, "script must be a path to a Python file, got 7"),
    ],
)
def test_bad_script_options_are_refused_when_the_plugin_is_built(plugin, options, message):
    with pytest.raises(DefinitionError, match="^" + plugin.__name__) as info:
        plugin(**options)
    assert message in str(info.value)


def test_mpi_command_runs_any_executable_under_mpiexec():
    mpi = MPI(nnodes=2, slots_per_node=2, command=["./solver", "--n", 10])
    assert mpi.program == ("./solver", "--n", "10") and mpi.command(RANK0) == ["./solver", "--n", "10"]
    spec = mpi.launcher(RANK0, [("node-0", 2), ("node-1", 2)], ["python", "-m", "engine.executor.rank"])
    assert Path(spec.command[0]).name == "mpiexec"
    assert spec.command[-4:] == ["-prepend-rank", "./solver", "--n", "10"]  # the program, not the rank runner
    assert spec.command[spec.command.index("-n") + 1] == "4"


def test_mpi_script_and_body_under_mpiexec():
    script = MPI(nnodes=2, script="solve.py", args=("1",)).launcher(RANK0, [("a", 1), ("b", 1)], ["runner"])
    assert script.command[-4:] == ["-prepend-rank", sys.executable, "solve.py", "1"]
    body = MPI(nnodes=2).launcher(RANK0, [("a", 1), ("b", 1)], ["runner"])
    assert body.command[-2:] == ["-genvnone", "runner"]  # the body's ranks write their own logs: no labels


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"command": []}, "command must name a program, got an empty command []"),
        ({"command": [""]}, "command must name a program"),
        ({"command": "hostname -f"}, "write command=['hostname', '-f']"),
        ({"command": ["hostname", None]}, "command[1] must be a string"),
        ({"command": ["./a.out"], "script": "a.py"}, "give either script= or command=, not both"),
        ({"command": ["./a.out"], "args": ["1"]}, "with command= put the arguments in the command"),
    ],
)
def test_bad_mpi_commands_are_refused_at_import(options, message):
    with pytest.raises(DefinitionError, match=r"^MPI: ") as info:
        MPI(**options)
    assert message in str(info.value)


def test_a_script_task_is_an_ordinary_distributed_task():
    @task(plugin=MPI(nnodes=2, slots_per_node=2, command=["hostname"]), resources=Resources(cpu=1))
    def ranks() -> None:
        """The body is not used."""

    from engine.core.definitions import definition_of

    defn = definition_of(ranks)
    assert defn.gang is not None and defn.gang.world_size == 4


def test_run_script_runs_a_file_as_python_would(tmp_path):
    (tmp_path / "helper.py").write_text("VALUE = 'sibling'\n")
    (tmp_path / "main.py").write_text(
        "import sys, helper\n"
        "if __name__ == '__main__':\n"
        "    print(sys.argv, helper.VALUE)\n"
        "    sys.exit(int(sys.argv[1]))\n"
    )
    code = "import sys; from plugins.script import run_script; run_script(sys.argv[1:])"
    ok = subprocess.run([sys.executable, "-P", "-c", code, str(tmp_path / "main.py"), "0"], capture_output=True)
    assert ok.returncode == 0 and f"['{tmp_path / 'main.py'}', '0'] sibling" in ok.stdout.decode()
    failed = subprocess.run([sys.executable, "-P", "-c", code, str(tmp_path / "main.py"), "3"], capture_output=True)
    assert failed.returncode == 3  # the script's exit status is the rank's
    missing = subprocess.run([sys.executable, "-P", "-c", code, str(tmp_path / "nope.py")], capture_output=True)
    assert missing.returncode == 2 and b"can't open file" in missing.stderr and b"nope.py" in missing.stderr


def test_a_bare_jax_initialize_finds_the_gang_before_any_other_cluster(monkeypatch):
    pytest.importorskip("jax", reason="the jax extra is not installed")
    from jax._src import clusters

    from plugins.jax.script import register_gang_cluster

    saved = list(clusters.ClusterEnv._cluster_types)
    env = Jax(nnodes=2).rank_env(RankContext(3, 1, 4, 2, 1, 2, "10.0.0.7", 41709, (), "r", 0, "/c"))
    for key, value in {**env, "SLURM_JOB_ID": "1", "SLURM_STEP_NODELIST": "n1", "SLURM_NTASKS": "64"}.items():
        monkeypatch.setenv(key, value)  # a node agent started by Slurm: its job is not the gang
    monkeypatch.setenv("SLURM_PROCID", "9")
    monkeypatch.setenv("SLURM_LOCALID", "0")
    try:
        register_gang_cluster()
        found = clusters.ClusterEnv.auto_detect_unset_distributed_params(None, None, None, None, None, 10)
        assert found[:3] == ("10.0.0.7:41709", 4, 3)
        # what the script passes itself still wins
        mine = clusters.ClusterEnv.auto_detect_unset_distributed_params("h:1", 2, 1, None, None, 10)
        assert mine[:3] == ("h:1", 2, 1)
    finally:
        clusters.ClusterEnv._cluster_types[:] = saved
    assert os.environ["JAX_NUM_PROCESSES"] == "4"
